"""``reamer calibrate``: measure this machine's performance-model constants into one profile.

One module per measurement (each returns plain numbers with their source):

* :mod:`~reamer.calibration.training`     core GFLOP/s, Amdahl fraction (1 vs 2 threads), PS
  update cost, and per-sample cost vs cores of the real-workload models (params and FLOPs counted);
* :mod:`~reamer.calibration.oversub`      thread-oversubscription penalty under CPU quotas;
* :mod:`~reamer.calibration.inference`    ONNX Runtime service time per (model, cores, batch) + fit;
* :mod:`~reamer.calibration.interference` training next to inference, each pinned in its own cgroup;
* :mod:`~reamer.calibration.run`          runs the parts and assembles the profile document.

:mod:`~reamer.calibration.worker` is the child process the cgroup measurements run in, and
:mod:`~reamer.calibration.machine` describes the machine and its background load. The profile
format and its loader live in :mod:`reamer.models.profiles`; every cgroup write goes through
:class:`reamer.backends.local.cgroups.CgroupExecutor`.
"""

"""Container entrypoint of the reference PS training job on Kubernetes: turns the ``REAMER_*``
environment the controller gives every TrainingJob pod (docs/kubernetes.md) into
:mod:`reamer.workloads.real.ps_training` arguments, and runs it.

    python -m reamer.workloads.real.k8s_entry        # in a PS or worker pod

PS pods listen on their host-list port and, with ``REAMER_CHECKPOINT_DIR`` (a shared volume
of the template), write their shard on SIGTERM and resume from what is there (any shard
count); worker pods run to the job's last step and serve ``reamer_train_samples_total`` on
``REAMER_METRICS_PORT`` (default 9400; the template's ``reamer.io/metrics-port`` annotation
tells the agent).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from reamer.workloads.real.ps_training import read_manifest
from collections.abc import Mapping


def argv_from_env(env: Mapping[str, str]) -> list[str]:
    """The ps_training command line of this pod; ``ValueError`` names a missing or bad variable."""
    def need(k: str) -> str:
        if not env.get(k):
            raise ValueError(f"environment {k}: expected it set by the Reamer controller")
        return env[k]

    role, index = need("REAMER_ROLE"), int(need("REAMER_INDEX"))
    ps, workers = need("REAMER_PS_HOSTS").split(","), need("REAMER_WORKER_HOSTS").split(",")
    model = env.get("REAMER_MODEL", "small_cnn")
    ckpt = env.get("REAMER_CHECKPOINT_DIR")
    if role == "ps":
        argv = ["ps", "--host", env.get("REAMER_BIND", "0.0.0.0"), "--port", ps[index].rsplit(":", 1)[1],
                "--shard", str(index), "--shards", str(len(ps)), "--workers", str(len(workers)), "--model", model]
        if ckpt:
            argv += ["--checkpoint", ckpt]
            if read_manifest(Path(ckpt)) is not None:
                argv += ["--resume", ckpt]
        return argv
    if role != "worker":
        raise ValueError(f"environment REAMER_ROLE: expected ps or worker, got {role!r}")
    batch = int(env.get("REAMER_BATCH", "32"))
    steps = math.ceil(float(need("REAMER_SAMPLES")) / (batch * len(workers)))
    return ["worker", "--ps", ",".join(ps), "--worker-id", str(index), "--batch", str(batch), "--steps", str(steps),
            "--model", model, "--metrics-port", env.get("REAMER_METRICS_PORT", "9400"),
            "--metrics-host", env.get("REAMER_BIND", "0.0.0.0"), "--report-every-s", "5"]


def main() -> int:
    from reamer.workloads.real import ps_training

    try:
        argv = argv_from_env(os.environ)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return ps_training.main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""Real workloads for the local backend, run as separate processes.

- :mod:`~reamer.workloads.real.ps_training`: parameter-server data-parallel training in
  PyTorch over real TCP (PS shards and workers).
- :mod:`~reamer.workloads.real.inference_server`: ONNX Runtime HTTP inference server with
  dynamic batching and Prometheus metrics.
- :mod:`~reamer.workloads.real.loadgen`: open-loop Poisson load generator.
- :mod:`~reamer.workloads.real.nets`: the model definitions they share.

Nothing here is imported by ``reamer.workloads``; torch / onnxruntime load lazily.
"""

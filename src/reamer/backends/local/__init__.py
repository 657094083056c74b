"""Local backend: Linux cgroups as containers, real PyTorch / ONNX Runtime workloads.

``cgroups`` is the only module that writes cgroup files; ``launcher`` sizes framework
thread pools to a container's CPU allocation (and re-tunes them when it changes).
"""

"""Workloads: clusters and training jobs from generators, the openb trace or a user's job list."""

from reamer.workloads.build import build_jobs, build_nodes

__all__ = ["build_jobs", "build_nodes"]

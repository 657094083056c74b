"""Reamer: a resource manager for shared, containerized ML clusters.

Folders show the architecture:
  domain/    plain immutable snapshots and decisions
  models/    performance models (training speed, ...), shared by every backend
  policies/  pure policies: snapshot -> decisions; never import a backend
  backends/  sim (discrete-event), later local (cgroups) and k8s
  workloads/ traces and generators that produce job specs
  config/    the validated scenario model and its loader
  reports/   metrics and interactive HTML reports
  cli/       the `reamer` command
"""

__version__ = "0.1.0"

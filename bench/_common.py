"""Helpers shared by the benchmark scripts (run them from the repo root)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()
OPENB_NODES = SHARED_DATA / "openb_node_list_all_node.csv"
OPENB_PODS = SHARED_DATA / "openb_pod_list_default.csv"

# Node shapes of the openb cluster (counts by GPUs per node, typical cores), used only
# when ../shared/data is absent so the benchmark still runs on 1,523 nodes.
OPENB_LIKE_POOLS = [
    {"name": "gpu8", "count": 617, "cores": 96, "mem_gib": 512, "gpus": 8},
    {"name": "gpu2", "count": 518, "cores": 64, "mem_gib": 384, "gpus": 2},
    {"name": "cpu", "count": 310, "cores": 32, "mem_gib": 256},
    {"name": "gpu4", "count": 54, "cores": 64, "mem_gib": 384, "gpus": 4},
    {"name": "gpu1", "count": 24, "cores": 32, "mem_gib": 128, "gpus": 1},
]


def openb_cluster() -> dict:
    if OPENB_NODES.is_file():
        return {"node_list": str(OPENB_NODES), "nic_gbps": 10}
    return {"node_pools": OPENB_LIKE_POOLS, "nic_gbps": 10}

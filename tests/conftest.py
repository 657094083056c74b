"""Shared fixtures. Real cluster data lives in ../shared/data (never copied here)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "openb_node_list_all_node.csv").is_file():
        pytest.skip(f"real cluster data not found at {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


@pytest.fixture
def shared_data_or_none() -> Path | None:
    """The real data folder, or None where it is absent (tests then use what they build)."""
    return SHARED_DATA if (SHARED_DATA / "openb_pod_list_default.csv").is_file() else None

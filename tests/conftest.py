"""Shared fixtures. Real cluster data lives in ../shared/data (never copied here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()
# pages (reports, the dashboard) are checked in real headless Chromium: Debian's chromium and
# chromedriver, driven by selenium
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "openb_node_list_all_node.csv").is_file():
        pytest.skip(f"real cluster data not found at {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


@pytest.fixture
def shared_data_or_none() -> Path | None:
    """The real data folder, or None where it is absent (tests then use what they build)."""
    return SHARED_DATA if (SHARED_DATA / "openb_pod_list_default.csv").is_file() else None


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install 'selenium>=4.20')")
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--allow-file-access-from-files", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()

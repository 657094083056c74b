"""Regenerate the dashboard screenshots in docs/img/ (docs/dashboard.md shows them):

    python tools/dashboard_screenshots.py [--only simulated|local]

* ``dashboard-simulated.png``: the shipped co-location scenario simulated with NEARCHUS and
  Reamer, replayed on the dashboard;
* ``dashboard-local.png``: the embedded local scenario (what ``make run`` runs), run for real
  with the dashboard open; needs root and writable cgroups (about three minutes).

Both pages are opened in headless Chromium (Debian's chromium and chromedriver, selenium) at
1400 x 1500 and captured once every round is drawn."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reamer.dashboard import serve
from reamer.runtime.rounds import RoundStream

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"


def chromium():
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1500",
              "--hide-scrollbars"):
        opts.add_argument(a)
    return webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver") or "chromedriver"))


def capture(stream: RoundStream, path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    dash = serve(stream, poll_ms=250)
    driver = chromium()
    try:
        driver.get(dash.url)
        WebDriverWait(driver, 120, poll_frequency=0.25).until(
            lambda d: d.execute_script("return window.reamerDashboard && reamerDashboard.finished && "
                                       "reamerDashboard.draws > 0"))
        time.sleep(1.0)  # plotly's transitions settle
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
        print(f"wrote {path}", file=sys.stderr)
    finally:
        driver.quit()
        dash.close()


def simulated() -> None:
    from reamer.config.scenario import load_embedded
    from reamer.runtime import simulate

    sc = load_embedded("colocation")
    stream = RoundStream({"scenario": sc.name, "backend": "simulator", "policy": "nearchus", "harvest": "reamer"})
    simulate(sc, "nearchus", harvest="reamer", on_round=stream.publish)
    stream.finish()
    capture(stream, OUT / "dashboard-simulated.png")


def local() -> None:
    from reamer.backends.local import session
    from reamer.config.local import load_local
    from reamer.models.profiles import load_profiles
    from reamer.runtime.local import run_scenario

    reason = session.unavailable()
    if reason is not None:
        raise SystemExit(f"dashboard-local.png: no real local run here ({reason})")
    sc = load_local(None)
    stream = RoundStream({"scenario": sc.name, "backend": "local", "policy": sc.policy.training,
                          "harvest": sc.policy.harvest})
    run_scenario(sc, load_profiles(None), on_round=stream.publish)
    stream.finish()
    capture(stream, OUT / "dashboard-local.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["simulated", "local"], default=None)
    a = ap.parse_args()
    if a.only in (None, "simulated"):
        simulated()
    if a.only in (None, "local"):
        local()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

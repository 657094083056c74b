"""Every report kind, generated from small real inputs and checked in headless Chromium:
no console errors, no empty panel, every axis titled, the p99 chart's range within its data
and SLOs, readable log ticks, and each report under 1 MB (plotly.js shared beside it)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from reamer.config.scenario import parse_scenario
from reamer.domain.inference import (
    EvictReplica,
    MigrateReplica,
    PlaceReplica,
    ResizeReplica,
)
from reamer.reports.html import write_report
from reamer.reports.local import write_local_report
from reamer.reports.page import PLOTLY_JS
from reamer.runtime import simulate
from reamer.runtime.local import LocalResult, LocalRun
from reamer.runtime.rounds import RoundRecord

pytestmark = pytest.mark.slow

HEADER = "id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,duration_s\n"
GPU_JOBS = ("j1,resnet50,0,1,2,1,12,1,3000\nj2,mobilenet_v2,600,1,1,1,8,1,2000\nj3,resnet50,1200,1,2,1,10,1,100000\n"
            "j4,resnet50,300,1,1,1,6,1,400\nj5,mobilenet_v2,900,1,1,1,6,1,300\nj6,resnet50,2400,1,1,1,6,1,800\n")
CPU_JOBS = "c1,resnet50,0,1,2,2,8,0,2500\nc2,mobilenet_v2,300,1,1,1,6,0,1500\nc3,resnet50,900,1,2,2,8,0,100000\n"
SLO_MS = 300.0
MB = 1_000_000


def _scenario(tmp_path: Path, jobs: str, pool: dict, inference: bool) -> object:
    (tmp_path / "jobs.csv").write_text(HEADER + jobs)
    data = {"name": "t", "seed": 3, "horizon_s": 7200, "cluster": {"node_pools": [pool]},
            "workload": {"kind": "joblist", "path": str(tmp_path / "jobs.csv")}}
    if inference:
        data["inference"] = {"services": [{"id": "resnet", "model": "resnet50", "slo_p99_ms": SLO_MS,
                                           "peak_rate_per_s": 60, "rate": {"kind": "diurnal"}}],
                             "pool": {"count": 4, "cores": 32}}
    return parse_scenario(data, "test")


@pytest.fixture(scope="module")
def colo_report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("colo")
    sc = _scenario(tmp, GPU_JOBS, {"name": "gpu", "count": 2, "cores": 48, "mem_gib": 256, "gpus": 4,
                                   "gpu_model": "V100M32"}, inference=True)
    runs = [simulate(sc, "static", harvest=h, track=3) for h in ("naive", "reamer")]
    table = [{"policy": r.policy, "SLO met %": r.metrics["slo_attainment_pct"]} for r in runs]
    return write_report(tmp / "colo.html", "co-location", runs, table=table)


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("cpu")
    sc = _scenario(tmp, CPU_JOBS, {"name": "cpu", "count": 2, "cores": 32, "mem_gib": 128}, inference=False)
    runs = [simulate(sc, p, track=3) for p in ("static", "nearchus")]
    return write_report(tmp / "cpu.html", "CPU only", runs)


def _local_run() -> LocalRun:
    rounds = []
    for i in range(12):
        t = 10.0 * i
        ps = 1 if i < 6 else 2
        rounds.append(RoundRecord(
            t=t, speeds={"cifar-ps": 40.0 + 3 * i} if i else {},
            bottlenecks={"cifar-ps": "ps_cpu" if i < 6 else "none"},
            shapes={"cifar-ps": (ps, 2, 2.0 + ps)}, decisions=[],
            inference={"vgg": {"replicas": [("n1", 1.0)] + ([("n2", 1.5)] if i > 4 else []),
                               "p99_ms": 120.0 + i}},
            node_cpu={"n1": 1.5, "n2": 1.0 + 0.1 * i}))
    result = LocalResult(rounds=rounds, jct_s={"cifar-ps": 118.0}, restarts_s=[2.5], wall_s=120.0,
                         replica_failures=[(70.0, "vgg-1", "exited")])
    windows = [{"t_end_s": 10.0 * (i + 1), "ok": 50, "errors": 0, "p99_ms": 100.0 + 10 * i} for i in range(11)]
    events = [(0.0, "cifar-ps", "start 3 containers"),
              (1.0, "PlaceReplica", str(PlaceReplica("vgg", "n1", 1.0, 8, 0.01))),
              (50.0, "PlaceReplica", str(PlaceReplica("vgg", "n2", 1.5, 8, 0.01))),
              (60.0, "cifar-ps", "add ps on n2"),
              (65.0, "ResizeReplica", str(ResizeReplica("vgg-0", 0.5))),
              (70.0, "ReplicaFailed", "vgg-1 exited"),
              (80.0, "MigrateReplica", str(MigrateReplica("vgg-0", "n2"))),
              (110.0, "EvictReplica", str(EvictReplica("vgg-2")))]
    return LocalRun(result, services={"vgg": windows},
                    load_reports={"vgg": {"errors": {}, "latency_ms": {"p99": 190.0}}}, events=events)


@pytest.fixture(scope="module")
def local_report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    return write_local_report(tmp / "local.html", "real run", _local_run(), {"vgg": 250.0})


def _values(trace: dict) -> list[float]:
    return [v for v in trace["y"] if isinstance(v, int | float) and math.isfinite(v)]


def check_page(path: Path, plots: list[dict], severe: list[dict]) -> None:
    assert not severe, f"console errors: {severe}"
    assert path.stat().st_size < MB, f"{path.name}: {path.stat().st_size} bytes"
    assert (path.parent / PLOTLY_JS).is_file()
    assert "<script type=\"text/javascript\">/**\n* plotly.js" not in path.read_text()  # not embedded
    assert plots
    for p in plots:
        assert p["title"], p
        for name, ax in p["axes"].items():
            assert ax["title"], f"{p['title']}: {name} has no title"
            ref = ax["id"]  # 'x', 'x2', 'y3'
            held = [t for t in p["data"] if t[name[0] + "axis"] == ref and _values(t)]  # x may be x0 + dx
            assert held, f"{p['title']}: the panel of {name} ({ax['title']}) holds no data"


def check_log_ticks(driver, plots: list[dict]) -> None:
    """A log axis's tick labels are the values they stand at (0.2 h reads "0.2", not "2")."""
    labels = driver.execute_script("""
        return Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (gd) {
          var out = {};
          ['xaxis', 'yaxis'].forEach(function (k) {
            if (gd._fullLayout[k] && gd._fullLayout[k].type === 'log')
              out[k] = Array.from(gd.querySelectorAll('.' + k[0] + 'tick text')).map(function (e) {
                return e.textContent; });
          });
          return out;
        });""")
    seen = 0
    for p, lab in zip(plots, labels, strict=True):
        for k, texts in lab.items():
            lo, hi = (10 ** v for v in p["axes"][k]["range"])
            assert texts, f"{p['title']}: no tick labels on {k}"
            for s in texts:
                v = float(re.sub(r"[^0-9.eE+-]", "", s.replace("\u2212", "-")))
                assert lo * 0.999 <= v <= hi * 1.001, f"{p['title']}: tick '{s}' outside {lo:g}..{hi:g}"
            seen += 1
    assert seen


def check_p99(plots: list[dict]) -> dict:
    """The p99 chart's log range spans its data and SLO lines, within a factor 2 of them
    (SLO labels once stretched it to 1e322)."""
    lat = next(p for p in plots if "p99" in p["axes"]["yaxis"]["title"])
    assert lat["axes"]["yaxis"]["type"] == "log"
    data = [v for t in lat["data"] for v in _values(t) if v > 0]  # the SLO lines are traces too
    lo, hi = min(data), max(data)
    r0, r1 = (10 ** v for v in lat["axes"]["yaxis"]["range"])
    assert lo / 2 <= r0 <= lo and hi <= r1 <= hi * 2, f"p99 range {r0:g}..{r1:g} for data and SLO {lo:g}..{hi:g}"
    return lat


def test_colocation_report_in_chromium(colo_report, open_report, browser):
    plots, severe = open_report(colo_report)
    check_page(colo_report, plots, severe)
    check_log_ticks(browser, plots)
    titles = [p["title"] for p in plots]
    lat = check_p99(plots)
    assert any(t["name"].startswith("SLO resnet") and SLO_MS in _values(t) for t in lat["data"])
    over = next(p for p in plots if p["title"] == "Over time")
    assert any(a["title"] == "% of cluster GPUs" for a in over["axes"].values())  # a GPU cluster: its panel
    dashes = browser.execute_script("""
        var gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(function (g) {
          return g.layout.title.text === 'Over time'; });
        return gd._fullData.filter(function (t) { return t.showlegend; }).map(function (t) { return t.line.dash; });""")
    assert len(set(dashes)) == len(dashes) == 2  # the two policies' lines differ in style, not only colour
    assert any("CPU of GPU training nodes" in t for p in plots for t in [p["title"]] if t) or len(titles) >= 4
    page = colo_report.read_text()
    assert "jobs unfinished" in page and "GPU allocated %" in page and "GPU used % (model-busy)" in page


def test_cpu_only_report_has_no_gpu_panel(cpu_report, open_report, browser):
    plots, severe = open_report(cpu_report)
    check_page(cpu_report, plots, severe)
    check_log_ticks(browser, plots)
    axes = [a["title"] for p in plots for a in p["axes"].values()]
    assert "% of cluster GPUs" not in axes and "GPU" not in cpu_report.read_text().split("<script")[0]
    assert "jobs unfinished" in cpu_report.read_text()


def test_local_report_in_chromium(local_report, open_report):
    plots, severe = open_report(local_report)
    check_page(local_report, plots, severe)
    tables = local_report.read_text().split("<body>")[1].split("<div")[0]  # the tables, before the plots
    page = re.sub(r"<[^>]+>", " ", tables)  # their text
    assert "jct_s:" not in page and "JCT of cifar-ps (s)" in page and "jobs finished" in page
    for raw in ("PlaceReplica(", "MigrateReplica(", "ResizeReplica(", "EvictReplica(", "Replica(", "='", "cores="):
        assert raw not in page, raw
    assert "start a replica on n2 with 1.5 cores" in page and "move to n2" in page
    assert "exited: taken out of routing and replaced" in page


def test_reports_in_one_folder_share_one_plotly(tmp_path, colo_report):
    """Two reports in a folder: one plotly.min.js, each report small."""
    run = _local_run()
    a = write_local_report(tmp_path / "a.html", "a", run, {"vgg": 250.0})
    b = write_local_report(tmp_path / "b.html", "b", run, {"vgg": 250.0})
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a.html", "b.html", PLOTLY_JS]
    assert a.stat().st_size < MB and b.stat().st_size < MB


def test_demo_sized_colocation_report(tmp_path, open_report, browser):
    """The demo's co-location report (the shipped scenario, every harvesting policy, per-node
    views of 8 nodes): under 1 MB, and it holds up in the browser like the small ones."""
    from reamer.config.scenario import load_embedded
    from reamer.policies import policy_names

    sc = load_embedded("colocation")
    runs = [simulate(sc, "static", harvest=h) for h in policy_names("harvest")]
    path = write_report(tmp_path / "demo-colocation.html", "demo", runs)
    plots, severe = open_report(path)
    check_page(path, plots, severe)
    check_log_ticks(browser, plots)
    check_p99(plots)

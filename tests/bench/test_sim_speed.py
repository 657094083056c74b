"""bench/sim_speed.py end to end on small sizes: each run in its own process, the output in
the documented shape, and the growth exponents as the slopes of log wall time and log events
on log jobs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sim_speed.py"


def test_small_runs_give_the_documented_keys(shared_data, tmp_path):
    if not (shared_data / "pai_synthetic" / "jobs.csv").is_file():
        pytest.skip("the pai_synthetic workload is not in ../shared/data")
    out = tmp_path / "speed.json"
    subprocess.run([sys.executable, str(BENCH), "--jobs", "100", "400", "--policies", "static",
                    "--clusters", "pai6500", "--json", str(out)], check=True, capture_output=True, timeout=300)
    doc = json.loads(out.read_text())
    assert doc["bench"] == "sim_speed" and len(doc["runs"]) == 2
    for run, jobs in zip(doc["runs"], (100, 400), strict=True):
        assert run["policy"] == "static" and run["params"] == {"jobs": jobs, "cluster": "pai6500"}
        m = run["metrics"]
        assert m["timed_out"] == 0 and m["jobs_done"] == jobs and m["unfinished"] == 0
        assert m["wall_s"] > 0 and m["peak_rss_mib"] > 0
        assert m["jobs_per_s"] == pytest.approx(jobs / m["wall_s"])
        assert m["events_per_s"] == pytest.approx(m["events"] / m["wall_s"])
        # under static a job runs as requested: its start re-times it alone (its neighbours'
        # NIC shares stay as recorded), and no round measures anything
        assert m["retimings"] == jobs and m["job_intervals"] == 0
    (a, b) = (r["metrics"]["wall_s"] for r in doc["runs"])
    slope = math.log(b / a) / math.log(4)
    assert doc["ratios"]["growth_exponent_static"] == pytest.approx(slope)
    assert doc["ratios"]["growth_exponent_static_pai6500"] == pytest.approx(slope)
    # static makes two events per job (arrival, completion): its events grow linearly
    assert doc["ratios"]["events_growth_exponent_static"] == pytest.approx(1.0)
    assert doc["ratios"]["retimings_growth_exponent_static"] == pytest.approx(1.0)
    assert "job_intervals_growth_exponent_static" not in doc["ratios"]  # no telemetry: no slope


def test_missing_workload_is_one_line_and_exit_2(tmp_path):
    import shutil

    fake = tmp_path / "repo" / "bench"
    fake.mkdir(parents=True)
    for f in ("sim_speed.py", "_common.py"):
        shutil.copy(BENCH.parent / f, fake / f)
    r = subprocess.run([sys.executable, str(fake / "sim_speed.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "pai_synthetic" in r.stderr and "expected" in r.stderr


def test_nic_gbps_takes_nic_sharing_out(shared_data, tmp_path):
    """With the NIC made effectively infinite no job re-times its neighbours: NEARCHUS's
    reshapes make fewer events than at the workload's 10 GbE, and the runs say which NIC."""
    if not (shared_data / "pai_synthetic" / "jobs.csv").is_file():
        pytest.skip("the pai_synthetic workload is not in ../shared/data")
    events = {}
    for nic in (None, 100000):
        out = tmp_path / f"speed-{nic}.json"
        cmd = [sys.executable, str(BENCH), "--jobs", "600", "--policies", "nearchus", "--clusters", "pai6500",
               "--json", str(out)] + ([] if nic is None else ["--nic-gbps", str(nic)])
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        (run,) = json.loads(out.read_text())["runs"]
        assert run["params"] == {"jobs": 600, "cluster": "pai6500"} | ({} if nic is None else {"nic_gbps": nic})
        events[nic] = run["metrics"]["events"]
    assert events[100000] < events[None]


def test_bad_nic_gbps_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, str(BENCH), "--nic-gbps", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--nic-gbps" in r.stderr and "expected" in r.stderr


def test_repeat_keeps_the_fastest_of_equal_runs(shared_data, tmp_path):
    if not (shared_data / "pai_synthetic" / "jobs.csv").is_file():
        pytest.skip("the pai_synthetic workload is not in ../shared/data")
    out = tmp_path / "speed.json"
    subprocess.run([sys.executable, str(BENCH), "--jobs", "100", "--policies", "static", "--clusters", "pai6500",
                    "--repeat", "3", "--json", str(out)], check=True, capture_output=True, timeout=300)
    (run,) = json.loads(out.read_text())["runs"]
    m = run["metrics"]
    assert m["repeats"] == 3 and 0 < m["wall_s"] <= m["wall_s_max"]
    assert m["jobs_per_s"] == pytest.approx(100 / m["wall_s"])  # the kept run's own rates


def test_bad_repeat_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, str(BENCH), "--repeat", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--repeat" in r.stderr and "expected" in r.stderr


def test_trace_gives_each_policy_over_static_and_its_observed_floor(shared_data, tmp_path):
    """--trace replays the whole openb pod list; static-observed measures every running job
    each interval and decides as static does (the same re-timings and jobs), and the ratios
    are the runs' wall times over static's and over that floor's."""
    if not (shared_data / "openb_pod_list_default.csv").is_file():
        pytest.skip("the openb pod list is not in ../shared/data")
    out = tmp_path / "trace.json"
    subprocess.run([sys.executable, str(BENCH), "--trace", "--policies", "static", "--json", str(out)],
                   check=True, capture_output=True, timeout=600)
    doc = json.loads(out.read_text())
    runs = {r["policy"]: r for r in doc["runs"]}
    assert list(runs) == ["static", "static-observed"]
    static, observed = runs["static"]["metrics"], runs["static-observed"]["metrics"]
    for r in runs.values():
        assert r["scenario"] == "openb" and r["params"] == {"trace": "openb"} and r["metrics"]["timed_out"] == 0
    assert static["job_intervals"] == 0 < observed["job_intervals"]
    assert static["retimings"] == observed["retimings"] and static["jobs_done"] == observed["jobs_done"] > 8000
    assert observed["rounds"] > static["rounds"]
    assert doc["ratios"] == {"trace_wall_vs_static_static-observed":
                             pytest.approx(observed["wall_s"] / static["wall_s"])}


def test_trace_without_the_pod_list_is_one_line_and_exit_2(tmp_path):
    import shutil

    fake = tmp_path / "repo" / "bench"
    fake.mkdir(parents=True)
    for f in ("sim_speed.py", "_common.py"):
        shutil.copy(BENCH.parent / f, fake / f)
    r = subprocess.run([sys.executable, str(fake / "sim_speed.py"), "--trace"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "openb" in r.stderr and "expected" in r.stderr

"""The live dashboard: the one round stream, its HTTP API over real TCP, and the page in real
headless Chromium (Debian's chromium and chromedriver) for a replayed simulation and, where
root and cgroups allow, a real ``reamer local`` run watched while it runs."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest

from reamer.config.scenario import load_embedded
from reamer.dashboard import serve
from reamer.runtime import simulate
from reamer.runtime.rounds import CPU_BANDS, RoundRecord, RoundStream

# what the page drew, as the browser holds it: every plot's traces (name, x, y) by div id
DRAWN_JS = """
var out = {};
document.querySelectorAll('.js-plotly-plot').forEach(function (gd) {
  out[gd.id] = {title: gd._fullLayout.title.text || '',
                xtitle: (gd._fullLayout.xaxis.title || {}).text || '', ytitle: (gd._fullLayout.yaxis.title || {}).text || '',
                data: gd._fullData.map(function (t) {
                  return {name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])}; })};
});
return out;
"""


# the embedded local scenario (make run), shortened: about a minute
SHORT_LOCAL = {
    "name": "dash-local", "seed": 1, "max_s": 100, "system_reserve_cores": 0.25,
    "hosts": [{"name": "ps-a", "cores": 1.0, "cpus": [0], "link_mbit": 5}, {"name": "trainer", "cores": 2.0, "cpus": [0, 1]}],
    "jobs": [{"id": "cifar-ps", "model": "resnet_narrow", "samples": 1200, "batch": 32, "ps": 1, "workers": 1,
              "ps_cores": 1.0, "worker_cores": 1.0}],
    "services": [{"id": "vgg", "model": "vgg_cifar", "slo_p99_ms": 250, "window_s": 5, "rates": [10] * 12}],
    "policy": {"training": "nearchus", "harvest": "reamer", "interval_s": 3,
               "options": {"nearchus": {"block_s": 60},
                           "reamer": {"core_options": [0.5, 0.75, 1.0], "safety_margin_cores": 0.25, "min_cores": 0.25,
                                      "core_step": 0.25, "stable_s": 15, "stale_s": 10}}},
}


def _rec(t: float, **kw) -> RoundRecord:
    return RoundRecord(t=t, speeds={}, bottlenecks={}, shapes={}, decisions=[], **kw)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_stream_hands_each_reader_the_rounds_it_has_not_seen():
    s = RoundStream(keep=3)
    for t in range(5):
        s.publish(_rec(float(t)))
    got, nxt, done = s.since(0)  # the first two dropped off; indexes stay absolute
    assert [r["t"] for r in got] == [2.0, 3.0, 4.0] and nxt == 5 and not done
    assert [r["t"] for r in s.since(4)[0]] == [4.0]
    assert s.since(5)[:2] == ([], 5)
    s.finish()
    assert s.since(5)[2]


def test_a_replay_releases_the_rounds_as_the_wall_clock_passes():
    now = [100.0]
    s = RoundStream(clock=lambda: now[0])
    for t in (0.0, 60.0, 120.0):
        s.publish(_rec(t))
    s.finish()
    s.replay(speed=60.0)  # one simulated minute per second
    assert [r["t"] for r in s.since(0)[0]] == [0.0] and not s.since(0)[2]
    now[0] += 1.0
    assert [r["t"] for r in s.since(0)[0]] == [0.0, 60.0]
    now[0] += 1.0
    got, nxt, done = s.since(0)
    assert len(got) == 3 and nxt == 3 and done
    with pytest.raises(ValueError, match="speed"):
        s.replay(0.0)


@pytest.fixture(scope="module")
def colocation_run() -> tuple[RoundStream, list[RoundRecord]]:
    """The shipped co-location scenario (GPU training nodes, inference on their spare CPU)
    simulated with NEARCHUS and Reamer, every round recorded."""
    sc = load_embedded("colocation")
    recs: list[RoundRecord] = []
    stream = RoundStream({"scenario": sc.name, "backend": "simulator", "policy": "nearchus", "harvest": "reamer"})
    simulate(sc, "nearchus", harvest="reamer", on_round=stream.hook(recs.append))
    stream.finish()
    return stream, recs


def test_every_round_record_is_plain_json_with_cpu_bands_that_add_up(colocation_run):
    _, recs = colocation_run
    assert len(recs) > 10
    for r in recs:
        json.dumps(r.to_json(), allow_nan=False)
        assert len(r.reasons) == len(r.decisions)
        for node, row in r.nodes.items():
            assert all(row[b] >= 0 for b in CPU_BANDS), (node, row)
            used = sum(row[b] for b in CPU_BANDS if b != "idle")
            # the bands fill the node exactly, unless what is booked exceeds it (idle is then 0)
            assert math.isclose(used + row["idle"], row["cores"], abs_tol=1e-6) or (row["idle"] == 0 and used > row["cores"])
    assert any(r.inference for r in recs) and any(r.shapes for r in recs)
    slo = {sid: s["slo_ms"] for r in recs for sid, s in r.inference.items()}
    assert slo and all(v > 0 for v in slo.values())
    decided = [(d, why) for r in recs for d, why in zip(r.decisions, r.reasons, strict=True)]
    assert decided and all(why for _, why in decided), [d for d, why in decided if not why][:5]


def test_the_api_over_tcp_serves_rounds_from_an_index_and_refuses_a_bad_one(colocation_run):
    stream, recs = colocation_run
    dash = serve(stream)
    try:
        assert dash.url.startswith("http://127.0.0.1:")  # loopback unless told
        code, body = _get(dash.url + "api/rounds?since=0")
        got = json.loads(body)
        assert code == 200 and got["finished"] and got["next"] == len(recs) == len(got["rounds"])
        assert got["rounds"][-1] == json.loads(json.dumps(recs[-1].to_json()))
        assert got["meta"]["backend"] == "simulator"
        code, body = _get(dash.url + f"api/rounds?since={len(recs) - 2}")
        assert len(json.loads(body)["rounds"]) == 2
        for bad in ("-1", "x", "1.5"):
            code, body = _get(dash.url + f"api/rounds?since={bad}")
            assert code == 400 and b"since: expected an integer >= 0" in body
        code, page = _get(dash.url)
        assert code == 200 and b'src="plotly.min.js"' in page and b'src="dashboard.js"' in page
        code, js = _get(dash.url + "plotly.min.js")
        assert code == 200 and len(js) > 1_000_000
        assert _get(dash.url + "healthz") == (200, b"ok\n")
    finally:
        dash.close()


def _watch(browser, url: str, until, timeout_s: float = 60.0) -> dict:
    """Open ``url`` and wait until ``until(state)`` (the page's window.reamerDashboard)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # drop what an earlier page logged
    browser.get(url)
    WebDriverWait(browser, timeout_s, poll_frequency=0.2).until(
        lambda d: until(d.execute_script("return window.reamerDashboard && {rounds: reamerDashboard.rounds.length, "
                                         "finished: reamerDashboard.finished, draws: reamerDashboard.draws, "
                                         "errors: reamerDashboard.errors}")))
    return browser.execute_script(DRAWN_JS)


def check_drawn(browser, drawn: dict, rounds: list[dict]) -> None:
    """The page's plots hold the run's data: one point per round in the CPU plot, the latest
    round per node, each service's p99 and SLO, each job's cores; the tables are filled; no
    console errors."""
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe
    for pid, p in drawn.items():
        assert p["title"] and p["xtitle"] and p["ytitle"], (pid, p["title"])
    # the CPU plots: every round that measured the nodes (and, with inference, the services)
    colo = any(r["inference"] for r in rounds)
    measured = [r for r in rounds if r["nodes"] and (r["inference"] or not colo)]
    cpu = drawn["plot-cpu-time"]["data"]
    assert len(cpu) == len(CPU_BANDS) and all(t["x"] == [r["t"] for r in measured] for t in cpu)
    need = next(t for t in cpu if t["name"] == "training need")
    assert need["y"][-1] == pytest.approx(sum(n["training_need"] for n in measured[-1]["nodes"].values()))
    bars = drawn["plot-cpu-nodes"]["data"]
    assert sorted(bars[0]["x"]) == sorted(measured[-1]["nodes"])[:60] or len(bars[0]["x"]) == 60
    services = sorted({s for r in rounds for s in r["inference"]})
    if services:
        p99 = {t["name"]: t for t in drawn["plot-p99"]["data"]}
        for s in services:
            assert f"{s} p99" in p99 and f"{s} SLO" in p99
            want = [r["inference"][s]["p99_ms"] for r in rounds if s in r["inference"]]
            held = p99[f"{s} p99"]["y"]
            assert len(held) == len(want)
            assert [v for v in held if v is not None] == pytest.approx([v for v in want if v is not None])
            assert set(p99[f"{s} SLO"]["y"]) == {r["inference"][s]["slo_ms"] for r in rounds if s in r["inference"]}
    jobs = sorted({j for r in rounds for j in r["shapes"]})
    if jobs:
        cores = {t["name"]: t for t in drawn["plot-cores"]["data"]}
        assert sorted(cores) == jobs
        last = next(r for r in reversed(rounds) if jobs[0] in r["shapes"])
        assert cores[jobs[0]]["y"][-1] == pytest.approx(last["shapes"][jobs[0]][2])
    decisions = browser.execute_script(
        "return Array.from(document.querySelectorAll('#decisions-table tbody tr')).map("
        "function (tr) { return Array.from(tr.cells).map(function (c) { return c.textContent; }); });")
    made = [(d, w) for r in rounds for d, w in zip(r["decisions"], r["reasons"], strict=True)]
    assert len(decisions) == min(40, len(made))
    if made:
        assert decisions[0][1:] == list(made[-1])  # the newest first, with its reason


def test_the_dashboard_of_a_replayed_simulation_in_chromium(browser, colocation_run):
    stream, recs = colocation_run
    # the replay's wall clock is the test's: half the run is due until the page has shown it
    # (a loaded machine may take longer to open the page than a timed replay would last)
    now = [0.0]
    replay = RoundStream(stream.meta, clock=lambda: now[0])
    for r in recs:
        replay.publish(r)
    replay.finish()
    replay.replay(speed=1.0)
    dash = serve(replay, poll_ms=250)
    try:
        # it updates as the replay goes: first a part of the run, then all of it
        now[0] = (recs[-1].t - recs[0].t) / 2
        partial = _watch(browser, dash.url, lambda s: s and 0 < s["rounds"] < len(recs))
        assert 0 < len(partial["plot-cores"]["data"][0]["x"]) < len(recs)
        now[0] = recs[-1].t - recs[0].t
        drawn = _watch(browser, dash.url, lambda s: s and s["finished"] and s["draws"] > 0)
        rounds = replay.since(0)[0]
        assert len(rounds) == len(recs)
        check_drawn(browser, drawn, rounds)
        assert "finished" in browser.find_element("id", "status").text
        assert "colocation" in browser.find_element("id", "run").text
    finally:
        dash.close()


@pytest.mark.privileged
@pytest.mark.slow
def test_the_dashboard_of_a_real_local_run_while_it_runs(browser, tmp_path):
    """A short real run (a PS job on thin links, an inference service on the spare CPU), its
    dashboard opened while it runs: the page follows the rounds, then holds them all."""
    from reamer.backends.local import session
    from reamer.config.local import parse_local
    from reamer.models.profiles import load_profiles

    reason = session.unavailable()
    if reason is not None:
        pytest.skip(f"no real local run here: {reason}")
    import threading

    from reamer.runtime.local import run_scenario

    sc = parse_local(SHORT_LOCAL, "test")
    stream = RoundStream({"scenario": sc.name, "backend": "local", "policy": sc.policy.training,
                          "harvest": sc.policy.harvest})
    dash = serve(stream, poll_ms=500)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(run=run_scenario(sc, load_profiles(None), on_round=stream.publish,
                                                                    state_dir=tmp_path / "state")))
    t.start()
    try:
        live = _watch(browser, dash.url, lambda s: s and s["rounds"] >= 3 and s["draws"] > 0, timeout_s=90)
        assert len(live["plot-cpu-time"]["data"][0]["x"]) >= 3
        t.join(timeout=240)
        assert not t.is_alive(), "the local run did not end"
        stream.finish()
        drawn = _watch(browser, dash.url, lambda s: s and s["finished"], timeout_s=30)
        rounds = stream.since(0)[0]
        assert len(rounds) == len(out["run"].result.rounds)
        check_drawn(browser, drawn, rounds)
        errors = drawn["plot-errors"]["data"] if "plot-errors" in drawn else []
        assert errors and all(len(e["y"]) > 0 for e in errors)  # the local backend measures failed requests
    finally:
        stream.finish()
        t.join(timeout=240)
        dash.close()


def test_the_dashboard_serves_the_rounds_as_prometheus_series(colocation_run):
    from prometheus_client.parser import text_string_to_metric_families

    stream, recs = colocation_run
    dash = serve(stream)
    try:
        code, body = _get(dash.url + "metrics")
    finally:
        dash.close()
    assert code == 200
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    last_h = next(r for r in reversed(recs) if "harvest" in r.halves)
    slo = {s.labels["service"]: s.value for s in fams["reamer_service_slo_seconds"].samples}
    assert slo == {sid: pytest.approx(s["slo_ms"] / 1e3) for sid, s in last_h.inference.items()}
    nodes = {(s.labels["node"], s.labels["use"]): s.value for s in fams["reamer_node_cpu_cores"].samples}
    assert {n for n, _ in nodes} == set(last_h.nodes) and {u for _, u in nodes} == set(CPU_BANDS)
    made = {s.labels["kind"]: s.value for s in fams["reamer_decisions"].samples
            if s.name == "reamer_decisions_total" and s.labels["component"] == "simulator"}
    want: dict[str, int] = {}
    for r in recs:
        for d in r.decisions:
            want[d.split(" ", 1)[0]] = want.get(d.split(" ", 1)[0], 0) + 1
    assert made == want
    last_t = next(r for r in reversed(recs) if "training" in r.halves)
    assert {s.labels["job"] for s in fams["reamer_job_cpu_cores"].samples} == set(last_t.shapes)
    assert fams["reamer_last_round_time_seconds"].samples[0].value == recs[-1].t

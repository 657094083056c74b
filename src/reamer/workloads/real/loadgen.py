"""Open-loop load generator: Poisson arrivals, latency percentiles as JSON.

    python -m reamer.workloads.real.loadgen --url http://127.0.0.1:8080/infer --rate 50 --duration 10
    python -m reamer.workloads.real.loadgen --url ... --rates 10,20,40,20 --interval 1 --seed 3
    python -m reamer.workloads.real.loadgen --endpoints svc.json --path /infer --rate 50

Arrivals are a Poisson process whose rate is piecewise constant: ``--rate`` for the
whole run, or ``--rates`` (one rate per ``--interval`` seconds, e.g. per second from a
trace). The schedule is drawn up front from ``--seed`` and bounded by ``--duration`` and
``--max-requests``. It is open-loop: a request is due at its arrival time whether or not
earlier ones have answered; a pool of ``--max-inflight`` sender threads sends them
(stdlib ``http.client``, one connection per request), and latency is measured from the
*scheduled* arrival, so a backlog on the client side shows up as latency rather than as a
silently lower rate. Only the given URL is ever contacted, or, with ``--endpoints``, the
replicas a controller publishes in that file (:mod:`reamer.workloads.real.endpoints`:
weighted client-side balancing, re-read when the file changes).

With ``--deadline-ms D`` each request carries ``X-Deadline-Ms``: what is left of ``D`` since its
scheduled arrival (the time its client still waits), less the time the request spends outside
the server — the way there and back, measured: the p99, over the answers of the last
``OUTSIDE_WINDOW_S`` seconds, of their latency (from sending) less the server's own time, which
the inference server reports in ``Server-Timing: app;dur=MS`` (0 when nothing was answered in
that time: it learns from answers only) — so an overloaded server can shed it
(:mod:`reamer.workloads.real.admission`) instead of answering after the client's deadline.

The report (stdout, one JSON object): sent / ok / errors (by HTTP status or exception;
every non-2xx answer and every failure, 503 included: they all count against the SLO),
``shed`` (how many of those errors were 503: refused by the server's admission control),
offered and achieved rate (successes over wall time), latency p50 / p95 / p99 / mean / max
in milliseconds of the successful requests, and ``outside_server_ms`` (p50 / p99 of the
time outside the server, where it sends ``Server-Timing``). A window line (``--window-s``) has the same
``errors`` and ``shed`` counts, and ``p99_with_failures_ms``: the p99 with every failed
request counted at the timeout (what a client saw). The requests completed after the last
full window come in one last, shorter window, before the report: the windows add up to it.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import math
import queue
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reamer.workloads.real.endpoints import EndpointsFile

SAMPLE_FLOATS = 3 * 32 * 32
# the deadline's allowance for the way to the server and back: the OUTSIDE_QUANTILE percentile
# over the answers of the last OUTSIDE_WINDOW_S seconds, recomputed every OUTSIDE_EVERY answers
# (a fraction of a second at a few hundred requests/s). 99.5: half of the 1 % a p99 SLO lets be
# late, the other half is the server's admission margin (admission.MARGIN_QUANTILE)
OUTSIDE_QUANTILE = 99.5
OUTSIDE_WINDOW_S = 2.0
OUTSIDE_EVERY = 100


def poisson_arrivals(
    rates: Sequence[float],
    interval_s: float,
    duration_s: float,
    seed: int,
    max_requests: int | None = None,
) -> list[float]:
    """Arrival times (seconds from start) of a Poisson process with rate ``rates[i]`` in
    ``[i*interval_s, (i+1)*interval_s)`` (the last rate holds to ``duration_s``).
    Exact for piecewise-constant rates (memorylessness: each piece draws afresh)."""
    if not rates:
        raise ValueError("rates: expected at least one rate")
    if any(r < 0 or not math.isfinite(r) for r in rates):
        raise ValueError(f"rates: expected finite rates >= 0, got {list(rates)!r}")
    if interval_s <= 0 or duration_s <= 0:
        raise ValueError("interval_s and duration_s must be > 0")
    rng = random.Random(seed)
    out: list[float] = []
    i = 0
    while True:
        start = i * interval_s
        if start >= duration_s:
            break
        end = min(duration_s, start + interval_s)
        rate = rates[min(i, len(rates) - 1)]
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= end:
                break
            out.append(t)
            if max_requests is not None and len(out) >= max_requests:
                return out
        i += 1
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` in [0, 100] of already sorted values."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def default_payload(seed: int = 0) -> bytes:
    """One CIFAR-shaped float32 sample (what ``inference_server`` takes as octet-stream)."""
    import numpy as np

    return np.random.default_rng(seed).standard_normal(SAMPLE_FLOATS).astype("<f4").tobytes()


def run_load(
    url: str | None = None,
    *,
    endpoints: Path | None = None,
    path: str = "/infer",
    rates: Sequence[float],
    interval_s: float = 1.0,
    duration_s: float = 10.0,
    max_requests: int | None = None,
    seed: int = 0,
    payload: bytes | None = None,
    content_type: str = "application/octet-stream",
    method: str = "POST",
    max_inflight: int = 64,
    timeout_s: float = 10.0,
    window_s: float = 0.0,
    on_window: Any = None,
    deadline_ms: float | None = None,
) -> dict[str, Any]:
    """Run the schedule against ``url`` (or, per request, the replica the ``endpoints`` file's
    balancer picks, at ``path``) and return the report. With ``window_s`` > 0,
    ``on_window(report)`` gets, every ``window_s``, the requests completed in that window:
    count, errors, p50/p99 latency (what a monitoring system sees per window). With
    ``deadline_ms``, every request carries ``X-Deadline-Ms``: what is left of it since the
    request's scheduled arrival, less the measured time outside the server (at least 0)."""
    if deadline_ms is not None and not (math.isfinite(deadline_ms) and deadline_ms > 0):
        raise ValueError(f"deadline_ms: expected > 0, got {deadline_ms!r}")
    if (url is None) == (endpoints is None):
        raise ValueError("expected exactly one of url and endpoints")
    picker = EndpointsFile(endpoints) if endpoints is not None else None
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url: expected http://HOST[:PORT]/PATH, got {url!r}")
        fixed = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    else:
        fixed, target = None, path if path.startswith("/") else "/" + path
    body = default_payload(seed) if payload is None and method == "POST" else payload
    arrivals = poisson_arrivals(rates, interval_s, duration_s, seed, max_requests)

    lock = threading.Lock()
    latencies: list[float] = []
    errors: dict[str, int] = {}
    done_at: list[float] = []
    late = [0]
    shed = [0]
    outside: list[float] = []  # every answer's time outside the server, seconds
    recent: collections.deque[tuple[float, float]] = collections.deque()  # (answered at, outside s)
    allow = [0.0, 0.0]  # seconds: the deadline's allowance for the way there and back, valid until
    work: queue.Queue[float | None] = queue.Queue()

    def fail(kind: str) -> None:
        with lock:
            errors[kind] = errors.get(kind, 0) + 1
            win_err[0] += 1

    def send(due: float, t0: float) -> None:
        try:
            addr = fixed if picker is None else picker.pick()
        except ValueError:
            fail("bad endpoints file")
            return
        if addr is None:
            fail("no endpoint")
            return
        try:
            conn = http.client.HTTPConnection(*addr, timeout=timeout_s)
            try:
                headers = {"Content-Type": content_type} if body is not None else {}
                sent_at = time.perf_counter()
                if deadline_ms is not None:
                    left = deadline_ms - 1e3 * (sent_at - (t0 + due) + (allow[0] if sent_at < allow[1] else 0.0))
                    headers["X-Deadline-Ms"] = f"{max(0.0, left):.3f}"
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                status = resp.status
                timing = resp.getheader("Server-Timing") or ""
            finally:
                conn.close()
            now = time.perf_counter()
            with lock:
                if timing.startswith("app;dur="):
                    try:
                        away = now - sent_at - float(timing[8:].split(",")[0]) / 1e3
                    except ValueError:
                        away = None
                    if away is not None:
                        outside.append(away)
                        recent.append((now, away))
                        while recent[0][0] < now - OUTSIDE_WINDOW_S:
                            recent.popleft()
                        # cold (fewer than OUTSIDE_EVERY answers yet): refreshed every tenth of that
                        if len(outside) % (OUTSIDE_EVERY if len(outside) > OUTSIDE_EVERY else OUTSIDE_EVERY // 10) == 0:
                            allow[0] = max(0.0, percentile(sorted(v for _, v in recent), OUTSIDE_QUANTILE) or 0.0)
                        allow[1] = now + OUTSIDE_WINDOW_S
                if 200 <= status < 300:
                    latencies.append(now - (t0 + due))
                    done_at.append(now - t0)
                    win_lat.append(now - (t0 + due))
                else:
                    errors[str(status)] = errors.get(str(status), 0) + 1
                    win_err[0] += 1
                    if status == 503:
                        shed[0] += 1
                        win_shed[0] += 1
        except (OSError, http.client.HTTPException) as e:
            fail(type(e).__name__)

    win_lat: list[float] = []
    win_err = [0]
    win_shed = [0]
    finished = threading.Event()

    def reporter() -> None:
        k = 0
        while True:
            last = finished.wait(max(0.0, t0 + (k + 1) * window_s - time.perf_counter()))
            k += 1
            with lock:
                lat_w, err_w, shed_w = sorted(win_lat), win_err[0], win_shed[0]
                win_lat.clear()
                win_err[0] = win_shed[0] = 0
            if last and not (lat_w or err_w or shed_w):
                return  # the run ended on a window's end: nothing is left to report
            ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
            # what a client saw: a failed request counts at the timeout (it got no answer in time)
            seen_w = sorted(lat_w + [timeout_s] * err_w)
            on_window({"event": "window", "window": k, "t_end_s": round(k * window_s, 3), "ok": len(lat_w),
                       "errors": err_w, "shed": shed_w, "p50_ms": ms(percentile(lat_w, 50)), "p99_ms": ms(percentile(lat_w, 99)),
                       "p99_with_failures_ms": ms(percentile(seen_w, 99))})
            if last:
                return  # the requests completed since the last full window, as a last (shorter) one

    t0 = time.perf_counter()
    windows = None
    if window_s > 0 and on_window is not None:
        windows = threading.Thread(target=reporter, daemon=True, name="loadgen-windows")
        windows.start()

    def sender() -> None:
        while True:
            due = work.get()
            if due is None:
                return
            if time.perf_counter() - (t0 + due) > 0.01:
                with lock:
                    late[0] += 1
            send(due, t0)

    pool = [threading.Thread(target=sender, daemon=True) for _ in range(max(1, min(max_inflight, len(arrivals))))]
    for th in pool:
        th.start()
    try:
        for due in arrivals:  # the dispatcher: release each request at its arrival time
            wait = t0 + due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            work.put(due)
    finally:
        for _ in pool:
            work.put(None)
        for th in pool:
            th.join(timeout=timeout_s + 5.0)
        finished.set()
        if windows is not None:
            windows.join()  # every window is out before the report
    window = max(duration_s if max_requests is None or len(arrivals) < max_requests else arrivals[-1], 1e-9)
    wall = max(time.perf_counter() - t0, 1e-9)
    lat = sorted(latencies)
    ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
    return {
        "event": "done",
        "url": url if url is not None else f"endpoints:{endpoints}",
        "seed": seed,
        "target_rate": round(sum(rates) / len(rates), 3) if len(rates) > 1 else rates[0],
        "duration_s": round(window, 3),
        "wall_s": round(wall, 3),
        "sent": len(arrivals),
        "ok": len(lat),
        "errors": errors,
        "shed": shed[0],
        "late_dispatches": late[0],
        "offered_rate": round(len(arrivals) / window, 3),
        "achieved_rate": round(len(lat) / wall, 3),  # successes over the wall time the run took
        "latency_ms": {
            "p50": ms(percentile(lat, 50)),
            "p95": ms(percentile(lat, 95)),
            "p99": ms(percentile(lat, 99)),
            "mean": ms(sum(lat) / len(lat)) if lat else None,
            "max": ms(lat[-1]) if lat else None,
        },
        "outside_server_ms": {"p50": ms(percentile(sorted(outside), 50)), "p99": ms(percentile(sorted(outside), 99))},
    }


def _schedule_parser() -> argparse.ArgumentParser:
    """The options that decide the arrival schedule (shared by :func:`main` and :func:`schedule_of`)."""
    ap = argparse.ArgumentParser(add_help=False)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--rate", type=float, help="requests per second for the whole run")
    g.add_argument("--rates", help="comma-separated rates, one per --interval seconds (a trace)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds each --rates entry covers")
    ap.add_argument("--duration", type=float, default=None, help="seconds (default: the --rates trace length, else 10)")
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _schedule(a: argparse.Namespace) -> tuple[list[float], float]:
    rates = [a.rate] if a.rate is not None else [float(r) for r in a.rates.split(",") if r.strip()]
    return rates, a.duration if a.duration is not None else (len(rates) * a.interval if a.rates else 10.0)


def schedule_of(args: Sequence[str]) -> list[float]:
    """The arrival times (s from start) that this load generator, given ``args`` (its command
    line; options other than the schedule's are ignored), sends requests at: what a model of
    the run replays to see the very sample the real one measured."""
    a, _ = _schedule_parser().parse_known_args(list(args))
    rates, duration = _schedule(a)
    return poisson_arrivals(rates, a.interval, duration, a.seed, a.max_requests)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reamer.workloads.real.loadgen", description=__doc__.split("\n\n")[0],
                                 parents=[_schedule_parser()])
    to = ap.add_mutually_exclusive_group(required=True)
    to.add_argument("--url", help="the only URL contacted, e.g. http://127.0.0.1:8080/infer")
    to.add_argument("--endpoints", type=Path, help="a published endpoints file: balance over its replicas")
    ap.add_argument("--path", default="/infer", help="request path on the endpoints (with --endpoints)")
    ap.add_argument("--max-inflight", type=int, default=64, help="sender threads (requests in flight at most)")
    ap.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    ap.add_argument("--payload-file", default=None, help="request body (default: one random 3x32x32 float32 sample)")
    ap.add_argument("--content-type", default="application/octet-stream")
    ap.add_argument("--method", default="POST", choices=["GET", "POST"])
    ap.add_argument("--deadline-ms", type=float, default=None,
                    help="send X-Deadline-Ms: what is left of this since each request's scheduled arrival, less "
                         "the measured time outside the server")
    ap.add_argument("--window-s", type=float, default=0.0,
                    help="also print one JSON line per window of this many seconds (completed requests, p99)")
    a = ap.parse_args(argv)
    rates, duration = _schedule(a)
    payload = open(a.payload_file, "rb").read() if a.payload_file else None  # noqa: SIM115
    report = run_load(a.url, endpoints=a.endpoints, path=a.path, rates=rates, interval_s=a.interval, duration_s=duration, max_requests=a.max_requests,
                      seed=a.seed, payload=payload, content_type=a.content_type, method=a.method,
                      max_inflight=a.max_inflight, timeout_s=a.timeout, window_s=a.window_s,
                      on_window=lambda w: print(json.dumps(w), flush=True), deadline_ms=a.deadline_ms)
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] > 0 or report["sent"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Simulated inference services co-located on GPU training nodes (Cloud Reamer).

:class:`SimInference` implements :class:`reamer.control.HarvestBackend`: it observes what
training uses on each GPU node (from the training speed model, with seeded noise) and the
services' replicas, applies a harvesting policy's replica decisions, and judges every service
once per window (``inference.interval_s``, default one minute). Model, per window ``m``:

* **Rates.** Each service's mean rate ``rate[m]`` comes from its source (seeded diurnal curve
  or the GenAI trace scaled to the peak). The policy sees the *observed* rate of past windows
  (a Poisson count / window) and a forecast ``max(r1, r1 + (r1 - r2))`` of the last two (the
  first window: the true rate).
* **Latency** (analytic mode, :mod:`reamer.models.inference`). Requests are split across a
  service's replicas in proportion to each replica's capacity at the SLO; each replica is a
  stationary M/G^(1,B)/1 bulk queue at its share of ``rate[m]``. Its load ratio is rounded *up*
  to a 0.01 grid and its cores *down* to a 0.05 grid so the analytic values can be cached
  (conservative); interference slowdowns are rounded to 0.001; at ≥ 0.97 of
  saturation a replica misses every request. A service-minute meets its SLO when the share of
  its requests slower than the SLO (the capacity-weighted mix of the replicas' miss shares) is
  ≤ 1 %, i.e. exactly when the mixed latency law's p99 ≤ SLO. ``requests_within_slo_pct``
  is ``100 × (1 − miss share)`` weighted by the expected request count: an approximation from
  the stationary latency distribution (the per-minute scatter of a finite sample is not
  modelled). The p99 a policy observes is the largest p99 of the replicas that get ≥ 0.5 % of
  the requests (an upper bound of the mix's p99).
* **Training need.** Each training container's CPU use is the speed model's (a GPU worker's
  input pipeline busy ``t_pipe / t`` of the step, a PS its update share), measured with
  seeded noise once per window; the need signal reads the *uncontended* use (what training
  would use; a node agent sees it as CPU pressure/throttling when it is contended), while
  ``training_used`` reads what training actually got. A node's ``training_need`` is the larger of the last
  measurement and the ``need_percentile`` (p95) of the measurements over the last
  ``need_window_s`` of the containers there now (``training_need: usage``: a rise counts at
  once, a dip only once it lasts; a container that left counts no more, as a node agent's
  per-pod metrics drop a deleted pod), or the
  containers' CPU limits (``limits``); the limits are reported too (``training_limit``: training
  can never take back more than them — NEARCHUS's trimmed limits in the joint mode);
  ``training_used`` is the last window's measured use (what Koordinator-style reclaiming
  reads). With ``need_variation`` every job's input-pipeline cost drifts (log-normal
  AR(1), :mod:`reamer.workloads.need`; one process for all jobs, or ``pai2020``: each job its
  own, fitted to PAI's mini-batch times), redrawn each window *after* the round decided, so a
  policy always acts on the previous window's measurements. A job started since the last
  window runs at the ``need_scale`` (its factor's mean) until its first draw. A joint round
  between windows (training is about to take cores a replica holds, :meth:`crowded_by`) sees
  the window's measurements of the containers there now, a container started since counted
  at its CPU limit; it measures nothing anew.
* **CPU contention** (:meth:`SimInference.update_contention`). On a training node with
  ``A = cores − system reserve``, training wants ``U`` cores (its use at uncontended speed,
  weight = its containers' CPU as cpu.shares) and the replicas, while they serve, their
  limits ``C`` (weight ``C``). When ``U + C > A`` the CPU is split by weighted max-min
  fairness (:func:`cfs_split`, the CFS with cpu.shares), so *both* slow: the replicas' service
  times stretch by ``C / C_got``; training gets ``U_got`` while inference is busy (share ``β``
  of the window) and runs at ``k = 1 − β (1 − U_got / U)`` of its speed; every job with a
  container there slows to ``k`` (:meth:`SimCluster.set_contention`).
  With ``training_qos: burstable`` training's ``U`` includes what its input-bound GPU workers
  take above their requests from the node's idle cores (:meth:`SimCluster._burst_node`), and
  the harvester is not told the training limits (training can exceed them).
  ``training_slowdown_pct`` is ``100 × (1 − mean k)``
  over running jobs, integrated over time (job-seconds): the ratio of contended to
  uncontended speed measured in the same run (no second run needed: the uncontended step
  is kept beside the contended one).
* **Interference** (coefficients from the profile's ``interference`` section unless the
  scenario sets them; 0 in the shipped profile): training speed
  ÷ ``1 + training_interference × inference cores / node cores``;
  replica latency × ``1 + inference_interference × training use / node cores``.
* **Startup.** A placed or migrated replica serves in the window it is placed in (no start-up
  delay modelled); migration is make-before-break, so it never loses a window.

Evictions are :class:`EvictReplica` decisions that come with a new replica of the same
service in the same round (a replica pushed out); the others are scale-downs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import repeat

import numpy as np

from reamer.backends.sim.cluster import SimCluster
from reamer.backends.state import MoveReplica, ReplicaState, ServiceRecord, SetReplicaQuota, StartReplica
from reamer.config.scenario import DiurnalRate, InferenceSection, Scenario
from reamer.domain import Decision, Node
from reamer.domain.inference import HarvestDecision, HarvestSnapshot, NodeUsage, PlaceReplica, Replica
from reamer.errors import InputError
from reamer.models.inference import (
    InferenceProfile,
    analytic_p99_s,
    analytic_slo_miss,
    max_throughput_per_s,
    routing_weights,
    shared,
)
from reamer.workloads.need import Ar1, NeedProcess, pai2020_variation
from reamer.workloads.rates import diurnal_rates, read_genai_qps

GIB = 1024.0
RHO_GRID = 0.01
CORE_GRID = 0.05  # a replica's cores are rounded *down* to this grid for the latency lookups
RHO_MAX = 0.97
MISS_OK = 0.01 + 1e-12
NODE_LAYERS = ("training_used_cores", "training_unused_cores", "harvested_cores", "idle_cores")  # report stack
SLOW_MAX = 1000.0  # service-time stretch above which a replica is taken as stopped


def cfs_split(avail: float, train_demand: float, train_weight: float, inf_demand: float,
              inf_weight: float) -> tuple[float, float]:
    """(training's cores, inference's cores) when both want ``*_demand`` of ``avail`` cores:
    weighted max-min fairness with ``*_weight`` as cpu.shares (the CFS, work-conserving)."""
    avail = max(0.0, avail)
    if train_demand + inf_demand <= avail:
        return train_demand, inf_demand
    wt, wi = max(train_weight, 0.0), max(inf_weight, 0.0)
    share_t = avail * wt / (wt + wi) if wt + wi > 0 else avail / 2.0
    if train_demand <= share_t:
        return train_demand, avail - train_demand
    if inf_demand <= avail - share_t:
        return avail - inf_demand, inf_demand
    return share_t, avail - share_t  # a window meets a p99 SLO when at most 1 % of its requests miss


@lru_cache(maxsize=65536)
def _replica_latency(profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_s: float,
                     slowdown: float, rho_q: int) -> tuple[float, float]:
    """(p99 s, share of requests over the SLO) of one replica at load ratio ``rho_q × RHO_GRID``."""
    return shared("replica_latency", _latency, profile, cores, max_batch, max_wait_s, slo_s, slowdown, rho_q)


def _latency(profile: InferenceProfile, cores: float, max_batch: int, max_wait_s: float, slo_s: float,
             slowdown: float, rho_q: int) -> tuple[float, float]:
    rho = rho_q * RHO_GRID
    if rho >= RHO_MAX:
        return math.inf, 1.0
    rate = rho * max_throughput_per_s(profile, cores, max_batch, slowdown)
    return (analytic_p99_s(rate, profile, cores, max_batch, max_wait_s, slowdown),
            analytic_slo_miss(rate, profile, cores, max_batch, max_wait_s, slo_s, slowdown))


def pool_nodes(sec: InferenceSection) -> tuple[Node, ...]:
    p = sec.pool
    return tuple(Node(f"{p.name}-{k:04d}", p.cores, p.mem_gib * GIB, pool=p.name) for k in range(p.count))


def service_rates(sc: Scenario, minutes: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Mean request rate (req/s) per window of every service, ``minutes`` windows long."""
    sec = sc.inference
    assert sec is not None
    out = {}
    for k, s in enumerate(sec.services):
        r = s.rate
        if isinstance(r, DiurnalRate):
            start = int(round(r.start_hour * 60 * 60 / sec.interval_s))
            rates = diurnal_rates(minutes, s.peak_rate_per_s, s.peak_rate_per_s * r.trough_frac, rng,
                                  peak_hour=r.peak_hour, noise=r.noise, start_minute=start)
        else:
            series = read_genai_qps(r.path, window_s=sec.interval_s, request_type=r.request_type,
                                    peak_per_s=s.peak_rate_per_s)
            rates = np.resize(series, minutes)  # repeat the trace when the run is longer
        out[s.id] = np.asarray(rates, dtype=float)
    return out


def percentile(xs: Iterable[float], q: float) -> float:
    """``numpy.percentile(xs, q)`` (its default, linear interpolation; the same arithmetic, so
    the same bits) without numpy's per-call cost, for the few values of a node's need window."""
    a = sorted(xs)
    v = (len(a) - 1) * (q / 100)
    i = math.floor(v)
    g = v - i
    lo, hi = a[i], a[min(i + 1, len(a) - 1)]
    d = hi - lo
    return hi - d * (1 - g) if g >= 0.5 else lo + d * g


@dataclass
class InferenceTotals:
    windows: int = 0
    service_windows: int = 0
    service_windows_ok: int = 0
    requests: float = 0.0
    requests_ok: float = 0.0
    harvested_core_s: float = 0.0
    pool_core_s: float = 0.0
    pool_node_s: float = 0.0
    gpu_node_used_core_s: float = 0.0
    gpu_node_core_s: float = 0.0
    over_slack_core_s: float = 0.0  # inference cores above (cores − reserve − training use)
    harvestable_core_s: float = 0.0  # inference cores the GPU nodes' idle CPU could hold (≤ all inference cores)
    migrations: int = 0
    evictions: int = 0
    placements: int = 0
    resizes: int = 0


class SimInference:
    """The ``sim`` backend of the harvest round (observe → decide → actuate), one per run. The
    replicas and what was measured per window are the shared
    :class:`~reamer.backends.state.ReplicaState`'s; this keeps the rates, latency and
    contention physics."""

    def __init__(self, sc: Scenario, cluster: SimCluster, rng: np.random.Generator,
                 profiles: Mapping[str, InferenceProfile], noise_pct: float | None = None,
                 need_scale: float = 1.0) -> None:
        sec = sc.inference
        if sec is None:
            raise ValueError("scenario has no inference section")
        self.sec = sec
        self.cluster = cluster
        cluster.track_share = True
        if sec.training_qos == "burstable":
            cluster.burstable, cluster.burst_reserve = True, sec.system_reserve_cores
        self.rng = rng
        self.noise = (sc.policy.telemetry_noise_pct if noise_pct is None else noise_pct) / 100.0
        self.interval_s = sec.interval_s
        self.train_nodes = tuple(n for n in cluster.nodes if n.gpus > 0)
        if any(n.pool == sec.pool.name for n in cluster.nodes):
            raise InputError(sc.source, "field inference.pool.name", "a name no cluster node pool uses", sec.pool.name)
        self.pool = pool_nodes(sec)
        self.nodes = self.train_nodes + self.pool
        self.train_names = {n.name for n in self.train_nodes}
        horizon = sc.horizon_s or 86400.0
        self.windows = int(math.ceil(horizon / self.interval_s))
        for k, s in enumerate(sec.services):
            if s.model not in profiles:
                raise InputError(sc.source, f"field inference.services.{k}.model",
                                 f"one of {', '.join(sorted(profiles))}", s.model)
        self.rates = service_rates(sc, self.windows, rng)
        self.profile = {s.id: profiles[s.model] for s in sec.services}
        self.replicas = ReplicaState(cluster.state, [ServiceRecord(s.id, s.model, s.slo_p99_ms / 1e3, s.mem_mib_per_replica)
                                                     for s in sec.services], self.nodes, sec.pool.name)
        self.totals = InferenceTotals()
        # per node and window: container -> measured use; and the use of the containers there now
        self.use_hist: dict[str, deque[dict[str, float]]] = {n.name: deque() for n in self.train_nodes}
        self._use_sums: dict[str, tuple[frozenset[str], deque[float]]] = {}
        self._used: dict[str, float] = {}  # node -> training's measured use, last window
        self._measured: int | None = None  # the window whose measurements observe last took
        self.need_scale = need_scale  # on every job's input cost: the level of training's need
        cluster.input_scale_default = need_scale  # from a job's start, before its first window's factor
        v = sec.need_variation  # each job's need factor per window (reamer.workloads.need)
        self.need = (None if v == 0 else NeedProcess(int(rng.integers(2**63)), pai2020_variation() if v == "pai2020"
                                                      else Ar1(float(v), sec.need_corr)))
        self.inference_slow: dict[str, float] = {}  # node -> service-time stretch from CPU contention
        self._busy_key: tuple | None = None  # (window, the services' routing entries) of the busy shares remembered
        self._busy: dict[str, float] = {}
        self._routing: dict[str, tuple] = {}  # per service (_weights)
        self._route_caps: dict[tuple[str, float], dict] = {}  # per service and SLO: routing capacities by shape
        self.series: dict[str, list[float]] = {
            "t": [], "harvested_cores": [], "pool_cores": [], "slo_ok_pct": [],
            # GPU training nodes' cores, stacked: training use, training allocation left
            # unused, inference, idle (for the report)
            "training_used_cores": [], "training_unused_cores": [], "idle_cores": [],
        }
        for s in sec.services:
            self.series[f"p99_ms:{s.id}"] = []
            self.series[f"slo_ms:{s.id}"] = [1000.0 * (s.slo_p99_ms / 1e3)]
        for n in self.train_nodes:  # the same stack per GPU node: "node_cpu:LAYER:NODE"
            for layer in NODE_LAYERS:
                self.series[f"node_cpu:{layer}:{n.name}"] = []

    # ------------------------------------------------------------------ helpers
    def window(self, now: float) -> int:
        return int(math.floor(now / self.interval_s + 1e-9))

    def _noise(self) -> float:
        return max(0.0, 1.0 + self.noise * float(self.rng.standard_normal())) if self.noise else 1.0

    def _weights(self, s: ServiceRecord) -> tuple[list[Replica], list[float], list[float], list[float]]:
        """The service's replicas, their cores on the latency grid, their routing weights and
        their uncontended saturation rates (remembered while no replica of the service changes:
        the busy shares and the window's judging share them)."""
        reps = list(s.replicas.values())
        got = self._routing.get(s.id)
        if got is None or got[0] != reps:
            prof = self.profile[s.id]
            cores = [max(CORE_GRID, math.floor(r.cores / CORE_GRID + 1e-9) * CORE_GRID) for r in reps]
            memo = self._route_caps.setdefault((s.id, s.slo_p99_s), {})
            got = self._routing[s.id] = (reps, cores,
                                         routing_weights(prof, reps, s.slo_p99_s, [round(c, 4) for c in cores], memo),
                                         [max_throughput_per_s(prof, c, r.max_batch) for r, c in zip(reps, cores)])
        return got

    # ------------------------------------------------------------------ joint round
    def expect(self, decisions: Sequence[Decision]) -> None:
        self.replicas.expect(decisions)

    def crowded_by(self, decisions: Sequence[Decision]) -> bool:
        """Would training, with ``decisions`` applied, need cores a replica holds: on a node it
        grows on, what its containers there use plus the CPU it adds (new containers at their
        limits) plus the replicas' cores above the cores less the system reserve?"""
        state, inf = self.cluster.state, None
        for node, g in state.growth(decisions).items():
            if g.cpu <= 0:
                continue
            inf = self.replicas.cores_on() if inf is None else inf
            held = inf.get(node, 0.0)
            n = state.node_by_name[node]
            if held > 0 and self.cluster.node_use(node) + g.cpu + held > n.cores - self.sec.system_reserve_cores + 1e-9:
                return True
        return False

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> HarvestSnapshot:
        """Training's use per node as a node agent reports it: measured once per window (the
        window's first round). A round between windows (the joint loop's, :meth:`crowded_by`)
        sees the window's measurements, of the containers there now; one started since counts
        at its CPU limit until it is measured."""
        m = self.window(now)
        if m == self._measured:
            return self._observe_between(now, m)
        self._measured = m
        sec = self.sec
        usage = {}
        for n in self.train_nodes:
            used = self._used[n.name] = self.cluster.node_use(n.name, True) * self._noise()
            hist = self.use_hist[n.name]
            f = self._noise()
            cs = self.cluster.state.containers_on(n.name)
            now_use = {c.id: use * f for c, use in zip(cs, self.cluster.container_uses(cs), strict=True)}
            hist.append(now_use)
            while len(hist) > max(1, int(round(sec.need_window_s / self.interval_s))):
                hist.popleft()
            # the use of the containers there now, window by window: one that left no longer counts
            here = frozenset(now_use)
            kept = self._use_sums.get(n.name)
            if kept is not None and kept[0] == here:
                sums = kept[1]
                sums.append(sum(now_use.values()))
                while len(sums) > len(hist):
                    sums.popleft()
            else:
                sums = deque(sum(map(h.get, now_use, repeat(0.0))) for h in hist)
            self._use_sums[n.name] = (here, sums)
            need = None if sec.training_need == "limits" else max(sums[-1], percentile(sums, sec.need_percentile))
            usage[n.name] = self._node_usage(n, now, need, used)
        return self._snapshot(now, m, usage)

    def _observe_between(self, now: float, m: int) -> HarvestSnapshot:
        sec = self.sec
        usage = {}
        for n in self.train_nodes:
            hist = self.use_hist[n.name]
            last = hist[-1] if hist else {}
            here = self.cluster.state.containers_on(n.name)
            new = sum(c.res.cpu for c in here if c.id not in last)
            need = None
            if sec.training_need != "limits":
                kept = self._use_sums.get(n.name)
                if kept is not None and len(kept[0]) == len(here) and all(c.id in kept[0] for c in here):
                    sums = kept[1]  # the same containers as the window's: its sums
                else:
                    ids = [c.id for c in here]
                    sums = [sum(map(h.get, ids, repeat(0.0))) for h in hist] or [0.0]
                need = max(sums[-1], percentile(sums, sec.need_percentile)) + new
            usage[n.name] = self._node_usage(n, now, need, self._used.get(n.name, 0.0))
        return self._snapshot(now, m, usage)

    def _node_usage(self, n: Node, now: float, need: float | None, used: float) -> NodeUsage:
        sec = self.sec
        u = self.replicas.node_usage(n, now, reserve=sec.system_reserve_cores, need=need, used=used)
        limited = sec.coordination == "joint" and sec.training_qos == "guaranteed"
        return u if limited else replace(u, training_limit=None)

    def _snapshot(self, now: float, m: int, usage: dict[str, NodeUsage]) -> HarvestSnapshot:
        first = {sid: float(r[min(m, len(r) - 1)]) for sid, r in self.rates.items()}  # before any window: the true rate
        return self.replicas.snapshot(now, usage, first)

    # ------------------------------------------------------------------ actuate
    def actuate(self, decisions: Sequence[HarvestDecision], now: float) -> None:
        """Book each decision in the shared state (which validates it) and count it. A replica
        serves in the window it is placed in; a migration never loses a window."""
        placed = {d.service for d in decisions if isinstance(d, PlaceReplica)}
        t = self.totals
        for d in decisions:
            e = self.replicas.apply(d)
            if isinstance(e, StartReplica):
                t.placements += 1
            elif isinstance(e, SetReplicaQuota):
                t.resizes += 1
            elif isinstance(e, MoveReplica):
                t.migrations += 1
            elif e.service in placed:  # a replica pushed out, replaced elsewhere this round
                t.evictions += 1

    # ------------------------------------------------------------------ need variation
    def vary_need(self, now: float) -> None:
        """Redraw each running job's input-pipeline cost factor for the coming window (× the
        run's need scale)."""
        if self.need is None and self.need_scale == 1.0:
            return
        running = self.cluster.state.running
        f = self.need.step(running) if self.need is not None else dict.fromkeys(running, 1.0)
        k = self.need_scale
        self.cluster.set_input_scale(f if k == 1.0 else {j: k * v for j, v in f.items()}, now)

    # ------------------------------------------------------------------ contention
    def _busy_shares(self, m: int) -> dict[str, float]:
        """Replica id -> share of the window its replica is busy (load ratio at its share of the
        window's rate, uncontended, capped at 1), with the same capacity-weighted routing as
        :meth:`serve`. Remembered while the window and the replicas stay the same (the
        training rounds within a window re-check contention with the same shares)."""
        key = (m, tuple(self._weights(s) for s in self.replicas.services.values() if s.replicas))
        if self._busy_key is not None and key[0] == self._busy_key[0] and len(key[1]) == len(self._busy_key[1]) \
                and all(a is b for a, b in zip(key[1], self._busy_key[1])):
            return self._busy
        out: dict[str, float] = {}
        for s in self.replicas.services.values():
            if not s.replicas:
                continue
            rates = self.rates[s.id]
            rate = float(rates[min(m, len(rates) - 1)])
            reps, _, weights, sats = self._weights(s)
            for r, w, sat in zip(reps, weights, sats, strict=True):
                out[r.id] = min(1.0, rate * w / sat) if sat > 0 else 1.0
        self._busy_key, self._busy = key, out
        return out

    def update_contention(self, now: float) -> None:
        """Share each training node's CPU between training and the replicas there (CFS shares).

        On a node with ``A = cores − system reserve``, training wants ``U`` cores (its use at
        uncontended speed; weight: its containers' CPU, i.e. their requests as cpu.shares) and
        the replicas, while they serve, want their limits ``C`` (weight ``C``). When ``U + C > A``
        the CPU is split by weighted max-min fairness (what the Linux CFS does with cpu.shares
        under a work-conserving scheduler): each side gets its weighted share, and a side that
        needs less than its share leaves the rest to the other. Both can slow:

        * inference, while busy, runs on ``C_got < C`` cores: its service times stretch by
          ``C / C_got`` (the latency ``slowdown`` of :meth:`serve`);
        * training gets ``U_got < U`` cores while inference is busy — the capacity-weighted busy
          share ``β`` of the replicas at the window's rate (stretched by the same factor, at most
          1) — and ``U`` otherwise, so it runs at ``k = 1 − β (1 − U_got / U)`` of its speed.

        Replicas on one node are taken as busy together (conservative for inference).
        Interference (coefficients, default 0) multiplies on top.
        """
        sec = self.sec
        m = min(self.window(now), self.windows - 1)
        busy: dict[str, float] | None = None  # looked up where training is short of CPU
        per_node: dict[str, list[Replica]] = {}
        for s in self.replicas.services.values():
            for r in s.replicas.values():
                per_node.setdefault(r.node, []).append(r)
        factors: dict[str, float] = {}
        slow: dict[str, float] = {}
        for n in self.train_nodes:
            reps = per_node.get(n.name, [])
            cores_inf = sum(r.cores for r in reps)
            if cores_inf <= 0:
                continue
            use = self.cluster.node_use(n.name, False)
            weight = self.cluster.state.cpu_limits(n.name)
            got_t, got_i = cfs_split(n.cores - sec.system_reserve_cores, use, weight, cores_inf, cores_inf)
            s_inf = cores_inf / got_i if got_i > 0 else math.inf
            k = 1.0
            if use > 0 and got_t < use:
                busy = self._busy_shares(m) if busy is None else busy
                beta = min(1.0, sum(r.cores * busy.get(r.id, 1.0) for r in reps) / cores_inf * s_inf)
                k = 1.0 - beta * (1.0 - got_t / use)
            k /= 1.0 + sec.training_interference * cores_inf / n.cores
            if k < 1.0:
                factors[n.name] = k
            if s_inf > 1.0:
                slow[n.name] = s_inf
        self.inference_slow = slow
        self.cluster.set_contention(factors, now)

    # ------------------------------------------------------------------ serve one window
    def serve(self, now: float) -> None:
        """Judge window ``[now, now + interval)`` with the replicas and contention in place."""
        sec, t, dt = self.sec, self.totals, self.interval_s
        m = self.window(now)
        if m >= self.windows:
            return
        t.windows += 1
        load = {n.name: self.cluster.node_use(n.name, True) / n.cores for n in self.train_nodes}
        stretch: dict[str, float] = {}  # node -> the service-time stretch of the replicas there
        busy: dict[str, float] = {}
        ok_now = 0
        for s in self.replicas.services.values():
            rate = float(self.rates[s.id][m])
            profile = self.profile[s.id]
            reps, cores, weights, sats = self._weights(s)
            miss, p99 = (1.0 if rate > 0 else 0.0), (math.inf if rate > 0 else None)
            if reps:
                miss, worst = 0.0, 0.0
                judged: dict[tuple, tuple[float, float, float]] = {}  # replicas alike: judged alike
                for r, c, w, sat in zip(reps, cores, weights, sats, strict=True):
                    slow = stretch.get(r.node)
                    if slow is None:
                        slow = (1.0 + sec.inference_interference * load.get(r.node, 0.0)) * self.inference_slow.get(r.node, 1.0)
                        slow = stretch[r.node] = min(round(slow, 3), SLOW_MAX)
                    key = (c, r.max_batch, r.max_wait_s, slow, w, sat)
                    got = judged.get(key)
                    if got is None:
                        if slow != 1.0:
                            sat = max_throughput_per_s(profile, c, r.max_batch, slow)
                        rho = rate * w / sat
                        rho_q = min(int(math.ceil(rho / RHO_GRID - 1e-9)), int(RHO_MAX / RHO_GRID) + 1)
                        p, x = _replica_latency(profile, round(c, 4), int(r.max_batch), float(r.max_wait_s),
                                                s.slo_p99_s, slow, rho_q)
                        got = judged[key] = (p, x, min(1.0, rho))
                    p, x, used = got
                    miss += w * x
                    if w >= 0.005:
                        worst = max(worst, p)
                    busy[r.node] = busy.get(r.node, 0.0) + r.cores * used
                p99 = worst
            ok = miss <= MISS_OK
            t.service_windows += 1
            t.service_windows_ok += int(ok)
            ok_now += int(ok)
            t.requests += rate * dt
            t.requests_ok += rate * dt * (1.0 - min(1.0, miss))
            s.last_p99_s, s.last_at_s = p99, now
            self.series[f"p99_ms:{s.id}"].append(1000.0 * p99 if p99 is not None and math.isfinite(p99) else math.nan)
            s.observed_rates.append(float(self.rng.poisson(rate * dt)) / dt)
        inf = self.replicas.cores_on()
        harvested = sum(v for k, v in inf.items() if k in self.train_names)
        pool = sum(v for k, v in inf.items() if k not in self.train_names)
        t.harvested_core_s += harvested * dt
        t.pool_core_s += pool * dt
        t.pool_node_s += sum(1 for k, v in inf.items() if k not in self.train_names and v > 0) * dt
        used_sum = alloc_sum = cores_sum = idle = 0.0
        for n in self.train_nodes:
            train = load[n.name] * n.cores
            used_sum += train
            limits = self.cluster.state.cpu_limits(n.name)
            alloc_sum += limits
            cores_sum += n.cores
            t.gpu_node_used_core_s += (train + busy.get(n.name, 0.0)) * dt
            t.gpu_node_core_s += n.cores * dt
            slack = n.cores - sec.system_reserve_cores - self.cluster.node_use(n.name, False)
            t.over_slack_core_s += max(0.0, inf.get(n.name, 0.0) - max(0.0, slack)) * dt
            idle += max(0.0, slack)
            self._stack(f":{n.name}", n.cores, train, limits, inf.get(n.name, 0.0))
        t.harvestable_core_s += min(harvested + pool, idle) * dt
        self.series["t"].append(now)
        self.series["pool_cores"].append(pool)
        self.series["slo_ok_pct"].append(100.0 * ok_now / max(1, len(self.replicas.services)))
        self._stack("", cores_sum, used_sum, alloc_sum, harvested)

    def _stack(self, suffix: str, cores: float, used: float, alloc: float, inference: float) -> None:
        """Append one stacked-CPU sample (all GPU nodes: ``suffix`` "", one node: ":NODE")."""
        rest = max(0.0, cores - used - inference)  # stacks to the cores
        unused = min(rest, max(0.0, alloc - used))
        vals = {"training_used_cores": used, "training_unused_cores": unused, "harvested_cores": inference,
                "idle_cores": rest - unused}
        for layer, v in vals.items():
            self.series[f"node_cpu:{layer}{suffix}" if suffix else layer].append(v)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, float]:
        t = self.totals
        ct = self.cluster.totals
        served = t.harvested_core_s + t.pool_core_s
        return {
            "slo_attainment_pct": 100.0 * t.service_windows_ok / t.service_windows if t.service_windows else math.nan,
            "requests_within_slo_pct": 100.0 * t.requests_ok / t.requests if t.requests > 0 else math.nan,
            "training_slowdown_pct": 100.0 * (1.0 - ct.speed_share_s / ct.job_s) if ct.job_s > 0 else 0.0,
            "harvested_share_pct": 100.0 * t.harvested_core_s / served if served > 0 else 0.0,
            "harvested_core_hours": t.harvested_core_s / 3600.0,
            "pool_core_hours": t.pool_core_s / 3600.0,
            "dedicated_node_hours": t.pool_node_s / 3600.0,
            "migrations": float(t.migrations),
            "evictions": float(t.evictions),
            "replica_placements": float(t.placements),
            "replica_resizes": float(t.resizes),
            "gpu_node_cpu_util_pct": 100.0 * t.gpu_node_used_core_s / t.gpu_node_core_s if t.gpu_node_core_s else 0.0,
            "over_slack_core_hours": t.over_slack_core_s / 3600.0,
            "harvestable_share_pct": 100.0 * t.harvestable_core_s / served if served > 0 else 0.0,
            "service_windows": float(t.service_windows),
        }

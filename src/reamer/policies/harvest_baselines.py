"""Baselines for Cloud Reamer (docs/design.md#cloud-reamer, #baselines). All size services like ``reamer``
(predicted rate × (1 + headroom), :func:`reamer.models.inference.size_service`) and place by
the same filter → score (best fit, spread), so they differ only in *where* inference may run
and in how they react when training takes cores back:

* ``dedicated`` — every replica on the dedicated inference pool; harvests nothing.
* ``naive`` — the Kubernetes default: inference pods on the *unrequested* CPU of training nodes
  (allocatable = cores − system reserve, minus training requests); no guard, no metrics.
* ``usage-reclaim`` — Koordinator's co-location: best-effort replicas are scheduled on
  reclaimable CPU = total − reserved − max(system used, system reserved) − Σ high-priority
  (training) usage, zero when metrics are stale; every round the CPU *suppress* loop caps the
  replicas' total limit at ``threshold`` × cores − training usage − max(system used, system
  reserved) (at least ``min_suppress_cores``; grows at most ``growth_frac_per_s`` of the
  node's cores per second, shrinks at once), and the *evict* loop stops replicas when
  satisfaction (limit / request) ≤ ``evict_lower`` while they use ≥ ``evict_usage`` of their
  limit, until it reaches ``evict_upper`` (``evict_cooldown_s`` between evictions per node).
  SLO-blind: it counts a suppressed replica at its requested capacity.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from reamer.domain.cluster import Node
from reamer.domain.inference import NodeUsage, Replica
from reamer.models.inference import InferenceProfile, max_throughput_per_s
from reamer.policies.harvest import EPS, HarvestConfig, Harvester, _Rep, _Round


class DedicatedConfig(HarvestConfig):
    pass


class NaiveConfig(HarvestConfig):
    pass


class UsageReclaimConfig(HarvestConfig):
    """Koordinator's defaults (from its source and design docs)."""

    stale_s: float = Field(180.0, gt=0)  # node metrics older than this → no reclaimable CPU
    reserved_cores: float = Field(0.0, ge=0)  # node reservation (besides the system reserve)
    threshold: float = Field(0.65, gt=0, le=1)  # suppress: share of node capacity for all but BE
    min_suppress_cores: float = Field(2.0, ge=0)  # the BE cpuset keeps at least this many cores
    growth_frac_per_s: float = Field(0.1, ge=0)  # BE limit grows at most this share of node cores per s
    evict_lower: float = Field(0.6, gt=0, le=1)  # satisfaction (limit/request) at or below which BE is evicted
    evict_upper: float = Field(0.8, gt=0, le=1)  # ... until satisfaction reaches this
    evict_usage: float = Field(0.9, gt=0, le=1)  # ... and only while BE uses this share of its limit
    evict_cooldown_s: float = Field(20.0, ge=0)


class Dedicated(Harvester):
    """Every replica in the dedicated pool (replicas found elsewhere are moved there)."""

    name = "dedicated"
    tiers = ("pool",)

    def __init__(self, config: DedicatedConfig | None = None, interval_s: float | None = 60.0,
                 profiles: Mapping[str, InferenceProfile] | None = None) -> None:
        super().__init__(config or DedicatedConfig(), interval_s, profiles)

    def _rebalance(self, r: _Round) -> None:
        for s in r.snap.services:
            for p in r.live(s.id):
                if p.id is not None and not p.acted and not r.pool[p.node]:
                    to = self._place(r, s.id, p.cores, p.mem, "pool")
                    if to is not None:
                        self._migrate(r, p, to)


class Naive(Harvester):
    """Unrequested CPU of training nodes (cores − system reserve − training requests); no guard."""

    name = "naive"

    def __init__(self, config: NaiveConfig | None = None, interval_s: float | None = 60.0,
                 profiles: Mapping[str, InferenceProfile] | None = None) -> None:
        super().__init__(config or NaiveConfig(), interval_s, profiles)

    def _budget(self, node: Node, usage: NodeUsage | None, now: float) -> float:
        if usage is None:
            return 0.0
        return min(node.cores, usage.cores) - usage.system_reserve - usage.training_request


class UsageReclaim(Harvester):
    """Koordinator-style reclaiming of measured-idle CPU with suppress and evict loops."""

    name = "usage-reclaim"
    cfg: UsageReclaimConfig

    def __init__(self, config: UsageReclaimConfig | None = None, interval_s: float | None = 60.0,
                 profiles: Mapping[str, InferenceProfile] | None = None) -> None:
        super().__init__(config or UsageReclaimConfig(), interval_s, profiles)
        self._requests: dict[str, float] = {}  # replica id -> requested cores (its limit when first seen)
        self._last_evict: dict[str, float] = {}

    def _fresh(self, usage: NodeUsage | None, now: float) -> bool:
        return usage is not None and now - usage.metrics_at <= self.cfg.stale_s

    def _budget(self, node: Node, usage: NodeUsage | None, now: float) -> float:
        if usage is None or not self._fresh(usage, now):
            return 0.0
        total = min(node.cores, usage.cores)
        return total - self.cfg.reserved_cores - max(usage.system_usage, usage.system_reserve) - usage.training_usage

    def _request_of(self, rep: Replica) -> float:
        return self._requests.setdefault(rep.id, rep.cores)

    def _footprint(self, rep: _Rep) -> float:
        return rep.request  # batch resources are scheduled by request

    def _cap_cores(self, rep: _Rep) -> float:
        return rep.request  # SLO-blind: a suppressed replica still counts at its request

    def decide(self, snap):
        live = {rep.id for s in snap.services for rep in s.replicas}
        for k in [k for k in self._requests if k not in live]:
            del self._requests[k]
        return super().decide(snap)

    def _demand(self, r: _Round, rep: _Rep) -> float:
        """Cores a replica would use at its share of the predicted rate (busy share of its limit)."""
        s = r.services[rep.service]
        total = self._capsum(r, s.id)
        share = s.predicted_rate_per_s * self._cap(r, rep) / total if total > 0 else 0.0
        sat = max_throughput_per_s(self.profile(s.model), rep.cores, rep.max_batch, self.cfg.slowdown)
        return rep.cores * min(1.0, share / sat) if sat > 0 else rep.cores

    def _guard(self, r: _Round) -> None:
        cfg = self.cfg
        dt = 0.0 if self._last_now is None else max(0.0, r.now - self._last_now)
        for i, nd in enumerate(r.nodes):
            if r.pool[i]:
                continue
            reps = [p for p in r.on_node(i) if p.id is not None]
            u = r.snap.usage.get(nd.name)
            if not reps or not self._fresh(u, r.now):
                continue  # no fresh metrics: the suppress loop keeps the last limits
            assert u is not None
            cores = min(nd.cores, u.cores)
            budget = cores * cfg.threshold - u.training_usage - max(u.system_usage, u.system_reserve)
            budget = max(budget, cfg.min_suppress_cores)
            req = sum(p.request for p in reps)
            cur = sum(p.cores for p in reps)
            limit = min(req, budget)
            if limit > cur:
                limit = min(limit, cur + cfg.growth_frac_per_s * cores * dt)
            # evict while satisfaction is low and the replicas are busy
            if (limit / req <= cfg.evict_lower + EPS
                    and r.now - self._last_evict.get(nd.name, -float("inf")) >= cfg.evict_cooldown_s
                    and sum(self._demand(r, p) for p in reps) >= cfg.evict_usage * limit):
                for p in sorted(reps, key=lambda p: -p.request):
                    if limit / req >= cfg.evict_upper - EPS or len(reps) == 0:
                        break
                    self._evict(r, p)
                    reps.remove(p)
                    req -= p.request
                    if req <= EPS:
                        break
                    limit = min(limit, req)
                self._last_evict[nd.name] = r.now
            if not reps or req <= EPS:
                continue
            k = limit / req
            for p in reps:
                want = p.request * k
                if abs(want - p.cores) > 1e-6:
                    self._resize(r, p, want)

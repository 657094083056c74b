"""Container placement on a working copy of free capacity (pure; shared by policies).

Strategies: ``spread`` — Kubernetes' default LeastAllocated scoring (most free CPU/GPU
share first); ``pack`` — best fit (least left over), which keeps whole nodes free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from reamer.domain import ClusterSnapshot, JobView, Resources, Role, TrainingJob
from reamer.domain.decisions import Placement

Strategy = Literal["spread", "pack"]


def gang_order(wants: Sequence[tuple[Role, Resources]]) -> list[tuple[Role, Resources]]:
    """The order :meth:`FreeMap.place_gang` places containers in: largest first (GPUs, then
    cores, then memory)."""
    return sorted(wants, key=lambda rw: (rw[1].gpu, rw[1].cpu, rw[1].mem_mib), reverse=True)


class FreeMap:
    """Free capacity per node as arrays; ``place`` reserves tentatively, ``release`` undoes.
    ``free`` (nodes × (cores, MiB, GPUs)) is stored column by column (Fortran order): a
    placement reads whole columns, which are then contiguous."""

    def __init__(self, snap: ClusterSnapshot, prev: FreeMap | None = None) -> None:
        """``prev``: the caller's FreeMap of an earlier round; its node arrays are reused
        when the node list is the same object (backends keep it across rounds)."""
        if prev is not None and prev.nodes is snap.nodes:
            self.nodes, self.names, self.index, self.cap, self._norm, self._masks = (
                prev.nodes, prev.names, prev.index, prev.cap, prev._norm, prev._masks)
        else:
            self.nodes = snap.nodes
            self.names = [n.name for n in snap.nodes]
            self.index = {n: i for i, n in enumerate(self.names)}
            self.cap = np.array([(n.cores, n.mem_mib, n.gpus) for n in snap.nodes], dtype=float)
            self._norm = np.asfortranarray(1.0 / np.maximum(self.cap, 1e-9))
            self._masks: dict[frozenset[str], np.ndarray] = {}  # a job's allowed nodes -> mask
        self._unfit: list[tuple[float, float, float]] = []  # requests no node could take (place_one)
        if snap.free_rows is not None:
            self.free = np.array(snap.free_rows, order="F")
        else:
            free = snap.free
            self.free = np.fromiter((x for n in self.names for f in (free[n],) for x in (f.cpu, f.mem_mib, f.gpu)),
                                    dtype=float, count=3 * len(self.names)).reshape(-1, 3).copy(order="F")

    def sums(self) -> np.ndarray:
        """Σ free (cores, MiB, GPUs), added node after node (a running sum: numpy's pairwise sum
        of a contiguous column would round differently)."""
        f = self.free
        return f.cumsum(axis=0)[-1] if len(f) else np.zeros(3)

    def total_free(self) -> Resources:
        cpu, mem, gpu = self.sums()
        return Resources(float(cpu), float(mem), float(gpu))

    def fits(self, res: Resources) -> np.ndarray:
        f = self.free
        return (f[:, 0] >= res.cpu - 1e-9) & (f[:, 1] >= res.mem_mib - 1e-9) & (f[:, 2] >= res.gpu - 1e-9)

    def place_one(self, role: Role, res: Resources, strategy: Strategy = "pack",
                  crowding: np.ndarray | None = None, keep_gpus: bool = False,
                  allowed: np.ndarray | None = None, gpu_fit: bool = False) -> Placement | None:
        """Best node for one container. ``crowding`` (per node, e.g. PS/worker containers
        sharing its NIC) ranks first when given; the strategy breaks ties. ``keep_gpus``
        puts a CPU-only container on a node with free GPUs only as a last resort.
        ``allowed`` (per node, bool) excludes the other nodes. ``gpu_fit`` puts a
        fractional-GPU container where the fewest GPU shares stay free (best fit, before
        anything else), so fractions fill partly used nodes and whole GPUs stay free for
        whole-GPU requests; whole-GPU containers keep the strategy's order."""
        cpu, mem, gpu = res.cpu, res.mem_mib, res.gpu
        for u in self._unfit:  # no node took u since free capacity last grew: nor will it take more
            if u[0] <= cpu and u[1] <= mem and u[2] <= gpu:
                return None
        ok = self.fits(res)
        if allowed is not None:
            ok &= allowed
        if not (len(ok) and ok[ok.argmax()]):  # (argmax: the first True, if any; cheaper than any())
            if allowed is None:
                self._unfit.append((cpu, mem, gpu))
            return None
        f, norm = self.free, self._norm
        score = (f[:, 0] - cpu) * norm[:, 0] + (f[:, 2] - gpu) * norm[:, 2]  # share left
        score = score if strategy == "pack" else -score
        if crowding is not None:
            score = score + 10.0 * crowding  # |score| ≤ 4: crowding dominates
        if keep_gpus and gpu == 0:  # leave free GPUs' CPU to the GPU jobs that need it
            score = score + 1000.0 * (f[:, 2] > 1e-9)
        if gpu_fit and 0 < gpu < 1:
            score = score + 1e4 * (f[:, 2] - gpu)
        score = np.where(ok, score, np.inf)
        i = int(score.argmin())
        f[i, 0] -= cpu
        f[i, 1] -= mem
        f[i, 2] -= gpu
        return Placement(role, self.names[i], res)

    def crowding(self, snap: ClusterSnapshot) -> np.ndarray:
        """PS/worker containers per node: the flows that would share a new container's NIC."""
        if snap.containers_per_node is not None:
            return snap.containers_per_node.copy()
        n = np.zeros(len(self.names))
        for job in snap.running:
            for c in job.containers:
                if c.role is not Role.INFERENCE:
                    n[self.index[c.node]] += 1
        return n

    def release(self, p: Placement) -> None:
        self.free[self.index[p.node]] += (p.res.cpu, p.res.mem_mib, p.res.gpu)
        self._unfit.clear()

    def reserve(self, node: str, res: Resources) -> None:
        """Take ``res`` on ``node`` (negative parts give capacity back)."""
        self.free[self.index[node]] -= (res.cpu, res.mem_mib, res.gpu)
        if res.cpu < 0 or res.mem_mib < 0 or res.gpu < 0:
            self._unfit.clear()

    def place_gang(self, wants: Sequence[tuple[Role, Resources]], strategy: Strategy = "pack",
                   allowed: np.ndarray | None = None, gpu_fit: bool = False,
                   one_node: bool = False, ordered: bool = False,
                   spec: TrainingJob | None = None) -> tuple[Placement, ...] | None:
        """Place all containers or none (largest first, so big ones are not starved);
        ``one_node``: all on one node that fits them together (a job that is one pod);
        ``ordered``: ``wants`` is already in :func:`gang_order`; ``spec``: the job, whose
        allowed nodes per role (:meth:`TrainingJob.nodes_for`) narrow ``allowed``."""
        order = wants if ordered else gang_order(wants)
        by_role = None
        if spec is not None and (spec.ps_nodes is not None or spec.worker_nodes is not None):
            by_role = {r: self.allowed(spec, r, allowed) for r in (Role.PS, Role.WORKER)}
        if one_node:
            total = sum((r for _, r in wants), Resources())
            allowed = self.fits(total) if allowed is None else self.fits(total) & allowed
            if by_role is not None:  # one node both roles may use
                allowed = allowed & self.allowed(spec, Role.PS, self.allowed(spec, Role.WORKER))
                by_role = None
        done: list[Placement] = []
        for role, res in order:
            p = self.place_one(role, res, strategy, allowed=allowed if by_role is None else by_role[role],
                               gpu_fit=gpu_fit)
            if p is None:
                for q in done:
                    self.release(q)
                return None
            done.append(p)
            if one_node:
                allowed = self.only(p.node)
        return tuple(done)

    def allowed(self, spec: TrainingJob, role: Role, mask: np.ndarray | None = None) -> np.ndarray | None:
        """``mask`` (per node, bool; None: every node) narrowed to the nodes a container of
        ``role`` of ``spec`` may use (None when neither restricts)."""
        nodes = spec.nodes_for(role)
        if nodes is None:
            return mask
        own = self._masks.get(nodes)
        if own is None:
            own = self._masks[nodes] = np.fromiter((n in nodes for n in self.names), dtype=bool, count=len(self.names))
            own.flags.writeable = False  # shared by every round on these nodes
        return own if mask is None else own & mask

    def only(self, node: str) -> np.ndarray:
        """The mask (per node, bool) that allows ``node`` alone."""
        mask = np.zeros(len(self.names), dtype=bool)
        mask[self.index[node]] = True
        return mask

    def home(self, job: JobView, role: Role, allowed: np.ndarray | None = None) -> np.ndarray | None:
        """Where a container of ``role`` added to ``job`` may go: ``allowed`` (None: anywhere),
        narrowed to the nodes the job allows that role, and to the job's node when the job is one
        pod (``one_node``)."""
        allowed = self.allowed(job.spec, role, allowed)
        if not job.spec.one_node or not job.containers:
            return allowed
        mask = self.only(job.containers[0].node)
        return mask if allowed is None else mask & allowed

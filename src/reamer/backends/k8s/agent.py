"""The node agent (``reamer k8s agent``, a DaemonSet): reads each pod's cgroup, network
namespace and ``reamer_*`` metrics on its node and publishes them, with the node's slack,
as the node's ``NodeSlack`` (docs/kubernetes.md: the formula and the telemetry contract).

Pod cgroups are found for cgroup v1 and v2, the systemd and cgroupfs drivers, and the three
QoS classes (:func:`pod_cgroup`); container scopes of containerd (``cri-containerd-ID.scope``),
cri-o (``crio-ID.scope``) and docker (``docker-ID.scope``) are recognised below them
(:func:`container_cgroups`). Usage and throttling come from the one cgroup reader,
:func:`reamer.backends.local.cgroups.read_cpu_stats`.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from reamer.backends.k8s import objects as ko
from reamer.backends.k8s.kube import ApiError, Kube, custom, nodes
from reamer.backends.local.cgroups import (
    CgroupError,
    CpuStats,
    detect_version,
    read_cpu_stats,
)

log = logging.getLogger(__name__)

QOS_DIRS = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}
SCOPE = re.compile(r"^(?:cri-containerd-|crio-|docker-)?([0-9a-f]{12,64})(?:\.scope)?$")
METRICS_PORT = ko.P + "metrics-port"


def cpu_hierarchy(root: Path, version: int) -> Path:
    """The directory pod cgroups live under for CPU: v2 the root, v1 the cpu(acct) mount."""
    if version == 2:
        return root
    for d in ("cpu,cpuacct", "cpuacct,cpu", "cpu"):
        if (root / d).is_dir():
            return root / d
    raise CgroupError(root / "cpu", "a mounted cgroup-v1 cpu hierarchy", "directory missing")


def usage_hierarchy(root: Path, top: Path, version: int) -> Path:
    """Where ``cpuacct.usage`` lives: ``top`` (v2, or v1 with cpu and cpuacct co-mounted), else
    the separately mounted v1 ``cpuacct`` hierarchy."""
    if version == 2 or (top / "cpuacct.usage").exists() or not (root / "cpuacct").is_dir():
        return top
    return root / "cpuacct"


def kubelet_root(root: str) -> tuple[str, ...]:
    """The components of a kubelet's ``--cgroup-root`` (cgroupfs form, ``/`` its default): the
    cgroup its ``kubepods`` tree is under."""
    return tuple(p for p in root.split("/") if p)


def kubelet_roots(top: Path) -> list[tuple[str, ...]]:
    """The kubelet cgroup roots found under ``top``: the default (``/``), then every top-level
    cgroup with a kubepods tree below it, in either driver's form (kind's ``/kubelet``:
    ``kubelet/kubepods`` or ``kubelet.slice/kubelet-kubepods.slice``)."""
    out: list[tuple[str, ...]] = [()]
    try:
        children = sorted(c for c in top.iterdir() if c.is_dir())
    except OSError:
        return out
    for c in children:
        if (c / "kubepods").is_dir():
            out.append((c.name,))
        elif c.name.endswith(".slice") and (c / f"{c.name[:-6]}-kubepods.slice").is_dir():
            out.append((c.name[:-6].replace("_", "-"),))
    return out


def _systemd(name: tuple[str, ...]) -> tuple[str, ...]:
    """The kubelet's systemd form of a cgroup name: each component a slice named after every
    component down to it, ``-`` in a component written ``_``."""
    esc = [p.replace("-", "_") for p in name]
    return tuple("-".join(esc[:i + 1]) + ".slice" for i in range(len(esc)))


def pod_cgroup(top: Path, uid: str, qos: str | None = None, root: tuple[str, ...] = ()) -> Path | None:
    """The pod's cgroup directory under ``top`` (the CPU hierarchy), whatever the driver:
    cgroupfs ``kubepods[/burstable|/besteffort]/pod<uid>`` or systemd
    ``kubepods.slice[/kubepods-burstable.slice]/kubepods[-burstable]-pod<uid_>.slice``, below the
    kubelet's cgroup root (:func:`kubelet_root`; ``("kubelet",)`` gives kind's
    ``kubelet.slice/kubelet-kubepods.slice/...``)."""
    classes = [qos] if qos in QOS_DIRS else []
    classes += [q for q in QOS_DIRS if q not in classes]
    for q in classes:
        sub = QOS_DIRS[q]
        name = (*root, "kubepods", *((sub,) if sub else ()), f"pod{uid}")
        for c in (top.joinpath(*name), top.joinpath(*_systemd(name))):
            if c.is_dir():
                return c
    return None


def container_cgroups(pod_dir: Path) -> dict[str, Path]:
    """Container id → its cgroup below a pod's (containerd, cri-o, docker or cgroupfs names)."""
    out = {}
    for d in sorted(p for p in pod_dir.iterdir() if p.is_dir()):
        m = SCOPE.match(d.name)
        if m:
            out[m.group(1)] = d
    return out


def procs(d: Path) -> list[int]:
    """Pids in ``d`` or any cgroup below it."""
    out = []
    for f in [d / "cgroup.procs", *d.glob("*/cgroup.procs")]:
        try:
            out += [int(x) for x in f.read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def net_bytes(proc: Path, pid: int) -> int | None:
    """rx + tx bytes of every interface but loopback in ``pid``'s network namespace."""
    try:
        lines = (proc / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return None
    total = 0
    for ln in lines:
        name, _, rest = ln.partition(":")
        if name.strip() == "lo":
            continue
        f = rest.split()
        total += int(f[0]) + int(f[8])
    return total


def memory_mib(d: Path, root: Path, version: int) -> float:
    f = d / "memory.current" if version == 2 else root / "memory" / d.relative_to(cpu_hierarchy(root, 1)) / \
        "memory.usage_in_bytes"
    try:
        return int(f.read_text()) / 2**20
    except (OSError, ValueError):
        return 0.0


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, dict]:
    """``reamer_*`` families of a Prometheus endpoint: ``{name: {"type", "samples": [(name, labels, value)]}}``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.startswith("reamer_"):
            out[fam.name] = {"type": fam.type, "samples": [(s.name, s.labels, s.value) for s in fam.samples]}
    return out


def summarize(now: dict[str, dict], before: dict[str, dict] | None, window_s: float) -> dict[str, float]:
    """The published metrics: counters as value and ``:rate``, histograms as ``:p99`` over the
    window (from bucket deltas, interpolated within its bucket as Prometheus'
    ``histogram_quantile`` does), gauges as value."""
    out: dict[str, float] = {}
    for name, fam in now.items():
        samples = fam["samples"]
        if not samples:
            continue  # a family with no series says nothing (not a rate of 0)
        if fam["type"] == "counter" or (fam["type"] in ("unknown", "untyped") and name.endswith("_total")):
            v = sum(s[2] for s in samples if s[0].endswith("_total") or s[0] == name)
            key = name if name.endswith("_total") else name + "_total"
            out[key] = v
            if before and name in before and window_s > 0:
                v0 = sum(s[2] for s in before[name]["samples"] if s[0].endswith("_total") or s[0] == name)
                out[key + ":rate"] = max(0.0, v - v0) / window_s
        elif fam["type"] == "histogram":
            if not before or name not in before:
                continue
            b1 = {s[1]["le"]: s[2] for s in samples if s[0].endswith("_bucket")}
            b0 = {s[1]["le"]: s[2] for s in before[name]["samples"] if s[0].endswith("_bucket")}
            edges = sorted(b1, key=lambda le: math.inf if le == "+Inf" else float(le))
            total = b1.get("+Inf", 0.0) - b0.get("+Inf", 0.0)
            if total > 0:
                rank, lower, below = 0.99 * total, 0.0, 0.0  # Prometheus' histogram_quantile(0.99, ...)
                finite = [float(le) for le in edges if le != "+Inf"]
                for le in edges:
                    count = b1[le] - b0.get(le, 0.0)
                    if count >= rank:
                        if le == "+Inf":  # beyond the last bucket: at least its edge (so a miss shows)
                            out[name + ":p99"] = max(finite, default=math.inf)
                            out[name + ":p99_beyond_buckets"] = 1.0
                        else:  # linear within the bucket, as histogram_quantile
                            upper = float(le)
                            out[name + ":p99"] = lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
                        break
                    lower, below = float(le), count
        elif samples:
            out[name] = float(samples[0][2])
    return {k: v for k, v in out.items() if math.isfinite(v)}


@dataclass
class _Prev:
    at: float
    cpu: CpuStats | None
    net: int | None
    metrics: dict[str, dict] | None
    metrics_at: float = 0.0  # when ``metrics`` were scraped


class Agent:
    """Measures the pods of ``node`` every round and publishes its NodeSlack.

    ``cgroup_root`` / ``proc_root`` are where the node's cgroup tree and ``/proc`` are mounted
    (the DaemonSet mounts the host's); ``kubelet_cgroup_root`` is the kubelet's ``--cgroup-root``
    (``cgroupRoot``; None: found, :func:`kubelet_roots`); ``system_reserved`` cores are kept for the system;
    ``scrape_host`` overrides the pods' IP (tests); ``scrape_workers`` bounds the metrics
    endpoints scraped at once."""

    def __init__(self, kube: Kube, node: str, *, cgroup_root: Path = Path("/sys/fs/cgroup"),
                 proc_root: Path = Path("/proc"), kubelet_cgroup_root: str | None = None,
                 system_reserved: float = 1.0, nic_gbps: float | None = None,
                 clock: Callable[[], float] = time.time, scrape_host: str | None = None,
                 scrape_workers: int = 16) -> None:
        self.kube, self.node = kube, node
        self.cgroup_root, self.proc_root = cgroup_root, proc_root
        self.version = detect_version(cgroup_root)
        self.top = cpu_hierarchy(cgroup_root, self.version)
        self.usage_top = usage_hierarchy(cgroup_root, self.top, self.version)
        self.fixed_root = kubelet_cgroup_root is not None
        self.roots = [kubelet_root(kubelet_cgroup_root)] if kubelet_cgroup_root is not None else kubelet_roots(self.top)
        self._looked = False  # the roots were looked for again this round
        self._unseen: set[str] = set()  # running pods whose cgroup was not found (said once each)
        self.system_reserved, self.nic_gbps = system_reserved, nic_gbps
        self.clock, self.scrape_host = clock, scrape_host
        self.scrape_workers = scrape_workers
        self._prev: dict[str, _Prev] = {}
        self._last: float | None = None
        self._sys_prev: float | None = None
        self._sys_last = 0.0  # the system's use in the last window every pod was measured in

    def measure(self) -> dict:
        """One NodeSlack status from the pods on the node now."""
        node = self.kube.get(nodes(self.node))
        cores = ko.quantity(((node.get("status") or {}).get("allocatable") or {}).get("cpu", 0), "node cpu")
        nic = self.nic_gbps or float(ko.labels(node).get(ko.P + "nic-gbps", 10.0))
        items, _ = self.kube.list("/api/v1/pods", field_selector=f"spec.nodeName={self.node}")
        entries, seen = [], set()
        used = {"training": 0.0, "inference": 0.0, "other": 0.0}
        limits = 0.0
        live = [p for p in items if not ko.terminated(p)]
        scraped = self._scrape_all(live)
        now = self.clock()  # the readings' time: the cgroups are read next (the API calls and scrapes took their time)
        window = now - self._last if self._last is not None else 0.0
        self._looked = False
        partial = False  # a pod's use this window is not known: the machine's use less the pods' is not the system's
        for p in live:
            m = ko.meta(p)
            uid = m["uid"]
            seen.add(uid)
            e, cpu_used, unknown = self._pod(p, now, scraped.get(uid))
            partial |= unknown
            entries.append(e)
            kind = "training" if ko.JOB in ko.labels(p) else "inference" if ko.SERVICE in ko.labels(p) else "other"
            used[kind] += cpu_used
            if kind == "training":
                limits += ko.pod_cpu_limit(p)
            e["netCapacityGbps"] = nic
        for uid in set(self._prev) - seen:
            partial |= self._prev[uid].cpu is not None  # it ran part of the window, unmeasured
            del self._prev[uid]
        self._unseen &= seen
        self._last = now
        system = self._system_used(window, sum(used.values()), partial)  # outside every pod
        return {"reportedAt": now, "windowSeconds": window, "cores": cores, "systemReserved": self.system_reserved,
                "systemUsed": system, "trainingUsed": used["training"], "inferenceUsed": used["inference"],
                "trainingNeed": max(limits, used["training"]),
                "memoryUsedMiB": sum(e.get("memoryUsedMiB", 0.0) for e in entries),
                "slack": max(0.0, cores - max(system, self.system_reserved) - max(limits, used["training"])),
                "pods": entries}

    def _scrape_all(self, pods: list[dict]) -> dict[str, tuple[dict | Exception, float]]:
        """Each pod's metrics endpoint (``reamer.io/metrics-port``), all at once: one that hangs
        costs the report its time-out once, not once per pod behind it. By pod uid: the
        families, or what went wrong, and when that scrape ended (each pod's rates are over its
        own scrapes' times: one endpoint that hangs does not skew the others')."""
        urls = {}
        for p in pods:
            port = ko.annotations(p).get(METRICS_PORT)
            host = self.scrape_host or (p.get("status") or {}).get("podIP")
            if port and host:
                urls[ko.meta(p)["uid"]] = f"http://{host}:{port}/metrics"
        if not urls:
            return {}
        def timed(url: str) -> tuple[dict, float]:
            got = scrape(url)
            return got, self.clock()

        out: dict[str, tuple[dict | Exception, float]] = {}
        with ThreadPoolExecutor(max_workers=min(self.scrape_workers, len(urls)),
                                thread_name_prefix="reamer-scrape") as pool:
            futures = {uid: pool.submit(timed, url) for uid, url in urls.items()}
            for uid, f in futures.items():
                try:
                    out[uid] = f.result()
                except Exception as err:  # any pod's endpoint (a non-HTTP port: BadStatusLine) is that pod's trouble
                    out[uid] = (err, self.clock())
        return out

    def _pod(self, p: dict, now: float, scraped: tuple[dict | Exception, float] | None) -> tuple[dict, float, bool]:
        """The pod's entry, its cores used over the window, and whether it ran unmeasured (a
        cgroup read now with no reading before, or none now after one: its first or last window)."""
        m = ko.meta(p)
        uid = m["uid"]
        e: dict = {"namespace": m["namespace"], "name": m["name"], "uid": uid, "cpuLimit": ko.pod_cpu_limit(p)}
        status = p.get("status") or {}
        running = status.get("phase") == "Running"
        d = self._pod_cgroup(uid, status.get("qosClass"), running)
        if d is None and running and not ko.deleting(p) and uid not in self._unseen:
            self._unseen.add(uid)
            log.warning("pod %s/%s is running but has no cgroup under %s below the kubelet cgroup root(s) %s: its "
                        "CPU is not measured (set --kubelet-cgroup-root to the kubelet's --cgroup-root)",
                        m["namespace"], m["name"], self.top, ", ".join("/" + "/".join(r) for r in self.roots))
        prev = self._prev.get(uid)
        cpu = net = None
        cpu_used = 0.0
        if d is not None:
            try:
                cpu = read_cpu_stats(d, self.version, self.usage_top / d.relative_to(self.top))
            except CgroupError as err:
                log.info("pod %s: %s", m["name"], err)
            pids = procs(d)
            net = net_bytes(self.proc_root, pids[0]) if pids else None
            e["memoryUsedMiB"] = memory_mib(d, self.cgroup_root, self.version)
        dt = now - prev.at if prev else 0.0
        if prev and dt > 0 and cpu is not None and prev.cpu is not None:
            delta = cpu - prev.cpu
            cpu_used = max(0.0, delta.usage_s / dt)
            e["cpuUsed"] = cpu_used
            e["throttledRatio"] = delta.nr_throttled / delta.nr_periods if delta.nr_periods > 0 else 0.0
        if prev and dt > 0 and net is not None and prev.net is not None:
            e["netGbps"] = 8.0 * max(0, net - prev.net) / dt / 1e9
        # a failed scrape keeps the last one as the next one's start (no window without a rate)
        metrics, metrics_at = (prev.metrics, prev.metrics_at) if prev else (None, now)
        if scraped is not None:
            got, at = scraped
            if isinstance(got, Exception):
                log.info("pod %s: metrics not scraped: %s", m["name"], got)
            else:
                before = prev.metrics if prev else None
                e["metrics"] = summarize(got, before, at - metrics_at if before is not None else 0.0)
                metrics, metrics_at = got, at
        self._prev[uid] = _Prev(now, cpu, net, metrics, metrics_at)
        unknown = (cpu is not None and "cpuUsed" not in e) or (cpu is None and prev is not None
                                                               and prev.cpu is not None)
        return e, cpu_used, unknown

    def _pod_cgroup(self, uid: str, qos: str | None, running: bool) -> Path | None:
        """The pod's cgroup below any of the kubelet roots; for a running pod not found, the roots
        are looked for again (once a round) unless they were given."""
        for root in self.roots:
            if (d := pod_cgroup(self.top, uid, qos, root)) is not None:
                return d
        if running and not self.fixed_root and not self._looked:
            self._looked = True
            roots = kubelet_roots(self.top)
            if roots != self.roots:
                self.roots = roots
                return self._pod_cgroup(uid, qos, running)
        return None

    def _system_used(self, window: float, pods_used: float, partial: bool = False) -> float:
        """Cores used outside the pods: the whole machine's use (root cgroup) less the pods'. In a
        ``partial`` window (a pod started or ended unmeasured) that difference holds the pod's use
        too: the last whole window's figure stands."""
        try:
            if self.version == 1:
                total = int((self.usage_top / "cpuacct.usage").read_text()) / 1e9
            else:
                total = ko.quantity(dict(ln.split() for ln in (self.top / "cpu.stat").read_text().splitlines())
                                    ["usage_usec"], "usage_usec") / 1e6
        except (OSError, KeyError, ValueError, ko.SpecError):
            return 0.0
        prev, self._sys_prev = self._sys_prev, total
        if prev is None or window <= 0:
            return 0.0
        if not partial:
            self._sys_last = max(0.0, (total - prev) / window - pods_used)
        return self._sys_last

    def publish(self, status: dict) -> dict:
        """Write the node's NodeSlack status (the object is created, owned by its Node, on first use)."""
        path = custom("nodeslacks", name=self.node)
        try:
            return self.kube.merge_patch(path + "/status", {"status": status})
        except ApiError as e:
            if e.status != 404:
                raise
        node = self.kube.get(nodes(self.node))
        self.kube.create(custom("nodeslacks"), {
            "apiVersion": "reamer.io/v1alpha1", "kind": "NodeSlack", "metadata": {
                "name": self.node, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                                        "uid": ko.meta(node)["uid"]}]}, "spec": {}})
        return self.kube.merge_patch(path + "/status", {"status": status})

    def round(self) -> dict:
        return self.publish(self.measure())


"""Testbed hosts — network namespaces joined by veth pairs and a bridge, links shaped with ``tc``.

Each host is a network namespace ``{prefix}-{pid}-h{k}`` with loopback up and one veth end
(``{prefix}{token}{k}a``) holding ``198.18.0.{k+1}/24`` (the RFC 2544 benchmark range, never
routed anywhere). The other end (``{prefix}{token}{k}b``) sits on bridge ``br0`` inside a
dedicated "switch" namespace ``{prefix}-{pid}-sw``. Both veth ends are created directly in
their namespaces, so nothing is ever added to the root namespace; deleting a namespace
deletes its veth ends (and with them the peers).

``set_bandwidth(host, mbit)`` installs a token-bucket filter on the host-side veth (traffic
the host sends) and on the switch-side veth (traffic the host receives), so both directions
of the host's link are limited.

Every command goes through one injected runner (``subprocess.run``-like), and every failure
is a one-line :class:`NetnsError` naming the command and what was expected. Everything a
:class:`Testbed` creates is named after the owner's pid, so :func:`sweep` can find and remove
the leftovers of a process that no longer exists (a startup sweep after ``kill -9``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,4}$")  # no '-': names are parsed back by sweep
SUBNET = "198.18.0"  # /24 inside our own namespaces only
MAX_HOSTS = 250
BRIDGE = "br0"
IFNAMSIZ = 15
# a limited link's queue: what a NIC's default qdisc holds, Linux's default txqueuelen of 1000
# packets of a full Ethernet frame (1514 bytes)
QUEUE_BYTES = 1000 * 1514


def bucket_bytes(mbit: float) -> int:
    """The token bucket a limit of ``mbit`` Mbit/s gets: 5 ms of traffic, at least a few
    full-size frames (tbf needs burst >= MTU)."""
    return max(16 * 1024, int(max(1, round(mbit * 1000)) * 1000 / 8 * 0.005))


Runner = Callable[..., Any]  # subprocess.run-like: run(argv, capture_output=, text=, timeout=)


class NetnsError(Exception):
    """A testbed operation failed. ``str(err)`` is one line: ``COMMAND: expected WHAT: REASON``."""

    def __init__(self, command: Sequence[str] | str, expected: str, reason: str):
        self.command = command if isinstance(command, str) else shlex.join(command)
        self.expected = expected
        self.reason = reason
        super().__init__(" ".join(f"{self.command}: expected {expected}: {reason}".split()))


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (signal 0; EPERM still means it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# what tc says when a device has no root qdisc of its own to delete (iproute2 5.x+, and older)
NO_QDISC = ("Cannot delete qdisc with handle of zero", "RTNETLINK answers: No such file or directory")


def _call(run: Runner, argv: list[str], expected: str, timeout_s: float, ok_when: tuple[str, ...] = ()) -> str:
    """The one place that runs a command. Returns stdout; raises a one-line NetnsError. A
    failure whose message holds one of ``ok_when`` counts as done."""
    try:
        res = run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise NetnsError(argv, expected, f"{argv[0]!r} not found (install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(argv, expected, f"timed out after {timeout_s}s") from None
    except OSError as err:
        raise NetnsError(argv, expected, err.strerror or str(err)) from None
    if res.returncode != 0:
        msg = (res.stderr or "").strip() or (res.stdout or "").strip() or "no output"
        if any(s in msg for s in ok_when):
            return res.stdout or ""
        raise NetnsError(argv, expected, f"exit {res.returncode}: {msg}")
    return res.stdout or ""


def list_namespaces(run: Runner = subprocess.run, timeout_s: float = 10.0) -> list[str]:
    """Names from ``ip netns list`` (lines look like ``name`` or ``name (id: 3)``)."""
    out = _call(run, ["ip", "netns", "list"], "a list of network namespaces", timeout_s)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _owned_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d+)-(h\d+|sw)$")


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise NetnsError("Testbed", "a prefix of 1-5 chars [a-z][a-z0-9]* (no '-')", f"got {prefix!r}")


def _delete_namespace(name: str, run: Runner, timeout_s: float, kill: Callable[[int, int], None]) -> None:
    """SIGKILL the processes inside ``name`` (they would keep it alive), then delete it."""
    out = _call(run, ["ip", "netns", "pids", name], f"the pids in namespace {name}", timeout_s)
    for tok in out.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            kill(int(tok), signal.SIGKILL)
    _call(run, ["ip", "netns", "del", name], f"namespace {name} deleted", timeout_s)


def sweep(
    prefix: str = "rmr",
    *,
    run: Runner = subprocess.run,
    alive: Callable[[int], bool] = pid_alive,
    kill: Callable[[int, int], None] = os.kill,
    timeout_s: float = 10.0,
) -> list[str]:
    """Startup sweep: delete every ``{prefix}-{pid}-...`` namespace whose owner pid is dead
    (killing processes left inside). Returns the names removed, in the order removed."""
    _check_prefix(prefix)
    pat = _owned_pattern(prefix)
    removed: list[str] = []
    for name in list_namespaces(run, timeout_s):
        m = pat.match(name)
        if m is None or alive(int(m.group(1))):
            continue
        _delete_namespace(name, run, timeout_s, kill)
        removed.append(name)
    return removed


@dataclass(frozen=True, slots=True)
class Host:
    """One testbed host: its namespace, its interface (inside it), and its address."""

    index: int
    netns: str
    ifname: str  # host-side veth, inside ``netns``
    peer: str  # switch-side veth, inside the switch namespace
    ip: str


class Testbed:
    """``hosts`` network namespaces on one bridge. Created by the constructor; on a failure
    midway everything created so far is removed before the error propagates.

    ``pid`` only names things (tests pass a dead pid to imitate a crashed owner). Use as a
    context manager, or call :meth:`close` (a run removes it on SIGTERM and Ctrl-C too:
    :func:`reamer.backends.local.session.sigterm_as_interrupt`; after ``kill -9`` the next
    run's :func:`sweep` does).
    """

    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        hosts: int = 2,
        prefix: str = "rmr",
        *,
        run: Runner = subprocess.run,
        pid: int | None = None,
        timeout_s: float = 10.0,
        kill: Callable[[int, int], None] = os.kill,
    ):
        _check_prefix(prefix)
        if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
            raise NetnsError("Testbed", f"1 to {MAX_HOSTS} hosts", f"got {hosts!r}")
        self.prefix = prefix
        self.pid = os.getpid() if pid is None else int(pid)
        self.timeout_s = timeout_s
        self._run = run
        self._kill = kill
        self._lock = threading.Lock()
        self._created: list[str] = []  # namespaces, in creation order
        self._closed = False
        self.token = _base36(self.pid)
        self.switch = f"{prefix}-{self.pid}-sw"
        self.hosts: list[Host] = []
        for k in range(hosts):
            a, b = f"{prefix}{self.token}{k}a", f"{prefix}{self.token}{k}b"
            if len(a) > IFNAMSIZ:
                raise NetnsError("Testbed", f"interface names of at most {IFNAMSIZ} chars", f"{a!r} is too long")
            self.hosts.append(Host(k, f"{prefix}-{self.pid}-h{k}", a, b, f"{SUBNET}.{k + 1}"))
        try:
            self._build()
        except BaseException:
            with contextlib.suppress(NetnsError):
                self._teardown()
            raise

    # ------------------------------------------------------------------ commands
    def _ip(self, argv: list[str], expected: str) -> str:
        return _call(self._run, ["ip", *argv], expected, self.timeout_s)

    def _add_namespace(self, name: str) -> None:
        self._ip(["netns", "add", name], f"a new namespace {name} (sweep leftovers or use another prefix)")
        self._created.append(name)
        self._ip(["-n", name, "link", "set", "lo", "up"], f"loopback up in {name}")

    def _build(self) -> None:
        sw = self.switch
        self._add_namespace(sw)
        self._ip(["-n", sw, "link", "add", BRIDGE, "type", "bridge"], f"bridge {BRIDGE} in {sw}")
        self._ip(["-n", sw, "link", "set", BRIDGE, "up"], f"bridge {BRIDGE} up in {sw}")
        for h in self.hosts:
            self._add_namespace(h.netns)
            self._ip(
                ["-n", sw, "link", "add", h.peer, "type", "veth", "peer", "name", h.ifname, "netns", h.netns],
                f"a veth pair {h.peer} ({sw}) <-> {h.ifname} ({h.netns})",
            )  # fmt: skip
            self._ip(["-n", sw, "link", "set", h.peer, "master", BRIDGE], f"{h.peer} on bridge {BRIDGE}")
            self._ip(["-n", sw, "link", "set", h.peer, "up"], f"{h.peer} up in {sw}")
            self._ip(["-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.ifname], f"address {h.ip}/24 on {h.ifname}")
            self._ip(["-n", h.netns, "link", "set", h.ifname, "up"], f"{h.ifname} up in {h.netns}")

    def _teardown(self) -> None:
        """Delete created namespaces, hosts first, newest first. Tries all; those that could
        not be deleted stay listed (a later close retries them) and the first error is raised."""
        first: NetnsError | None = None
        failed: list[str] = []
        for name in reversed(list(self._created)):
            try:
                _delete_namespace(name, self._run, self.timeout_s, self._kill)
            except NetnsError as err:
                try:
                    gone = name not in list_namespaces(self._run, self.timeout_s)
                except NetnsError:
                    gone = False
                if not gone:  # already removed by someone else (a sweep) is fine
                    first = first or err
                    failed.append(name)
        self._created = failed[::-1]
        if first is not None:
            raise first

    # ------------------------------------------------------------------ api
    def host(self, host: int | str | Host) -> Host:
        """Look a host up by index, namespace name or Host."""
        if isinstance(host, Host):
            host = host.index
        for h in self.hosts:
            if host in (h.index, h.netns):
                return h
        raise NetnsError("Testbed.host", f"a host index 0..{len(self.hosts) - 1} or namespace name", f"got {host!r}")

    def ip(self, host: int | str | Host) -> str:
        return self.host(host).ip

    def exec_argv(self, host: int | str | Host, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside the host's namespace (cgroups are the caller's)."""
        if not argv:
            raise NetnsError("Testbed.exec_argv", "a non-empty argv", "got an empty one")
        return ["ip", "netns", "exec", self.host(host).netns, *map(str, argv)]

    def set_bandwidth(self, host: int | str | Host, mbit: float | None, *, queue_bytes: int = QUEUE_BYTES) -> None:
        """Limit both directions of the host's link to ``mbit`` Mbit/s (tbf); ``None`` removes it.

        ``queue_bytes``: what the limited link may hold queued (tbf ``limit``), by default a
        NIC's own queue (:data:`QUEUE_BYTES`). The receiving end's limit sits on the switch
        side, where a sender's burst arrives at veth speed (Gbit/s): with a queue of 50 ms at
        5 Mbit/s (31 KB), a parameter server's 156-312 KB step transfers lose most of their
        segments and wait out TCP retransmission timeouts (200 ms), two shards' parallel
        transfers most (``docs/local.md``)."""
        h = self.host(host)
        ends = ((h.netns, h.ifname), (self.switch, h.peer))
        if mbit is None:
            for ns, dev in ends:
                # no qdisc to delete (already unlimited) is done; any other failure (EPERM ...) is not
                self._ip(["-n", ns, "link", "show", dev], f"interface {dev} in {ns}")
                _call(
                    self._run, ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                    f"the limit on {dev} removed", self.timeout_s, ok_when=NO_QDISC,
                )  # fmt: skip
            return
        if not isinstance(mbit, int | float) or not mbit > 0 or mbit != mbit or mbit == float("inf"):
            raise NetnsError("Testbed.set_bandwidth", "mbit > 0 (finite) or None", f"got {mbit!r}")
        rate_kbit = max(1, round(mbit * 1000))
        burst = bucket_bytes(mbit)
        if not isinstance(queue_bytes, int) or queue_bytes < burst:
            raise NetnsError("Testbed.set_bandwidth", f"queue_bytes >= the bucket ({burst})", f"got {queue_bytes!r}")
        for ns, dev in ends:
            _call(
                self._run,
                ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", f"{rate_kbit}kbit", "burst", str(burst), "limit", str(queue_bytes)],
                f"a {mbit:g} Mbit/s tbf limit on {dev} in {ns}", self.timeout_s,
            )  # fmt: skip

    def link_bytes(self, host: int | str | Host) -> tuple[int, int]:
        """Cumulative (received, sent) bytes of the host's interface (its NIC)."""
        h = self.host(host)
        base = f"/sys/class/net/{h.ifname}/statistics"
        out = _call(self._run, ["ip", "netns", "exec", h.netns, "cat", f"{base}/rx_bytes", f"{base}/tx_bytes"],
                    f"byte counters of {h.ifname} in {h.netns}", self.timeout_s)
        rx, tx = (int(x) for x in out.split())
        return rx, tx

    def namespaces(self) -> list[str]:
        """Namespaces this testbed created and has not removed yet."""
        return list(self._created)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, blocking: bool = True) -> None:
        """Remove everything created (processes left in the namespaces are SIGKILLed). Idempotent.
        ``blocking=False`` returns at once when another close is in progress."""
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            if self._closed:
                return
            try:
                self._teardown()
            finally:
                self._closed = not self._created
        finally:
            self._lock.release()

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._created)} namespaces"
        return f"Testbed(prefix={self.prefix!r}, pid={self.pid}, hosts={len(self.hosts)}, {state})"

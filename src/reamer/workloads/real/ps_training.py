"""Parameter-server data-parallel training over real TCP (synchronous SGD).

    python -m reamer.workloads.real.ps_training ps --port P --shard K --shards N --workers W --model small_cnn
    python -m reamer.workloads.real.ps_training worker --ps HOST:PORT[,HOST:PORT...] --model small_cnn --steps S

The model's parameter tensors are split across the N PS shards (greedy by size, so the
shards carry about the same bytes); the i-th ``--ps`` address is shard i. Each step a
worker pulls its parameters from every shard (in parallel), runs forward/backward on a
synthetic CIFAR-shaped batch and pushes the gradients back; a shard applies SGD with the
mean gradient once all W workers' gradients for that step have arrived, and only then
serves the next step's pull.

Wire protocol (no pickle): every message is a fixed header
``!4sBQII`` = magic ``b"RMPS"``, type, step, worker id, count; HELLO / HELLO_OK / ERROR
carry ``count`` bytes of UTF-8 JSON; PARAMS / PUSH carry ``count`` tensors, each a
``!Q`` byte length and the raw little-endian float32 data. Every length is checked
against what the model's shard expects before anything is allocated.

Telemetry: one JSON line per interval on stdout (``"role": "worker"`` / ``"ps"``).
Threads are sized from the process's own CPU quota (container-aware launcher).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"RMPS"
HEADER = struct.Struct("!4sBQII")
TLEN = struct.Struct("!Q")
HELLO, HELLO_OK, PULL, PARAMS, PUSH, PUSH_OK, BYE, ERROR = range(1, 9)
MAX_JSON = 64 * 1024
F32 = np.dtype("<f4")


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow."""


# --------------------------------------------------------------------------- sharding
def shard_assignment(numels: Sequence[int], shards: int) -> list[int]:
    """Shard of each parameter tensor: largest first onto the least-loaded shard (ties →
    lowest shard), deterministic. Every shard gets at least one tensor when possible."""
    if shards < 1:
        raise ValueError(f"shards: expected >= 1, got {shards!r}")
    if shards > len(numels):
        raise ValueError(f"shards: expected <= number of parameter tensors ({len(numels)}), got {shards}")
    load = [0] * shards
    out = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        k = min(range(shards), key=lambda s: (load[s], s))
        out[i] = k
        load[k] += numels[i]
    return out


def shard_indices(numels: Sequence[int], shards: int, shard: int) -> list[int]:
    """Indices (in model order) of the parameter tensors that shard ``shard`` holds."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard: expected 0 <= shard < {shards}, got {shard!r}")
    return [i for i, k in enumerate(shard_assignment(numels, shards)) if k == shard]


# --------------------------------------------------------------------------- wire
class Conn:
    """A TCP connection that frames messages and counts bytes both ways."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.bytes_sent = 0
        self.bytes_recv = 0

    def close(self) -> None:
        """Shut down first: that wakes a thread blocked in ``recv`` on this socket."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    def peer_closed(self) -> bool:
        """While the peer should be silent (waiting for our reply): has it hung up?"""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable) and self.sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _send(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)
        self.bytes_sent += len(data)

    def _recv_into(self, buf: memoryview) -> None:
        got = 0
        n = len(buf)
        while got < n:
            r = self.sock.recv_into(buf[got:], n - got)
            if r == 0:
                raise ConnectionError("peer closed the connection")
            got += r
        self.bytes_recv += n

    def _recv(self, n: int) -> bytes:
        buf = bytearray(n)
        self._recv_into(memoryview(buf))
        return bytes(buf)

    def send_header(self, mtype: int, step: int = 0, worker: int = 0, count: int = 0) -> None:
        self._send(HEADER.pack(MAGIC, mtype, step, worker, count))

    def send_json(self, mtype: int, obj: dict[str, Any], step: int = 0, worker: int = 0) -> None:
        data = json.dumps(obj).encode()
        self._send(HEADER.pack(MAGIC, mtype, step, worker, len(data)) + data)

    def send_tensors(self, mtype: int, arrays: Sequence[np.ndarray], step: int = 0, worker: int = 0) -> None:
        self.send_header(mtype, step, worker, len(arrays))
        for a in arrays:
            a = np.ascontiguousarray(a, dtype=F32)
            self._send(TLEN.pack(a.nbytes))
            self._send(memoryview(a).cast("B"))

    def recv_header(self) -> tuple[int, int, int, int]:
        magic, mtype, step, worker, count = HEADER.unpack(self._recv(HEADER.size))
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic!r}")
        return mtype, step, worker, count

    def recv_json(self, count: int) -> dict[str, Any]:
        if count > MAX_JSON:
            raise ProtocolError(f"JSON payload of {count} bytes exceeds {MAX_JSON}")
        obj = json.loads(self._recv(count).decode())
        if not isinstance(obj, dict):
            raise ProtocolError("JSON payload is not an object")
        return obj

    def recv_tensors(self, count: int, numels: Sequence[int]) -> list[np.ndarray]:
        """``count`` tensors whose sizes must be exactly ``numels`` (float32 elements)."""
        if count != len(numels):
            raise ProtocolError(f"expected {len(numels)} tensors, got {count}")
        out = []
        for n in numels:
            (nbytes,) = TLEN.unpack(self._recv(TLEN.size))
            if nbytes != n * F32.itemsize:
                raise ProtocolError(f"tensor of {nbytes} bytes, expected {n * F32.itemsize}")
            a = np.empty(n, dtype=F32)
            self._recv_into(memoryview(a).cast("B"))
            out.append(a)
        return out


def emit(obj: dict[str, Any]) -> None:
    """One JSON telemetry line on stdout."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def size_threads(threads: int | None) -> tuple[float, int, int]:
    """Size PyTorch's pools from the container (or ``threads``): (cores, intra, inter)."""
    from reamer.backends.local import launcher

    cores = float(threads) if threads else launcher.own_effective_cpus()
    # before torch (and its OpenMP runtime) loads: pools sized to the container and
    # OMP_WAIT_POLICY=PASSIVE. Spinning OpenMP workers of co-located processes were
    # measured 20x slower here (2 workers x 2 threads on 2 cores). Explicit env wins.
    for k, v in launcher.thread_env(cores).items():
        os.environ.setdefault(k, v)
    intra, inter = launcher.apply_torch(cores)
    return cores, intra, inter


def model_numels(model: Any) -> list[int]:
    return [p.numel() for p in model.parameters()]


# --------------------------------------------------------------------------- PS
@dataclass
class PSStats:
    applies: int = 0
    apply_s: float = 0.0
    bytes_sent: int = 0
    bytes_recv: int = 0


class ParameterServer:
    """One PS shard: holds its tensors, sums the workers' gradients for the current step
    and applies SGD when all ``workers`` have pushed. Thread per connection."""

    def __init__(
        self,
        model_name: str,
        shard: int,
        shards: int,
        workers: int,
        *,
        lr: float = 0.1,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        report_every: int = 10,
        serve_forever: bool = False,
        checkpoint: str | None = None,
        resume: str | None = None,
        checkpoint_every: int = 0,
    ):
        from reamer.workloads.real.nets import build_model

        if workers < 1:
            raise ValueError(f"workers: expected >= 1, got {workers!r}")
        model = build_model(model_name, seed)
        all_numels = model_numels(model)
        self.model_name = model_name
        self.shard, self.shards, self.workers = shard, shards, workers
        self.indices = shard_indices(all_numels, shards, shard)
        params = list(model.parameters())
        self.params = [params[i].detach().numpy().astype(F32).ravel().copy() for i in self.indices]
        self.numels = [all_numels[i] for i in self.indices]
        self.grad_sum = [np.zeros_like(p) for p in self.params]
        self.lr = lr
        self.version = 0  # number of SGD steps applied
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every  # also save every N applied steps (0: only on exit)
        if resume:
            self.version = self._resume(resume)
        self.pushed: set[int] = set()
        self.cond = threading.Condition()
        self.failed: str | None = None
        self.stop = threading.Event()
        self.stats = PSStats()
        self.report_every = report_every
        self.serve_forever = serve_forever
        self.connected = 0
        self.finished = 0
        self.departed = 0
        self.cpu0 = (time.process_time(), time.perf_counter())
        self.conns: list[Conn] = []
        self.sock = socket.create_server((host, port), backlog=64)
        self.port = self.sock.getsockname()[1]

    # ---- checkpoint (re-sharding: a job restarted with another number of shards resumes)
    # A checkpoint of N shards at step S is the files s{N}-v{S}-k{K}.npz (each: its tensors by
    # model index and the step). The manifest (manifest.json: shards, step) is written
    # atomically once every file of a layout and step exists; resume reads only the manifest's
    # files, and every other file is removed once a new checkpoint is complete — a shard that
    # died mid-save, or one a step ahead of the others, leaves the last complete one intact.
    def _resume(self, directory: str) -> int:
        """Load this shard's tensors from the manifest's layout (any shard count). Returns the
        step to resume at: the manifest's."""
        from pathlib import Path

        d = Path(directory)
        m = read_manifest(d)
        if m is None:
            raise ValueError(f"--resume {directory}: expected a checkpoint manifest (manifest.json), found none")
        shards, version = m
        tensors: dict[int, np.ndarray] = {}
        for k in range(shards):
            f = d / layout_file(shards, k, version)
            with np.load(f) as z:
                if int(z["version"]) != version:
                    raise ValueError(f"--resume {directory}: {f.name} holds step {int(z['version'])}, "
                                     f"the manifest step {version}")
                for key in z.files:
                    if key.startswith("t"):
                        tensors[int(key[1:])] = z[key]
        for j, i in enumerate(self.indices):
            a = tensors.get(i)
            if a is None or a.size != self.numels[j]:
                raise ValueError(f"--resume {directory}: tensor {i} missing or of the wrong size")
            self.params[j] = a.astype(F32).ravel().copy()
        return version

    def _save(self) -> None:
        """Write this shard's tensors (by model index) and step atomically; the shard that
        completes its layout commits it in the manifest and removes the other layouts."""
        from pathlib import Path

        d = Path(self.checkpoint)  # type: ignore[arg-type]
        d.mkdir(parents=True, exist_ok=True)
        with self.cond:
            arrays = {f"t{i}": p.copy() for i, p in zip(self.indices, self.params, strict=True)}
            version = self.version
        name = layout_file(self.shards, self.shard, version)
        tmp = d / f".{name}.tmp.npz"
        np.savez(tmp, version=np.int64(version), **arrays)
        os.replace(tmp, d / name)
        commit_layout(d, self.shards, version)

    # ---- state machine
    def _wait_version(self, step: int, conn: Conn) -> None:
        with self.cond:
            while self.version < step and self.failed is None and not self.stop.is_set():
                self.cond.wait(0.2)
                if conn.peer_closed():
                    raise ConnectionError("worker hung up while waiting for the step")
            if self.failed is not None:
                raise ProtocolError(f"job failed: {self.failed}")
            if self.stop.is_set():
                raise ProtocolError("parameter server stopping")
            if self.version != step:
                raise ProtocolError(f"pull for step {step} but the shard is at step {self.version}")

    def _push(self, step: int, worker: int, grads: list[np.ndarray]) -> None:
        with self.cond:
            if step != self.version:
                raise ProtocolError(f"push for step {step} but the shard is at step {self.version}")
            if worker in self.pushed:
                raise ProtocolError(f"worker {worker} pushed step {step} twice")
            for s, g in zip(self.grad_sum, grads, strict=True):
                s += g
            self.pushed.add(worker)
            self._maybe_apply_locked()

    def _maybe_apply_locked(self) -> None:
        """SGD with the mean gradient once every worker still in the job has pushed
        (a worker that said BYE early no longer holds the others up)."""
        if not self.pushed or len(self.pushed) < self.workers - self.departed:
            return
        t0 = time.perf_counter()
        scale = self.lr / len(self.pushed)
        for p, s in zip(self.params, self.grad_sum, strict=True):
            p -= scale * s
            s.fill(0.0)
        self.stats.apply_s += time.perf_counter() - t0
        self.stats.applies += 1
        self.pushed.clear()
        self.version += 1
        self.cond.notify_all()
        if self.checkpoint and self.checkpoint_every and self.version % self.checkpoint_every == 0:
            self._save()  # every shard saves the same step: the checkpoint commits once all have
        if self.report_every and self.version % self.report_every == 0:
            self._report("interval")

    def _report(self, event: str) -> None:
        sent = self.stats.bytes_sent + sum(c.bytes_sent for c in self.conns)
        recv = self.stats.bytes_recv + sum(c.bytes_recv for c in self.conns)
        emit(
            {
                "role": "ps",
                "event": event,
                "shard": self.shard,
                "version": self.version,
                "applies": self.stats.applies,
                "apply_s": round(self.stats.apply_s, 6),
                "apply_ms_mean": round(1e3 * self.stats.apply_s / max(1, self.stats.applies), 4),
                "bytes_sent": sent,
                "bytes_recv": recv,
                "params": sum(self.numels),
                "cpu_cores": round((time.process_time() - self.cpu0[0]) / max(1e-9, time.perf_counter() - self.cpu0[1]), 3),
            }
        )

    # ---- connections
    def _serve(self, conn: Conn) -> None:
        clean = False
        worker = -1
        try:
            mtype, _, worker, count = conn.recv_header()
            if mtype != HELLO:
                raise ProtocolError("first message must be HELLO")
            hello = conn.recv_json(count)
            if hello.get("model") != self.model_name or hello.get("shard") != self.shard:
                raise ProtocolError(
                    f"worker expects model {hello.get('model')!r} shard {hello.get('shard')!r}; "
                    f"this is {self.model_name!r} shard {self.shard}"
                )
            conn.send_json(
                HELLO_OK,
                {"model": self.model_name, "shard": self.shard, "shards": self.shards,
                 "workers": self.workers, "indices": self.indices, "version": self.version},
            )
            while True:
                mtype, step, w, count = conn.recv_header()
                if mtype == PULL:
                    self._wait_version(step, conn)
                    with self.cond:  # params are only written under the lock
                        snapshot = [p.copy() for p in self.params]
                    conn.send_tensors(PARAMS, snapshot, step=step)
                elif mtype == PUSH:
                    grads = conn.recv_tensors(count, self.numels)
                    self._push(step, w, grads)
                    conn.send_header(PUSH_OK, step=step)
                elif mtype == BYE:
                    clean = True
                    with self.cond:
                        self.departed += 1
                        self._maybe_apply_locked()
                    return
                else:
                    raise ProtocolError(f"unexpected message type {mtype}")
        except (ProtocolError, ConnectionError, OSError, ValueError, struct.error) as e:
            if not self.stop.is_set():
                with self.cond:
                    if self.failed is None:
                        self.failed = f"worker {worker}: {e}"
                    self.cond.notify_all()
                try:
                    conn.send_json(ERROR, {"error": str(e)})
                except OSError:
                    pass
        finally:
            conn.close()
            with self.cond:
                self.finished += 1
                self.stats.bytes_sent += conn.bytes_sent
                self.stats.bytes_recv += conn.bytes_recv
                self.conns.remove(conn)
                if not clean and self.failed is None and not self.stop.is_set():
                    self.failed = f"worker {worker} disconnected without BYE"
                self.cond.notify_all()
                if not self.serve_forever and (self.failed or self.finished >= self.workers):
                    self.stop.set()

    def run(self) -> int:
        """Accept workers until all ``workers`` have finished (or forever), or SIGTERM."""
        emit({"role": "ps", "event": "listening", "port": self.port, "shard": self.shard, "version": self.version,
              "shards": self.shards, "workers": self.workers, "tensors": len(self.indices),
              "params": sum(self.numels)})
        self.sock.settimeout(0.2)
        threads = []
        try:
            while not self.stop.is_set():
                try:
                    s, _ = self.sock.accept()
                except TimeoutError:
                    continue
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = Conn(s)
                with self.cond:
                    self.conns.append(conn)
                    self.connected += 1
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                t.start()
                threads.append(t)
        finally:
            self.stop.set()
            self.sock.close()
            with self.cond:
                for c in list(self.conns):
                    c.close()
                self.cond.notify_all()
            for t in threads:
                t.join(timeout=2.0)
            if self.checkpoint:
                self._save()
            self._report("done")
        return 1 if self.failed else 0


# --------------------------------------------------------------------------- checkpoint layouts
MANIFEST = "manifest.json"


def layout_file(shards: int, shard: int, step: int) -> str:
    return f"s{shards}-v{step}-k{shard}.npz"


def read_manifest(d: Any) -> tuple[int, int] | None:
    """(shards, step) of the checkpoint in folder ``d``; None when there is none yet."""
    from pathlib import Path

    f = Path(d) / MANIFEST
    try:
        m = json.loads(f.read_text())
        return int(m["shards"]), int(m["step"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{f}: expected {{\"shards\": N, \"step\": S}}, got {e}") from None


def commit_layout(d: Any, shards: int, version: int) -> bool:
    """Commit the ``shards``-shard layout at ``version`` when all its files hold that step
    (else nothing changes: the manifest keeps the last complete layout). True when committed."""
    from pathlib import Path

    d = Path(d)
    for k in range(shards):
        try:
            with np.load(d / layout_file(shards, k, version)) as z:
                if int(z["version"]) != version:
                    return False
        except (OSError, ValueError, KeyError):
            return False
    tmp = d / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"shards": shards, "step": version}))
    os.replace(tmp, d / MANIFEST)
    keep = {layout_file(shards, k, version) for k in range(shards)}
    for f in d.glob("s*-v*-k*.npz"):
        if f.name not in keep:
            f.unlink(missing_ok=True)
    return True


# --------------------------------------------------------------------------- worker
def parse_addrs(spec: str) -> list[tuple[str, int]]:
    out = []
    for part in spec.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--ps: expected HOST:PORT[,HOST:PORT...], got {spec!r}")
        out.append((host.strip("[]"), int(port)))
    return out


def connect(addr: tuple[str, int], timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s = socket.create_connection(addr, timeout=5.0)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Worker:
    def __init__(
        self,
        ps: Sequence[tuple[str, int]],
        model_name: str,
        *,
        worker_id: int = 0,
        batch: int = 32,
        seed: int = 0,
        connect_timeout_s: float = 30.0,
    ):
        from reamer.workloads.real.nets import build_model

        self.model_name = model_name
        self.model = build_model(model_name, seed)
        self.params = list(self.model.parameters())
        numels = model_numels(self.model)
        self.worker_id = worker_id
        self.batch = batch
        self.seed = seed
        self.shard_idx = [shard_indices(numels, len(ps), k) for k in range(len(ps))]
        self.shard_numels = [[numels[i] for i in idx] for idx in self.shard_idx]
        self.conns: list[Conn] = []
        versions: list[int] = []
        try:
            for k, addr in enumerate(ps):
                c = Conn(connect(addr, connect_timeout_s))
                self.conns.append(c)
                c.send_json(HELLO, {"model": model_name, "shard": k}, worker=worker_id)
                mtype, _, _, count = c.recv_header()
                reply = c.recv_json(count)
                if mtype != HELLO_OK:
                    raise ProtocolError(f"PS {addr} refused: {reply.get('error')}")
                if reply.get("indices") != self.shard_idx[k] or reply.get("shards") != len(ps):
                    raise ProtocolError(f"PS {addr} holds a different shard layout: {reply}")
                versions.append(int(reply.get("version", 0)))
            if len(set(versions)) > 1:
                raise ProtocolError(f"PS shards are at different steps {versions}")
            self.start_step = versions[0]  # > 0 when the job resumed from a checkpoint
            self.pool = ThreadPoolExecutor(max_workers=len(ps))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for c in self.conns:
            c.close()
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def bytes(self) -> tuple[int, int]:
        return sum(c.bytes_sent for c in self.conns), sum(c.bytes_recv for c in self.conns)

    def _pull_one(self, k: int, step: int) -> list[np.ndarray]:
        c = self.conns[k]
        c.send_header(PULL, step=step, worker=self.worker_id)
        mtype, rstep, _, count = c.recv_header()
        if mtype == ERROR:
            raise ProtocolError(f"PS shard {k}: {c.recv_json(count).get('error')}")
        if mtype != PARAMS or rstep != step:
            raise ProtocolError(f"PS shard {k}: expected PARAMS for step {step}")
        return c.recv_tensors(count, self.shard_numels[k])

    def _push_one(self, k: int, step: int, grads: list[np.ndarray]) -> None:
        c = self.conns[k]
        c.send_tensors(PUSH, grads, step=step, worker=self.worker_id)
        mtype, _, _, count = c.recv_header()
        if mtype == ERROR:
            raise ProtocolError(f"PS shard {k}: {c.recv_json(count).get('error')}")
        if mtype != PUSH_OK:
            raise ProtocolError(f"PS shard {k}: expected PUSH_OK")

    def pull(self, step: int) -> None:
        import torch

        results = list(self.pool.map(lambda k: self._pull_one(k, step), range(len(self.conns))))
        with torch.no_grad():
            for idx, arrays in zip(self.shard_idx, results, strict=True):
                for i, a in zip(idx, arrays, strict=True):
                    self.params[i].copy_(torch.from_numpy(a).view_as(self.params[i]))

    def push(self, step: int) -> None:
        grads = [p.grad.detach().contiguous().view(-1).numpy() for p in self.params]
        per = [[grads[i] for i in idx] for idx in self.shard_idx]
        list(self.pool.map(lambda k: self._push_one(k, step, per[k]), range(len(self.conns))))

    def bye(self) -> None:
        for c in self.conns:
            try:
                c.send_header(BYE, worker=self.worker_id)
            except OSError:
                pass

    def eval_loss(self) -> float:
        import torch
        from reamer.workloads.real.nets import synthetic_batch

        x, y = synthetic_batch(128, seed=10_000_000 + self.seed)  # fixed, the same on every worker
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(self.model(x), y))

    def checksum(self) -> float:
        return float(sum(float(p.detach().double().sum()) for p in self.params))

    def train(
        self, steps: int, report_every: int = 10, report_every_s: float = 0.0, poll: Any = None,
        stop: Any = None, on_step: Any = None,
    ) -> dict[str, Any]:
        """Run until the job's global step reaches ``steps`` (it starts at :attr:`start_step`).
        ``poll``: called between steps, e.g. ``QuotaWatcher.poll`` (re-tunes threads);
        ``stop``: called between steps, True = leave cleanly now (BYE; the PS checkpoints);
        ``on_step(samples)``: called after each step with the samples it trained."""
        import torch
        from reamer.workloads.real.nets import synthetic_batch

        loss_fn = torch.nn.functional.cross_entropy
        pool_batches = [
            synthetic_batch(self.batch, seed=self.seed * 1_000_003 + self.worker_id * 1009 + i) for i in range(16)
        ]
        start = self.steps_done = self.start_step
        self.pull(start)
        loss0 = self.eval_loss()
        t_start = time.perf_counter()
        cpu_start = time.process_time()
        win = {"steps": 0, "t": t_start, "comm": 0.0, "compute": 0.0, "sent": 0, "recv": 0, "cpu": time.process_time()}
        win["sent"], win["recv"] = self.bytes()
        tot_comm = tot_compute = 0.0
        loss = float("nan")
        step = last = start
        for step in range(start, steps):
            if stop is not None and stop():
                break
            if poll is not None:
                poll()
            t0 = time.perf_counter()
            if step > start:
                self.pull(step)
            t1 = time.perf_counter()
            x, y = pool_batches[step % len(pool_batches)]
            self.model.zero_grad(set_to_none=False)
            out = loss_fn(self.model(x), y)
            out.backward()
            loss = float(out.detach())
            t2 = time.perf_counter()
            self.push(step)
            t3 = time.perf_counter()
            comm, compute = (t1 - t0) + (t3 - t2), t2 - t1
            win["comm"] += comm
            win["compute"] += compute
            tot_comm += comm
            tot_compute += compute
            win["steps"] += 1
            last = self.steps_done = step + 1
            if on_step is not None:
                on_step(self.batch)
            now = time.perf_counter()
            due = (report_every and win["steps"] >= report_every) or (
                report_every_s and now - win["t"] >= report_every_s
            )
            if (due or step == steps - 1) and win["steps"]:
                sent, recv = self.bytes()
                dt = now - win["t"]
                n = win["steps"]
                emit(
                    {
                        "role": "worker",
                        "event": "interval",
                        "worker": self.worker_id,
                        "step": step + 1,
                        "samples_per_s": round(n * self.batch / dt, 3),
                        "step_s": round(dt / n, 6),
                        "comm_s": round(win["comm"] / n, 6),
                        "compute_s": round(win["compute"] / n, 6),
                        "bytes_sent": sent - win["sent"],
                        "bytes_recv": recv - win["recv"],
                        "loss": round(loss, 6),
                        "cpu_cores": round((time.process_time() - win["cpu"]) / dt, 3),
                        "threads": torch.get_num_threads(),
                    }
                )
                win = {"steps": 0, "t": now, "comm": 0.0, "compute": 0.0, "sent": sent, "recv": recv,
                       "cpu": time.process_time()}
        elapsed = time.perf_counter() - t_start
        done = last - start
        stopped = last < steps
        if not stopped:
            self.pull(steps)  # the parameters after the last step (identical on every worker)
        sent, recv = self.bytes()
        summary = {
            "role": "worker",
            "event": "stopped" if stopped else "done",
            "worker": self.worker_id,
            "model": self.model_name,
            "start_step": start,
            "step": last,
            "steps": done,
            "batch": self.batch,
            "shards": len(self.conns),
            "elapsed_s": round(elapsed, 6),
            "samples_per_s": round(done * self.batch / elapsed, 3) if elapsed > 0 else None,
            "comm_s": round(tot_comm / max(1, done), 6),
            "compute_s": round(tot_compute / max(1, done), 6),
            "cpu_cores": round((time.process_time() - cpu_start) / elapsed, 3) if elapsed > 0 else None,
            "bytes_sent": sent,
            "bytes_recv": recv,
            "last_loss": round(loss, 6),
            "eval_loss_before": round(loss0, 6),
            "eval_loss_after": round(self.eval_loss(), 6),
            "param_checksum": self.checksum(),
        }
        self.bye()
        emit(summary)
        return summary


# --------------------------------------------------------------------------- CLI
def serve_train_metrics(host: str, port: int) -> Any:
    """Serve the training telemetry contract of the Kubernetes backend (docs/kubernetes.md):
    ``reamer_train_samples_total``, the samples this process has trained since it started.
    Returns the per-step callback that counts them."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    reg = CollectorRegistry()
    samples = Counter("reamer_train_samples", "Samples this worker has trained since it started.", registry=reg)
    server, _ = start_http_server(port, host, registry=reg)
    emit({"role": "worker", "event": "metrics", "port": server.server_port})
    return samples.inc


def main(argv: Sequence[str] | None = None) -> int:
    from reamer.workloads.real.nets import MODELS

    ap = argparse.ArgumentParser(prog="python -m reamer.workloads.real.ps_training", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    p = sub.add_parser("ps", help="one parameter-server shard")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (only this one)")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (printed in the 'listening' line)")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--workers", type=int, default=1, help="workers per synchronous step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--report-every", type=int, default=10, help="telemetry every N applied steps")
    p.add_argument("--serve-forever", action="store_true", help="do not exit when all workers are done")
    p.add_argument("--checkpoint", default=None, help="directory: write this shard's tensors and step on exit")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="with --checkpoint: also save every N applied steps (0: only on exit)")
    p.add_argument("--resume", default=None,
                   help="checkpoint folder of a previous run (its manifest.json; any shard count): start from it")
    w = sub.add_parser("worker", help="one data-parallel worker")
    w.add_argument("--ps", required=True, help="HOST:PORT[,HOST:PORT...]; the i-th is shard i")
    w.add_argument("--steps", type=int, default=100, help="the global step to stop at (a resumed job starts at the PS step)")
    w.add_argument("--batch", type=int, default=32)
    w.add_argument("--worker-id", type=int, default=0)
    w.add_argument("--report-every", type=int, default=10, help="telemetry every N steps (0 = off)")
    w.add_argument("--report-every-s", type=float, default=0.0, help="telemetry every N seconds (0 = off)")
    w.add_argument("--connect-timeout", type=float, default=30.0)
    w.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus /metrics (reamer_train_samples_total) on this port (0: any free)")
    w.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    for q in (p, w):
        q.add_argument("--model", default="small_cnn", choices=sorted(MODELS))
        q.add_argument("--seed", type=int, default=0, help="initial weights (must match across the job)")
        q.add_argument("--threads", type=int, default=None, help="override the container-derived thread count")
    a = ap.parse_args(argv)

    cores, intra, inter = size_threads(a.threads)
    stop = {"flag": False}

    if a.role == "ps":
        server = ParameterServer(a.model, a.shard, a.shards, a.workers, lr=a.lr, seed=a.seed, host=a.host,
                                 port=a.port, report_every=a.report_every, serve_forever=a.serve_forever,
                                 checkpoint=a.checkpoint, resume=a.resume, checkpoint_every=a.checkpoint_every)

        def on_term(signum: int, frame: Any) -> None:
            server.stop.set()

        signal.signal(signal.SIGTERM, on_term)
        emit({"role": "ps", "event": "threads", "cores": cores, "intra": intra, "inter": inter})
        try:
            return server.run()
        except KeyboardInterrupt:
            server.stop.set()
            return 130

    def on_term_worker(signum: int, frame: Any) -> None:
        """First SIGTERM: finish the current step and leave cleanly (the PS checkpoints);
        a second one: leave now."""
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_term_worker)
    emit({"role": "worker", "event": "threads", "worker": a.worker_id, "cores": cores, "intra": intra, "inter": inter})
    worker = Worker(parse_addrs(a.ps), a.model, worker_id=a.worker_id, batch=a.batch, seed=a.seed,
                    connect_timeout_s=a.connect_timeout)
    emit({"role": "worker", "event": "connected", "worker": a.worker_id, "shards": len(worker.conns)})
    poll = None
    if not a.threads:  # sized from the container: follow its allocation while running
        from reamer.backends.local import launcher

        watcher = launcher.QuotaWatcher(launcher.own_effective_cpus, launcher.retune_torch, interval_s=1.0)
        watcher.threads = intra  # already applied at start-up
        poll = watcher.poll
    on_step = None
    if a.metrics_port is not None:
        on_step = serve_train_metrics(a.metrics_host, a.metrics_port)
    try:
        worker.train(a.steps, a.report_every, a.report_every_s, poll, stop=lambda: stop["flag"], on_step=on_step)
        return 0
    except KeyboardInterrupt:
        return 130
    except (ProtocolError, ConnectionError, OSError) as e:
        emit({"role": "worker", "event": "error", "worker": a.worker_id, "error": str(e),
              "step": getattr(worker, "steps_done", worker.start_step)})  # the steps it completed: what a restart loses
        return 1
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())

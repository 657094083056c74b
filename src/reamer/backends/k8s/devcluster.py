"""A throw-away control plane on loopback: etcd + a real kube-apiserver (+ optionally
kube-controller-manager for garbage collection, namespaces, PDBs and quotas), for the tier-A
tests and the scheduler benchmark. No kubelet: whoever uses it plays the kubelet
(pods/status, forced deletes).

The binaries come from ``tools/k8s/build.sh`` (Kubernetes 1.20.2 built from Debian's source
package), cached outside the repository; :func:`find_binaries` says why they are missing.
Every port is a free one picked at start; everything lives under ``workdir``.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reamer.backends.k8s.kube import Kube, nodes

log = logging.getLogger(__name__)

DEFAULT_CACHE = Path.home() / ".cache" / "reamer" / "k8s-1.20.2"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")


def find_binaries(cache: Path = DEFAULT_CACHE) -> tuple[Path | None, str]:
    """(bin dir, "") when every binary is there, else (None, why)."""
    bin_dir = cache / "bin"
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        return None, f"{', '.join(missing)} not in {bin_dir}: run tools/k8s/build.sh"
    return bin_dir, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class DevCluster:
    """etcd + kube-apiserver (+ controller-manager) under ``workdir``; ``tokens`` maps user
    name → (token, groups) for token authentication (``admin`` is in ``system:masters``)."""

    bin_dir: Path
    workdir: Path
    controller_manager: bool = True
    extra_users: dict[str, tuple[str, ...]] = field(default_factory=dict)  # user -> groups
    port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kubeconfig(self, user: str = "admin") -> Path:
        """A kubeconfig file for ``user`` (written once)."""
        path = self.workdir / f"kubeconfig-{user}"
        if not path.exists():
            doc = {
                "apiVersion": "v1", "kind": "Config", "current-context": "dev",
                "clusters": [{"name": "dev", "cluster": {"server": self.url,
                                                         "certificate-authority": str(self.workdir / "certs" / "apiserver.crt")}}],
                "users": [{"name": user, "user": {"token": self.tokens[user]}}],
                "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": user}}],
            }
            path.write_text(yaml.safe_dump(doc))
        return path

    def start(self, timeout_s: float = 60.0) -> DevCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        etcd_port, peer_port = free_port(), free_port()
        self.port = free_port()
        users = {"admin": ("system:masters",), **self.extra_users}
        self.tokens = {u: secrets.token_hex(16) for u in users}
        (self.workdir / "tokens.csv").write_text(
            "".join(f'{self.tokens[u]},{u},{u},"{",".join(g)}"\n' for u, g in users.items()))
        sa_key = self.workdir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
        ], logs)
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--insecure-port=0",
            f"--cert-dir={self.workdir / 'certs'}", f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--disable-admission-plugins=ServiceAccount", "--advertise-address=127.0.0.1",
        ], logs)
        self._wait_ready(timeout_s)
        if self.controller_manager:
            self._spawn("kube-controller-manager", [
                str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig()}",
                "--controllers=garbagecollector,namespace,disruption,resourcequota", "--bind-address=127.0.0.1",
                "--secure-port=0", "--port=0", "--leader-elect=false",
            ], logs)
        return self

    def _spawn(self, name: str, argv: list[str], logs: Path) -> None:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self._procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        out.close()

    def _wait_ready(self, timeout_s: float) -> None:
        import ssl
        import urllib.request

        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout_s
        req = urllib.request.Request(self.url + "/readyz", headers={"Authorization": f"Bearer {self.tokens['admin']}"})
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}: see {self.workdir / 'logs'}")
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {timeout_s} s: see {self.workdir / 'logs'}")

    def stop(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def add_node(kube: Kube, name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None) -> dict:
    """Register a node as its kubelet would, Ready, and clear the ``node.kubernetes.io/not-ready``
    taint the API server's admission puts on every new node, as the node lifecycle controller
    does once the node is Ready (the dev cluster runs neither a kubelet nor that controller)."""
    kube.create(nodes(), {"metadata": {"name": name, "labels": labels or {}},
                          "status": {"capacity": allocatable, "allocatable": allocatable,
                                     "conditions": [{"type": "Ready", "status": "True"}]}})
    return kube.merge_patch(nodes(name), {"spec": {"taints": None}})

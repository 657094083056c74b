"""The one way Reamer's components talk to the API server: plain JSON objects over the
official client's transport (``kubernetes.client.ApiClient``: kubeconfig or in-cluster
auth, TLS, connection pool), and a :class:`Reflector` (list + watch from the list's
resourceVersion, periodic re-list) that keeps a local store of one kind.

Objects stay plain dicts (as ``kubectl get -o json`` shows them): the components read a few
fields and write merge patches, and custom resources have no generated models.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config

log = logging.getLogger(__name__)

GROUP = "reamer.io"
VERSION = "v1alpha1"
Obj = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer: ``status`` (HTTP), ``reason`` (``Conflict``, ``NotFound`` …) and the
    message; ``status`` 0: no answer (the server unreachable, a timeout, a reset connection)."""

    def __init__(self, status: int, reason: str, message: str, body: Obj | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status, self.reason, self.message, self.body = status, reason, message, body or {}


def no_answer(err: urllib3.exceptions.HTTPError, where: str) -> ApiError:
    """A transport error of the client as an :class:`ApiError` with status 0 and one line that
    names the server and the reason (refused, timed out, TLS), not the connection pool's repr."""
    reason = getattr(err, "reason", None) or err
    args = getattr(reason, "args", ())
    why = str(args[-1] if args else reason).rsplit(": ", 1)[-1]  # the innermost words: refused, reset ...
    what = "no TLS session with" if isinstance(reason, urllib3.exceptions.SSLError) else "no answer from"
    pool = getattr(err, "pool", None)
    server = f"{pool.host}:{pool.port}" if pool is not None else where
    return ApiError(0, "NoAnswer", f"{what} the API server at {server} ({why})".replace("\n", " "))


def pods(ns: str | None, name: str | None = None, sub: str | None = None) -> str:
    """Pods of namespace ``ns`` (None: of every namespace, for a list or a watch)."""
    return _path("/api/v1/pods" if ns is None else f"/api/v1/namespaces/{ns}/pods", name, sub)


def services(ns: str, name: str | None = None) -> str:
    return _path(f"/api/v1/namespaces/{ns}/services", name, None)


def nodes(name: str | None = None, sub: str | None = None) -> str:
    return _path("/api/v1/nodes", name, sub)


def custom(plural: str, ns: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    """Path of Reamer's custom resources (``trainingjobs``, ``inferenceservices`` namespaced;
    ``nodeslacks`` cluster-scoped)."""
    base = f"/apis/{GROUP}/{VERSION}" + (f"/namespaces/{ns}" if ns else "") + f"/{plural}"
    return _path(base, name, sub)


def _path(base: str, name: str | None, sub: str | None) -> str:
    return base + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


class Kube:
    """JSON requests through one ``ApiClient``. ``timeout_s`` bounds every non-watch call."""

    def __init__(self, api: client.ApiClient, timeout_s: float = 10.0) -> None:
        self.api = api
        self.timeout_s = timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None, pool: int = 32) -> Kube:
        """From ``kubeconfig`` (a path), else in-cluster (a pod's service account), else
        ~/.kube/config. ``pool``: connections kept (one per open watch, plus requests)."""
        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(context=context, client_configuration=cfg)
        cfg.connection_pool_maxsize = pool
        return cls(client.ApiClient(cfg))

    # ---------------------------------------------------------------- requests
    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout_s: float | None = None, stream: bool = False) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        q = [(k, v if not isinstance(v, bool) else str(v).lower()) for k, v in (query or {}).items() if v is not None]
        _, url, hdrs, ser_body, _ = self.api.param_serialize(method, path, query_params=q, header_params=headers,
                                                             body=body, auth_settings=["BearerToken"])
        try:
            resp = self.api.call_api(method, url, header_params=hdrs, body=ser_body,
                                     _request_timeout=timeout_s if timeout_s is not None else self.timeout_s)
            if stream and 200 <= resp.status < 300:
                return resp.response
            raw = resp.read()
        except urllib3.exceptions.HTTPError as e:  # no answer: an error of this request, like a 5xx
            raise no_answer(e, self.api.configuration.host) from e
        if not 200 <= resp.status < 300:
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {"message": raw.decode(errors="replace")[:500]}
            raise ApiError(resp.status, doc.get("reason", resp.reason or ""), doc.get("message", ""), doc)
        return json.loads(raw) if raw else {}

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, path: str, label_selector: str | None = None, field_selector: str | None = None,
             page: int = 500) -> tuple[list[Obj], str]:
        """Every item (paged) and the list's resourceVersion."""
        items: list[Obj] = []
        cont = None
        while True:
            doc = self.request("GET", path, query={"labelSelector": label_selector, "fieldSelector": field_selector,
                                                   "limit": page, "continue": cont})
            items += doc.get("items") or []
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items, (doc.get("metadata") or {}).get("resourceVersion", "")

    def create(self, path: str, obj: Obj) -> Obj:
        return self.request("POST", path, obj)

    def replace(self, path: str, obj: Obj) -> Obj:
        """PUT: fails with 409 when ``obj``'s resourceVersion is not the stored one."""
        return self.request("PUT", path, obj)

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, content_type="application/strategic-merge-patch+json")

    def delete(self, path: str, grace_s: int | None = None, uid: str | None = None) -> bool:
        """Delete; False when it was already gone. ``uid`` deletes only that incarnation."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path, body)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    # ---------------------------------------------------------------- subresources
    def bind(self, ns: str, pod: str, node: str, uid: str | None = None) -> None:
        """POST pods/{pod}/binding (the scheduler's bind)."""
        body: Obj = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": ns},
                     "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if uid:
            body["metadata"]["uid"] = uid
        self.request("POST", pods(ns, pod, "binding"), body)

    def evict(self, ns: str, pod: str) -> None:
        """The Eviction API (honours PodDisruptionBudgets: 429 when one forbids it).
        ``policy/v1`` first, ``policy/v1beta1`` on servers before 1.22."""
        for version in ("policy/v1", "policy/v1beta1"):
            body = {"apiVersion": version, "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}}
            try:
                self.request("POST", pods(ns, pod, "eviction"), body)
                return
            except ApiError as e:
                if version == "policy/v1" and e.status in (400, 404, 415, 422):  # 1.20: no policy/v1 kind
                    continue
                raise

    def resize(self, ns: str, pod: str, containers: list[Obj]) -> Obj:
        """PATCH pods/{pod}/resize (in-place resize, Kubernetes ≥ 1.33): ``containers`` is
        ``[{"name": …, "resources": {…}}]``. 404 on servers without the subresource."""
        return self.strategic_patch(pods(ns, pod, "resize"), {"spec": {"containers": containers}})

    def watch(self, path: str, resource_version: str, timeout_s: int = 60,
              label_selector: str | None = None) -> Iterator[tuple[str, Obj]]:
        """(type, object) events after ``resource_version`` until the server ends the stream.
        An ``ERROR`` event (410 Gone: the version is too old) raises :class:`ApiError`."""
        resp = self.request("GET", path, query={"watch": True, "resourceVersion": resource_version,
                                                "timeoutSeconds": timeout_s, "allowWatchBookmarks": True,
                                                "labelSelector": label_selector},
                            timeout_s=timeout_s + 10, stream=True)
        buf = b""
        ended = False
        try:
            for chunk in resp.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        o = ev.get("object") or {}
                        raise ApiError(int(o.get("code") or 500), o.get("reason", ""), o.get("message", ""), o)
                    yield ev["type"], ev["object"]
            ended = True
        finally:
            if not ended:  # left mid-stream: this connection must not go back to the pool
                resp.close()
            resp.release_conn()


def key(obj: Obj) -> str:
    m = obj.get("metadata") or {}
    return f"{m.get('namespace', '')}/{m['name']}"


def _rv(obj: Obj | None) -> int | None:
    """An object's resourceVersion as a number (etcd's revision), or None when it is not one."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


def newer(obj: Obj, than: Obj | None) -> bool:
    """``obj`` is not older than ``than`` (a late watch event must not undo our own write)."""
    a, b = _rv(obj), _rv(than)
    return a is None or b is None or a >= b


@dataclass
class Store:
    """What a reflector knows of one kind: objects by ``namespace/name``."""

    objects: dict[str, Obj]
    resource_version: str = ""


class Reflector:
    """Keeps :attr:`store` equal to the server's objects at ``path``: list, then watch from the
    list's resourceVersion; a cut stream resumes from the last version seen, a 410 or any
    other error re-lists (after ``backoff_s``), and every ``resync_s`` it re-lists anyway."""

    def __init__(self, kube: Kube, path: str, *, label_selector: str | None = None, resync_s: float = 30.0,
                 watch_s: int = 30, backoff_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 transform: Callable[[Obj], Obj] | None = None) -> None:
        self.kube, self.path, self.selector = kube, path, label_selector
        self.transform = transform or (lambda o: o)  # what is kept of each object (client-go's TransformFunc)
        self.resync_s, self.watch_s, self.backoff_s = resync_s, watch_s, backoff_s
        self.clock = clock
        self.store = Store({})
        self.synced = threading.Event()
        self.relists = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self.store.objects.values())

    def get(self, k: str) -> Obj | None:
        with self._lock:
            return self.store.objects.get(k)

    def put(self, obj: Obj) -> None:
        """Record our own write's answer at once (the watch event that follows agrees)."""
        obj = self.transform(obj)
        with self._lock:
            if newer(obj, self.store.objects.get(key(obj))):
                self.store.objects[key(obj)] = obj

    def relist(self) -> None:
        items, rv = self.kube.list(self.path, label_selector=self.selector)
        with self._lock:
            self.store = Store({key(o): self.transform(o) for o in items}, rv)
        self.relists += 1
        self.synced.set()

    def start(self) -> Reflector:
        self._thread = threading.Thread(target=self._run, name=f"reflector {self.path}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last_list = -1e18
        while not self._stop.is_set():
            try:
                if not self.synced.is_set() or self.clock() - last_list >= self.resync_s:
                    self.relist()
                    last_list = self.clock()
                opened, events = self.clock(), 0
                for typ, obj in self.kube.watch(self.path, self.store.resource_version, self.watch_s, self.selector):
                    events += 1
                    self._event(typ, obj)
                    if self._stop.is_set() or self.clock() - last_list >= self.resync_s:
                        break
                else:
                    if not events and self.clock() - opened < min(1.0, self.watch_s):
                        # ended at once and cleanly (a proxy closing streams): not a tight loop of requests
                        self._stop.wait(self.backoff_s)
            except ApiError as e:
                if e.status:  # the server answered (410 Gone, an error): list again
                    log.info("watch %s: %s; re-listing", self.path, e)
                    self.synced.clear()
                else:  # no answer: resume from the last version, as after a cut stream
                    log.info("watch %s ended: %s", self.path, e)
                self._stop.wait(self.backoff_s)
            except Exception as e:  # a cut connection, a reset: resume from the last version
                log.info("watch %s ended: %s", self.path, e)
                self._stop.wait(self.backoff_s)

    def _event(self, typ: str, obj: Obj) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion", "")
        with self._lock:
            if typ != "BOOKMARK":
                if typ == "DELETED":
                    self.store.objects.pop(key(obj), None)
                elif newer(obj, self.store.objects.get(key(obj))):
                    self.store.objects[key(obj)] = self.transform(obj)
            if rv:
                self.store.resource_version = rv

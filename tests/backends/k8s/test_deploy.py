"""deploy/ against a real kube-apiserver 1.20.2 (the session's, with RBAC authorization):

* every overlay renders with ``kubectl kustomize`` and every rendered object applies
  server-side (1.20 serves PodDisruptionBudgets only as policy/v1beta1: the overlays are
  applied with the ``kube-1.20`` component, and without it the PDBs are the only objects
  1.20 refuses);
* the RBAC matrix, through SubjectAccessReview: each component's ServiceAccount may do
  exactly what :data:`NEEDS` says (its SelfSubjectRulesReview holds nothing more) and none
  may read Secrets;
* the components run under their own ServiceAccounts' tokens (TokenRequest): the CLI with
  the args of the rendered manifests, and the controller and scheduler tests of this folder
  replayed with those identities; every request they make is one :data:`NEEDS` names, and
  none is refused.

``python tests/backends/k8s/test_deploy.py`` prints the RBAC table of docs/install.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
# imported here, not in the tests: the name "conftest" is rebound as pytest collects other folders
from conftest import Controller, Kubelet, Scheduler, clear_bound_pods, make_node, publish_slack

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
NS = "reamer"  # the base's namespace
COMPONENTS = ("controller", "scheduler", "agent")
R = "reamer.io"

# What each component does on the API server: (apiGroup, resource) -> (scope, verbs), derived
# from every request in src/reamer/backends/k8s (kube.py's list / watch / get / create /
# replace / merge_patch / delete / bind / evict / resize) and checked below against what the
# components really send. Scope "ns": the install's namespace; "cluster": a cluster-scoped
# resource; "all": a namespaced resource in every namespace. A resource needed in two scopes
# has a list of (scope, verbs).
Need = tuple[str, tuple[str, ...]]
NEEDS: dict[str, dict[tuple[str, str], Need | list[Need]]] = {
    "controller": {
        ("", "nodes"): ("cluster", ("list", "watch")),
        (R, "nodeslacks"): ("cluster", ("list", "watch")),
        (R, "trainingjobs"): ("ns", ("list", "watch")),
        (R, "trainingjobs/status"): ("ns", ("update", "patch")),
        ("", "pods"): [("all", ("list", "watch")), ("ns", ("create", "delete"))],
        ("", "pods/resize"): ("ns", ("patch",)),
        ("", "pods/eviction"): ("ns", ("create",)),
        ("", "services"): ("ns", ("get", "create")),
    },
    "scheduler": {
        ("", "nodes"): ("cluster", ("list", "watch")),
        (R, "nodeslacks"): ("cluster", ("list", "watch")),
        (R, "trainingjobs"): ("ns", ("list", "watch")),
        (R, "inferenceservices"): ("ns", ("list", "watch")),
        (R, "inferenceservices/status"): ("ns", ("patch",)),
        ("", "pods"): [("all", ("list", "watch")), ("ns", ("get", "create", "patch", "delete"))],
        ("", "pods/binding"): ("ns", ("create",)),
        ("", "pods/eviction"): ("ns", ("create",)),
        ("", "pods/resize"): ("ns", ("patch",)),
    },
    "agent": {
        ("", "nodes"): ("cluster", ("get",)),
        ("", "pods"): ("all", ("list",)),
        (R, "nodeslacks"): ("cluster", ("create",)),
        (R, "nodeslacks/status"): ("cluster", ("patch",)),
    },
}

# What no component may do (beyond what it needs), each as (verb, group, resource, namespace);
# namespace "" is cluster-wide. Every other component's needs are checked too.
FORBIDDEN: list[tuple[str, str, str, str]] = [
    *[(v, "", "secrets", ns) for v in ("get", "list", "watch") for ns in (NS, "kube-system", "default", "")],
    ("create", "", "secrets", NS), ("update", "", "secrets", NS),
    *[(v, "", "configmaps", NS) for v in ("get", "list")],
    ("create", "", "pods/exec", NS), ("create", "", "pods/attach", NS), ("create", "", "pods/portforward", NS),
    ("get", "", "pods/log", NS), ("update", "", "pods/status", NS), ("patch", "", "pods/status", NS),
    ("create", "", "pods", "kube-system"), ("create", "", "pods", "default"), ("delete", "", "pods", "default"),
    ("update", "", "pods", NS), ("deletecollection", "", "pods", NS),
    ("create", "", "serviceaccounts/token", NS), ("create", "", "serviceaccounts", NS),
    ("update", "", "nodes", ""), ("patch", "", "nodes", ""), ("delete", "", "nodes", ""),
    ("patch", "", "nodes/status", ""),
    ("create", "", "nodes", ""), ("create", "", "namespaces", ""), ("delete", "", "namespaces", ""),
    ("create", "", "events", NS), ("delete", "", "services", NS), ("update", "", "services", NS),
    ("create", R, "trainingjobs", NS), ("update", R, "trainingjobs", NS), ("patch", R, "trainingjobs", NS),
    ("delete", R, "trainingjobs", NS), ("create", R, "inferenceservices", NS), ("update", R, "inferenceservices", NS),
    ("delete", R, "inferenceservices", NS), ("update", R, "inferenceservices/status", NS),
    ("delete", R, "nodeslacks", ""), ("update", R, "nodeslacks", ""), ("patch", R, "nodeslacks", ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("update", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("delete", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    *[(v, "rbac.authorization.k8s.io", r, "") for r in ("clusterroles", "clusterrolebindings")
      for v in ("create", "update", "bind", "escalate")],
    ("create", "rbac.authorization.k8s.io", "rolebindings", NS), ("create", "rbac.authorization.k8s.io", "roles", NS),
    ("impersonate", "", "users", ""), ("impersonate", "", "groups", ""), ("impersonate", "", "serviceaccounts", NS),
    ("create", "apps", "deployments", NS), ("update", "apps", "deployments", NS), ("update", "apps", "daemonsets", NS),
    ("create", "policy", "poddisruptionbudgets", NS), ("delete", "policy", "poddisruptionbudgets", NS),
    ("create", "certificates.k8s.io", "certificatesigningrequests", ""),
    ("create", "", "persistentvolumes", ""),
]


def entries(component: str) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(group, resource, scope, verbs) of every need of the component."""
    return [(g, r, scope, verbs) for (g, r), e in NEEDS[component].items()
            for scope, verbs in (e if isinstance(e, list) else [e])]


def needed(component: str) -> set[tuple[str, str, str, str]]:
    """(verb, group, resource, namespace) the component must be allowed."""
    return {(v, group, res, NS if scope == "ns" else "") for group, res, scope, verbs in entries(component)
            for v in verbs}


def checks() -> list[tuple[str, str, str, str]]:
    """Every request the matrix asks about: all needs (in the namespace, and the namespaced
    ones elsewhere too), and the forbidden list."""
    out = set(FORBIDDEN)
    for c in COMPONENTS:
        for v, g, r, ns in needed(c):
            out.add((v, g, r, ns))
            if ns:
                out.add((v, g, r, "default"))  # a Role in the namespace grants nothing elsewhere
                out.add((v, g, r, ""))
    return sorted(out)


def allowed_expected(component: str, check: tuple[str, str, str, str]) -> bool:
    v, g, r, ns = check
    return any((group, res) == (g, r) and v in verbs and (scope in ("cluster", "all") or ns == NS)
               for group, res, scope, verbs in entries(component))


def rbac_table() -> str:
    """The RBAC table of docs/install.md (from :data:`NEEDS`)."""
    rows = sorted({k for n in NEEDS.values() for k in n}, key=lambda k: (k[0] != "", k[0], k[1]))
    scope = {"ns": "namespace", "cluster": "cluster", "all": "all namespaces"}
    out = ["| API group | resource | controller | scheduler | agent |", "|---|---|---|---|---|"]
    for g, r in rows:
        cells = []
        for c in COMPONENTS:
            cells.append("; ".join(f"{', '.join(verbs)} ({scope[sc]})" for gg, rr, sc, verbs in entries(c)
                                   if (gg, rr) == (g, r)))
        out.append(f"| {g or 'core'} | {r} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# --------------------------------------------------------------------------- rendering
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").is_file())


def kustomize(path: Path) -> list[dict]:
    p = subprocess.run([KUBECTL, "kustomize", str(path)], check=False, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def combine(tmp: Path, resources: list[Path], components: list[Path] = ()) -> Path:
    """A kustomization in ``tmp`` made of ``resources`` and ``components``, as an operator's
    own overlay would be (with its ``namespace:``, which the components' objects need;
    kustomize wants relative paths)."""
    tmp.mkdir(parents=True, exist_ok=True)
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NS,
           "resources": [os.path.relpath(p, tmp) for p in resources]}
    if components:
        doc["components"] = [os.path.relpath(p, tmp) for p in components]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return tmp


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(doc: dict) -> dict:
    [c] = doc["spec"]["template"]["spec"]["containers"]
    return c


def test_deploy_crds_are_the_packages():
    """deploy/base/crds is a copy kustomize can load (it refuses files outside the
    kustomization's folder, symlinks too); it must not drift from what install-crds installs."""
    pkg = REPO / "src" / "reamer" / "data" / "crds"
    ours = DEPLOY / "base" / "crds"
    assert sorted(f.name for f in ours.glob("*.yaml")) == sorted(f.name for f in pkg.glob("*.yaml"))
    for f in pkg.glob("*.yaml"):
        assert (ours / f.name).read_text() == f.read_text(), f"run: cp {f.relative_to(REPO)} {ours.relative_to(REPO)}/"


def test_the_dockerfile_copies_what_exists_and_installs_from_the_lock():
    """No engine here builds it: what can be checked without one is that every file it copies
    exists and is kept by its .dockerignore, and that it installs with the lock's versions."""
    text = (DEPLOY / "Dockerfile").read_text()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    copied = [w for ln in text.splitlines() if ln.startswith("COPY ") for w in ln.split()[1:-1]]
    assert copied and all((REPO / c).exists() and f"!{c.rstrip('/')}" in [i.rstrip("/") for i in ignore]
                          for c in copied), copied
    assert "-c requirements-lock.txt" in text and "USER 65532:65532" in text
    assert 'ENTRYPOINT ["reamer"]' in text


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_install(overlay):
    from reamer import __version__
    from reamer.cli.k8s import crds

    docs = kustomize(DEPLOY / "overlays" / overlay)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == sorted([
        *(f"CustomResourceDefinition/{c['metadata']['name']}" for c in crds()), f"Namespace/{NS}",
        *(f"{k}/reamer-{c}" for c in COMPONENTS for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")),
        *(f"{k}/reamer-{c}" for c in ("controller", "scheduler") for k in ("Role", "RoleBinding", "Deployment",
                                                                            "PodDisruptionBudget")),
        "DaemonSet/reamer-agent", *(f"Service/reamer-{c}-metrics" for c in COMPONENTS)])
    assert {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "CustomResourceDefinition"} == \
        {c["metadata"]["name"]: c["spec"] for c in crds()}
    for d in docs:
        if d["kind"] not in ("CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NS, d["metadata"]
    for b in [*by_kind(docs, "ClusterRoleBinding").values(), *by_kind(docs, "RoleBinding").values()]:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": b["metadata"]["name"], "namespace": NS}]

    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "DaemonSet")}
    assert set(workloads) == {f"reamer-{c}" for c in COMPONENTS}
    for name, w in workloads.items():
        comp = name.removeprefix("reamer-")
        spec = w["spec"]["template"]["spec"]
        c = container(w)
        assert spec["serviceAccountName"] == name
        assert c["image"] == f"reamer:{'dev' if overlay == 'dev' else __version__}"
        assert c["args"][c["args"].index("k8s") + 1] == comp
        port = int(c["args"][c["args"].index("--metrics-port") + 1])
        assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        assert c["args"][c["args"].index("--metrics-host") + 1] == "0.0.0.0"  # kubelet probes the pod IP
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert spec["securityContext"]["runAsNonRoot"] and "memory" in c["resources"]["limits"]
        if w["kind"] == "Deployment":
            assert w["spec"]["replicas"] == 1 and w["spec"]["strategy"] == {"type": "Recreate"}  # no leader election
            assert c["args"][c["args"].index("--namespace") + 1] == "$(POD_NAMESPACE)"
    ag = workloads["reamer-agent"]
    spec, c = ag["spec"]["template"]["spec"], container(ag)
    assert spec["hostPID"] and {"operator": "Exists"} in spec["tolerations"]
    assert c["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    assert c["args"][c["args"].index("--node") + 1] == "$(NODE_NAME)"
    vols = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols == {"cgroup": "/sys/fs/cgroup", "proc": "/proc"}
    assert all(mounts[v]["readOnly"] for v in vols)
    assert c["args"][c["args"].index("--cgroup-root") + 1] == mounts["cgroup"]["mountPath"]
    assert c["args"][c["args"].index("--proc-root") + 1] == mounts["proc"]["mountPath"]
    if overlay == "prod":
        for w in workloads.values():
            assert set(container(w)["resources"]["limits"]) == {"cpu", "memory"}


@needs_kubectl
def test_a_namespace_of_ones_own_moves_everything(tmp_path):
    """An operator's overlay that sets ``namespace:`` moves every object, the bindings'
    subjects with them, and the components manage the namespace they run in."""
    doc = yaml.safe_load((combine(tmp_path, [DEPLOY / "overlays" / "prod"]) / "kustomization.yaml").read_text())
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({**doc, "namespace": "ml-team"}))
    docs = kustomize(tmp_path)
    text = yaml.safe_dump_all(docs)
    assert "namespace: reamer\n" not in text
    assert "Namespace/ml-team" in {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    for b in [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        assert [s["namespace"] for s in b["subjects"]] == ["ml-team"]


# --------------------------------------------------------------------------- applying
def apply(devcluster, path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``kubectl apply --server-side`` of a kustomization, as the cluster's admin."""
    docs = kustomize(path)
    return subprocess.run([KUBECTL, "--kubeconfig", str(devcluster.kubeconfig()), "apply", "--server-side",
                           "--field-manager", "reamer-deploy-test", "-f", "-", *extra],
                          input=yaml.safe_dump_all(docs), check=False, capture_output=True, text=True, timeout=120)


def for_1_20(tmp: Path, overlay: str, *components: str) -> Path:
    return combine(tmp, [DEPLOY / "overlays" / overlay],
                   [DEPLOY / "components" / c for c in ("kube-1.20", *components)])


# A ServiceMonitor CRD with a schema of only the fields deploy/components/monitoring uses, and
# no unknown fields kept: a misspelt field would be pruned, and the read-back below would differ.
SERVICEMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor",
                       "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {
                     "type": "object", "required": ["selector", "endpoints"], "properties": {
                         "selector": {"type": "object", "properties": {"matchLabels": {
                             "type": "object", "additionalProperties": {"type": "string"}}}},
                         "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                             "port": {"type": "string"}, "path": {"type": "string"}, "interval": {"type": "string"},
                             "relabelings": {"type": "array", "items": {"type": "object", "properties": {
                                 "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                 "targetLabel": {"type": "string"}}}}}}}}}}}}}]},
}


@needs_kubectl
def test_overlays_as_shipped_differ_on_1_20_only_in_their_pdbs(devcluster, kube):
    """policy/v1 (1.21+, the only PDB version 1.25+ serves) is the base's; 1.20 refuses those
    two objects and nothing else (a server-side dry run)."""
    if kube.get_or_none(f"/api/v1/namespaces/{NS}") is None:  # a dry run creates no namespace to check in
        kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    for overlay in OVERLAYS:
        p = apply(devcluster, DEPLOY / "overlays" / overlay, "--dry-run=server")
        errors = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode != 0 and errors, p.stderr
        assert all("PodDisruptionBudget" in ln and "policy/v1" in ln for ln in errors if "mapping" in ln), p.stderr
        assert sum('kind "PodDisruptionBudget" in version "policy/v1"' in ln for ln in errors) == 2, p.stderr
        assert p.stdout.count("(server dry run)") == len(kustomize(DEPLOY / "overlays" / overlay)) - 2


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_applies_server_side(devcluster, kube, tmp_path, overlay):
    path = for_1_20(tmp_path / overlay, overlay)
    docs = kustomize(path)
    p = apply(devcluster, path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("serverside-applied") == len(docs)
    for d in docs:
        ns = d["metadata"].get("namespace")
        got = kube.get(api_path(d["apiVersion"], d["kind"], d["metadata"]["name"], ns))
        assert got["metadata"]["uid"]
        if d["kind"] == "PodDisruptionBudget":
            assert got["apiVersion"] == "policy/v1beta1" and got["spec"]["maxUnavailable"] == 1
        if d["kind"] in ("Deployment", "DaemonSet"):
            assert container(got)["args"] == container(d)["args"]
    p = apply(devcluster, path)  # again: nothing changes, nothing conflicts
    assert p.returncode == 0 and p.stdout.count("serverside-applied") == len(docs), p.stderr


@needs_kubectl
def test_the_servicemonitors_apply_where_the_operator_is(devcluster, kube, tmp_path):
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    if kube.get_or_none(f"{base}/servicemonitors.monitoring.coreos.com") is None:
        kube.create(base, SERVICEMONITOR_CRD)
    deadline = time.monotonic() + 30
    while not any(c["type"] == "Established" and c["status"] == "True" for c in (kube.get(
            f"{base}/servicemonitors.monitoring.coreos.com").get("status") or {}).get("conditions") or []):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    path = for_1_20(tmp_path, "prod", "monitoring")
    docs = kustomize(path)
    mons = by_kind(docs, "ServiceMonitor")
    assert set(mons) == {f"reamer-{c}" for c in COMPONENTS}
    assert {m["metadata"]["namespace"] for m in mons.values()} == {NS}  # beside the Services they select
    services = by_kind(docs, "Service")
    for name, m in mons.items():  # each selects its component's metrics Service, by the port's name
        [svc] = [s for s in services.values()
                 if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert svc["metadata"]["name"] == f"{name}-metrics"
        assert {e["port"] for e in m["spec"]["endpoints"]} == {p["name"] for p in svc["spec"]["ports"]}
    p = apply(devcluster, path)
    assert p.returncode == 0, p.stderr
    for name, m in mons.items():
        got = kube.get(f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/servicemonitors/{name}")
        assert got["spec"] == m["spec"]  # nothing pruned: every field is one the schema knows


def api_path(api_version: str, kind: str, name: str, ns: str | None) -> str:
    plural = {"Namespace": "namespaces", "CustomResourceDefinition": "customresourcedefinitions",
              "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "Role": "roles",
              "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings", "Service": "services",
              "Deployment": "deployments", "DaemonSet": "daemonsets", "PodDisruptionBudget": "poddisruptionbudgets",
              "ServiceMonitor": "servicemonitors"}[kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return base + (f"/namespaces/{ns}" if ns else "") + f"/{plural}/{name}"


# --------------------------------------------------------------------------- RBAC
@pytest.fixture(scope="module")
def installed(devcluster, tmp_path_factory):
    """The prod overlay applied (for 1.20), and a kubeconfig per component holding a token
    of its ServiceAccount (TokenRequest), so requests carry exactly its identity."""
    if KUBECTL is None:
        pytest.skip("no kubectl on PATH")
    from reamer.backends.k8s.kube import Kube

    tmp = tmp_path_factory.mktemp("deploy")
    p = apply(devcluster, for_1_20(tmp / "k", "prod"))
    assert p.returncode == 0, p.stderr
    admin = Kube.connect(str(devcluster.kubeconfig()))
    configs = {}
    for c in COMPONENTS:
        tr = admin.create(f"/api/v1/namespaces/{NS}/serviceaccounts/reamer-{c}/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": 3600}})
        doc = yaml.safe_load(devcluster.kubeconfig().read_text())
        doc["users"] = [{"name": f"reamer-{c}", "user": {"token": tr["status"]["token"]}}]
        doc["contexts"][0]["context"]["user"] = f"reamer-{c}"
        configs[c] = tmp / f"kubeconfig-{c}"
        configs[c].write_text(yaml.safe_dump(doc))
    return configs


def access_review(kube, user: str, check: tuple[str, str, str, str]) -> bool:
    v, g, r, ns = check
    res, _, sub = r.partition("/")
    attrs = {"verb": v, "group": g, "resource": res, "subresource": sub, "namespace": ns}
    sa_ns = user.split(":")[2]
    doc = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}",
                                          "system:authenticated"], "resourceAttributes": attrs}})
    return bool(doc["status"].get("allowed"))


def test_rbac_matrix(kube, installed, capsys):
    """Every (verb, resource, namespace) a component needs is allowed to its ServiceAccount,
    everything else in the matrix is denied: other components' needs, its own needs outside
    its namespace, and the forbidden list (Secrets above all)."""
    wrong, table = [], []
    for check in checks():
        row = []
        for c in COMPONENTS:
            got = access_review(kube, f"system:serviceaccount:{NS}:reamer-{c}", check)
            want = allowed_expected(c, check)
            row.append("allowed" if got else "denied")
            if got != want:
                wrong.append((c, check, "allowed" if got else "denied"))
        table.append((check, row))
    with capsys.disabled():
        if os.environ.get("REAMER_PRINT_RBAC"):
            print("\n| verb | resource | namespace | " + " | ".join(COMPONENTS) + " |")
            for (v, g, r, ns), row in table:
                print(f"| {v} | {g + '/' if g else ''}{r} | {ns or '(cluster)'} | " + " | ".join(row) + " |")
    assert not wrong, wrong
    assert len(table) >= 100
    for c in COMPONENTS:  # no component reads a Secret, anywhere
        user = f"system:serviceaccount:{NS}:reamer-{c}"
        assert not any(access_review(kube, user, (v, "", "secrets", ns)) for v in ("get", "list", "watch")
                       for ns in (NS, "default", "kube-system", ""))


BASELINE = {("create", "authorization.k8s.io", "selfsubjectaccessreviews"),
            ("create", "authorization.k8s.io", "selfsubjectrulesreviews")}  # every authenticated user's


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_service_account_holds_exactly_its_needs(installed, component):
    """The server's own account of what the token may do (SelfSubjectRulesReview), in the
    install's namespace and in another: exactly NEEDS, plus what every user has."""
    from reamer.backends.k8s.kube import Kube

    sa = Kube.connect(str(installed[component]))
    for ns in (NS, "default"):
        doc = sa.create("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                         "spec": {"namespace": ns}})
        st = doc["status"]
        assert not st.get("incomplete"), st
        got = {(v, g, r) for rule in st["resourceRules"] for v in rule["verbs"] for g in rule.get("apiGroups", [])
               for r in rule.get("resources", []) if not rule.get("resourceNames")}
        assert not any("*" in x for t in got for x in t), got
        want = {(v, g, r) for v, g, r, n in needed(component) if ns == NS or n == ""}
        assert got - BASELINE == want, (ns, sorted(got - BASELINE - want), sorted(want - got))


def test_the_docs_example_job_is_one_the_cluster_and_the_controller_accept(kube, installed):
    """docs/install.md's TrainingJob: the API server's schema takes it (a server-side dry
    run) and the controller finds nothing wrong with it."""
    from reamer.backends.k8s import objects as ko
    from reamer.backends.k8s.kube import custom
    from reamer.models.profiles import shipped_profiles

    text = (REPO / "docs" / "install.md").read_text()
    [block] = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:] if b.startswith("# example: a TrainingJob")]
    tj = yaml.safe_load(block)
    got = kube.request("POST", custom("trainingjobs", tj["metadata"]["namespace"]), tj, query={"dryRun": "All"})
    assert {k: got["spec"][k] for k in tj["spec"]} == tj["spec"]  # nothing pruned (the CRD adds defaults)
    spec = ko.training_job(got, shipped_profiles().models)
    assert spec.id == "resnet"


def test_docs_show_the_rbac_table():
    text = (REPO / "docs" / "install.md").read_text()
    assert rbac_table() in text, "docs/install.md: paste `python tests/backends/k8s/test_deploy.py`:\n" + rbac_table()


# --------------------------------------------------------------------------- running as the ServiceAccounts
def rbac_attrs(method: str, path: str, watch: bool) -> tuple[str, str, str, str]:
    """The (verb, group, resource[/sub], namespace) RBAC sees for a request."""
    parts = path.split("?")[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    ns = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        ns, rest = rest[1], rest[2:]
    res = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method) or \
        ("watch" if watch else "get" if len(rest) > 1 else "list")
    return verb, group, res, ns


def recording_kube(kubeconfig: Path):
    """A Kube whose every request is recorded as (method, path, watch, HTTP status)."""
    from reamer.backends.k8s.kube import ApiError, Kube

    class Recording(Kube):
        calls: list

        def request(self, method, path, body=None, query=None, **kw):
            status = None
            try:
                out = super().request(method, path, body, query, **kw)
                status = 200
                return out
            except ApiError as e:
                status = e.status
                raise
            finally:
                self.calls.append((method, path, bool((query or {}).get("watch")), status))

    k = Recording.connect(str(kubeconfig))
    k.calls = []
    return k


def _reset(kube) -> None:
    """The namespace as the install left it, and no nodes or NodeSlacks (as the ``ns`` fixture does)."""
    from reamer.backends.k8s import objects as ko
    from reamer.backends.k8s.kube import custom, nodes, pods, services

    for plural in ("trainingjobs", "inferenceservices"):
        for o in kube.list(custom(plural, NS))[0]:
            kube.delete(custom(plural, NS, ko.meta(o)["name"]))
    for p in kube.list(pods(NS))[0]:
        kube.delete(pods(NS, ko.meta(p)["name"]), grace_s=0)
    clear_bound_pods(kube)
    for s in kube.list(services(NS))[0]:
        if not ko.meta(s)["name"].startswith("reamer-"):
            kube.delete(services(NS, ko.meta(s)["name"]))
    for n in kube.list(nodes())[0]:
        kube.delete(nodes(ko.meta(n)["name"]))
    for s in kube.list(custom("nodeslacks"))[0]:
        kube.delete(custom("nodeslacks", name=ko.meta(s)["name"]))


def _check_calls(component: str, calls: list) -> set:
    assert calls, "no request recorded"
    refused = [c for c in calls if c[3] in (401, 403)]
    assert not refused, refused
    attrs = {rbac_attrs(m, p, w) for m, p, w, _ in calls}
    outside = {a for a in attrs if not allowed_expected(component, a)}
    assert not outside, f"{component} sent requests NEEDS does not name: {sorted(outside)}"
    return attrs


EXERCISED: dict[str, set] = {c: set() for c in COMPONENTS}  # RBAC attributes of the requests seen below

REPLAYED = [  # (module, test, its keyword arguments beyond kube / ns / components)
    ("test_k8s_controller", "test_trainingjob_gets_pods_of_requested_shape", {}),
    ("test_k8s_controller", "test_network_bound_job_gets_a_ps", {}),
    ("test_k8s_controller", "test_resize_falls_back_to_recreate_on_1_20", {"fallback": "RecreatePod"}),
    ("test_k8s_controller", "test_semantically_invalid_jobs_get_a_condition_and_the_controller_keeps_running", {}),
    ("test_k8s_scheduler", "test_inference_pods_are_bound_only_where_an_agent_reports_slack", {}),
    ("test_k8s_scheduler", "test_growing_training_moves_inference_first_make_before_break", {}),
    ("test_k8s_scheduler", "test_eviction_honours_a_pod_disruption_budget", {}),
    (None, "shrink_a_replica", {}),
]

# Requests the replays do not send, and why; the matrix above still checks they are allowed.
UNEXERCISED = {
    "controller": {
        ("create", "", "pods/eviction", NS): "evicts inference pods still in a job's way after --yield-timeout "
                                             "(test_k8s_scheduler, run as admin)",
    },
    "scheduler": {
        ("get", "", "pods", NS): "re-reads a replica pod whose create answered 409: a scheduler restarted between "
                                 "create and bind (test_k8s_restart's after-create, run as admin)",
        ("patch", "", "pods", NS): "records a replica's new cores in its annotation once an in-place resize "
                                   "succeeded (Kubernetes >= 1.33; test_k8s_kmock)",
    },
}


def shrink_a_replica(kube, ns, components):
    """A replica shrunk: ``PATCH pods/resize`` first (404 on 1.20), then a make-before-break
    replacement of the new size."""
    from test_k8s_scheduler import fresh, inference_service, replica_pods

    from reamer.backends.k8s import objects as ko
    from reamer.backends.k8s.kube import custom
    from reamer.domain.inference import ResizeReplica

    make_node(kube, "gpu-a", 16)
    fresh(kube, "gpu-a")
    kube.create(custom("inferenceservices", ns), inference_service("vgg", rate=20.0))
    s = components("scheduler")
    s.round()
    Kubelet(kube, ns).sync()
    [old] = replica_pods(kube, ns, "vgg")
    s.inf.sync()
    s.backend.observe(time.time())
    rid = next(iter(s.backend.pod_of))
    s.backend.actuate([ResizeReplica(rid, 1.0)], time.time())
    new = [p for p in replica_pods(kube, ns, "vgg") if ko.annotations(p).get(ko.REPLACES) == ko.meta(old)["name"]]
    assert new and new[0]["spec"]["nodeName"] == "gpu-a" and ko.annotations(new[0])[ko.CORES] == "1.0"


@pytest.mark.parametrize(("module", "name", "kw"), REPLAYED, ids=[r[1].removeprefix("test_") for r in REPLAYED])
def test_component_tests_pass_under_the_service_accounts(kube, installed, module, name, kw):
    """This folder's controller and scheduler tests, with each component's requests made with
    its own ServiceAccount's token in the install's namespace (the test plays the kubelet and
    the agent as admin)."""
    import importlib
    import inspect


    mod = importlib.import_module(module) if module else sys.modules[__name__]
    kubes = {c: recording_kube(installed[c]) for c in ("controller", "scheduler")}
    made = []

    def components(kind: str, **kw_):
        c = (Scheduler if kind == "scheduler" else Controller)(kubes[kind], NS, **kw_)
        made.append(c)
        return c

    _reset(kube)
    params = set(inspect.signature(getattr(mod, name)).parameters)
    args = {"kube": kube, "ns": NS, **kw}
    if "components" in params:
        args["components"] = components
    if "controller" in params:
        args["controller"] = lambda **k: components("controller", **k)
    try:
        getattr(mod, name)(**args)
    finally:
        for c in made:
            c.stop()
        _reset(kube)
    for c, k in kubes.items():
        if k.calls:
            EXERCISED[c] |= _check_calls(c, k.calls)


def test_the_agent_publishes_under_its_service_account(kube, installed):

    from reamer.backends.k8s.agent import Agent
    from reamer.backends.k8s.kube import custom

    _reset(kube)
    make_node(kube, "deploy-b", 8)
    sa = recording_kube(installed["agent"])
    try:
        agent = Agent(sa, "deploy-b", cgroup_root=Path("/sys/fs/cgroup"))
        agent.round()  # the first creates the NodeSlack (owned by the Node)
        agent.round()
        st = kube.get(custom("nodeslacks", name="deploy-b"))
        assert st["metadata"]["ownerReferences"][0]["name"] == "deploy-b" and st["status"]["cores"] == 8.0
    finally:
        _reset(kube)
    EXERCISED["agent"] |= _check_calls("agent", sa.calls)


def _component_argv(doc: dict, kubeconfig: Path, node: str) -> list[str]:
    """The rendered container's args, run here: its env and host paths resolved, the
    metrics port any free one on loopback, its ServiceAccount's kubeconfig, rounds every 0.3 s."""
    args = [a.replace("$(POD_NAMESPACE)", NS).replace("$(NODE_NAME)", node) for a in container(doc)["args"]]
    args = [a.removeprefix("/host") if a.startswith("/host/") else a for a in args]
    args[args.index("--metrics-port") + 1] = "0"
    args[args.index("--metrics-host") + 1] = "127.0.0.1"
    args[args.index("--interval") + 1] = "0.3"
    return [str(Path(sys.executable).parent / "reamer"), *args, "--kubeconfig", str(kubeconfig)]


def test_the_rendered_components_run_under_their_service_accounts(kube, installed):
    """Each component as its manifest starts it (the same args), with its ServiceAccount's
    token: it serves /healthz and /readyz where the probes look, runs its rounds without a
    refused request, and does its job: pods for a TrainingJob, a bound replica, a NodeSlack."""
    from test_k8s_controller import training_job
    from test_k8s_scheduler import inference_service

    from reamer.backends.k8s.kube import custom, pods

    _reset(kube)
    docs = kustomize(DEPLOY / "overlays" / "prod")
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "DaemonSet")}
    make_node(kube, "deploy-a", 32)
    publish_slack(kube, "deploy-a", reported_at=time.time() + 3600, cores=32)  # fresh for the whole test
    kube.create(custom("trainingjobs", NS), training_job("deployed", ps=1, workers=1))
    kube.create(custom("inferenceservices", NS), inference_service("served", rate=20.0))
    try:
        for comp in ("controller", "scheduler", "agent"):
            argv = _component_argv(workloads[f"reamer-{comp}"], installed[comp], "deploy-a")
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                port = json.loads(p.stdout.readline())["metrics_port"]
                base = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 60
                while True:
                    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
                    rounds = [float(ln.split()[-1]) for ln in text.splitlines()
                              if ln.startswith(f'reamer_rounds_total{{component="{comp}"}}')]
                    if rounds and rounds[0] >= 3:
                        break
                    assert time.monotonic() < deadline, text
                    time.sleep(0.2)
                for path in ("/healthz", "/readyz"):
                    assert urllib.request.urlopen(base + path, timeout=5).status == 200
                errors = [ln for ln in text.splitlines() if ln.startswith("reamer_round_errors_total{")]
                assert all(ln.endswith(" 0.0") for ln in errors), errors
            finally:
                p.terminate()
                _, err = p.communicate(timeout=30)
            assert p.returncode == 0, err[-3000:]
            assert "403" not in err and "Forbidden" not in err, err[-3000:]
        tj = kube.get(custom("trainingjobs", NS, "deployed"))
        assert tj["status"]["phase"] == "Running"
        job = [x for x in kube.list(pods(NS), label_selector="reamer.io/job=deployed")[0]]
        assert len(job) == 2 and {x["spec"]["nodeName"] for x in job} == {"deploy-a"}
        reps = kube.list(pods(NS), label_selector="reamer.io/service=served")[0]
        assert reps and all(x["spec"].get("nodeName") == "deploy-a" for x in reps)
        slack = kube.get(custom("nodeslacks", name="deploy-a"))["status"]
        assert slack["cores"] == 32.0 and {e["name"] for e in slack["pods"]} >= {x["metadata"]["name"] for x in job}
    finally:
        _reset(kube)


def test_every_permission_granted_is_used():
    """What the replayed tests sent covers NEEDS, but for the paths 1.20 or the replays do not
    reach (:data:`UNEXERCISED`, each with why): no permission is granted for nothing."""
    if not all(EXERCISED.values()):
        pytest.skip("run with the tests above (they record what the components send)")
    unused = {c: needed(c) - EXERCISED[c] for c in COMPONENTS}
    assert unused == {c: set(UNEXERCISED.get(c, {})) for c in COMPONENTS}


if __name__ == "__main__":
    print(rbac_table())

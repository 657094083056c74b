"""deploy/helm/reamer rendered by Helm's own engine (the Helm 4 Go SDK, through
helm-python-sdk: no ``helm`` binary comes from the registries here):

* with its defaults the chart renders exactly the objects of the kustomize prod overlay,
  which test_deploy.py applies to the real API server and whose RBAC it checks; with
  ``monitoring`` on, those of prod plus the monitoring component;
* its values are checked against values.schema.json (a wrong value is refused, naming it);
* its CRDs and Grafana dashboard are the package's;
* the joint controller (``controller.harvest``) gets the scheduler's permissions and needs the
  scheduler off;
* the render for Kubernetes 1.20 is accepted by the real kube-apiserver 1.20.2 (server-side
  dry run: nothing of the deploy tests' objects changes).
"""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml

# imported here, not in the tests: the name "conftest" is rebound as pytest collects other folders
from test_deploy import DEPLOY, KUBECTL, NS, combine, kustomize, needs_kubectl

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (pip install 'helm-python-sdk>=0.2.2')")

CHART = DEPLOY / "helm" / "reamer"
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")


def render(values: dict | None = None, namespace: str = NS) -> list[dict]:
    out = helm.Chart.load(CHART).render(values=values or {}, name="reamer", namespace=namespace)
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def key(d: dict) -> str:
    return f"{d['kind']}/{d['metadata'].get('namespace', '')}/{d['metadata']['name']}"


def strip(docs: list[dict]) -> dict[str, dict]:
    """Objects by kind/namespace/name, without Helm's own labels, the Namespace and the CRDs
    (Helm installs crds/ apart, and the release's namespace is Helm's to create)."""
    out = {}
    for d in copy.deepcopy(docs):
        if d["kind"] in ("Namespace", "CustomResourceDefinition"):
            continue
        for k in HELM_LABELS:
            d["metadata"].get("labels", {}).pop(k, None)
        out[key(d)] = d
    return out


def diff(a: dict[str, dict], b: dict[str, dict]) -> list[str]:
    lines = [f"only in the chart: {k}" for k in sorted(set(a) - set(b))]
    lines += [f"only in kustomize: {k}" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        if a[k] != b[k]:
            lines.append(f"{k}:\n  chart:     {a[k]}\n  kustomize: {b[k]}")
    return lines


@needs_kubectl
def test_the_defaults_render_the_prod_overlay():
    got, want = strip(render()), strip(kustomize(DEPLOY / "overlays" / "prod"))
    assert not diff(got, want), "\n".join(diff(got, want))
    for d in render():
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NS, key(d)
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


@needs_kubectl
def test_with_monitoring_it_renders_prod_and_the_monitoring_component(tmp_path):
    got = strip(render({"monitoring": {"serviceMonitor": True, "grafanaDashboard": True}}))
    want = strip(kustomize(combine(tmp_path, [DEPLOY / "overlays" / "prod"], [DEPLOY / "components" / "monitoring"])))
    assert not diff(got, want), "\n".join(diff(got, want))
    assert "ConfigMap/reamer/reamer-grafana-dashboard" in got


def test_the_charts_crds_and_dashboard_are_the_packages():
    pkg = DEPLOY.parent / "src" / "reamer" / "data" / "crds"
    ours = CHART / "crds"
    assert sorted(f.name for f in ours.glob("*.yaml")) == sorted(f.name for f in pkg.glob("*.yaml"))
    for f in pkg.glob("*.yaml"):
        assert (ours / f.name).read_text() == f.read_text(), f"run: cp {f} {ours}/"
    src = DEPLOY / "components" / "monitoring" / "grafana-dashboard.json"
    assert (CHART / "files" / "grafana-dashboard.json").read_text() == src.read_text(), f"run: cp {src} {CHART}/files/"
    assert {c["name"] for c in helm.Chart.load(CHART).crds} == {f"crds/{f.name}" for f in pkg.glob("*.yaml")}


@pytest.mark.parametrize("values,field", [
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"controller": {"policy": "reamer"}}, "policy"),
    ({"scheduler": {"policy": "nearchus"}}, "policy"),
    ({"controller": {"interval": 0}}, "interval"),
    ({"agent": {"metricsPort": 70000}}, "metricsPort"),
    ({"controller": {"resources": {"requests": {"cpu": "lots"}}}}, "cpu"),
    ({"controler": {"enabled": False}}, "controler"),
    ({"logLevel": "verbose"}, "logLevel"),
    ({"agent": {"kubeletCgroupRoot": "kubelet"}}, "kubeletCgroupRoot"),
], ids=["pull-policy", "training-policy", "harvest-policy", "interval", "port", "quantity", "unknown-key",
        "log-level", "cgroup-root"])
def test_the_values_schema_refuses_a_wrong_value_and_names_it(values, field):
    chart = helm.Chart.load(CHART)
    with pytest.raises(helm.HelmError, match=field):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmError, match=field):
        chart.render(values=values, name="reamer", namespace=NS)


def test_the_chart_lints_clean():
    report = helm.lint(CHART, strict=True, namespace=NS)
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report


def test_the_joint_controller_needs_the_scheduler_off_and_gets_its_permissions():
    with pytest.raises(helm.HelmError, match="scheduler.enabled=false"):
        render({"controller": {"harvest": "reamer"}})
    docs = {key(d): d for d in render({"controller": {"harvest": "reamer"}, "scheduler": {"enabled": False}})}
    assert "Deployment/reamer/reamer-scheduler" not in docs and "ServiceAccount/reamer/reamer-scheduler" not in docs
    args = docs["Deployment/reamer/reamer-controller"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--harvest") + 1] == "reamer"
    for kind, ns in (("RoleBinding", NS), ("ClusterRoleBinding", "")):
        subjects = docs[f"{kind}/{ns}/reamer-scheduler"]["subjects"]
        assert [s["name"] for s in subjects] == ["reamer-controller"]


def test_options_reach_the_components_args():
    docs = {key(d): d for d in render({"controller": {"policy": "optimus", "interval": 30, "dashboardPort": 8081},
                                       "logLevel": "debug", "image": {"repository": "r.example/reamer", "tag": "1.2"}},
                                      namespace="ml")}
    c = docs["Deployment/ml/reamer-controller"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "r.example/reamer:1.2"
    a = c["args"]
    assert a[a.index("--policy") + 1] == "optimus" and a[a.index("--interval") + 1] == "30"
    assert a[a.index("--dashboard-port") + 1] == "8081" and a[a.index("--log-level") + 1] == "debug"
    assert {p["name"] for p in c["ports"]} == {"metrics", "dashboard"}
    assert {s["namespace"] for s in docs["ClusterRoleBinding//reamer-agent"]["subjects"]} == {"ml"}
    assert "--kubelet-cgroup-root" not in docs["DaemonSet/ml/reamer-agent"]["spec"]["template"]["spec"]["containers"][0][
        "args"]  # auto: the agent's default
    docs = {key(d): d for d in render({"agent": {"kubeletCgroupRoot": "/kubelet"}})}
    a = docs["DaemonSet/reamer/reamer-agent"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert a[a.index("--kubelet-cgroup-root") + 1] == "/kubelet"


@needs_kubectl
def test_the_render_for_1_20_is_accepted_by_the_real_api_server(devcluster, kube):
    """Server-side apply, dry run: the API server validates every object (schemas, RBAC
    objects, policy/v1beta1 PDBs) and persists nothing."""
    ns = "reamer-helm"
    if kube.get_or_none(f"/api/v1/namespaces/{ns}") is None:
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    docs = render({"podDisruptionBudgetApiVersion": "policy/v1beta1"}, namespace=ns)
    p = subprocess.run([KUBECTL, "--kubeconfig", str(devcluster.kubeconfig()), "apply", "--server-side",
                        "--dry-run=server", "--force-conflicts", "--field-manager", "reamer-helm-test", "-f", "-"],
                       input=yaml.safe_dump_all(docs), check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("serverside-applied (server dry run)") == len(docs), p.stdout
    assert {d["apiVersion"] for d in docs if d["kind"] == "PodDisruptionBudget"} == {"policy/v1beta1"}


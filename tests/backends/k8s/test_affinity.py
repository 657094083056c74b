"""Node selection of pod templates, as kube-scheduler's NodeAffinity and TaintToleration filters
decide it (pure: the nodes are plain objects; the controller's use of it is tested against the
real API server in test_k8s_controller.py)."""

from __future__ import annotations

import pytest

from reamer.backends.k8s.affinity import Eligibility, node_filter
from reamer.backends.k8s.objects import SpecError


def _node(name, labels=None, taints=None):
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


NODES = [_node("a", {"pool": "cpu", "cores": "32"}), _node("b", {"pool": "gpu", "cores": "64", "gpu": "v100"}),
         _node("c", {"pool": "gpu", "cores": "96"}, [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
         _node("d", {"pool": "gpu"}, [{"key": "spot", "effect": "PreferNoSchedule"}])]


def _allowed(spec):
    return sorted(n["metadata"]["name"] for n in NODES if node_filter({"spec": spec}, "t").allows(n))


def _terms(*terms):
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def test_no_constraint_allows_every_node_but_one_with_a_hard_taint():
    assert _allowed({}) == ["a", "b", "d"]  # PreferNoSchedule only ranks nodes in kube-scheduler


def test_node_selector_needs_every_label():
    assert _allowed({"nodeSelector": {"pool": "gpu"}}) == ["b", "d"]
    assert _allowed({"nodeSelector": {"pool": "gpu", "gpu": "v100"}}) == ["b"]


@pytest.mark.parametrize(("expr", "want"), [
    ({"key": "pool", "operator": "In", "values": ["cpu", "gpu"]}, ["a", "b", "d"]),
    ({"key": "pool", "operator": "NotIn", "values": ["cpu"]}, ["b", "d"]),
    ({"key": "gpu", "operator": "NotIn", "values": ["v100"]}, ["a", "d"]),  # an absent label is not in the list
    ({"key": "gpu", "operator": "Exists"}, ["b"]),
    ({"key": "gpu", "operator": "DoesNotExist"}, ["a", "d"]),
    ({"key": "cores", "operator": "Gt", "values": ["40"]}, ["b"]),  # d has no such label: no match
    ({"key": "cores", "operator": "Lt", "values": ["40"]}, ["a"]),
])
def test_match_expressions(expr, want):
    assert _allowed(_terms({"matchExpressions": [expr]})) == want


def test_terms_are_ored_their_requirements_anded_and_an_empty_term_matches_nothing():
    cpu = {"key": "pool", "operator": "In", "values": ["cpu"]}
    v100 = {"key": "gpu", "operator": "Exists"}
    assert _allowed(_terms({"matchExpressions": [cpu]}, {"matchExpressions": [v100]})) == ["a", "b"]
    assert _allowed(_terms({"matchExpressions": [cpu, v100]})) == []
    assert _allowed(_terms({})) == []
    by_name = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in ("a", "d")]
    assert _allowed(_terms(*by_name)) == ["a", "d"]
    assert _allowed({"nodeSelector": {"pool": "gpu"}, **_terms(*by_name)}) == ["d"]  # both must hold


def test_gt_and_lt_read_integers_as_kubernetes_does():
    nodes = [_node("x", {"n": "+7"}), _node("y", {"n": "1_000"}), _node("z", {"n": "99999999999999999999"})]
    gt = lambda v: sorted(n["metadata"]["name"] for n in nodes if node_filter(
        {"spec": _terms({"matchExpressions": [{"key": "n", "operator": "Gt", "values": [v]}]})}, "t").allows(n))
    assert gt("5") == ["x"]  # '1_000' and a number beyond int64 are no integers to Go's ParseInt
    assert gt("five") == []  # a bound that is not an integer: the term matches no node
    other = {"matchExpressions": [{"key": "n", "operator": "Exists"}]}
    bad = {"matchExpressions": [{"key": "n", "operator": "Lt", "values": ["five"]}]}
    assert all(node_filter({"spec": _terms(bad, other)}, "t").allows(n) for n in nodes)  # the other term holds


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "infer"}, True),  # Equal by default; any effect
    ({"key": "dedicated", "value": "train"}, False),
    ({"key": "dedicated", "operator": "Exists"}, True),
    ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
    ({"key": "dedicated", "operator": "", "value": "infer"}, True),  # an empty operator is Equal
])
def test_tolerations(toleration, tolerated):
    assert ("c" in _allowed({"tolerations": [toleration]})) is tolerated


@pytest.mark.parametrize(("spec", "where"), [
    (_terms({"matchExpressions": [{"key": "pool", "operator": "Near", "values": ["x"]}]}), "operator: expected one of"),
    (_terms({"matchExpressions": [{"key": "pool", "operator": "In"}]}), "values: expected at least one value"),
    (_terms({"matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["x"]}]}), "values: expected none"),
    (_terms({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["1", "2"]}]}), "expected one value"),
    (_terms({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}),
     "values: expected one node name"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedul"}]}, r"tolerations\[0\].effect: expected one of"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 60}]},
     r"tolerations\[0\].tolerationSeconds: expected only with effect NoExecute"),
    (_terms({"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["x"]}]}),
     "key: expected metadata.name"),
    (_terms(), "nodeSelectorTerms: expected at least one term"),
    ({"nodeSelector": ["pool=gpu"]}, "nodeSelector: expected a mapping"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, r"tolerations\[0\].key: expected a key with Equal"),
    ({"tolerations": [{"key": "k", "operator": "Always"}]}, r"tolerations\[0\].operator: expected Equal or Exists"),
])
def test_a_constraint_the_api_server_would_refuse_is_a_spec_error_naming_its_field(spec, where):
    with pytest.raises(SpecError, match=where) as e:
        node_filter({"spec": spec}, "spec.worker.template")
    assert e.value.reason == "InvalidNodeConstraint" and str(e.value).startswith("spec.worker.template.spec.")


def test_a_noexecute_taint_evicts_what_does_not_tolerate_it_for_good():
    drained = _node("m", taints=[{"key": "maintenance", "effect": "NoExecute"}])
    lost = _node("u", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    plain = node_filter({"spec": {}}, "t")
    assert plain.evicts(drained) and not plain.allows(drained)
    # a node-condition taint: Reamer reads the node's Ready condition instead (pods tolerate it for a while)
    assert not plain.evicts(lost) and not plain.evicts(NODES[2])  # (c's taint is NoSchedule: it stays)
    forever = node_filter({"spec": {"tolerations": [{"key": "maintenance", "operator": "Exists"}]}}, "t")
    assert not forever.evicts(drained) and forever.allows(drained)
    # tolerationSeconds only delays the eviction: no placement there, and a pod there goes
    delayed = node_filter({"spec": {"tolerations": [{"key": "maintenance", "operator": "Exists",
                                                     "effect": "NoExecute", "tolerationSeconds": 300}]}}, "t")
    assert delayed.evicts(drained) and not delayed.allows(drained)
    e = Eligibility([drained, lost, NODES[0]])
    assert e.evicting({"spec": {}}, "t") == {"m"} and e.of({"spec": {}}, "t") == {"a"}


def test_eligibility_says_none_when_every_node_may_take_the_pod():
    untainted = [n for n in NODES if n["metadata"]["name"] != "c"]
    e = Eligibility(untainted)
    assert e.of({"spec": {"containers": []}}, "t") is None
    assert e.of(None, "t") is None
    assert e.of({"spec": {"nodeSelector": {"pool": "gpu"}}}, "t") == {"b", "d"}
    assert Eligibility(NODES).of(None, "t") == {"a", "b", "d"}

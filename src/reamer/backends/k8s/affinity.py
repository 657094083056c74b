"""Which nodes a pod template allows: its ``nodeSelector``, its required node affinity and its
tolerations of the nodes' taints — the filters kube-scheduler applies (NodeAffinity,
TaintToleration) before it scores nodes. The controller places pods itself, so it applies them.

Preferred (soft) affinity and ``PreferNoSchedule`` taints only rank nodes in kube-scheduler and
are not read; inter-pod affinity and topology spread are not modelled. A template's constraint
that Kubernetes would reject raises :class:`~reamer.backends.k8s.objects.SpecError`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reamer.backends.k8s.objects import Obj, SpecError, labels, meta

HARD_EFFECTS = ("NoSchedule", "NoExecute")  # a pod that does not tolerate these is not placed


def _list(v: Any, where: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise SpecError("InvalidNodeConstraint", f"{where}: expected a list, got {v!r}")
    return v


def _dict(v: Any, where: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SpecError("InvalidNodeConstraint", f"{where}: expected a mapping, got {v!r}")
    return v


def _requirement(req: Any, where: str, fields: bool) -> tuple[str, str, tuple[str, ...]]:
    """One ``matchExpressions`` / ``matchFields`` item, checked as the API server checks it."""
    req = _dict(req, where)
    key, op, values = req.get("key"), req.get("operator"), _list(req.get("values"), f"{where}.values")
    if not isinstance(key, str) or not key:
        raise SpecError("InvalidNodeConstraint", f"{where}.key: expected a label key, got {key!r}")
    ops = ("In", "NotIn") if fields else ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
    if op not in ops:
        raise SpecError("InvalidNodeConstraint", f"{where}.operator: expected one of {', '.join(ops)}, got {op!r}")
    if fields and key != "metadata.name":
        raise SpecError("InvalidNodeConstraint", f"{where}.key: expected metadata.name, got {key!r}")
    if not all(isinstance(x, str) for x in values):
        raise SpecError("InvalidNodeConstraint", f"{where}.values: expected strings, got {values!r}")
    if op in ("In", "NotIn") and not values:
        raise SpecError("InvalidNodeConstraint", f"{where}.values: expected at least one value for {op}")
    if op in ("Exists", "DoesNotExist") and values:
        raise SpecError("InvalidNodeConstraint", f"{where}.values: expected none for {op}, got {values!r}")
    if op in ("Gt", "Lt"):
        if len(values) != 1 or not _is_int(values[0]):
            raise SpecError("InvalidNodeConstraint", f"{where}.values: expected one integer for {op}, got {values!r}")
    return key, op, tuple(values)


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _matches(have: dict[str, str], key: str, op: str, values: tuple[str, ...]) -> bool:
    v = have.get(key)
    if op == "In":
        return v in values
    if op == "NotIn":
        return v not in values
    if op == "Exists":
        return v is not None
    if op == "DoesNotExist":
        return v is None
    if v is None or not _is_int(v):
        return False
    return int(v) > int(values[0]) if op == "Gt" else int(v) < int(values[0])


class NodeFilter:
    """A template's node constraints, parsed once (:func:`node_filter`); :meth:`allows` a node."""

    def __init__(self, selector: dict[str, str], terms: list[list[tuple[bool, str, str, tuple[str, ...]]]] | None,
                 tolerations: list[dict]) -> None:
        self.selector, self.terms, self.tolerations = selector, terms, tolerations

    def allows(self, node: Obj) -> bool:
        lb = labels(node)
        if any(lb.get(k) != v for k, v in self.selector.items()):
            return False
        if self.terms is not None:
            fields = {"metadata.name": meta(node)["name"]}
            if not any(all(_matches(fields if f else lb, k, op, vs) for f, k, op, vs in term) for term in self.terms):
                return False
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in HARD_EFFECTS and not any(_tolerates(t, taint) for t in self.tolerations):
                return False
        return True


def _tolerates(t: dict, taint: dict) -> bool:
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if t.get("operator", "Equal") == "Exists":
        return not t.get("key") or t["key"] == taint.get("key")
    return t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or "")


def node_filter(template: Any, where: str) -> NodeFilter:
    """The constraints of a pod template (``where``: its path in the resource, for errors)."""
    spec = _dict(_dict(template, where).get("spec"), f"{where}.spec")
    selector = _dict(spec.get("nodeSelector"), f"{where}.spec.nodeSelector")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise SpecError("InvalidNodeConstraint", f"{where}.spec.nodeSelector: expected string keys and values")
    at = f"{where}.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    na = _dict(_dict(spec.get("affinity"), f"{where}.spec.affinity").get("nodeAffinity"),
               f"{where}.spec.affinity.nodeAffinity")
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = None
    if required is not None:
        raw = _list(_dict(required, at).get("nodeSelectorTerms"), f"{at}.nodeSelectorTerms")
        if not raw:
            raise SpecError("InvalidNodeConstraint", f"{at}.nodeSelectorTerms: expected at least one term")
        terms = []
        for i, term in enumerate(raw):
            t = _dict(term, f"{at}.nodeSelectorTerms[{i}]")
            reqs = [(False, *_requirement(r, f"{at}.nodeSelectorTerms[{i}].matchExpressions[{k}]", False))
                    for k, r in enumerate(_list(t.get("matchExpressions"), f"{at}.nodeSelectorTerms[{i}]"))]
            reqs += [(True, *_requirement(r, f"{at}.nodeSelectorTerms[{i}].matchFields[{k}]", True))
                     for k, r in enumerate(_list(t.get("matchFields"), f"{at}.nodeSelectorTerms[{i}]"))]
            if reqs:  # a term without requirements matches no node
                terms.append(reqs)
    tolerations = []
    for i, t in enumerate(_list(spec.get("tolerations"), f"{where}.spec.tolerations")):
        t = _dict(t, f"{where}.spec.tolerations[{i}]")
        if t.get("operator", "Equal") not in ("Equal", "Exists"):
            raise SpecError("InvalidNodeConstraint", f"{where}.spec.tolerations[{i}].operator: expected Equal or "
                                                     f"Exists, got {t.get('operator')!r}")
        if t.get("operator") == "Exists" and t.get("value"):
            raise SpecError("InvalidNodeConstraint", f"{where}.spec.tolerations[{i}].value: expected none with Exists")
        if t.get("operator", "Equal") == "Equal" and not t.get("key"):
            raise SpecError("InvalidNodeConstraint", f"{where}.spec.tolerations[{i}].key: expected a key with Equal")
        tolerations.append(t)
    return NodeFilter(selector, terms, tolerations)


class Eligibility:
    """The nodes each pod template allows, over one read of the cluster's nodes; templates with
    the same constraints share one answer (one pass over the nodes)."""

    def __init__(self, nodes: Sequence[Obj]) -> None:
        self.nodes = nodes
        self._memo: dict[str, frozenset[str] | None] = {}

    def of(self, template: Any, where: str) -> frozenset[str] | None:
        """The names of the nodes a pod of ``template`` may be placed on; None when every node
        may take it. ``where``: the template's path in its resource, for errors."""
        spec = template.get("spec") if isinstance(template, dict) else template
        if isinstance(spec, dict):
            spec = {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations")}
        key = json.dumps(spec, sort_keys=True, default=str)
        if key not in self._memo:
            f = node_filter(template, where)
            ok = frozenset(meta(n)["name"] for n in self.nodes if f.allows(n))
            self._memo[key] = None if len(ok) == len(self.nodes) else ok
        return self._memo[key]

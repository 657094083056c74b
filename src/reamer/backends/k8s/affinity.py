"""Which nodes a pod template allows: its ``nodeSelector``, its required node affinity and its
tolerations of the nodes' taints — the filters kube-scheduler applies (NodeAffinity,
TaintToleration) before it scores nodes. The controller places pods itself, so it applies them.

Preferred (soft) affinity and ``PreferNoSchedule`` taints only rank nodes in kube-scheduler and
are not read; inter-pod affinity and topology spread are not modelled. A template's constraint
that Kubernetes would reject raises :class:`~reamer.backends.k8s.objects.SpecError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from reamer.backends.k8s.objects import Obj, SpecError, labels, meta

HARD_EFFECTS = ("NoSchedule", "NoExecute")  # a pod that does not tolerate these is not placed
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
INT = re.compile(r"[+-]?[0-9]+")
# taints the node lifecycle controller sets from a node's conditions (not-ready, unreachable, ...):
# Reamer reads those conditions themselves (:func:`reamer.backends.k8s.objects.schedulable`), and
# pods tolerate their NoExecute form for a while (DefaultTolerationSeconds), so they do not evict
CONDITION_TAINTS = "node.kubernetes.io/"


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
    if op in ("Gt", "Lt") and len(values) != 1:
        raise SpecError("InvalidNodeConstraint", f"{where}.values: expected one value for {op}, got {values!r}")
    if fields and len(values) != 1:
        raise SpecError("InvalidNodeConstraint", f"{where}.values: expected one node name for {op}, got {values!r}")
    return key, op, tuple(values)


def _int64(s: str | None) -> int | None:
    """``s`` as Go's ``strconv.ParseInt(s, 10, 64)`` reads it (None: not such a number)."""
    if s is None or not INT.fullmatch(s):
        return None
    v = int(s)
    return v if -(2**63) <= v < 2**63 else None


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
    n, bound = _int64(v), _int64(values[0])
    if n is None or bound is None:  # (a bound that is not an integer: its term matches no node)
        return False
    return n > bound if op == "Gt" else n < bound


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

    def evicts(self, node: Obj) -> bool:
        """A pod of this template on ``node`` is evicted: a NoExecute taint it does not tolerate
        (but the node-condition taints, see :data:`CONDITION_TAINTS`)."""
        return any(taint.get("effect") == "NoExecute" and not str(taint.get("key", "")).startswith(CONDITION_TAINTS)
                   and not any(_tolerates(t, taint) for t in self.tolerations)
                   for taint in (node.get("spec") or {}).get("taints") or [])


def _tolerates(t: dict, taint: dict) -> bool:
    """``t`` tolerates ``taint`` for good: a NoExecute toleration with ``tolerationSeconds`` only
    delays the eviction, so it does not count (a pod placed there would be evicted, and placed
    there again)."""
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    if taint.get("effect") == "NoExecute" and t.get("tolerationSeconds") is not None:
        return False
    if t["operator"] == "Exists":
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
        at = f"{where}.spec.tolerations[{i}]"
        t = dict(_dict(t, at))
        t["operator"] = t.get("operator") or "Equal"  # (empty: Equal, as the API server reads it)
        if t["operator"] not in ("Equal", "Exists"):
            raise SpecError("InvalidNodeConstraint", f"{at}.operator: expected Equal or Exists, got {t['operator']!r}")
        if t["operator"] == "Exists" and t.get("value"):
            raise SpecError("InvalidNodeConstraint", f"{at}.value: expected none with Exists, got {t['value']!r}")
        if t["operator"] == "Equal" and not t.get("key"):
            raise SpecError("InvalidNodeConstraint", f"{at}.key: expected a key with Equal (or operator Exists)")
        if t.get("effect") and t["effect"] not in EFFECTS:
            raise SpecError("InvalidNodeConstraint", f"{at}.effect: expected one of {', '.join(EFFECTS)} or none, "
                                                     f"got {t['effect']!r}")
        if t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute":
            raise SpecError("InvalidNodeConstraint", f"{at}.tolerationSeconds: expected only with effect NoExecute")
        tolerations.append(t)
    return NodeFilter(selector, terms, tolerations)


class Eligibility:
    """The nodes each pod template allows, over one read of the cluster's nodes; templates with
    the same constraints share one answer (one pass over the nodes)."""

    def __init__(self, nodes: Sequence[Obj]) -> None:
        self.nodes = nodes
        self._memo: dict[str, tuple[frozenset[str] | None, frozenset[str]]] = {}

    def of(self, template: Any, where: str) -> frozenset[str] | None:
        """The names of the nodes a pod of ``template`` may be placed on; None when every node
        may take it. ``where``: the template's path in its resource, for errors."""
        return self._answer(template, where)[0]

    def evicting(self, template: Any, where: str) -> frozenset[str]:
        """The names of the nodes a running pod of ``template`` is evicted from
        (:meth:`NodeFilter.evicts`)."""
        return self._answer(template, where)[1]

    def _answer(self, template: Any, where: str) -> tuple[frozenset[str] | None, frozenset[str]]:
        spec = template.get("spec") if isinstance(template, dict) else template
        if isinstance(spec, dict):
            spec = {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations")}
        key = json.dumps(spec, sort_keys=True, default=str)
        if key not in self._memo:
            f = node_filter(template, where)
            ok = frozenset(meta(n)["name"] for n in self.nodes if f.allows(n))
            self._memo[key] = (None if len(ok) == len(self.nodes) else ok,
                               frozenset(meta(n)["name"] for n in self.nodes if f.evicts(n)))
        return self._memo[key]

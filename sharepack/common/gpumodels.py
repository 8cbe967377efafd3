"""GPU models: a node's, and those a pod allows, named as pods name them.

A pod that needs a GPU model says so with a node selector or a required node affinity on the
node label `nvidia.com/gpu.product`, which GPU feature discovery sets from NVML's product name
(its words joined by "-": "Tesla T4" -> "Tesla-T4"). So the node's model is that label's value;
a node without the label (no feature discovery installed) gets its agent's NVML product name
(`GpuState.product` in its NodeGpuState) in the label's form, so the two spellings agree.

The CPU-aware ranks use the node's model to know which typical shapes its GPUs can serve at all
(`fragmentation.Fragmentation.access`); `pod_models` reads a pod's own constraint, the same
vocabulary (`sharepack explain` shows which nodes it rules out: kube-scheduler's NodeAffinity
filter runs before the extender's, so the extender itself never sees those nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharepack.common.state import NodeState

PRODUCT_LABEL = "nvidia.com/gpu.product"


def label_value(product: str) -> str:
    """NVML's product name as feature discovery writes it into the label."""
    return "-".join(product.split())


def node_model(node: Mapping[str, Any]) -> str | None:
    """The Node object's `nvidia.com/gpu.product` label; None when it has none."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    value = labels.get(PRODUCT_LABEL) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) and value else None


def published_model(state: NodeState) -> str | None:
    """The GPU model the node's agent published (its first GPU's NVML product, label form);
    None when it names none."""
    for res in state.resources:
        for gpu in res.gpus:
            if gpu.product.strip():
                return label_value(gpu.product)
    return None


def pod_models(pod: Mapping[str, Any]) -> frozenset[str] | None:
    """The GPU models a pod allows by its node selector and required node affinity on
    `nvidia.com/gpu.product` (an `In` list); None when it does not constrain the model.

    Required affinity terms are ORed: the pod is constrained only when every term constrains
    the label (then the union of their values); expressions within a term are ANDed (their
    values intersect). A node selector intersects with all of it."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return None
    allowed: frozenset[str] | None = None
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and isinstance(selector.get(PRODUCT_LABEL), str):
        allowed = frozenset({selector[PRODUCT_LABEL]})
    terms = _required_terms(spec)
    if terms:
        union: set[str] = set()
        for term in terms:
            values = _term_models(term)
            if values is None:
                return allowed  # one term admits any model: the affinity does not constrain it
            union |= values
        allowed = frozenset(union) if allowed is None else allowed & union
    return allowed


def _required_terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node_affinity, Mapping) else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    return [t for t in terms if isinstance(t, Mapping)] if isinstance(terms, list) else []


def _term_models(term: Mapping[str, Any]) -> frozenset[str] | None:
    """The models one node selector term allows; None when it does not constrain the label."""
    allowed: frozenset[str] | None = None
    expressions = term.get("matchExpressions")
    for e in expressions if isinstance(expressions, list) else []:
        if not isinstance(e, Mapping) or e.get("key") != PRODUCT_LABEL or e.get("operator") != "In":
            continue
        values = e.get("values")
        found = frozenset(v for v in values if isinstance(v, str)) if isinstance(values, list) else frozenset()
        allowed = found if allowed is None else allowed & found
    return allowed

"""Strategic merge directives and server-side apply list rules, on the Pod schema the server
publishes."""

from __future__ import annotations

from typing import Any

import pytest

from sharepack.sandbox.apiserver import openapi
from sharepack.sandbox.apiserver import patching
from sharepack.sandbox.apiserver import resources as kinds

POD: dict[str, Any] = {
    "metadata": {"name": "p", "finalizers": ["a/x", "b/y"]},
    "spec": {
        "containers": [{"name": "one", "image": "i1"}, {"name": "two", "image": "i2"}],
        "tolerations": [{"key": "k1"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
}

CASES = {
    "$patch delete removes one element by its key": (
        {"spec": {"containers": [{"name": "one", "$patch": "delete"}]}},
        lambda pod: [c["name"] for c in pod["spec"]["containers"]] == ["two"],
    ),
    "an element without a match is appended": (
        {"spec": {"containers": [{"name": "three", "image": "i3"}]}},
        lambda pod: [c["name"] for c in pod["spec"]["containers"]] == ["one", "two", "three"],
    ),
    "$setElementOrder reorders": (
        {"spec": {"$setElementOrder/containers": [{"name": "two"}, {"name": "one"}]}},
        lambda pod: [c["name"] for c in pod["spec"]["containers"]] == ["two", "one"],
    ),
    "a list without a merge key is replaced": (
        {"spec": {"tolerations": [{"key": "k2"}]}},
        lambda pod: pod["spec"]["tolerations"] == [{"key": "k2"}],
    ),
    "$deleteFromPrimitiveList removes values of a merged scalar list": (
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]}},
        lambda pod: pod["metadata"]["finalizers"] == ["b/y"],
    ),
    "$retainKeys drops what it does not list": (
        {"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}, "$retainKeys": ["name", "hostPath"]}]}},
        lambda pod: pod["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/x"}}],
    ),
    "$patch replace on a map replaces it": (
        {"spec": {"containers": [{"name": "one", "image": "new", "$patch": "replace"}]}},
        lambda pod: pod["spec"]["containers"][0] == {"name": "one", "image": "new"},
    ),
}


@pytest.mark.parametrize(("patch", "check"), CASES.values(), ids=CASES.keys())
def test_strategic_merge_directives(patch: dict[str, Any], check: Any) -> None:
    got = patching.apply_patch(patching.STRATEGIC, POD, patch, lambda: openapi.schema_of(kinds.PODS))
    assert check(got), got
    assert "$" not in str(list(_keys(got))), "no directive is stored"


def _keys(node: Any) -> Any:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from _keys(v)


def test_apply_merges_by_list_type_and_needs_the_merge_key() -> None:
    schema = lambda: openapi.schema_of(kinds.PODS)  # noqa: E731
    applied = {"spec": {"containers": [{"name": "two", "image": "i9"}], "tolerations": [{"key": "k2"}]}}
    got = patching.apply_patch(patching.APPLY, POD, applied, schema)
    assert [(c["name"], c["image"]) for c in got["spec"]["containers"]] == [("one", "i1"), ("two", "i9")]
    assert got["spec"]["tolerations"] == [{"key": "k2"}], "an atomic list is replaced"
    with pytest.raises(patching.PatchError, match="merge key: name"):
        patching.apply_patch(patching.STRATEGIC, POD, {"spec": {"containers": [{"image": "x"}]}}, schema)

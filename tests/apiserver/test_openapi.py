"""The OpenAPI documents kubectl reads, checked without kubectl: what `apply` looks for to send
`fieldValidation` (a PATCH operation with the parameter and the kind's group-version-kind), the
schemas `explain` walks, the merge keys a strategic merge needs, and the CRD's own schema."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import yaml
from aiohttp import ClientSession

from sharepack.sandbox.apiserver import openapi
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer


async def _get(server: FakeApiServer, path: str) -> tuple[int, Any]:
    async with ClientSession() as s, s.get(server.url + path) as resp:
        return resp.status, orjson.loads(await resp.read())


async def test_the_v3_root_lists_a_document_per_group_version_and_each_serves(server: FakeApiServer) -> None:
    code, root = await _get(server, "/openapi/v3")
    assert code == 200
    want = {f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}" for rt in kinds.ALL}
    assert set(root["paths"]) == want
    for where, entry in root["paths"].items():
        code, doc = await _get(server, entry["serverRelativeURL"])
        assert (code, doc["openapi"]) == (200, "3.0.0"), where
        assert _refs(doc) and all(ref.startswith("#/components/schemas/") for ref in _refs(doc)), where
        assert set(_refs(doc)) <= {f"#/components/schemas/{n}" for n in doc["components"]["schemas"]}, where


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize("rt", [rt for rt in kinds.ALL if not rt.virtual], ids=lambda rt: f"{rt.plural}.{rt.group}")
def test_each_kind_has_a_patch_operation_with_field_validation(rt: kinds.ResourceType) -> None:
    doc = orjson.loads(openapi.v3_document(rt.group, rt.version) or b"{}")
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    patches = [p["patch"] for p in doc["paths"].values() if p.get("patch", {}).get("x-kubernetes-group-version-kind") == gvk]
    assert patches, f"no PATCH operation for {gvk}"
    for patch in patches:
        assert [q["in"] for q in patch["parameters"] if q["name"] == "fieldValidation"] == ["query"]
    schemas = doc["components"]["schemas"]
    assert any(gvk in s.get("x-kubernetes-group-version-kind", []) for s in schemas.values())


def test_containers_merge_by_name_and_quantities_stay_a_one_of_in_v3() -> None:
    doc = orjson.loads(openapi.v3_document("", "v1") or b"{}")
    schemas = doc["components"]["schemas"]
    containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert (containers["x-kubernetes-patch-strategy"], containers["x-kubernetes-patch-merge-key"]) == ("merge", "name")
    assert "type" not in schemas["io.k8s.apimachinery.pkg.api.resource.Quantity"], "explain prints Quantity"
    resources = schemas["io.k8s.api.core.v1.Container"]["properties"]["resources"]
    assert resources["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.core.v1.ResourceRequirements"}]
    v2 = orjson.loads(openapi.v2_document())
    assert v2["definitions"]["io.k8s.apimachinery.pkg.api.resource.Quantity"] == {"type": "string"}


def test_the_nodegpustate_schema_is_the_crds() -> None:
    crd = yaml.safe_load(openapi.CRD_FILE.read_text())
    (version,) = crd["spec"]["versions"]
    schema = openapi.schema_of(kinds.NODE_GPU_STATES)
    assert schema["properties"]["status"] == version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "sharepack.io", "version": "v1alpha1",
                                                          "kind": "NodeGpuState"}]  # fmt: skip


async def test_unknown_documents_are_404(server: FakeApiServer) -> None:
    for path in ("/openapi/v3/apis/apps/v1", "/openapi/v4", "/openapi/v3/api"):
        code, status = await _get(server, path)
        assert (code, status["reason"]) == (404, "NotFound"), path

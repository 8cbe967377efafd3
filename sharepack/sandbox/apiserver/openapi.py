"""The OpenAPI documents the sandbox API server publishes (`/openapi/v3`, `/openapi/v2`), and the
schema lookups built on them (unknown-field checks, strategic-merge keys).

kubectl needs them: `apply` and `create` refuse to run without one (`--validate` is on by
default), `explain` reads the v3 document, and `apply` computes its strategic merge patch from
the `x-kubernetes-patch-merge-key` of each list. The built-in types come from the definitions
`kubernetes-validate` ships for the Kubernetes release it is pinned to (the real server's own
OpenAPI, rewritten as JSON Schema); they are turned back into OpenAPI here. NodeGpuState's schema
is the CRD's `openAPIV3Schema`, read from deploy/base, the file users apply.

Like the real server's, the v3 root lists one document per group/version; each document holds the
paths of that group/version (their PATCH operations carry `fieldValidation`, which is how kubectl
learns that the server validates fields itself) and the schemas those paths reach.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from sharepack.sandbox.apiserver import resources
from sharepack.sandbox.apiserver.resources import ResourceType

log = logging.getLogger(__name__)
Schema = dict[str, Any]

def _defs_dir() -> Path:
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the kubernetes-validate package (the schemas' source) is not installed")
    return Path(spec.origin).parent / "kubernetes-json-schema"


CRD_FILE = Path(__file__).resolve().parents[3] / "deploy" / "base" / "crds" / "nodegpustates.yaml"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
# What the real v2 document says of these two; v3 has the oneOf kubernetes-validate keeps (and
# kubectl explain prints `map[string]Quantity` because of it).
_V2_SCALARS: dict[str, Schema] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
}
_COMMON = (f"{_META}Status", f"{_META}DeleteOptions", f"{_META}Patch", f"{_META}WatchEvent")


def _latest_definitions() -> Path:
    """The `_definitions.json` of the newest release the installed kubernetes-validate knows."""
    def release(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in p.name.removeprefix("v").removesuffix("-local").split("."))

    root = _defs_dir()
    dirs = [d for d in root.glob("v*-local") if (d / "_definitions.json").is_file()]
    if not dirs:
        raise FileNotFoundError(f"no Kubernetes schema definitions under {root}")
    return max(dirs, key=release) / "_definitions.json"


def _to_openapi(node: Any, ref_prefix: str) -> Any:
    """JSON Schema (kubernetes-validate's form) back to OpenAPI: `$ref`s under `ref_prefix`, no
    `null` in `type`, and no enum on apiVersion/kind (the real documents have none)."""
    if isinstance(node, list):
        return [_to_openapi(v, ref_prefix) for v in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = ref_prefix + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if len(types) == 1 else types
        elif key == "properties" and isinstance(value, dict):
            out[key] = {}
            for name, prop in value.items():
                converted = _to_openapi(prop, ref_prefix)
                if name in ("apiVersion", "kind") and isinstance(converted, dict):
                    converted.pop("enum", None)
                out[key][name] = converted
        else:
            out[key] = _to_openapi(value, ref_prefix)
    return out


@functools.cache
def _builtin_definitions() -> dict[str, Schema]:
    raw = orjson.loads(_latest_definitions().read_bytes())["$defs"]
    return {name: _to_openapi(schema, "#/definitions/") for name, schema in raw.items()}


def crd_definition_name(rt: ResourceType) -> str:
    """The name the real server gives a custom resource's schema: the group reversed."""
    return ".".join(reversed(rt.group.split("."))) + f".{rt.version}.{rt.kind}"


@functools.cache
def _crd_definitions() -> dict[str, Schema]:
    """The NodeGpuState schema as the real server publishes a CRD's: the CRD's own schema plus the
    standard apiVersion/kind/metadata and the group-version-kind."""
    rt = resources.NODE_GPU_STATES
    schema: Schema
    if CRD_FILE.is_file():
        crd = yaml.safe_load(CRD_FILE.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == rt.version]
        schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    else:  # an installed package without the repository's deploy/: keep every field
        log.warning("%s not found: NodeGpuState is served without its schema (no pruning, no explain)", CRD_FILE)
        schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": "APIVersion of this object."}
    props["kind"] = {"type": "string", "description": "Kind of this object."}
    props["metadata"] = {"$ref": f"#/definitions/{_META}ObjectMeta", "description": "Standard object's metadata."}
    gvk = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    schema["x-kubernetes-group-version-kind"] = gvk
    listing: Schema = {
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"$ref": f"#/definitions/{_META}ListMeta"},
            "items": {"type": "array", "items": {"$ref": f"#/definitions/{crd_definition_name(rt)}"}},
        },
        "x-kubernetes-group-version-kind": [{**gvk[0], "kind": f"{rt.kind}List"}],
    }
    return {crd_definition_name(rt): schema, crd_definition_name(rt) + "List": listing}


def definitions() -> dict[str, Schema]:
    """Every schema, v2 style (`#/definitions/...` references)."""
    return {**_builtin_definitions(), **_crd_definitions()}


@functools.cache
def definition_name(rt: ResourceType, kind: str = "") -> str:
    """The schema of `rt`'s kind (or of `kind` in its group/version, e.g. its List)."""
    want = {"group": rt.group, "version": rt.version, "kind": kind or rt.kind}
    for name, schema in definitions().items():
        if want in schema.get("x-kubernetes-group-version-kind", []):
            return name
    raise KeyError(f"no OpenAPI schema for {want}")


def resolve(schema: Schema) -> Schema:
    """Follow a `$ref` (alone or as a one-element `allOf`) to the schema it names."""
    while True:
        ref = schema.get("$ref")
        if ref is None and len(schema.get("allOf", [])) == 1:
            ref = schema["allOf"][0].get("$ref")
        if not isinstance(ref, str):
            return schema
        schema = definitions()[ref.rsplit("/", 1)[-1]]


def schema_of(rt: ResourceType) -> Schema:
    return definitions()[definition_name(rt)]


# -- paths -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    where: str  # path | query
    type: str = "string"
    description: str = ""


_FIELD_VALIDATION = _Param(
    "fieldValidation", "query",
    description="how the server treats unknown and duplicate fields: Ignore, Warn (the default) or Strict",
)  # fmt: skip
_WRITE_PARAMS = (_Param("dryRun", "query"), _Param("fieldManager", "query"), _FIELD_VALIDATION)
_LIST_PARAMS = (
    _Param("labelSelector", "query"), _Param("fieldSelector", "query"), _Param("limit", "query", "integer"),
    _Param("continue", "query"), _Param("resourceVersion", "query"), _Param("watch", "query", "boolean"),
    _Param("allowWatchBookmarks", "query", "boolean"), _Param("timeoutSeconds", "query", "integer"),
)  # fmt: skip
_PATCH_TYPES = (
    "application/json-patch+json", "application/merge-patch+json",
    "application/strategic-merge-patch+json", "application/apply-patch+yaml",
)  # fmt: skip


def _base(rt: ResourceType) -> str:
    return f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"


def _operations(rt: ResourceType) -> Iterator[tuple[str, str, str, tuple[_Param, ...], str]]:
    """(path, method, action, parameters, response kind) for every operation on `rt`."""
    ns = (_Param("namespace", "path"),) if rt.namespaced else ()
    name = (_Param("name", "path"),)
    collection = f"{_base(rt)}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{_base(rt)}/{rt.plural}"
    yield collection, "post", "post", ns + _WRITE_PARAMS, rt.kind
    if rt.virtual:
        return
    list_kind = f"{rt.kind}List"
    if rt.namespaced:
        yield f"{_base(rt)}/{rt.plural}", "get", "list", _LIST_PARAMS, list_kind
    yield collection, "get", "list", ns + _LIST_PARAMS, list_kind
    yield collection, "delete", "deletecollection", ns + _LIST_PARAMS, "Status"
    item = f"{collection}/{{name}}"
    yield item, "get", "get", ns + name, rt.kind
    yield item, "put", "put", ns + name + _WRITE_PARAMS, rt.kind
    yield item, "patch", "patch", ns + name + _WRITE_PARAMS + (_Param("force", "query", "boolean"),), rt.kind
    yield item, "delete", "delete", ns + name, "Status"
    if rt.status_subresource:
        for method in ("get", "put", "patch"):
            params = ns + name + (_WRITE_PARAMS if method != "get" else ())
            yield f"{item}/status", method, method, params, rt.kind


def _parameter(p: _Param, v3: bool) -> Schema:
    out: Schema = {"name": p.name, "in": p.where, "description": p.description, "required": p.where == "path"}
    if v3:
        out["schema"] = {"type": p.type}
    else:
        out["type"] = p.type
    return out


def _paths(members: list[ResourceType], ref_prefix: str, v3: bool) -> Schema:
    paths: Schema = {}
    for rt in members:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        for path, method, action, params, kind in _operations(rt):
            response = {"$ref": ref_prefix + (f"{_META}Status" if kind == "Status" else definition_name(rt, kind))}
            op: Schema = {
                "operationId": f"{action}{rt.kind}",
                "parameters": [_parameter(p, v3) for p in params],
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            }
            body = {"$ref": ref_prefix + definition_name(rt)}
            if v3:
                op["responses"] = {"200": {"description": "OK", "content": {"application/json": {"schema": response}}}}
                if method in ("post", "put"):
                    op["requestBody"] = {"content": {"*/*": {"schema": body}}, "required": True}
                elif method == "patch":
                    patch_ref = {"$ref": f"{ref_prefix}{_META}Patch"}
                    op["requestBody"] = {"content": {t: {"schema": patch_ref} for t in _PATCH_TYPES}, "required": True}
            else:
                op["responses"] = {"200": {"description": "OK", "schema": response}}
                if method in ("post", "put"):
                    op["parameters"].append({"name": "body", "in": "body", "required": True, "schema": body})
            paths.setdefault(path, {})[method] = op
    return paths


def _referenced(roots: list[str]) -> list[str]:
    """The schemas reachable from `roots`, in a stable order."""
    defs, seen, todo = definitions(), set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        stack: list[Any] = [defs[name]]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str):
                    todo.append(ref.rsplit("/", 1)[-1])
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return sorted(seen)


def _v3_schema(schema: Any) -> Any:
    """v2 references to v3 ones; a `$ref` with siblings (a description) becomes a one-element
    `allOf`, as the real v3 documents write it (OpenAPI 3.0 ignores siblings of `$ref`)."""
    if isinstance(schema, list):
        return [_v3_schema(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _v3_schema(v) for k, v in schema.items() if k != "$ref"}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        ref = "#/components/schemas/" + ref.rsplit("/", 1)[-1]
        if out:
            out["allOf"] = [{"$ref": ref}]
        else:
            out["$ref"] = ref
    return out


def _members(group: str, version: str) -> list[ResourceType]:
    return [rt for rt in resources.ALL if rt.group_version == (group, version)]


def _group_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def v3_document(group: str, version: str) -> bytes | None:
    """The OpenAPI 3.0 document of one group/version, or None when we serve no such one."""
    members = _members(group, version)
    if not members:
        return None
    names = _referenced([definition_name(rt) for rt in members]
                        + [definition_name(rt, f"{rt.kind}List") for rt in members if not rt.virtual]
                        + list(_COMMON))  # fmt: skip
    defs = definitions()
    doc = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (sharepack sandbox)", "version": resources.SERVER_VERSION["gitVersion"]},
        "paths": _paths(members, "#/components/schemas/", v3=True),
        "components": {"schemas": {n: _v3_schema(defs[n]) for n in names}},
    }
    return orjson.dumps(doc)


def v3_hash(group: str, version: str) -> str:
    doc = v3_document(group, version)
    return hashlib.sha512(doc or b"").hexdigest()[:32].upper()


def v3_root() -> dict[str, Any]:
    """`/openapi/v3`: where each group/version's document is, with a hash that changes with it."""
    paths = {}
    for group, version in dict.fromkeys(rt.group_version for rt in resources.ALL):
        where = _group_path(group, version)
        paths[where] = {"serverRelativeURL": f"/openapi/v3/{where}?hash={v3_hash(group, version)}"}
    return {"paths": paths}


@functools.cache
def v2_document() -> bytes:
    """`/openapi/v2` (Swagger 2.0, JSON only: clients that ask for protobuf get JSON's 406)."""
    members = list(resources.ALL)
    names = _referenced([definition_name(rt) for rt in members] + list(_COMMON))
    defs = definitions()
    doc = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes (sharepack sandbox)", "version": resources.SERVER_VERSION["gitVersion"]},
        "paths": _paths(members, "#/definitions/", v3=False),
        "definitions": {n: _V2_SCALARS.get(n, defs[n]) for n in names},
    }
    return orjson.dumps(doc)

"""The patch formats the API server accepts: JSON merge patch (RFC 7386), strategic merge patch,
JSON patch (RFC 6902) and server-side apply.

A strategic merge patch merges a list element by element when the schema gives the list a merge
key (`x-kubernetes-patch-strategy: merge`, `x-kubernetes-patch-merge-key`, e.g. containers by
name) and replaces it otherwise, and honours the directives `kubectl apply` sends: `$patch`
(replace, delete, merge), `$retainKeys`, `$setElementOrder/<list>` and
`$deleteFromPrimitiveList/<list>`.

Server-side apply is simplified: the applied configuration is merged into the live object (lists
by their `x-kubernetes-list-type`), without managed fields, so a field a manager stops applying
is not removed and no conflict between managers is reported.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from sharepack.sandbox.apiserver.openapi import Schema, resolve

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"doc is missing path: {path!r}")
    return node


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"unable to remove nonexistent key: {path!r}")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace operation does not apply: doc is missing key: {path!r}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"index out of range in {path!r}")
    else:
        raise PatchError(f"doc is missing path: {path!r}")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        # What the real server says when a merge-style object arrives as a JSON patch.
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"testing value {path} failed")
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])), replace=False)
        else:
            raise PatchError(f"unexpected kind of JSON patch operation: {kind!r}")
    return doc


_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"


def _list_merge(schema: Schema, apply: bool) -> tuple[bool, list[str]]:
    """(merge the list?, the keys that identify its elements). A strategic merge reads the patch
    strategy and merge key; server-side apply reads the list type (`map` by its keys, `set`, or
    atomic)."""
    if apply:
        kind = schema.get("x-kubernetes-list-type", "atomic")
        return kind in ("map", "set"), [str(k) for k in schema.get("x-kubernetes-list-map-keys") or []]
    strategies = set(str(schema.get("x-kubernetes-patch-strategy", "")).split(","))
    key = str(schema.get("x-kubernetes-patch-merge-key", ""))
    return "merge" in strategies, [key] if key else []




def _field_schema(schema: Schema, key: str) -> Schema:
    schema = resolve(schema)
    props = schema.get("properties") or {}
    if key in props:
        return dict(props[key])
    extra = schema.get("additionalProperties")
    return dict(extra) if isinstance(extra, dict) else {}


def _merge_list(target: list[Any], patch: list[Any], schema: Schema, apply: bool) -> list[Any]:
    merge, keys = _list_merge(schema, apply)
    items = resolve(schema.get("items") or {})
    if not merge:
        return [copy.deepcopy(p) for p in patch]
    result = copy.deepcopy(target)
    if not keys:  # a set of scalars: add the missing ones
        return result + [p for p in patch if p not in result]
    for element in patch:
        if not isinstance(element, dict) or keys[0] not in element:
            raise PatchError(f"map: {element!r} does not contain declared merge key: {keys[0]}")

        def same(t: Any, e: dict[str, Any] = element) -> bool:
            return isinstance(t, dict) and all(t.get(k) == e.get(k) for k in keys)

        at = next((i for i, t in enumerate(result) if same(t)), None)
        directive = element.get("$patch")
        if directive == "delete":
            if at is not None:
                result.pop(at)
        elif at is None:
            result.append(_strip_directives(element))
        elif directive == "replace":
            result[at] = _strip_directives(element)
        else:
            result[at] = strategic_merge(result[at], element, items, apply=apply)
    return result


def _strip_directives(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_directives(v) for k, v in obj.items() if not k.startswith("$")}
    if isinstance(obj, list):
        return [_strip_directives(v) for v in obj]
    return obj


def _order(values: list[Any], order: list[Any], key: str) -> list[Any]:
    """`$setElementOrder`: the listed elements first, in that order, then the rest as they were."""
    def ident(v: Any) -> Any:
        return v.get(key) if key and isinstance(v, dict) else v

    wanted = [ident(o) for o in order]
    ranked = sorted(range(len(values)), key=lambda i: (wanted.index(ident(values[i])) if ident(values[i]) in wanted
                                                        else len(wanted) + i))  # fmt: skip
    return [values[i] for i in ranked]


def strategic_merge(target: Any, patch: Any, schema: Schema, *, apply: bool = False) -> Any:
    """Strategic merge of `patch` into `target`, `schema` being the OpenAPI schema of both; with
    `apply`, lists merge as server-side apply merges them (by list type)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch type: {directive!r} in map")
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        field_schema = _field_schema(schema, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, field_schema, apply)
        elif isinstance(value, dict) and not (apply and resolve(field_schema).get("x-kubernetes-map-type") == "atomic"):
            result[key] = strategic_merge(result.get(key), value, field_schema, apply=apply)
        else:
            result[key] = _strip_directives(value)
    for key, value in patch.items():
        if key.startswith(_DELETE_PRIMITIVES) and isinstance(value, list):
            name = key.removeprefix(_DELETE_PRIMITIVES)
            result[name] = [v for v in result.get(name) or [] if v not in value]
        elif key.startswith(_ORDER) and isinstance(value, list):
            name = key.removeprefix(_ORDER)
            if isinstance(result.get(name), list):
                keys = _list_merge(_field_schema(schema, name), False)[1]
                result[name] = _order(result[name], value, keys[0] if keys else "")
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def apply_patch(
    content_type: str, target: Any, patch: Any, schema: Callable[[], Schema] = lambda: {}
) -> Any:
    """Raises PatchError (a 400/422 for the caller), or LookupError for an unsupported type (415).
    `schema` gives the target's OpenAPI schema, which only a strategic merge needs."""
    ctype = content_type.split(";")[0].strip().lower()
    if ctype in (MERGE, STRATEGIC):
        if not isinstance(patch, dict):
            raise PatchError("merge patch body must be a JSON object")
        return merge_patch(target, patch) if ctype == MERGE else strategic_merge(target, patch, schema())
    if ctype == APPLY:
        if not isinstance(patch, dict):
            raise PatchError("an apply configuration must be an object")
        return strategic_merge(target, patch, schema(), apply=True)
    if ctype == JSON_PATCH:
        return json_patch(target, patch)
    raise LookupError(ctype)

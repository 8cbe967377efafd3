"""Unknown fields: the real server drops every field its schema does not declare (a built-in type's
Go struct, a CRD's structural schema unless `x-kubernetes-preserve-unknown-fields`), and with
`fieldValidation` says so: `Strict` refuses the write (400), `Warn` (the default) answers a
`Warning` header per field, `Ignore` says nothing.
"""

from __future__ import annotations

from typing import Any

from sandbox.apiserver_openapi import Schema, resolve

MODES = ("Ignore", "Warn", "Strict")


def prune(obj: Any, schema: Schema, path: str = "") -> list[str]:
    """Drop from `obj`, in place, what `schema` does not declare; answer the dropped paths as the
    real server writes them (`spec.containers[0].foo`)."""
    schema = resolve(schema)
    dropped: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
        if props is None and not isinstance(extra, dict):
            return dropped  # a free-form object (FieldsV1, RawExtension, an untyped CRD part)
        for key in list(obj):
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                dropped += prune(obj[key], props[key], where)
            elif isinstance(extra, dict):
                dropped += prune(obj[key], extra, where)
            elif not keep_unknown:
                del obj[key]
                dropped.append(where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            dropped += prune(item, schema["items"], f"{path}[{i}]")
    return dropped


def mode(value: str) -> str:
    """The `fieldValidation` query parameter, checked."""
    if value == "":
        return "Warn"
    if value not in MODES:
        raise ValueError(f'fieldValidation: unsupported value "{value}": supported values: {", ".join(MODES)}')
    return value

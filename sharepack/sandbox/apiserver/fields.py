"""Decoding a written object as the real server's Go types do.

Unknown fields: the real server drops every field its schema does not declare (a built-in type's
Go struct, a CRD's structural schema unless `x-kubernetes-preserve-unknown-fields`), and with
`fieldValidation` says so: `Strict` refuses the write (400), `Warn` (the default) answers a
`Warning` header per field, `Ignore` says nothing.

Times: a `Time` (lastTransitionTime, firstTimestamp) is RFC 3339, any offset, stored in UTC to the
second; a `MicroTime` (eventTime, a Lease's renewTime) must have exactly six fractional digits and
is stored in UTC with them. A time that does not parse is a 400. (The Python client writes a
datetime as `2026-12-01T00:00:00+00:00`, which no MicroTime accepts.)
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from sharepack.sandbox.apiserver.openapi import Schema, resolve

MODES = ("Ignore", "Warn", "Strict")
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
_LAYOUTS = {f"{_META}Time": "2006-01-02T15:04:05Z07:00", f"{_META}MicroTime": "2006-01-02T15:04:05.000000Z07:00"}
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
)


class TimeFormatError(ValueError):
    pass


def _ref_name(schema: Schema) -> str:
    ref = schema.get("$ref")
    if ref is None and len(schema.get("allOf", [])) == 1:
        ref = schema["allOf"][0].get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else ""


def _time(value: str, kind: str) -> str:
    """`value` as the server stores a Time or MicroTime, or TimeFormatError."""
    layout = _LAYOUTS[kind]
    micro = kind.endswith("MicroTime")
    m = _RFC3339.match(value)
    if m is None or (micro and len(m.group(7) or "") != 7):
        raise TimeFormatError(f'parsing time "{value}" as "{layout}": cannot parse "{value}" as "{layout}"')
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    offset = m.group(8)
    zone = datetime.UTC if offset == "Z" else datetime.timezone(
        (-1 if offset[0] == "-" else 1) * datetime.timedelta(hours=int(offset[1:3]), minutes=int(offset[4:6]))
    )  # fmt: skip
    micros = int((m.group(7) or ".0")[1:7].ljust(6, "0"))
    try:
        when = datetime.datetime(year, month, day, hour, minute, second, micros, zone).astimezone(datetime.UTC)
    except ValueError as e:
        raise TimeFormatError(f'parsing time "{value}": {e}') from None
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def prune(obj: Any, schema: Schema, path: str = "") -> list[str]:
    """Drop from `obj`, in place, what `schema` does not declare, and normalize its times (or
    TimeFormatError); answer the dropped paths as the real server writes them
    (`spec.containers[0].foo`)."""
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
            declared = props[key] if props is not None and key in props else None
            if declared is not None and _ref_name(declared) in _LAYOUTS and isinstance(obj[key], str):
                obj[key] = _time(obj[key], _ref_name(declared))
            elif declared is not None:
                dropped += prune(obj[key], declared, where)
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

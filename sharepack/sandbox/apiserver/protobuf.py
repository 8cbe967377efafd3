"""The protobuf request bodies kubectl sends, decoded to their JSON form.

kubectl writes built-in types through its typed clients as `application/vnd.kubernetes.protobuf`
and falls back to JSON only for CBOR, whatever the server prefers (it does accept a JSON
answer). So `kubectl auth can-i` (SelfSubjectAccessReview), `kubectl create namespace`,
`kubectl create configmap`, `kubectl auth whoami` (SelfSubjectReview) and `kubectl drain`'s
deletions (DeleteOptions) arrive in protobuf.
The body is Kubernetes' envelope: the magic `k8s\\0`, then a `runtime.Unknown` whose `typeMeta`
names the kind and whose `raw` is the object. The messages below are the ones those commands send,
with the field numbers of k8s.io/api and k8s.io/apimachinery's generated.proto; a field not listed
is skipped, a kind not listed is refused with a message naming it.
"""

from __future__ import annotations

import base64
from typing import Any

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

# Field types: "string", "bytes" (base64 in JSON), "int", "bool",
# "map" / "bytesmap" (map<string, string|bytes>), or the name of another message; a leading "*"
# marks a repeated field, a leading "?" a pointer field. The encoder writes every plain field, zero
# or not, where JSON omits zeros (`omitempty`): a zero is kept only for a pointer field, where it
# was set on purpose (gracePeriodSeconds 0).
Fields = dict[int, tuple[str, str]]
_MESSAGES: dict[str, Fields] = {
    "Unknown": {1: ("typeMeta", "TypeMeta"), 2: ("raw", "bytes")},
    "TypeMeta": {1: ("apiVersion", "string"), 2: ("kind", "string")},
    "ObjectMeta": {
        1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"), 5: ("uid", "string"),
        6: ("resourceVersion", "string"), 7: ("generation", "int"), 10: ("deletionGracePeriodSeconds", "?int"),
        11: ("labels", "map"), 12: ("annotations", "map"), 13: ("ownerReferences", "*OwnerReference"),
        14: ("finalizers", "*string"),
    },
    "OwnerReference": {
        1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"), 5: ("apiVersion", "string"),
        6: ("controller", "?bool"), 7: ("blockOwnerDeletion", "?bool"),
    },
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 2: ("data", "map"), 3: ("binaryData", "bytesmap"),
                  4: ("immutable", "?bool")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "*string")},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "?int"), 2: ("preconditions", "Preconditions"), 3: ("orphanDependents", "?bool"),
        4: ("propagationPolicy", "?string"), 5: ("dryRun", "*string"),
    },
    "Preconditions": {1: ("uid", "?string"), 2: ("resourceVersion", "?string")},
    "SelfSubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SelfSubjectAccessReviewSpec")},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta")},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                                    2: ("nonResourceAttributes", "NonResourceAttributes")},
    "ResourceAttributes": {1: ("namespace", "string"), 2: ("verb", "string"), 3: ("group", "string"),
                           4: ("version", "string"), 5: ("resource", "string"), 6: ("subresource", "string"),
                           7: ("name", "string")},
    "NonResourceAttributes": {1: ("path", "string"), 2: ("verb", "string")},
    "MapEntry": {1: ("key", "string"), 2: ("value", "string")},
    "BytesMapEntry": {1: ("key", "string"), 2: ("value", "bytes")},
}  # fmt: skip
# The kinds a body may carry (the envelope's typeMeta.kind).
KINDS = ("ConfigMap", "Namespace", "DeleteOptions", "SelfSubjectAccessReview", "SelfSubjectReview")


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _value(kind: str, raw: bytes | int) -> Any:
    if kind == "int":
        return _signed(raw) if isinstance(raw, int) else None
    if kind == "bool":
        return bool(raw) if isinstance(raw, int) else None
    if not isinstance(raw, bytes):
        raise ProtobufError(f"a {kind} field arrived as a varint")
    if kind == "string":
        return raw.decode()
    if kind == "bytes":
        return raw
    return _decode(raw, kind)


def _decode(data: bytes, message: str) -> dict[str, Any]:
    fields = _MESSAGES[message]
    out: dict[str, Any] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        raw: bytes | int
        if wire == 0:
            raw, at = _varint(data, at)
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            continue
        elif wire == 2:
            size, at = _varint(data, at)
            raw, at = data[at : at + size], at + size
            if len(raw) != size:
                raise ProtobufError(f"truncated field {number} in {message}")
        else:
            raise ProtobufError(f"unsupported wire type {wire} in {message}")
        if number not in fields:
            continue  # a field this server does not read
        name, kind = fields[number]
        if kind in ("map", "bytesmap"):
            entry = _decode(raw if isinstance(raw, bytes) else b"", "MapEntry" if kind == "map" else "BytesMapEntry")
            value = entry.get("value", b"" if kind == "bytesmap" else "")
            if isinstance(value, bytes):
                value = base64.b64encode(value).decode()
            out.setdefault(name, {})[entry.get("key", "")] = value
        elif kind.startswith("*"):
            out.setdefault(name, []).append(_value(kind[1:], raw))
        elif kind.startswith("?"):
            out[name] = _value(kind[1:], raw)
        elif (value := _value(kind, raw)) not in ("", 0, False):
            out[name] = value
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded object (one of KINDS) as its JSON form."""
    if not body.startswith(_MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    envelope = _decode(body[len(_MAGIC):], "Unknown")
    type_meta = envelope.get("typeMeta") or {}
    kind = type_meta.get("kind", "")
    if kind not in KINDS:
        raise ProtobufError(f"the sandbox API server reads protobuf only for {', '.join(KINDS)}, not {kind!r}: "
                            "send JSON")  # fmt: skip
    return {"apiVersion": type_meta.get("apiVersion", ""), "kind": kind, **_decode(envelope.get("raw", b""), kind)}

"""The one protobuf body the sandbox API server reads: a SelfSubjectAccessReview.

kubectl sends built-in types as `application/vnd.kubernetes.protobuf` and falls back to JSON only
for CBOR, so `kubectl auth can-i` posts its review in protobuf whatever the server prefers (it
accepts a JSON answer). The body is Kubernetes' envelope (the magic `k8s\\0`, then a
`runtime.Unknown` whose `raw` is the object); the field numbers below are those of
k8s.io/api/authorization/v1/generated.proto.
"""

from __future__ import annotations

from typing import Any

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

# message name -> {field number: (json name, nested message name or "" for a string)}
_MESSAGES: dict[str, dict[int, tuple[str, str]]] = {
    "Unknown": {2: ("raw", "bytes")},
    "SelfSubjectAccessReview": {2: ("spec", "SelfSubjectAccessReviewSpec")},
    "SelfSubjectAccessReviewSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                                    2: ("nonResourceAttributes", "NonResourceAttributes")},
    "ResourceAttributes": {1: ("namespace", ""), 2: ("verb", ""), 3: ("group", ""), 4: ("version", ""),
                           5: ("resource", ""), 6: ("subresource", ""), 7: ("name", "")},
    "NonResourceAttributes": {1: ("path", ""), 2: ("verb", "")},
}  # fmt: skip


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


def _decode(data: bytes, message: str) -> dict[str, Any]:
    fields = _MESSAGES[message]
    out: dict[str, Any] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = _varint(data, at)
            continue
        if wire == 1 or wire == 5:
            at += 8 if wire == 1 else 4
            continue
        if wire != 2:
            raise ProtobufError(f"unsupported wire type {wire} in {message}")
        size, at = _varint(data, at)
        chunk, at = data[at : at + size], at + size
        if len(chunk) != size:
            raise ProtobufError(f"truncated field {number} in {message}")
        if number not in fields:
            continue  # a field this server does not read (metadata, selectors)
        name, nested = fields[number]
        if nested == "":
            out[name] = chunk.decode()
        elif nested == "bytes":
            out[name] = chunk
        else:
            out[name] = _decode(chunk, nested)
    return out


def decode_self_subject_access_review(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded SelfSubjectAccessReview as its JSON form (the spec; nothing else is read)."""
    if not body.startswith(_MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic number")
    envelope = _decode(body[len(_MAGIC):], "Unknown")
    review = _decode(envelope.get("raw", b""), "SelfSubjectAccessReview")
    review.setdefault("spec", {})
    return review

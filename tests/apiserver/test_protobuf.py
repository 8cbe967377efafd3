"""The protobuf bodies kubectl's typed clients send, decoded without kubectl: the envelope, maps,
repeated and nested messages, zero values of plain fields (dropped, as JSON omits them) and of
pointer fields (kept), and a kind the server does not read."""

from __future__ import annotations

import pytest
from aiohttp import ClientSession

from sharepack.sandbox.apiserver import protobuf
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer


def _varint(n: int) -> bytes:
    out = b""
    n &= (1 << 64) - 1
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, value: bytes | int | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version) + _field(2, kind)
    return b"k8s\x00" + _field(1, type_meta) + _field(2, raw)


def test_a_configmap_decodes_with_maps_and_without_zero_plain_fields() -> None:
    meta = _field(1, "c") + _field(2, "") + _field(3, "team") + _field(7, 0) + _field(11, _field(1, "a") + _field(2, "b"))
    raw = (
        _field(1, meta) + _field(2, _field(1, "k") + _field(2, "v")) + _field(2, _field(1, "j") + _field(2, ""))
        + _field(3, _field(1, "bin") + _field(2, b"\x00\x01")) + _field(4, 0)
    )  # fmt: skip
    got = protobuf.decode(_envelope("v1", "ConfigMap", raw))
    assert got == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "team", "labels": {"a": "b"}},
        "data": {"k": "v", "j": ""}, "binaryData": {"bin": "AAE="}, "immutable": False,
    }  # fmt: skip


def test_delete_options_keep_a_zero_grace_period_and_preconditions() -> None:
    raw = _field(1, 0) + _field(2, _field(1, "uid-1")) + _field(4, "Foreground") + _field(5, "All") + _field(5, "x")
    got = protobuf.decode(_envelope("meta.k8s.io/v1", "DeleteOptions", raw))
    assert got == {
        "apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
        "preconditions": {"uid": "uid-1"}, "propagationPolicy": "Foreground", "dryRun": ["All", "x"],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"kind": "ConfigMap"}', "magic number"),
        (_envelope("apps/v1", "Deployment", b""), "not 'Deployment'"),
        (b"k8s\x00\x0a\x05ab", "truncated"),
    ],
    ids=["not protobuf", "a kind the server does not read", "truncated"],
)
def test_bad_bodies_are_refused_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(protobuf.ProtobufError, match=message):
        protobuf.decode(body)


async def test_the_server_creates_from_protobuf_and_answers_400_to_a_bad_body(server: FakeApiServer) -> None:
    headers = {"Content-Type": protobuf.MEDIA_TYPE, "Accept": "application/vnd.kubernetes.protobuf,application/json"}
    body = _envelope("v1", "Namespace", _field(1, _field(1, "team")))
    async with ClientSession() as s:
        async with s.post(f"{server.url}/api/v1/namespaces", data=body, headers=headers) as resp:
            assert (resp.status, resp.content_type) == (201, "application/json")
        async with s.post(f"{server.url}/api/v1/namespaces", data=b"k8s\x00\xff", headers=headers) as resp:
            status = await resp.json()
    assert server.store.get(kinds.NAMESPACES, "", "team")["status"] == {"phase": "Active"}
    assert (status["code"], status["reason"]) == (400, "BadRequest")
    assert "could not be decoded as protobuf" in status["message"]

"""The extender's request body limit (issue 24, item 6): by default what 5,000 candidate nodes
need, with headroom, not 64 MiB against a 1 GiB memory limit (a whole-Node body of 59 MiB
decodes to 876 MiB of Python objects: benchmarks/bench_body_size.py)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from sharepack.common.policies import Policy
from sharepack.extender.__main__ import parse_args
from sharepack.extender.caches import ClusterView
from sharepack.extender.server import DEFAULT_MAX_BODY_BYTES, Extender

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
ETCD_OBJECT_LIMIT = 1536 * 1024  # kube-apiserver's default --max-request-bytes for etcd: the largest Pod


def bodies() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_body_size", ROOT / "benchmarks" / "bench_body_size.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_fits_5000_node_names_beside_the_largest_pod_with_headroom_and_no_more_than_8_mib() -> None:
    assert DEFAULT_MAX_BODY_BYTES <= 8 * MIB
    assert parse_args(["--insecure-http"]).max_body_bytes == DEFAULT_MAX_BODY_BYTES
    names = len(bodies().names_body(5000))
    assert 4 * (names + ETCD_OBJECT_LIMIT) <= DEFAULT_MAX_BODY_BYTES  # headroom: 4x what it must hold


async def test_a_body_over_the_default_is_refused_with_413_and_the_server_keeps_serving() -> None:
    extender = Extender(ClusterView(Policy.PACKED))
    async with TestClient(TestServer(extender.app())) as client:
        huge = orjson.dumps({"Pod": {"metadata": {"name": "p", "annotations": {"x": "y" * (9 * MIB)}}},
                             "NodeNames": ["node-0"]})  # fmt: skip
        resp = await client.post("/filter", data=io.BytesIO(huge))  # raw bytes this large: aiohttp warns
        assert resp.status == 413
        body: Any = {"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}},
                     "NodeNames": ["node-0"]}  # fmt: skip
        resp = await client.post("/filter", data=orjson.dumps(body))
        assert resp.status == 200
        assert orjson.loads(await resp.read())["NodeNames"] == ["node-0"]

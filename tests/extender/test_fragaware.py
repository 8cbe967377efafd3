"""`--node-policy fragaware`: prioritize prefers the node whose GPU fragmentation grows least."""

from __future__ import annotations

from pathlib import Path
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sharepack.common import fragmentation
from sharepack.common.policies import NodePolicy
from sharepack.extender.__main__ import parse_args
from sharepack.extender.caches import ClusterView
from sharepack.extender.server import Extender

from tests.extender.test_http import SHARED, args_body, pod_json, post, state_obj


# GPU pods only (the default trace's GPU shapes): no CPU-only shape counts every idle GPU.
GPU_PODS = fragmentation.TypicalWorkload(
    tuple(fragmentation.Shape(s.gpus, s.milli, s.weight) for s in fragmentation.DEFAULT_TYPICAL_WORKLOAD.shapes if s.needs_gpu),
    "GPU pods",
)


def view(workload: fragmentation.TypicalWorkload = GPU_PODS) -> ClusterView:
    v = ClusterView(NodePolicy.FRAGAWARE, workload=workload)
    v.replace_states([
        state_obj("node-half", [(10, 5), (10, 0)]),    # half a GPU free on GPU 0
        state_obj("node-idle", [(10, 0), (10, 0)]),
        state_obj("node-tight", [(10, 8), (10, 0)]),   # 0.2 GPU free: a half splits over two GPUs
    ])  # fmt: skip
    return v


NAMES = ["node-idle", "node-tight", "node-half", "node-unknown"]


async def prioritize(v: ClusterView, quantity: str) -> dict[str, int]:
    async with TestClient(TestServer(Extender(v).app())) as c:
        status, reply = await post(c, "prioritize", args_body(pod_json({SHARED: quantity}), NAMES))
    assert status == 200
    return {n: {p["Host"]: p["Score"] for p in reply}.get(n, 0) for n in NAMES}  # zeros are left out


async def test_prioritize_prefers_the_node_whose_fragmentation_grows_least() -> None:
    scores = await prioritize(view(), "5")  # half a GPU
    assert scores["node-half"] == 10  # closes GPU 0: fragmentation drops
    assert scores["node-idle"] == scores["node-tight"] == 0  # both open a half-GPU fragment
    assert scores["node-unknown"] == 0


async def test_a_whole_gpus_worth_moves_fragments_but_adds_none() -> None:
    # idle: one GPU taken whole; tight: 2 replicas close GPU 0, 8 leave 0.2 on GPU 1; half: 5 + 5.
    scores = await prioritize(view(), "10")
    assert scores["node-idle"] == scores["node-tight"] == scores["node-half"] == 5


async def test_prioritize_follows_the_given_typical_workload() -> None:
    # Only 0.2-GPU pods: 0.5 GPU left is no fragment, so the idle node no longer scores 0.
    fifths = fragmentation.TypicalWorkload((fragmentation.Shape(1, 200, 1),))
    scores = await prioritize(view(fifths), "5")
    assert scores["node-idle"] == 5


def test_node_policy_and_typical_workload_flags(tmp_path: Path) -> None:
    assert parse_args(["--node-policy", "fragaware"]).node_policy is NodePolicy.FRAGAWARE
    assert parse_args([]).typical_workload is None
    f = tmp_path / "wl.yaml"
    f.write_text("shapes:\n- {gpus: 1, share: 0.5, weight: 3}\n- {gpus: 2, share: 1, weight: 1}\n")
    opts = parse_args(["--node-policy", "fragaware", "--typical-workload", str(f)])
    assert opts.typical_workload is not None
    assert opts.typical_workload.shapes == (fragmentation.Shape(1, 500, 3), fragmentation.Shape(2, 1000, 1))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("shapes: [{share: 2, weight: 1}]", "shapes[0].share: invalid value 2", id="a bad share"),
        pytest.param(None, "invalid --typical-workload option", id="a missing file"),
    ],
)
def test_a_bad_typical_workload_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    f = tmp_path / "wl.yaml"
    if content is not None:
        f.write_text(content)
    with pytest.raises(SystemExit):
        parse_args(["--typical-workload", str(f)])
    assert message in capsys.readouterr().err


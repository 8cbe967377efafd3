"""The agent's DRA kubelet plugin over the real gRPC protocol on unix sockets: registration as
the kubelet's pluginwatcher sees it, NodePrepareResources / NodeUnprepareResources, CDI specs."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from sharepack.agent.dra import cdi, registering
from sharepack.agent.dra.running import DraPlugin, DraSettings
from sharepack.agent.health import XidPolicy
from sharepack.common import dradevices
from sharepack.common.errors import ClaimError
from sharepack.common.inventory import Inventory
from sharepack.proto.dra.v1 import api_pb2 as dra_pb2
from sharepack.proto.dra.v1 import api_pb2_grpc as dra_grpc
from sharepack.proto.pluginregistration.v1 import api_pb2 as reg_pb2
from sharepack.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.dra.test_dradevices import gpu, time_sliced

NODE = "node-a"


class Claims:
    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], Mapping[str, Any]] = {}

    def add(self, name: str, uid: str, *devices: str, pool: str = NODE) -> None:
        results = [{"request": "container-0-request-0", "driver": "gpu.sharepack.io", "pool": pool, "device": d}
                   for d in devices]  # fmt: skip
        self.docs[("default", name)] = {
            "metadata": {"namespace": "default", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.docs[(namespace, name)]
        except KeyError:
            raise ClaimError(f"claim {namespace}/{name}: cannot read it: not found") from None


@pytest.fixture
async def plugin(tmp_short: Path) -> AsyncIterator[tuple[DraPlugin, Claims]]:
    claims = Claims()
    settings = DraSettings(NODE, tmp_short / "plugins_registry", tmp_short / "plugins", tmp_short / "cdi")
    inventory = Inventory(gpus=(gpu(0), gpu(1)))
    p = DraPlugin(settings, time_sliced(4), inventory, claims)
    await p.start()
    try:
        yield p, claims
    finally:
        await p.stop(grace=0)


async def test_the_kubelet_finds_a_dra_plugin_serving_v1_at_its_socket(plugin: tuple[DraPlugin, Claims]) -> None:
    p, _ = plugin
    socket = registering.registration_socket(p.settings.plugins_registry)
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg_pb2.InfoRequest())
        assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", "gpu.sharepack.io", ["v1.DRAPlugin"])
        assert info.endpoint == str(p.dra_socket)
        assert not p.registration.registered.is_set()
        assert p.readiness() == (False, "not registered with the kubelet yet")
        await stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=False, error="no such service"))
        assert p.readiness() == (False, "no such service")
        await stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
        assert p.registration.registered.is_set()
        assert p.readiness() == (False, "ResourceSlices not published yet")


async def prepare(p: DraPlugin, *claims: tuple[str, str]) -> dra_pb2.NodePrepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{p.dra_socket}") as channel:
        request = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace="default", name=n, uid=u) for n, u in claims]
        )
        answer: dra_pb2.NodePrepareResourcesResponse = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request)
        return answer


async def test_a_prepared_claim_gets_one_cdi_device_naming_its_gpus(plugin: tuple[DraPlugin, Claims]) -> None:
    p, claims = plugin
    claims.add("pod-a-gpu", "uid-a", "gpu-0-replica-0", "gpu-1-replica-2")
    answer = await prepare(p, ("pod-a-gpu", "uid-a"))
    got = answer.claims["uid-a"]
    assert got.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in got.devices] == [
        (NODE, "gpu-0-replica-0", ["container-0-request-0"]), (NODE, "gpu-1-replica-2", ["container-0-request-0"]),
    ]  # fmt: skip
    cdi_id = "k8s.gpu.sharepack.io/claim=uid-a-container-0-request-0"
    assert [list(d.cdi_device_ids) for d in got.devices] == [[cdi_id], []]
    spec = json.loads(cdi.spec_path(p.settings.cdi_root, "uid-a").read_text())
    assert spec["kind"] == "k8s.gpu.sharepack.io/claim"
    (device,) = spec["devices"]
    assert device["name"] == "uid-a-container-0-request-0"
    assert f"NVIDIA_VISIBLE_DEVICES={gpu(0).uuid},{gpu(1).uuid}" in device["containerEdits"]["env"]


async def test_preparing_again_answers_the_same_and_unprepare_removes_the_spec(plugin: tuple[DraPlugin, Claims]) -> None:
    p, claims = plugin
    claims.add("pod-a-gpu", "uid-a", "gpu-0-replica-0")
    first = await prepare(p, ("pod-a-gpu", "uid-a"))
    claims.docs.clear()  # a retry must not need the API again
    assert await prepare(p, ("pod-a-gpu", "uid-a")) == first
    async with grpc.aio.insecure_channel(f"unix://{p.dra_socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        request = dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(namespace="default", name="pod-a-gpu", uid="uid-a")])
        for _ in range(2):  # unpreparing twice succeeds twice
            answer = await stub.NodeUnprepareResources(request)
            assert "uid-a" in answer.claims and answer.claims["uid-a"].error == ""
    assert not cdi.spec_path(p.settings.cdi_root, "uid-a").exists()
    assert p.preparer.prepared == {}


async def test_fresh_first_reorders_the_published_devices_as_claims_are_prepared_and_unprepared(tmp_short: Path) -> None:
    claims = Claims()
    settings = DraSettings(NODE, tmp_short / "plugins_registry", tmp_short / "plugins", tmp_short / "cdi",
                           device_order=dradevices.FRESH_FIRST)  # fmt: skip
    p = DraPlugin(settings, time_sliced(4), Inventory(gpus=(gpu(0), gpu(1))), claims)
    await p.start()
    try:
        gpu_order = lambda: list(dict.fromkeys(d.name.split("-replica-")[0] for d in p.devices))  # noqa: E731
        assert gpu_order() == ["gpu-0", "gpu-1"]
        assert not p._dirty.is_set()
        claims.add("pod-a-gpu", "uid-a", "gpu-0-replica-0")
        assert (await prepare(p, ("pod-a-gpu", "uid-a"))).claims["uid-a"].error == ""
        # GPU 0 is in use: the free GPU 1 comes first, and the slice is due to be republished.
        assert gpu_order() == ["gpu-1", "gpu-0"]
        assert p._dirty.is_set()
        async with grpc.aio.insecure_channel(f"unix://{p.dra_socket}") as channel:
            request = dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(namespace="default", name="pod-a-gpu", uid="uid-a")])
            await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(request)
        assert gpu_order() == ["gpu-0", "gpu-1"]
    finally:
        await p.stop(grace=0)


async def test_the_static_order_does_not_move_when_a_claim_is_prepared(plugin: tuple[DraPlugin, Claims]) -> None:
    p, claims = plugin
    before = p.devices
    claims.add("pod-a-gpu", "uid-a", "gpu-0-replica-0")
    await prepare(p, ("pod-a-gpu", "uid-a"))
    assert p.devices == before and not p._dirty.is_set()


async def test_a_bad_claim_is_its_own_error_and_does_not_fail_the_others(plugin: tuple[DraPlugin, Claims]) -> None:
    p, claims = plugin
    claims.add("good", "uid-g", "gpu-1-replica-0")
    claims.add("foreign", "uid-f", "gpu-0-replica-0", pool="node-b")
    claims.add("unknown-device", "uid-u", "gpu-7-replica-0")
    answer = await prepare(p, ("good", "uid-g"), ("foreign", "uid-f"), ("unknown-device", "uid-u"), ("missing", "uid-m"))
    assert answer.claims["uid-g"].error == ""
    assert "pool 'node-b'" in answer.claims["uid-f"].error
    assert "gpu-7-replica-0" in answer.claims["uid-u"].error and "not one this node publishes" in answer.claims["uid-u"].error
    assert "not found" in answer.claims["uid-m"].error
    assert sorted(p.preparer.prepared) == ["uid-g"]


@dataclass(frozen=True)
class Xid:
    uuid: str
    xid: int


async def test_a_critical_xid_marks_its_gpu_unhealthy_an_application_xid_does_not(plugin: tuple[DraPlugin, Claims]) -> None:
    p, _ = plugin
    policy = XidPolicy()
    p.handle_xid(Xid(gpu(1).uuid, 43), policy)  # 43: an application error, as upstream ignores it
    assert p.unhealthy == set()
    p.handle_xid(Xid(gpu(1).uuid, 48), policy)  # 48: a double-bit ECC error
    assert p.unhealthy == {gpu(1).uuid}
    p.handle_xid(Xid("", 79), policy)  # no GPU named: every GPU, as upstream
    assert p.unhealthy == {gpu(0).uuid, gpu(1).uuid}


async def test_the_sandbox_kubelet_registers_the_agents_driver_and_refuses_other_plugin_types(
    plugin: tuple[DraPlugin, Claims], tmp_short: Path
) -> None:
    from sharepack.sandbox.kubelet.dra import DraManager

    p, _ = plugin
    manager = DraManager(tmp_short, api=None)
    manager.registry_dir = p.settings.plugins_registry
    await manager.scan()
    assert manager.drivers["gpu.sharepack.io"].endpoint == str(p.dra_socket)
    assert p.registration.registered.is_set()
    p.registration.registered.clear()
    registering.registration_socket(p.settings.plugins_registry).unlink()
    await manager.scan()
    assert manager.drivers == {}


@pytest.fixture
def root_logging() -> Iterator[None]:
    """`main` points the root logger at the (captured) stderr: put it back for later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("root_logging")
def test_dra_mode_without_the_kubernetes_api_refuses_to_start_and_says_why(
    tmp_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sharepack.agent.__main__ import main

    code = main(
        ["--mode=dra", "--simulated-machine=t4-pcie", f"--plugins-registry={tmp_short}/r",
         f"--plugins-dir={tmp_short}/p", "--metrics-listen=127.0.0.1:0"],
        env={},
    )  # fmt: skip
    assert code == 1
    assert "--mode dra needs the Kubernetes API and --node-name" in capsys.readouterr().err
    assert not (tmp_short / "r").exists()  # nothing served


@pytest.mark.usefixtures("root_logging")
def test_an_unknown_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from sharepack.agent.__main__ import main

    assert main(["--mode=dra-ish"], env={}) == 2
    assert "invalid --mode option: dra-ish (from --mode; want device-plugin or dra)" in capsys.readouterr().err

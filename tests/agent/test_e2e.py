"""The agent in-process against the fake kubelet, over real unix sockets."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from sharepack.agent import nvml, registering
from sharepack.common.inventory import Inventory
from sharepack.common.devices import physical_key
from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from sharepack.sandbox.kubelet.pods import AdmissionError
from tests.agent.harness import (
    FakeXid,
    XidQueue,
    config,
    fake_kubelet,
    gpu_uuid,
    mig_gpus,
    plain_gpus,
    pod,
    running_agent,
    time_slicing,
)


@pytest.mark.parametrize(
    ("policy", "gpus_used_by_three_pods", "gpus_used_by_one_pair"),
    [
        pytest.param("packed", 1, 1, id="packed puts three pods on one gpu"),
        pytest.param("distributed", 3, 2, id="distributed puts three pods on three gpus"),
        pytest.param("spread", 3, 2, id="spread gives a pair two gpus"),
    ],
)
async def test_time_slicing_policies(policy: str, gpus_used_by_three_pods: int, gpus_used_by_one_pair: int) -> None:
    cfg = config(time_slicing(4), **{"shared-devices-allocation-policy": policy})
    async with fake_kubelet() as kubelet, running_agent(kubelet, cfg, plain_gpus(4)):
        assert kubelet.capacity() == {"nvidia.com/gpu": 16}
        used = set()
        for uid in ("a", "b", "c"):
            admission = await kubelet.admit_pod(pod(uid, "nvidia.com/gpu"))
            used |= {physical_key(d) for d in admission.devices("main", "nvidia.com/gpu")}
        assert len(used) == gpus_used_by_three_pods
        for uid in ("a", "b", "c"):
            await kubelet.remove_pod(uid)
        pair = await kubelet.admit_pod(pod("p", "nvidia.com/gpu", 2))
        assert len({physical_key(d) for d in pair.devices("main", "nvidia.com/gpu")}) == gpus_used_by_one_pair


MIG_LAYOUT = (("3g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5))


@pytest.mark.parametrize(
    ("strategy", "layout", "capacity"),
    [
        pytest.param("none", MIG_LAYOUT, {"nvidia.com/gpu": 2}, id="none serves whole gpus"),
        pytest.param("single", (("1g.5gb", 0), ("1g.5gb", 1)), {"nvidia.com/gpu": 4}, id="single serves instances as gpus"),
        pytest.param(
            "mixed", MIG_LAYOUT, {"nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-3g.20gb": 2}, id="mixed serves one resource per profile"
        ),
    ],
)
async def test_mig_strategies(strategy: str, layout: tuple[tuple[str, int], ...], capacity: dict[str, int]) -> None:
    inventory = mig_gpus(2, layout)
    mig_uuids = {m.uuid for g in inventory.gpus for m in g.mig_devices}
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(**{"mig-strategy": strategy}), inventory):
        assert kubelet.capacity() == capacity
        for resource in capacity:
            admission = await kubelet.admit_pod(pod(f"p-{resource}", resource))
            visible = admission.allocation("main", resource).envs["NVIDIA_VISIBLE_DEVICES"]
            assert (visible in mig_uuids) is (strategy != "none"), visible


async def test_mig_packed_groups_instances_by_parent_gpu() -> None:
    inventory = mig_gpus(2, (("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2)))
    parent = {m.uuid: g.uuid for g in inventory.gpus for m in g.mig_devices}
    cfg = config(**{"mig-strategy": "mixed", "shared-devices-allocation-policy": "packed"})
    async with fake_kubelet() as kubelet, running_agent(kubelet, cfg, inventory):
        parents = set()
        for uid in ("a", "b", "c"):
            admission = await kubelet.admit_pod(pod(uid, "nvidia.com/mig-1g.5gb"))
            parents |= {parent[d] for d in admission.devices("main", "nvidia.com/mig-1g.5gb")}
        assert len(parents) == 1


def _index(device_id: str) -> int:
    """GPU index (= minor) of a harness GPU UUID."""
    return int(device_id[len("GPU-"):len("GPU-") + 8], 16)


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        pytest.param(
            {"device-list-strategy": "envvar"},
            lambda r, ids: dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)} and not r.mounts,
            id="envvar lists uuids",
        ),
        pytest.param(
            {"device-list-strategy": "envvar", "device-id-strategy": "index"},
            lambda r, ids: sorted(r.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(str(_index(i)) for i in ids),
            id="envvar with index ids",
        ),
        pytest.param(
            {"device-list-strategy": "volume-mounts"},
            lambda r, ids: r.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
            and sorted((m.container_path, m.host_path) for m in r.mounts)
            == sorted((f"/var/run/nvidia-container-devices/{i}", "/dev/null") for i in ids),
            id="volume-mounts mounts dev null per device",
        ),
        pytest.param(
            {"device-list-strategy": "cdi-annotations"},
            lambda r, ids: not r.envs
            and len(r.annotations) == 1
            and next(iter(r.annotations)).startswith("cdi.k8s.io/nvidia-device-plugin_")
            and sorted(next(iter(r.annotations.values())).split(",")) == sorted(f"nvidia.com/gpu={i}" for i in ids),
            id="cdi-annotations annotate qualified names",
        ),
        pytest.param(
            {"device-list-strategy": "cdi-cri"},
            lambda r, ids: not r.envs and sorted(d.name for d in r.cdi_devices) == sorted(f"nvidia.com/gpu={i}" for i in ids),
            id="cdi-cri fills cdi devices",
        ),
        pytest.param(
            {"device-list-strategy": "envvar,cdi-cri"},
            lambda r, ids: "NVIDIA_VISIBLE_DEVICES" in r.envs and len(r.cdi_devices) == 2,
            id="envvar and cdi-cri together",
        ),
        pytest.param(
            {"pass-device-specs": "true"},
            lambda r, ids: {d.container_path for d in r.devices if d.container_path[len("/dev/nvidia"):].isdigit()}
            == {f"/dev/nvidia{_index(i)}" for i in ids}
            and all(d.permissions == "rw" and d.host_path == d.container_path for d in r.devices),
            id="pass-device-specs adds the gpus device nodes",
        ),
    ],
)
async def test_device_list_strategies(flags: dict[str, str], check: object) -> None:
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(**flags), plain_gpus(4)):
        admission = await kubelet.admit_pod(pod("p", "nvidia.com/gpu", 2))
        allocation = admission.allocation("main", "nvidia.com/gpu")
        assert callable(check)
        assert check(allocation.response, list(allocation.device_ids)), allocation.response


async def test_mps_sets_the_pipe_directory_and_mounts() -> None:
    text = time_slicing(2).replace("timeSlicing", "mps")
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(text), plain_gpus(2)):
        allocation = (await kubelet.admit_pod(pod("p", "nvidia.com/gpu"))).allocation("main", "nvidia.com/gpu")
        assert allocation.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
        mounts = {(m.container_path, m.host_path) for m in allocation.response.mounts}
        assert mounts == {
            ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
            ("/dev/shm", "/run/nvidia/mps/shm"),
        }


async def test_xid_marks_every_replica_of_the_gpu_unhealthy_and_list_and_watch_resends() -> None:
    xids = XidQueue()
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(time_slicing(2)), plain_gpus(2), xids=xids) as agent:
        assert kubelet.allocatable() == {"nvidia.com/gpu": 4}
        xids.put(FakeXid(gpu_uuid(0), 13))  # application error: ignored
        xids.put(FakeXid(gpu_uuid(1), 79))
        await kubelet.wait_until(lambda: kubelet.allocatable() == {"nvidia.com/gpu": 2}, timeout=30, what="gpu 1 unhealthy")
        assert kubelet.healthy("nvidia.com/gpu") == {f"{gpu_uuid(0)}::0", f"{gpu_uuid(0)}::1"}
        assert agent.snapshot().unhealthy == {f"{gpu_uuid(1)}::0", f"{gpu_uuid(1)}::1"}
        assert kubelet.capacity() == {"nvidia.com/gpu": 4}


async def test_quiet_device_recovers_when_recovery_is_configured() -> None:
    xids = XidQueue()
    async with fake_kubelet() as kubelet, running_agent(
        kubelet, config(), plain_gpus(2), xids=xids, recovery_after_s=0.3
    ):
        xids.put(FakeXid(gpu_uuid(1), 79))
        await kubelet.wait_until(lambda: kubelet.allocatable() == {"nvidia.com/gpu": 1}, timeout=30, what="unhealthy")
        await kubelet.wait_until(lambda: kubelet.allocatable() == {"nvidia.com/gpu": 2}, timeout=30, what="healed")


async def test_kubelet_restart_re_registers_every_resource() -> None:
    # Generous deadline: a hung test, not a speed claim (bench_agent.py times the restart).
    cfg = config(**{"mig-strategy": "mixed"})
    async with fake_kubelet() as kubelet, running_agent(kubelet, cfg, mig_gpus(2, MIG_LAYOUT)) as agent:
        before = len(kubelet.registrations)
        await kubelet.restart()
        for resource in agent.resources:
            await kubelet.wait_for_resource(resource.name, timeout=30.0)
        assert len(kubelet.registrations) >= before + len(agent.resources)
        assert kubelet.capacity() == {"nvidia.com/mig-1g.5gb": 4, "nvidia.com/mig-3g.20gb": 2}
        await kubelet.admit_pod(pod("after", "nvidia.com/mig-1g.5gb"))


async def test_bad_config_on_reload_keeps_the_old_config_serving(caplog: pytest.LogCaptureFixture) -> None:
    texts = {"now": time_slicing(2)}
    loader = lambda: config(texts["now"])  # noqa: E731 - the "file" the agent re-reads
    async with fake_kubelet() as kubelet, running_agent(kubelet, loader(), plain_gpus(2), loader=loader) as agent:
        texts["now"] = "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: spreadd\n"
        assert await agent.reload() is False
        assert "config reload failed, keeping the config in use" in caplog.text
        assert "invalid --shared-devices-allocation-policy option: spreadd" in caplog.text
        assert kubelet.capacity() == {"nvidia.com/gpu": 4}
        await kubelet.admit_pod(pod("still-served", "nvidia.com/gpu"))

        texts["now"] = time_slicing(3, rename=True)
        assert await agent.reload() is True
        await kubelet.wait_for_resource("nvidia.com/gpu.shared")
        assert kubelet.capacity()["nvidia.com/gpu.shared"] == 6


async def test_allocate_errors_name_the_device_and_map_to_status_codes() -> None:
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(time_slicing(2, fail_gt_one=True)), plain_gpus(2)) as agent:
        path = agent.server_sockets()["nvidia.com/gpu"]
        assert path == kubelet.device_plugin_dir / "nvidia-gpu.sock"
        async with grpc.aio.insecure_channel(registering.unix_target(Path(path))) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope"])])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Allocate(request)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == 'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: GPU-nope'
        with pytest.raises(AdmissionError, match="maximum request size for shared resources is 1"):
            await kubelet.admit_pod(pod("two", "nvidia.com/gpu", 2))


# ---- on the NVML simulator, through the real adapter ------------------------------------------


@contextmanager
def simulated(machine: str) -> Iterator[tuple[nvml.NvmlLibrary, Inventory]]:
    lib = nvml.load_library(machine)
    try:
        yield lib, nvml.read_inventory(lib)
    finally:
        nvml.shutdown(lib)


def _score(inventory: Inventory, gpus: tuple[str, ...]) -> int:
    scores = inventory.pair_scores
    return sum(scores.get((a, b), scores.get((b, a), 0)) for a, b in itertools.combinations(gpus, 2))


async def test_full_gpus_on_dgx1_volta_get_the_best_partition_through_the_kubelet() -> None:
    # docs/policies.md's example: on an idle hybrid cube mesh a pair request gets GPUs 0 and 3
    # (230), not the best single pair 2-3 (250), because 0-3 belongs to the best partition into
    # pairs that the lowest GPU index breaks the tie for. The sandbox kubelet lists the available
    # IDs in a random order (as a Go set does), so an order-dependent answer fails here.
    with simulated("dgx1-volta") as (_, inventory):
        index = {g.uuid: g.index for g in inventory.gpus}
        async with fake_kubelet() as kubelet, running_agent(
            kubelet, config(**{"shared-devices-allocation-policy": "packed"}), inventory
        ):
            answers = []
            for uid, size in (("pair", 2), ("quad", 4)):
                got = (await kubelet.admit_pod(pod(uid, "nvidia.com/gpu", size))).devices("main", "nvidia.com/gpu")
                answers.append((sorted(index[g] for g in got), _score(inventory, got)))
    # The quad comes from GPUs 1, 2, 4..7: 4-7 is the only full group of the best partition.
    assert answers == [([0, 3], 230), ([4, 5, 6, 7], 1120)]


async def test_simulated_xid_reaches_the_kubelet_through_the_nvml_adapter() -> None:
    with simulated("dgx-a100-mig") as (lib, inventory):
        mig = next(m for g in inventory.gpus for m in g.mig_devices)
        siblings = {m.uuid for g in inventory.gpus for m in g.mig_devices if m.parent_uuid == mig.parent_uuid}
        with nvml.XidWatcher(lib) as watcher:
            async with fake_kubelet() as kubelet, running_agent(
                kubelet, config(**{"mig-strategy": "mixed"}), inventory, xids=watcher
            ) as agent:
                lib.inject_xid(mig.uuid, 48)  # type: ignore[attr-defined]
                await agent.wait_changed(agent.version)
                await kubelet.wait_until(lambda: mig.uuid in {
                    d for r in kubelet.resources() for d, s in kubelet.devices(r).items() if not s.healthy
                }, timeout=30, what="mig instance unhealthy")
                assert agent.snapshot().unhealthy == {mig.uuid}, "only the instance the event names"
                lib.inject_xid(mig.parent_uuid, 79)  # type: ignore[attr-defined]
                await kubelet.wait_until(lambda: siblings <= {
                    d for r in kubelet.resources() for d, s in kubelet.devices(r).items() if not s.healthy
                }, timeout=30, what="every instance of the gpu unhealthy")


async def test_the_publisher_sees_allocations_health_and_config_changes() -> None:
    xids = XidQueue()
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(time_slicing(2)), plain_gpus(2), xids=xids) as agent:
        changes = agent.changes()
        first = await anext(changes)
        assert [r.name for r in first.resources] == ["nvidia.com/gpu"] and not first.allocations

        admission = await kubelet.admit_pod(pod("p", "nvidia.com/gpu"))
        snap = await anext(changes)
        assert snap.version > first.version
        assert [(a.resource, a.device_ids) for a in snap.allocations] == [
            ("nvidia.com/gpu", admission.devices("main", "nvidia.com/gpu"))
        ]

        xids.put(FakeXid(gpu_uuid(0), 79))
        snap = await agent.wait_changed(snap.version)
        assert not snap.healthy(f"{gpu_uuid(0)}::1") and snap.healthy(f"{gpu_uuid(1)}::1")

        await agent.apply_config(config(time_slicing(3, rename=True)))
        snap = agent.snapshot()
        assert [r.name for r in snap.resources] == ["nvidia.com/gpu.shared"]
        sick = {f"{gpu_uuid(0)}::{n}" for n in range(3)}
        assert snap.unhealthy == sick, "a reload keeps a broken gpu broken, new replicas included"
        await kubelet.wait_for_resource("nvidia.com/gpu.shared")
        await changes.aclose()


async def test_preferred_allocation_that_cannot_be_met_is_resource_exhausted() -> None:
    async with fake_kubelet() as kubelet, running_agent(kubelet, config(), plain_gpus(2)) as agent:
        path = agent.server_sockets()["nvidia.com/gpu"]
        async with grpc.aio.insecure_channel(registering.unix_target(Path(path))) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            request = api_pb2.PreferredAllocationRequest(container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=[gpu_uuid(0)], allocation_size=2)
            ])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetPreferredAllocation(request)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            # Upstream's text prefix; upstream's status code would be UNKNOWN (docs/policies.md).
            assert (info.value.details() or "").startswith(
                "error getting list of preferred allocation devices: not enough available devices"
            )
            assert "nvidia.com/gpu wants 2 of 1 available" in (info.value.details() or "")


async def test_stopping_ends_the_streams_and_removes_the_sockets() -> None:
    async with fake_kubelet() as kubelet:
        async with running_agent(kubelet, config(), plain_gpus(2)) as agent:
            socket = agent.server_sockets()["nvidia.com/gpu"]
            assert kubelet.healthy("nvidia.com/gpu")
        await kubelet.wait_until(lambda: not kubelet.healthy("nvidia.com/gpu"), timeout=30, what="stream ended")
        assert not socket.exists()


async def test_a_policy_only_reload_keeps_the_servers_and_takes_effect() -> None:
    flags = {"shared-devices-allocation-policy": "distributed"}
    loader = lambda: config(time_slicing(4), **flags)  # noqa: E731
    async with fake_kubelet() as kubelet, running_agent(kubelet, loader(), plain_gpus(4), loader=loader) as agent:
        registrations = len(kubelet.registrations)
        flags["shared-devices-allocation-policy"] = "packed"
        assert await agent.reload() is True
        assert len(kubelet.registrations) == registrations, "no re-registration for a policy change"
        used = set()
        for uid in ("a", "b", "c"):
            used |= {physical_key(d) for d in (await kubelet.admit_pod(pod(uid, "nvidia.com/gpu"))).devices("main", "nvidia.com/gpu")}
        assert len(used) == 1, "packed is in effect"


async def test_a_list_and_watch_stream_cut_by_the_kubelet_is_registered_again() -> None:
    """The kubelet ends the stream without restarting (no socket deleted): it now counts every
    device unhealthy and never redials. The agent registers again, once."""
    cfg = config(time_slicing(2))
    async with fake_kubelet() as kubelet, running_agent(kubelet, cfg, plain_gpus(2)) as agent:
        (resource,) = (r.name for r in agent.resources)
        before = len(kubelet.registrations)
        await kubelet.cut_stream(resource)
        assert kubelet.healthy(resource) == frozenset()
        await kubelet.wait_until(lambda: len(kubelet.healthy(resource)) == 4, timeout=10.0,
                                 what="the resource healthy again")  # fmt: skip
        assert len(kubelet.registrations) == before + 1
        await kubelet.admit_pod(pod("after-cut", resource))
        # The kubelet replacing the old endpoint by the new one is no second loss: no more
        # registrations (waited out over several grace periods).
        await asyncio.sleep(4 * agent.settings.stream_grace_s)
        assert len(kubelet.registrations) == before + 1

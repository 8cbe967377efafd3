"""Pod admission as the kubelet's device manager does it, container by container."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
import pytest

from sharepack.proto.deviceplugin.v1beta1 import api_pb2
from sharepack.sandbox.kubelet.devicemanager import AdmissionError, ContainerSpec, FakeKubelet, PodSpec, effective_requests
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, StubPlugin, dev


def pod(uid: str, *containers: ContainerSpec, init: tuple[ContainerSpec, ...] = ()) -> PodSpec:
    return PodSpec(uid=uid, name=f"pod-{uid}", namespace="ns", containers=containers, init_containers=init)


def gpus(name: str, count: int, **kwargs: bool) -> ContainerSpec:
    return ContainerSpec(name, {RESOURCE: count}, **kwargs)


def preferred_requests(plugin: StubPlugin) -> list[tuple[set[str], set[str], int]]:
    return [
        (set(r.available_deviceIDs), set(r.must_include_deviceIDs), r.allocation_size)
        for request in plugin.served("GetPreferredAllocation")
        for r in request.container_requests
    ]


def allocate_requests(plugin: StubPlugin) -> list[list[str]]:
    return [list(r.devices_ids) for request in plugin.served("Allocate") for r in request.container_requests]


async def test_preferred_allocation_sees_free_healthy_devices_and_its_answer_is_used(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    registered.set_devices([dev("d0"), dev("d1", healthy=False), dev("d2"), dev("d3")])
    await kubelet.wait_until(lambda: kubelet.allocatable() == {RESOURCE: 3}, what="d1 unhealthy")
    await kubelet.admit_pod(pod("a", gpus("main", 1)))
    registered.calls.clear()
    registered.preferred = lambda r: ["d3", "d2"]

    admission = await kubelet.admit_pod(pod("b", gpus("main", 2)))

    assert preferred_requests(registered) == [({"d2", "d3"}, set(), 2)]
    assert admission.devices("main", RESOURCE) == ("d2", "d3")
    assert allocate_requests(registered) == [["d2", "d3"]]
    assert admission.allocation("main", RESOURCE).preferred == frozenset({"d2", "d3"})


async def test_admission_records_the_allocate_response(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    registered.allocate_envs = {"EXTRA": "1"}
    admission = await kubelet.admit_pod(pod("a", gpus("main", 2)))

    allocation = admission.allocation("main", RESOURCE)
    assert allocation.device_ids == ("d0", "d1")
    assert allocation.envs == {"STUB_DEVICES": "d0,d1", "EXTRA": "1"}
    assert allocation.annotations == {"stub/devices": "d0,d1"}
    assert [(m.container_path, m.host_path, m.read_only) for m in allocation.mounts] == [("/stub", "/var/stub", True)]
    assert [(d.container_path, d.permissions) for d in allocation.devices] == [("/dev/d0", "rw"), ("/dev/d1", "rw")]
    assert allocation.cdi_devices == ("example.com/gpu=d0", "example.com/gpu=d1")
    assert dict(allocation.numa_nodes) == {"d0": (0,), "d1": (0,)}
    assert kubelet.allocated(RESOURCE) == {"d0", "d1"}


@pytest.mark.parametrize(
    ("answer", "expected", "why"),
    [
        pytest.param(["d3"], {"d3", "d0", "d1"}, "short answer", id="short answer is filled by the kubelet"),
        pytest.param([], {"d0", "d1", "d2"}, "empty answer", id="empty answer is filled by the kubelet"),
        pytest.param(["d9", "d2"], {"d2", "d0", "d1"}, "unknown id", id="ids not on offer are ignored"),
        pytest.param(["d3", "d2", "d1", "d0"], None, "too many", id="oversized answer is cut to the request"),
    ],
)
async def test_shortfall_in_the_preferred_answer_is_filled(
    kubelet: FakeKubelet, registered: StubPlugin, answer: list[str], expected: set[str] | None, why: str
) -> None:
    registered.preferred = lambda r: answer

    admission = await kubelet.admit_pod(pod("a", gpus("main", 3)))

    held = set(admission.devices("main", RESOURCE))
    assert len(held) == 3
    if expected is not None:
        assert held == expected
    else:
        assert held <= set(answer)


async def test_no_preferred_allocation_call_when_the_plugin_does_not_offer_it(
    kubelet: FakeKubelet, make_plugin: PluginFactory
) -> None:
    plugin = await make_plugin(devices=[dev("x0"), dev("x1"), dev("x2")], preferred=None)
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)

    admission = await kubelet.admit_pod(pod("a", gpus("main", 2)))

    assert plugin.served("GetPreferredAllocation") == []
    assert len(admission.devices("main", RESOURCE)) == 2
    assert admission.allocation("main", RESOURCE).preferred is None


async def test_init_container_devices_are_reused_by_app_containers(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    admission = await kubelet.admit_pod(pod("a", gpus("app", 1), init=(gpus("setup", 2),)))

    assert admission.devices("setup", RESOURCE) == ("d0", "d1")
    assert admission.devices("app", RESOURCE) == ("d0",)
    assert admission.allocation("app", RESOURCE).reused
    # Only the init container asked the plugin; the app container took a reused device.
    assert preferred_requests(registered) == [({"d0", "d1", "d2", "d3"}, set(), 2)]
    assert kubelet.allocated(RESOURCE) == {"d0", "d1"}


async def test_app_container_needing_more_than_init_gave_must_include_them(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    # The init container is offered everything and takes d0; the app container must keep d0.
    registered.preferred = lambda r: [*r.must_include_deviceIDs, "d3"] if r.must_include_deviceIDs else ["d0"]

    admission = await kubelet.admit_pod(pod("a", gpus("app", 2), init=(gpus("setup", 1),)))

    assert admission.devices("setup", RESOURCE) == ("d0",)
    assert preferred_requests(registered)[1] == ({"d0", "d1", "d2", "d3"}, {"d0"}, 2)
    assert admission.devices("app", RESOURCE) == ("d0", "d3")


async def test_two_app_containers_never_share_and_the_second_is_not_handed_reused_devices(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    admission = await kubelet.admit_pod(pod("a", gpus("one", 1), gpus("two", 1), init=(gpus("setup", 1),)))

    assert admission.devices("one", RESOURCE) == ("d0",)
    assert admission.devices("two", RESOURCE) == ("d1",)
    assert preferred_requests(registered)[-1] == ({"d1", "d2", "d3"}, set(), 1)


async def test_sidecar_devices_are_kept_not_reused(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    admission = await kubelet.admit_pod(pod("a", gpus("app", 1), init=(gpus("sidecar", 1, restartable=True),)))

    assert admission.devices("sidecar", RESOURCE) == ("d0",)
    assert admission.devices("app", RESOURCE) == ("d1",)


async def test_sidecar_after_a_plain_init_container_reuses_its_devices(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    admission = await kubelet.admit_pod(
        pod("a", gpus("app", 1), init=(gpus("setup", 1), gpus("sidecar", 1, restartable=True)))
    )

    assert admission.devices("setup", RESOURCE) == ("d0",)
    assert admission.devices("sidecar", RESOURCE) == ("d0",)
    # The sidecar keeps d0 running, so the app container gets a fresh device.
    assert admission.devices("app", RESOURCE) == ("d1",)


async def test_concurrent_admissions_never_hand_out_a_device_twice(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    admissions = await asyncio.gather(*(kubelet.admit_pod(pod(str(n), gpus("main", 1))) for n in range(4)))

    held = [a.devices("main", RESOURCE) for a in admissions]
    assert sorted(d for devices in held for d in devices) == ["d0", "d1", "d2", "d3"]


async def test_remove_pod_frees_its_devices(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    await kubelet.admit_pod(pod("a", gpus("main", 4)))
    assert kubelet.allocated(RESOURCE) == {"d0", "d1", "d2", "d3"}

    await kubelet.remove_pod("a")
    await kubelet.remove_pod("a")  # gone already: nothing to do

    assert kubelet.allocated(RESOURCE) == frozenset()
    assert (await kubelet.admit_pod(pod("b", gpus("main", 4)))).devices("main", RESOURCE) == ("d0", "d1", "d2", "d3")


async def test_pre_start_container_is_called_when_the_plugin_requires_it(
    kubelet: FakeKubelet, make_plugin: PluginFactory
) -> None:
    plugin = await make_plugin(devices=[dev("x0"), dev("x1")], pre_start_required=True)
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)

    await kubelet.admit_pod(pod("a", gpus("main", 1)))

    assert [list(r.devices_ids) for r in plugin.served("PreStartContainer")] == [["x0"]]


async def test_admitting_the_same_uid_twice_is_a_caller_error(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    await kubelet.admit_pod(pod("a", gpus("main", 1)))
    with pytest.raises(ValueError, match="pod uid a: already admitted"):
        await kubelet.admit_pod(pod("a", gpus("main", 1)))


async def _expect_rejection(kubelet: FakeKubelet, spec: PodSpec) -> AdmissionError:
    before = kubelet.allocated(RESOURCE)
    with pytest.raises(AdmissionError) as caught:
        await kubelet.admit_pod(spec)
    assert kubelet.allocated(RESOURCE) == before, "a rejected pod must not keep devices"
    assert spec.uid not in {a.pod.uid for a in kubelet.admissions()}
    return caught.value


async def test_not_enough_devices_is_rejected_with_the_kubelet_text(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    await kubelet.admit_pod(pod("a", gpus("main", 2)))

    error = await _expect_rejection(kubelet, pod("b", gpus("main", 3)))

    assert error.reason == "UnexpectedAdmissionError"
    assert error.cause == f"requested number of devices unavailable for {RESOURCE}. Requested: 3, Available: 2"
    assert error.message == f"Allocate failed due to {error.cause}, which is unexpected"


async def test_failure_in_a_later_container_frees_the_earlier_ones(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    error = await _expect_rejection(kubelet, pod("b", gpus("one", 2), gpus("two", 3)))
    assert "Requested: 3, Available: 2" in error.cause
    assert len(allocate_requests(registered)) == 1  # the first container did reach the plugin


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        pytest.param(grpc.StatusCode.INVALID_ARGUMENT, "rpc error: code = InvalidArgument desc = bad", id="invalid argument"),
        pytest.param(grpc.StatusCode.CANCELLED, "rpc error: code = Canceled desc = bad", id="cancelled spelled as Go does"),
    ],
)
async def test_allocate_error_from_the_plugin_rejects_the_pod(
    kubelet: FakeKubelet, registered: StubPlugin, code: grpc.StatusCode, expected: str
) -> None:
    registered.allocate_error = (code, "bad")
    error = await _expect_rejection(kubelet, pod("a", gpus("main", 1)))
    assert error.cause == expected


async def test_no_healthy_devices_after_the_stream_ended(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    registered.end_streams()
    await kubelet.wait_until(lambda: not kubelet.connected(RESOURCE), what="endpoint stopped")

    error = await _expect_rejection(kubelet, pod("a", gpus("main", 1)))

    assert error.cause == f"no healthy devices present; cannot allocate unhealthy devices {RESOURCE}"


async def test_unregistered_resource_fails_the_node_fit_check(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    spec = pod("a", ContainerSpec("main", {"example.com/fpga": 1}))

    error = await _expect_rejection(kubelet, spec)

    assert error.reason == "OutOfexample.com/fpga"
    assert error.message == "Node didn't have enough resource: example.com/fpga, requested: 1, used: 0, capacity: 0"


async def test_native_resources_are_not_the_device_managers(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    admission = await kubelet.admit_pod(pod("a", ContainerSpec("main", {"cpu": 4, "memory": 1 << 30, RESOURCE: 1})))

    assert set(admission.container("main").resources) == {RESOURCE}
    assert len(registered.served("Allocate")) == 1


async def test_node_fit_raises_allocatable_to_what_is_allocated(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    await kubelet.admit_pod(pod("a", gpus("main", 2)))  # d0, d1
    # d0 (held) turns unhealthy: 3 healthy devices, and 2 + 2 requested. The kubelet lifts
    # allocatable to the 4 devices allocated (the new pod's included) before the fit check.
    registered.set_devices([dev("d0", healthy=False), dev("d1"), dev("d2"), dev("d3")])
    await kubelet.wait_until(lambda: kubelet.allocatable() == {RESOURCE: 3}, what="d0 unhealthy")

    admission = await kubelet.admit_pod(pod("b", gpus("main", 2)))

    assert admission.devices("main", RESOURCE) == ("d2", "d3")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(pod("p", gpus("a", 1), gpus("b", 2)), {RESOURCE: 3}, id="app containers add up"),
        pytest.param(pod("p", gpus("a", 1), init=(gpus("i", 3),)), {RESOURCE: 3}, id="a bigger init container wins"),
        pytest.param(pod("p", gpus("a", 2), init=(gpus("i", 1),)), {RESOURCE: 2}, id="smaller init container is hidden"),
        pytest.param(
            pod("p", gpus("a", 1), init=(gpus("s", 1, restartable=True), gpus("i", 2))),
            {RESOURCE: 3},
            id="init container runs beside earlier sidecars",
        ),
        pytest.param(
            pod("p", gpus("a", 2), init=(gpus("s", 1, restartable=True),)),
            {RESOURCE: 3},
            id="sidecars add to app containers",
        ),
        pytest.param(pod("p", ContainerSpec("a", {RESOURCE: 0})), {}, id="zero requests vanish"),
    ],
)
def test_effective_requests(spec: PodSpec, expected: Mapping[str, int]) -> None:
    assert effective_requests(spec) == expected


def test_pod_spec_rejects_duplicate_container_names() -> None:
    with pytest.raises(ValueError, match=r"pod ns/pod-p: duplicate container names \['a'\]"):
        pod("p", gpus("a", 1), init=(gpus("a", 1),))


def test_allocation_request_messages_are_real_protobufs() -> None:
    # Guard the field names the kubelet and plugins share (mixed case on purpose).
    request = api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=["a"], must_include_deviceIDs=[], allocation_size=1
    )
    assert request.allocation_size == 1

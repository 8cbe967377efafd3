"""deploy/dra's device order on the real kube-scheduler: agents with `--dra-device-order=fresh-first`
republish their ResourceSlice whenever a claim is prepared, GPUs in no use first, and the
scheduler's first-fit allocator follows the new order: the next share opens a free GPU; once no
GPU is free, shares top up the fullest."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sharepack.common import dradevices
from sharepack.sandbox.controlplane.plane import BackgroundControlPlane
from sharepack.sandbox.drivers.drastack import DraCluster
from tests.realcluster.test_dra import allocated, dra_stack, get, run_pod

pytestmark = pytest.mark.timeout(300)

NODE = "dra-fresh"


@pytest.fixture(scope="module")
def fresh() -> Iterator[tuple[BackgroundControlPlane, DraCluster]]:
    yield from dra_stack((NODE,), device_order=dradevices.FRESH_FIRST)


def gpu_order(background: BackgroundControlPlane, cluster: DraCluster) -> list[str]:
    (published,) = get(cluster.control, background, "resourceslices", f"--field-selector=spec.nodeName={NODE}")["items"]
    return list(dict.fromkeys(d["name"].split("-replica-")[0] for d in published["spec"]["devices"]))


def wait_order(background: BackgroundControlPlane, cluster: DraCluster, first: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while (order := gpu_order(background, cluster))[0] != first:
        assert time.monotonic() < deadline, f"the slice still lists {order} (want {first} first)"
        time.sleep(0.2)
    return order


def gpus_of(background: BackgroundControlPlane, cluster: DraCluster, name: str, replicas: int = 1) -> list[str]:
    pod = run_pod(cluster.control, background, name, replicas)
    return [d.split("-replica-")[0] for _, d in allocated(cluster.control, background, pod)]


def test_the_allocator_opens_a_free_gpu_for_each_share_while_one_is_left_then_tops_up_the_fullest(
    fresh: tuple[BackgroundControlPlane, DraCluster],
) -> None:
    background, cluster = fresh
    gpus = gpu_order(background, cluster)
    assert len(gpus) >= 2
    # Each share opens the next free GPU: the agent republished its slice after preparing the
    # last; the last GPU gets 3 replicas, the others 2.
    for i, want in enumerate(gpus):
        n = 3 if i == len(gpus) - 1 else 2
        assert gpus_of(background, cluster, f"fresh-{i}", n) == [want] * n
        if i + 1 < len(gpus):
            wait_order(background, cluster, gpus[i + 1])
    # No GPU is free now: the fullest (the last one, not first in the static order) comes first,
    # and the next share tops it up.
    order = wait_order(background, cluster, gpus[-1])
    assert order == [gpus[-1], *gpus[:-1]]
    assert gpus_of(background, cluster, "fresh-top") == [gpus[-1]]

"""Issue 5's acceptance scenario, through the real processes.

Two simulated nodes (4 Tesla T4 each, 4 time-slicing replicas per GPU), the sandbox API server,
one agent per node and the extender, all with the same policy. A serial stream: 8 pods of one
replica, then 4 pods of 4 replicas (a whole GPU's worth). Under `packed` every full-GPU pod gets
a GPU to itself; under `distributed` the single replicas sit one per GPU and every full-GPU pod
is stranded across GPUs shared with others. Counts come from the published NodeGpuState.

Each policy's stream runs once per module and control plane (6 to 14 s each on the in-process
one, by load; about twice that on the real kube-apiserver and kube-scheduler); the tests read its
record.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sharepack.common.policies import Policy
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import Wave
from tests.conftest import real_binaries
from tests.scenario.harness import (
    REPLICAS,
    StreamResult,
    free_gpus,
    pods_on,
    run_stream,
    whole_gpu_holders,
)

pytestmark = [
    pytest.mark.timeout(300),  # the first test of each policy pays for its stream
    # Every test on both control planes; module scope, so each stream runs once per plane.
    pytest.mark.parametrize("control_plane", demo.CONTROL_PLANES, indirect=True, scope="module"),
]

NODES = 2
GPUS = NODES * 4
SHARED = Wave("shared", GPUS, 1, False)
FULL = Wave("full-gpu", GPUS // 2, REPLICAS, True)


def _run(policy: Policy, control_plane: str) -> StreamResult:
    # A sync fixture with its own loop: the stream outlives any one test's event loop.
    return asyncio.run(run_stream(policy, NODES, (SHARED, FULL), control_plane=control_plane))


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> str:
    if request.param == demo.REAL:
        real_binaries()
    return str(request.param)


@pytest.fixture(scope="module")
def packed(control_plane: str) -> StreamResult:
    return _run(Policy.PACKED, control_plane)


@pytest.fixture(scope="module")
def distributed(control_plane: str) -> StreamResult:
    return _run(Policy.DISTRIBUTED, control_plane)


@pytest.fixture(params=[Policy.PACKED, Policy.DISTRIBUTED], ids=str)
def stream(request: pytest.FixtureRequest, control_plane: str) -> StreamResult:
    result: StreamResult = request.getfixturevalue(str(request.param))
    return result


def test_on_the_real_control_plane_kube_scheduler_bound_every_pod(stream: StreamResult) -> None:
    if stream.control_plane != demo.REAL:
        pytest.skip("only the real control plane has kube-scheduler's Scheduled events")
    assert stream.scheduled_by == {o.name: "default-scheduler" for o in stream.outcomes}


def test_every_pod_is_scheduled_admitted_and_published(stream: StreamResult) -> None:
    unplaced = [f"{o.name}: {o.reason}" for o in stream.outcomes if o.node is None]
    assert unplaced == []
    published = set().union(*(pods_on(s) for s in stream.final.values()))
    assert published == {o.uid for o in stream.outcomes}
    for o in stream.outcomes:
        assert sum(o.admitted.values()) == (1 if o.wave == SHARED.name else REPLICAS), o.describe()
        assert o.published == set(o.admitted), o.describe()


def test_packed_keeps_whole_gpus_free_for_the_full_gpu_wave(packed: StreamResult) -> None:
    # 8 single replicas fill 2 GPUs: 6 stay whole, enough for the 4 full-GPU pods.
    assert free_gpus(packed.after_shared) == GPUS - SHARED.count // REPLICAS
    full = {o.uid for o in packed.wave(FULL.name)}
    assert whole_gpu_holders(packed.final) >= full
    assert sum(1 for o in packed.wave(FULL.name) if len(o.published) == 1) == FULL.count


def test_packed_fills_one_node_before_opening_the_other(packed: StreamResult) -> None:
    assert len({o.node for o in packed.wave(SHARED.name)}) == 1


def test_distributed_strands_every_full_gpu_pod(distributed: StreamResult) -> None:
    assert free_gpus(distributed.after_shared) == 0  # one replica on every GPU
    full = {o.uid for o in distributed.wave(FULL.name)}
    assert whole_gpu_holders(distributed.final) & full == set()
    # Placed nonetheless (the kubelet counts replicas), each spread over GPUs shared with others.
    assert all(len(o.published) > 1 for o in distributed.wave(FULL.name))


def test_scoring_predicts_the_agents_placement_of_every_pod(stream: StreamResult) -> None:
    """common.scoring on the state published before each pod == what the kubelet got from the
    agent, replica for replica, and what the agent then published."""
    wrong = [o.describe() for o in stream.outcomes if o.predicted != o.admitted]
    assert wrong == []
    assert all(sum(o.predicted.values()) > 0 for o in stream.outcomes)


def test_the_extender_counts_every_prediction_as_a_match(stream: StreamResult) -> None:
    match, mismatch = stream.predictions
    assert (match, mismatch) == (len(stream.outcomes), 0), "\n".join(stream.missed)
    assert stream.missed == ()


def test_every_pod_holds_the_gpus_the_extender_directed(stream: StreamResult) -> None:
    """The extender annotates each pod with the GPUs it counted it on; each node's agent
    allocates on exactly those: the annotation equals, replica for replica, the devices
    PodResources lists for the pod (and the agents never logged a fallback)."""
    wrong = [f"{o.describe()}; directed {dict(o.directed)}, holds {dict(o.held)}" for o in stream.outcomes
             if not o.directed or o.directed != o.held]  # fmt: skip
    assert wrong == []
    assert all(o.held == o.admitted for o in stream.outcomes)  # PodResources agrees with the kubelet
    _, fallbacks = stream.directed
    assert fallbacks == ()


def test_the_sandbox_leaves_no_process_socket_or_task_behind(stream: StreamResult) -> None:
    up, after = stream.while_up, stream.after
    # While up: one agent per node and the extender (and on the real control plane etcd,
    # kube-apiserver and kube-scheduler), with their sockets (else the checks below would pass
    # for seeing nothing).
    expected = NODES + 1 + (3 if stream.control_plane == demo.REAL else 0)
    assert len(up.children) == len(up.processes) == expected, up
    assert up.bound_sockets and up.socket_files, up
    assert after.children == frozenset()
    assert after.processes == ()
    assert after.bound_sockets == ()
    assert after.socket_files == ()
    assert after.tasks == ()


def test_packed_and_distributed_differ_only_in_policy(packed: StreamResult, distributed: StreamResult) -> None:
    """The same stream, so the difference in whole GPUs is the policy's doing."""
    shape = Counter((o.wave, sum(o.admitted.values())) for o in packed.outcomes)
    assert shape == Counter((o.wave, sum(o.admitted.values())) for o in distributed.outcomes)
    won = len(whole_gpu_holders(packed.final) & {o.uid for o in packed.wave(FULL.name)})
    lost = len(whole_gpu_holders(distributed.final) & {o.uid for o in distributed.wave(FULL.name)})
    assert (won, lost) == (FULL.count, 0)
    for r in (packed, distributed):
        pods = len(r.outcomes)
        print(
            f"\n{r.policy}: {r.seconds:.1f} s = stack up {r.startup_s:.1f} s + {pods} pods "
            f"{(r.seconds - r.startup_s) / pods:.2f} s each",
            end="",
        )

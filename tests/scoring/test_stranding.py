"""`packed` with the node's CPU and memory known: fill used GPUs first, keep whole GPUs free,
and never take the CPU a node's free GPUs need (`common.stranding`)."""

from __future__ import annotations

from sharepack.common import fragmentation as fr
from sharepack.common import podrequests as pr
from sharepack.common import scoring, stranding
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState

SHARED = "nvidia.com/gpu.shared"
# One shape: a whole GPU with 8 CPUs. A node with less than 8 CPUs left strands its free GPUs.
WHOLE_GPU_8_CPU = fr.TypicalWorkload((fr.Shape(1, 1000, 1, cpu=8000),), "test")
MEASURE = fr.measure_for(WHOLE_GPU_8_CPU)


def node(allocated: list[int], total: int = 10) -> NodeState:
    gpus = tuple(GpuState(f"GPU-{i}", str(i), "T4", total, a, 0) for i, a in enumerate(allocated))
    return NodeState("", "", Policy.PACKED, MigStrategy.NONE, (ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus),))


def request(replicas: int, cpu: int) -> pr.PodRequest:
    containers = (pr.ContainerRequest("c", pr.ContainerKind.APP, ((SHARED, replicas),) if replicas else ()),)
    return pr.PodRequest("u", "ns", "p", containers, cpu=cpu)


def admitted(cpu_left: int, cpu: int) -> tuple[int, int]:
    return MEASURE.admitted(cpu_left, 1 << 20), MEASURE.admitted(cpu_left - cpu, 1 << 20)


def score(state: NodeState, req: pr.PodRequest, room: int | None, policy: NodePolicy = NodePolicy.PACKED) -> scoring.NodeScore:
    known = admitted(room, req.cpu) if room is not None else None
    return scoring.score_node(state, req, policy, workload=WHOLE_GPU_8_CPU, admitted=known)


def test_a_pod_that_takes_the_cpu_of_a_free_gpu_strands_it() -> None:
    # Half a GPU on the half-used GPU 0 leaves GPU 1 free; with 10 CPUs left, taking 4 leaves 6:
    # no whole-GPU pod fits any more, GPU 1 is stranded. With 20 CPUs left nothing is.
    half = request(5, 4000)
    tight, roomy = score(node([5, 0]), half, 10_000), score(node([5, 0]), half, 20_000)
    assert stranding.stranded_gpus(MEASURE, (500, 1000), admitted(10_000, 4000)) == 1.0
    assert stranding.stranded_gpus(MEASURE, (500, 1000), admitted(20_000, 4000)) == 0.0
    assert roomy.rank - tight.rank == stranding.STRAND_WEIGHT
    assert roomy.score > tight.score and "stranded=1.00" in tight.reason
    assert tight.placement == roomy.placement  # the GPUs on the node are the agent's choice still


def test_without_the_nodes_cpu_packed_ranks_by_gpus_alone() -> None:
    half = request(5, 4000)
    assert score(node([5, 0]), half, None).rank == score(node([5, 0]), half, 20_000).rank


def test_packed_still_fills_used_gpus_first_when_nothing_is_stranded() -> None:
    half = request(5, 1000)
    assert score(node([5, 0]), half, 40_000).rank > score(node([0, 0]), half, 40_000).rank


def test_a_cpu_only_pod_goes_where_it_strands_nothing_and_gpus_are_used() -> None:
    cpu_only = request(0, 4000)
    full, free_tight, free_roomy = node([10, 10]), node([0, 0]), node([0, 0])
    ranks = [score(full, cpu_only, 10_000).rank, score(free_tight, cpu_only, 10_000).rank,
             score(free_roomy, cpu_only, 40_000).rank]  # fmt: skip
    assert ranks[0] > ranks[2] > ranks[1]
    assert score(free_roomy, cpu_only, None) == scoring.NO_REQUEST  # CPU unknown: not ranked


def test_distributed_ignores_the_cpu() -> None:
    half = request(5, 4000)
    d = NodePolicy.DISTRIBUTED
    assert score(node([5, 0]), half, 10_000, d).rank == score(node([5, 0]), half, 20_000, d).rank

"""The placement configuration sharepack ships: one place for the defaults that decide packing.

deploy/ (the extender's Deployment flags, the agents' ConfigMap, deploy/scheduler's
KubeSchedulerConfiguration), the Helm chart's values, the extender's flag defaults and
`sharepack-simulate --policy shipped` all say the same; tests tie each of them to this module.

Why these values (measured with `sharepack-simulate` and `benchmarks/bench_kube.py`, README's
trace-replay section):

* `fragaware` ranks nodes by the FGD study's fragmentation gradient over the typical workload,
  knowing each node's CPU and memory left (a GPU whose CPU is gone counts as fragment) and its
  GPU model (the node's `nvidia.com/gpu.product` label, `common.gpumodels`: a GPU no typical
  shape's allowed models include is fragment for that shape, as FGD counts it). Without the
  models it lost to kube-scheduler alone where a third of the pods require a model (gpuspec33).
* Every pod reaches the extender (no `managedResources` in the scheduler configuration): a
  CPU-only pod decides whether a GPU node keeps the CPU its GPUs need.
* The filter passes only the best node by that rank (`FILTER_TIER_WIDTH`): kube-scheduler's
  in-tree scores (LeastAllocated spreads) then only break true ties.
* The extender directs the GPUs it chose (`DIRECTED_GPUS`): for a share, `fragaware` picks the
  GPU with the best rank, as FGD does; the agents allocate `packed` (their own choice when not
  directed, and for whole GPUs).
"""

from __future__ import annotations

from sharepack.common.policies import NodePolicy, Policy

NODE_POLICY = NodePolicy.FRAGAWARE  # the extender's --node-policy
AGENT_POLICY = Policy.PACKED  # the agents' sharedDevicesAllocationPolicy
FILTER_TIER_WIDTH = 1  # the extender's --filter-tier-width
EXTENDER_WEIGHT = 5  # deploy/scheduler's extender weight
DIRECTED_GPUS = True  # the extender's --directed-gpus
EVERY_POD = True  # no managedResources: CPU-only pods reach the extender too
# deploy/ runs two extender replicas behind one Service; a bind reaching the replica that did not
# score the pod is re-checked there (the extender's --unscored-binds), not refused: refused,
# kube-scheduler (the entry is ignorable) binds the pod itself, without directed GPUs.
EXTENDER_REPLICAS = 2
REPLICATED_UNSCORED_BINDS = "recheck"
# The DRA mode (deploy/dra, docs/dra.md): the same scheduler configuration and tier; the
# extender's --node-policy there (`sharepack-simulate --policy dra-shipped` measures it).
DRA_NODE_POLICY = NodePolicy.FRAGAWARE
# The agents' --dra-device-order there: GPUs in no use first, republished as claims are prepared
# (`common.dradevices.fresh_first`): 4.22 % unallocated against 4.52 % with the static order.
DRA_DEVICE_ORDER = "fresh-first"

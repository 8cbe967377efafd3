"""The placement configuration sharepack ships: one place for the defaults that decide packing.

deploy/ (the extender's Deployment flags, the agents' ConfigMap, deploy/scheduler's
KubeSchedulerConfiguration), the Helm chart's values, the extender's flag defaults and
`sharepack-simulate --policy shipped` all say the same; tests tie each of them to this module.

Why these values (measured with `sharepack-simulate` and `benchmarks/bench_kube.py`, README's
trace-replay section):

* `packed` ranks nodes knowing each node's CPU and memory (`common.stranding`): it still fills
  used GPUs first and keeps whole GPUs free, but never takes the CPU a node's free GPUs need.
* Every pod reaches the extender (no `managedResources` in the scheduler configuration): a
  CPU-only pod decides whether a GPU node keeps the CPU its GPUs need.
* The filter passes only the best node by that rank (`FILTER_TIER_WIDTH`): kube-scheduler's
  in-tree scores (LeastAllocated spreads) then only break true ties.
* The agents allocate `packed`, the node policy's own choice of GPUs on the node, so directing
  GPUs changes nothing for `packed` (it matters for `fragaware`, which chooses a share's GPU).
"""

from __future__ import annotations

from sharepack.common.policies import NodePolicy, Policy

NODE_POLICY = NodePolicy.PACKED  # the extender's --node-policy
AGENT_POLICY = Policy.PACKED  # the agents' sharedDevicesAllocationPolicy
FILTER_TIER_WIDTH = 1  # the extender's --filter-tier-width
EXTENDER_WEIGHT = 5  # deploy/scheduler's extender weight
DIRECTED_GPUS = True  # the extender's --directed-gpus
EVERY_POD = True  # no managedResources: CPU-only pods reach the extender too
# The DRA mode (deploy/dra, docs/dra.md): the same scheduler configuration and tier; the
# extender's --node-policy there (`sharepack-simulate --policy dra-shipped` measures it).
DRA_NODE_POLICY = NodePolicy.FRAGAWARE

"""DRA mode on the real control plane: deploy/dra applied as users apply it, kube-scheduler with
its shipped configuration (allocating devices itself), and simulated GPU nodes whose agents run
as DRA kubelet plugins (`--mode dra`) with tokens bound to their nodes, and whose sandbox
kubelets prepare each pod's claims before it starts.

The extender's DRA ranking is not part of this stack: kube-scheduler is pointed at an address
where nothing listens, and the shipped configuration marks the extender ignorable, so the
allocation is DRA's alone.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes
import orjson

from sharepack.common import draslices
from sharepack.common.policies import Policy
from sharepack.common.state import NodeState
from sharepack.sandbox.controlplane import plane as controlplane
from sharepack.sandbox.controlplane.plane import DEPLOY_DIR, RealControlPlane
from sharepack.sandbox.controlplane.identities import Identities, find
from sharepack.sandbox.kubelet.nodes import DRA_MODE, NodeSpec, SimulatedNode
from sharepack.sandbox.drivers.stacks import Stack

DRA_DIR = DEPLOY_DIR / "dra"
AGENT_CONFIGMAP = "sharepack-agent-config"
NO_EXTENDER = "http://127.0.0.1:1"  # nothing listens: the ignorable extender is skipped


class DraCluster(Stack):
    def __init__(
        self,
        control: RealControlPlane,
        root: Path,
        nodes: Sequence[str],
        *,
        machine: str = "t4-pcie",
        policy: Policy | None = None,
        labels: Mapping[str, str] | None = None,
        device_order: str | None = None,
    ) -> None:
        """`policy`: the agents' allocation policy; None keeps the shipped config's.
        `device_order`: the agents' --dra-device-order; None: the agent's default (`static`, so
        the order is `policy`'s, which is what the demo contrasts)."""
        self.control = control
        self.root = root
        self.node_names = tuple(nodes)
        self.machine = machine
        self.policy = policy
        self.labels = dict(labels or {})
        self.device_order = device_order
        self.nodes: dict[str, SimulatedNode] = {}
        self.agent_kubeconfigs: dict[str, Path] = {}  # node -> its agent's credentials
        self.docs: list[dict[str, Any]] = []
        super().__init__()

    async def _start(self) -> None:
        self.docs = await self.control.apply_deploy_base(DRA_DIR)
        config = self.root / "agent-config.yaml"
        # The shipped default config (time-slicing, packed), as the DaemonSet mounts it.
        config.write_text(find(self.docs, "ConfigMap", AGENT_CONFIGMAP)["data"]["default"])
        identities = Identities(self.control, self.docs)
        extra: tuple[str, ...] = (f"--shared-devices-allocation-policy={self.policy}",) if self.policy is not None else ()
        if self.device_order is not None:
            extra += (f"--dra-device-order={self.device_order}",)
        for i, name in enumerate(self.node_names):
            node_root = Path(tempfile.mkdtemp(prefix=f"n{i}-", dir=self.root))
            kubelet_api = controlplane.api_client(self.control.node_kubeconfig(name))
            self._stack.callback(kubelet_api.close)
            spec = NodeSpec(name, self.machine, config, labels=self.labels, extra_agent_args=extra, mode=DRA_MODE)
            self.agent_kubeconfigs[name] = await identities.agent_kubeconfig(name)
            node = SimulatedNode(spec, node_root, kubelet_api, self.agent_kubeconfigs[name], log_dir=self.root)
            self.nodes[name] = node
            self._stack.push_async_callback(node.stop)
        async with asyncio.TaskGroup() as group:
            for node in self.nodes.values():
                group.create_task(node.start([], watch_pods=True))
        await self.control.start_scheduler(NO_EXTENDER)
        self._stack.push_async_callback(self.control.stop_scheduler)


async def node_states(api: Any, nodes: Sequence[str]) -> list[NodeState]:
    """Each node's per-GPU view, as the extender's DRA mode reads it: the node's ResourceSlices
    of driver gpu.sharepack.io and every allocated ResourceClaim (`common.draslices`). A node
    with no complete pool of slices has no GPUs (an empty state). `api`: an ApiClient allowed
    to list both."""
    resource: Any = kubernetes.client.ResourceV1Api(api)
    slices, claims = await asyncio.gather(
        asyncio.to_thread(
            resource.list_resource_slice, field_selector=f"spec.driver={draslices.DRIVER}", _preload_content=False
        ),
        asyncio.to_thread(resource.list_resource_claim_for_all_namespaces, _preload_content=False),
    )
    slice_items = orjson.loads(slices.data).get("items") or []
    holdings = [h for claim in orjson.loads(claims.data).get("items") or [] for h in draslices.claim_holdings(claim)]
    out = []
    for name in nodes:
        devices = draslices.pool_devices(slice_items, name) or ()
        out.append(draslices.node_state(draslices.dra_node(name, devices, holdings)))
    return out

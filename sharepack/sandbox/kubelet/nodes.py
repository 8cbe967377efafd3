"""A simulated GPU node: the fake kubelet, the real agent as a child process, and the kubelet's
duties towards the API server (the Node object and its status, admitting the pods bound to it).

The agent runs exactly as it would on a node (`python -m sharepack.agent ...` with a simulated machine
instead of a driver), talking to the fake kubelet over its unix sockets and to the sandbox API
server over HTTP with a kubeconfig.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from sharepack.agent import nvmlsim
from sharepack.common import podrequests
from sharepack.sandbox.controlplane import kubebuild
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.api import KubeletApi
from sharepack.sandbox.kubelet.pods import ContainerSpec, PodSpec
from sharepack.sandbox.processes import LoggedProcess

log = logging.getLogger(__name__)

AGENT_START_TIMEOUT_S = 30.0
# What GPU feature discovery labels a GPU node with; the agent DaemonSet selects on it.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    machine: str  # a built-in simulated machine name or a machine YAML path
    config_file: Path | None = None
    labels: Mapping[str, str] | None = None
    extra_agent_args: tuple[str, ...] = ()


def _container_specs(containers: Sequence[podrequests.Container]) -> tuple[ContainerSpec, ...]:
    return tuple(
        ContainerSpec(
            name=c.name,
            requests={**c.limits, **c.requests},
            restartable=c.kind == podrequests.ContainerKind.SIDECAR,
        )
        for c in containers
    )


def pod_spec_from_api(doc: Mapping[str, Any]) -> PodSpec:
    """The kubelet's view of a Pod object: the GPU requests of each container, in order."""
    pod = podrequests.decode_pod(doc)
    return PodSpec(
        uid=pod.uid,
        name=pod.name,
        namespace=pod.namespace,
        containers=_container_specs(pod.containers),
        init_containers=_container_specs(pod.init_containers),
    )


class NodeStartError(RuntimeError):
    pass


class SimulatedNode:
    def __init__(
        self,
        spec: NodeSpec,
        root: Path,
        api: kubernetes.client.ApiClient,
        kubeconfig: Path,
        *,
        log_dir: Path | None = None,
        kubelet_version: str = "",
    ) -> None:
        """`api`: the kubelet's client (its node credentials on the real control plane);
        `kubeconfig`: what the agent authenticates with."""
        self.spec = spec
        self.kubelet = FakeKubelet(root, node_name=spec.name)
        self.api = KubeletApi(
            spec.name,
            self.kubelet,
            api,
            labels={GPU_PRESENT_LABEL: "true", **(spec.labels or {})},
            kubelet_version=kubelet_version or kubebuild.kubernetes_version(),
            pod_spec=pod_spec_from_api,
        )
        # The client's generated types make every field Optional; the sandbox reads them as the
        # API server fills them, so it holds the client untyped.
        self._core: Any = kubernetes.client.CoreV1Api(api)
        self._kubeconfig = kubeconfig
        self._log_path = (log_dir or root) / f"agent-{spec.name}.log"
        self.nvml_control = root / "nvml-control"  # XIDs for the simulated machine
        self._agent: LoggedProcess | None = None
        self._loop: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def agent_log(self) -> Path:
        return self._log_path

    def agent_args(self) -> list[str]:
        args = [
            sys.executable, "-m", "sharepack.agent",
            f"--simulated-machine={self.spec.machine}",
            f"--kubelet-socket={self.kubelet.socket_path}",
            f"--pod-resources-socket={self.kubelet.pod_resources_socket}",
            f"--node-name={self.spec.name}",
            f"--kubeconfig={self._kubeconfig}",
            "--log-format=text",
            "--metrics-listen=127.0.0.1:0",  # many agents on one host: any free port each
        ]  # fmt: skip
        if self.spec.config_file is not None:
            args.append(f"--config-file={self.spec.config_file}")
        return args + list(self.spec.extra_agent_args)

    async def start(self, resources: Sequence[str], *, watch_pods: bool = True) -> None:
        """Register the Node, start the kubelet and the agent; return once `resources` are
        served. `watch_pods`: admit the pods bound here as they come (else only `sync_pods`)."""
        await self.api.register()
        try:
            await self.kubelet.start()
            await self.start_agent(resources)
            await self.sync_status()
            if watch_pods:
                self.watch_pods()
        except BaseException:
            # A caller registers stop() once start() returned: nothing else would stop these.
            await self.stop()
            raise

    async def start_agent(self, resources: Sequence[str]) -> None:
        """Start the agent; return once the kubelet has every one of `resources` from it."""
        agent = self._agent = LoggedProcess(
            self.agent_args(), self._log_path, env={nvmlsim.CONTROL_ENV: str(self.nvml_control)}
        )
        await agent.start()
        try:
            await self._wait_serving(agent, resources)
        except Exception as e:
            raise NodeStartError(
                f"node {self.name}: agent did not serve {list(resources)}: {e}\n{agent.log_tail()}"
            ) from e

    async def kill_agent(self) -> None:
        """SIGKILL the agent (its sockets stay behind, as after a crash)."""
        if self._agent is not None:
            await self._agent.kill()

    def inject_xid(self, uuid: str, xid: int) -> None:
        """An XID on a GPU of the simulated machine, through the agent's NVML control file."""
        with self.nvml_control.open("a") as f:
            f.write(nvmlsim.control_line(uuid, xid))

    def watch_pods(self) -> None:
        """From now on, admit the pods bound here as they come, renew the node's lease and post
        its status on change (once; a second call does nothing)."""
        if self._loop is None:
            self._loop = asyncio.create_task(self.api.run(), name=f"kubelet-api-{self.name}")

    async def _wait_serving(self, agent: LoggedProcess, resources: Sequence[str]) -> None:
        """Until the kubelet has every resource, failing at once when the agent exits (a bad
        --machine) rather than after the whole timeout."""
        assert agent.proc is not None
        served = asyncio.ensure_future(self._wait_resources(resources))
        exited = asyncio.ensure_future(agent.proc.wait())
        try:
            await asyncio.wait((served, exited), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (served, exited):
                task.cancel()
            await asyncio.gather(served, exited, return_exceptions=True)
        if not served.cancelled() and served.done() and served.exception() is None:
            return
        if exited.done() and not exited.cancelled():
            raise NodeStartError(f"the agent exited with code {exited.result()}")
        served.result()  # the kubelet's timeout

    async def _wait_resources(self, resources: Sequence[str]) -> None:
        for resource in resources:
            await self.kubelet.wait_for_resource(resource, timeout=AGENT_START_TIMEOUT_S)

    async def restart_agent(self) -> None:
        """SIGKILL the agent (a crash, or its DaemonSet pod replaced) and start it again with the
        same arguments; returns once the kubelet has every resource from the new one."""
        agent = self._agent
        if agent is None or agent.proc is None:
            raise NodeStartError(f"node {self.name}: no agent to restart")
        resources = self.kubelet.resources()
        agent.proc.kill()
        await agent.stop()
        # The kubelet notices the dead plugin when its streams break: wait for that, so the
        # wait below sees the new agent's registration, not the old one's.
        await self.kubelet.wait_until(lambda: not any(self.kubelet.connected(r) for r in resources),
                                      timeout=AGENT_START_TIMEOUT_S, what="the killed agent's streams ended")  # fmt: skip
        new = self._agent = LoggedProcess(self.agent_args(), self._log_path)
        await new.start()
        await self._wait_serving(new, resources)

    async def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        agent, self._agent = self._agent, None
        if agent is not None:
            await agent.stop()
        await self.kubelet.stop()

    async def sync_status(self) -> None:
        """Publish capacity and allocatable to the Node status, as the kubelet does."""
        await self.api.sync_status(force=True)

    async def sync_pods(self) -> list[tuple[str, str]]:
        """Admit the pods bound to this node not admitted yet; returns (pod key, error) for
        those rejected (by this call or by the pod watch before it)."""
        pods = await asyncio.to_thread(
            self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.name}"
        )
        rejected = []
        for pod in pods.items:
            doc = self._core.api_client.sanitize_for_serialization(pod)
            error = await self.api.admit(doc)
            if error is not None:
                rejected.append((f"{pod.metadata.namespace}/{pod.metadata.name}", error))
        return rejected

"""A fake kubelet that speaks the real device-plugin and PodResources protocols over unix sockets.

What it does, and where it follows the kubelet (pkg/kubelet/cm/devicemanager):
* Registration server on `<root>/device-plugins/kubelet.sock`: accepts exactly version `v1beta1`
  and extended resource names only, answering anything else with status UNKNOWN and the
  kubelet's text. The endpoint is a bare file name joined to the kubelet's directory. Inside
  `Register`, before answering, it dials the plugin (10 s) and calls `GetDevicePluginOptions`;
  a plugin that is not serving yet fails its registration.
* ListAndWatch runs in a background task per resource: every message replaces the device list
  (capacity = all devices, allocatable = healthy ones). When the stream ends every device of the
  resource turns unhealthy and the kubelet never redials: the plugin must register again.
  Registering a resource again replaces its endpoint (the old stream is dropped quietly).
* Admission, container by container (init containers first) as the device manager does:
  devices left by plain init containers are reused first; then available = healthy minus
  allocated; `GetPreferredAllocation` (only when the plugin's options say so) gets available plus
  the devices already chosen, must-include = those chosen (both in no set order, as a Go set
  lists them: `sandbox.goset`), size = the whole request; the answer is
  used as an unordered set and any shortfall is filled from the available devices; then
  `Allocate`. After the device manager, the node-fit predicate runs (allocatable, raised to what
  is already allocated, against the requests of all admitted pods). A failure rejects the pod
  and frees everything it held.
* `cut_stream(resource)`: the kubelet ends one ListAndWatch stream, sockets untouched (a broken
  connection): the resource's devices turn unhealthy until the plugin registers again.
* `restart()`: the process dies (servers and plugin connections go), every socket in the
  device-plugins directory is deleted, `kubelet.sock` and the PodResources socket are created
  anew, allocations are kept and capacity drops to zero until plugins register again.
* PodResources server on `<root>/pod-resources/kubelet.sock` (see podresources_server).

Deliberate simplifications: no topology manager (every device is "no affinity" to the
allocation), no checkpoint file, no grace period before a dead resource disappears, and
`PreStartContainer` (when the plugin requires it) is called right after the pod's allocation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import grpc
import grpc.aio
from google.protobuf import text_format

from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from sharepack.sandbox.kubelet import goset
from sharepack.sandbox.kubelet import validation
from sharepack.sandbox.kubelet.pods import (
    HEALTHY,
    UNEXPECTED_ADMISSION_ERROR,
    UNHEALTHY,
    Admission,
    AdmissionError,
    ContainerAdmission,
    ContainerSpec,
    DeviceState,
    PodSpec,
    ResourceAllocation,
)
from sharepack.sandbox.kubelet.podresources import DEFAULT_BURST, DEFAULT_QPS, PodResourcesServer

__all__ = [
    "HEALTHY",
    "UNEXPECTED_ADMISSION_ERROR",
    "UNHEALTHY",
    "Admission",
    "AdmissionError",
    "ContainerAdmission",
    "ContainerSpec",
    "DeviceState",
    "FakeKubelet",
    "PodSpec",
    "Registration",
    "ResourceAllocation",
    "effective_requests",
    "go_status",
]

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
DIAL_TIMEOUT_S = 10.0  # the kubelet's blocking dial inside Register
RPC_TIMEOUT_S = 10.0  # the kubelet sets none on plugin calls; a hung fake test should still end
DIAL_TIMEOUT_MESSAGE = "failed to dial device plugin: context deadline exceeded"


def go_status(error: grpc.aio.AioRpcError) -> str:
    """A gRPC error as Go's status package prints it (what the kubelet wraps in its messages)."""
    code = error.code()
    name = "Canceled" if code == grpc.StatusCode.CANCELLED else "".join(p.capitalize() for p in code.name.split("_"))
    return f"rpc error: code = {name} desc = {error.details()}"


def effective_requests(pod: PodSpec) -> dict[str, int]:
    """What the node must have free for the pod, per resource (sidecar-aware, as kube computes it).

    App containers and sidecars run together; each plain init container runs alone next to the
    sidecars started before it; the pod needs the larger of the two.
    """
    sidecars: Counter[str] = Counter()
    init_peak: Counter[str] = Counter()
    for container in pod.init_containers:
        if container.restartable:
            sidecars.update(container.requests)
            step = Counter(sidecars)
        else:
            step = Counter(container.requests)
            step.update(sidecars)
        init_peak = init_peak | step
    running: Counter[str] = Counter()
    for container in pod.containers:
        running.update(container.requests)
    running.update(sidecars)
    peak = running | init_peak
    return {resource: count for resource, count in peak.items() if count > 0}


@dataclass(frozen=True, slots=True)
class Registration:
    """One Register call as the kubelet saw it."""

    resource: str
    endpoint: str
    version: str
    options: api_pb2.DevicePluginOptions  # as sent in the RegisterRequest
    error: str | None  # None when accepted


class _DeviceManagerError(Exception):
    """A device-manager failure; the text is the kubelet's."""


@dataclass(slots=True)
class _Table:
    devices: dict[str, DeviceState] = field(default_factory=dict)
    updates: int = 0  # ListAndWatch messages received over the kubelet's life


@dataclass(eq=False, slots=True)
class _Endpoint:
    resource: str
    socket: Path
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginAsyncStub
    options: api_pb2.DevicePluginOptions  # from GetDevicePluginOptions
    task: asyncio.Task[None] | None = None
    stopped: bool = False
    updates: int = 0  # ListAndWatch messages received on this endpoint


class _RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.Empty:
        error = await self._kubelet._register(request)
        if error is not None:
            # The kubelet returns a plain Go error: status UNKNOWN carrying its text.
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()


class FakeKubelet:
    """One node's kubelet, as device plugins and PodResources clients see it.

    Lifecycle: `start`, `stop`, `restart` (or `async with`). Observation: `capacity`,
    `allocatable`, `devices`, `healthy`, `updates`, `connected`, `plugin_options`,
    `registrations`, `admissions`, `allocated`, and `wait_until` / `wait_for_resource` to await a
    state. Pods: `admit_pod` (raises AdmissionError) and `remove_pod`.
    """

    def __init__(
        self,
        root: Path,
        *,
        node_name: str = "node-0",
        dial_timeout: float = DIAL_TIMEOUT_S,
        rpc_timeout: float = RPC_TIMEOUT_S,
        pod_resources_qps: float = DEFAULT_QPS,
        pod_resources_burst: int = DEFAULT_BURST,
    ) -> None:
        self.root = Path(root).absolute()
        self.node_name = node_name
        self.device_plugin_dir = self.root / "device-plugins"
        self.socket_path = self.device_plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = self.root / "pod-resources" / KUBELET_SOCKET
        if len(str(self.socket_path)) >= 100 or len(str(self.pod_resources_socket)) >= 100:
            raise ValueError(f"fake kubelet root {self.root}: too long for unix socket paths")
        self._dial_timeout = dial_timeout
        self._rpc_timeout = rpc_timeout
        self._pod_resources_qps = pod_resources_qps
        self._pod_resources_burst = pod_resources_burst

        self._tables: dict[str, _Table] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._admitted: dict[str, Admission] = {}
        # Containers of the pod being admitted, so its later containers see them as in use.
        self._pending: dict[str, ContainerAdmission] = {}
        self._registrations: list[Registration] = []
        self._registration_server: grpc.aio.Server | None = None
        self._pod_resources: PodResourcesServer | None = None
        self._admit_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._restarts = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._registration_server is not None:
            raise RuntimeError(f"fake kubelet at {self.root}: already started")
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._remove_sockets()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._registration_server = server
        pod_resources = PodResourcesServer(
            self, self.pod_resources_socket, qps=self._pod_resources_qps, burst=self._pod_resources_burst
        )
        await pod_resources.start()
        self._pod_resources = pod_resources
        log.info("fake kubelet serving", extra={"socket": str(self.socket_path), "node": self.node_name})
        self._notify()

    async def stop(self) -> None:
        await self._die()
        self.socket_path.unlink(missing_ok=True)
        self._notify()

    async def restart(self) -> None:
        """A kubelet restart: sockets deleted and re-created, allocations kept."""
        await self._die()
        # Like a kubelet reading its checkpoint: resources stay known, with no devices until
        # their plugins register again.
        for table in self._tables.values():
            table.devices = {}
        self._restarts += 1
        await self.start()

    async def cut_stream(self, resource: str) -> None:
        """End a resource's ListAndWatch stream from the kubelet's side without a restart (the
        sockets stay): its devices turn unhealthy and the kubelet never redials, as when the
        real kubelet's stream breaks. Only a new registration brings the resource back."""
        endpoint = self._endpoints.get(resource)
        if endpoint is None or endpoint.stopped:
            raise ValueError(f"fake kubelet: no live ListAndWatch stream for {resource}")
        await self._close_endpoint(endpoint)
        table = self._tables.setdefault(resource, _Table())
        table.devices = {k: replace(d, healthy=False) for k, d in table.devices.items()}
        log.info("ListAndWatch cut by the kubelet", extra={"resource": resource})
        self._notify()

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _die(self) -> None:
        server, self._registration_server = self._registration_server, None
        if server is not None:
            await server.stop(None)
        pod_resources, self._pod_resources = self._pod_resources, None
        if pod_resources is not None:
            await pod_resources.stop()
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()
        for endpoint in endpoints:
            await self._close_endpoint(endpoint)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _remove_sockets(self) -> None:
        # The kubelet's CleanupPluginDirectory: every socket goes, directories and files stay.
        for entry in self.device_plugin_dir.iterdir():
            try:
                mode = entry.stat().st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                entry.unlink(missing_ok=True)

    # ------------------------------------------------------------------ observation

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def registrations(self) -> tuple[Registration, ...]:
        return tuple(self._registrations)

    def resources(self) -> tuple[str, ...]:
        return tuple(sorted(self._tables))

    def capacity(self) -> dict[str, int]:
        return {name: len(table.devices) for name, table in sorted(self._tables.items())}

    def allocatable(self) -> dict[str, int]:
        return {
            name: sum(1 for d in table.devices.values() if d.healthy) for name, table in sorted(self._tables.items())
        }

    def devices(self, resource: str) -> Mapping[str, DeviceState]:
        table = self._tables.get(resource)
        return MappingProxyType(dict(table.devices) if table else {})

    def healthy(self, resource: str) -> frozenset[str]:
        return frozenset(d.id for d in self.devices(resource).values() if d.healthy)

    def updates(self, resource: str) -> int:
        """ListAndWatch messages received for `resource` so far (await a change with wait_until)."""
        table = self._tables.get(resource)
        return table.updates if table else 0

    def plugin_options(self, resource: str) -> api_pb2.DevicePluginOptions | None:
        endpoint = self._endpoints.get(resource)
        return endpoint.options if endpoint else None

    def connected(self, resource: str) -> bool:
        endpoint = self._endpoints.get(resource)
        return endpoint is not None and not endpoint.stopped

    def admissions(self) -> Sequence[Admission]:
        return tuple(self._admitted.values())

    def admission(self, uid: str) -> Admission:
        return self._admitted[uid]

    def allocated(self, resource: str) -> frozenset[str]:
        return frozenset(self._in_use(resource))

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceState]]:
        return {
            name: tuple(d for d in table.devices.values() if d.healthy) for name, table in sorted(self._tables.items())
        }

    async def wait_until(self, predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition") -> None:
        """Wait for a state change that makes `predicate` true (checked after every change)."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(f"fake kubelet: {what}: not reached within {timeout} s") from None

    async def wait_for_resource(self, name: str, *, timeout: float = 5.0) -> None:
        """Wait until `name` is registered (since the last restart) and its first device list arrived."""

        def ready() -> bool:
            endpoint = self._endpoints.get(name)
            return endpoint is not None and not endpoint.stopped and endpoint.updates > 0

        await self.wait_until(ready, timeout=timeout, what=f"resource {name} registered with devices")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ registration

    async def _register(self, request: api_pb2.RegisterRequest) -> str | None:
        error = await self._connect(request)
        options = api_pb2.DevicePluginOptions()
        options.CopyFrom(request.options)
        self._registrations.append(
            Registration(
                resource=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                options=options,
                error=error,
            )
        )
        if error is not None:
            log.info("rejected device plugin registration", extra={"resource": request.resource_name, "error": error})
        self._notify()
        return error

    async def _connect(self, request: api_pb2.RegisterRequest) -> str | None:
        if not validation.is_supported_version(request.version):
            return validation.unsupported_version_message(request.version)
        if not validation.is_extended_resource_name(request.resource_name):
            return validation.invalid_resource_name_message(request.resource_name)
        # Go's filepath.Join: the endpoint is always taken relative to the kubelet's directory.
        socket = Path(os.path.normpath(f"{self.device_plugin_dir}/{request.endpoint}"))
        channel = grpc.aio.insecure_channel(f"unix://{socket}", options=[("grpc.default_authority", "localhost")])
        stub = api_pb2_grpc.DevicePluginStub(channel)
        handed_over = False
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
            except TimeoutError:
                return DIAL_TIMEOUT_MESSAGE
            try:
                options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self._rpc_timeout)
            except grpc.aio.AioRpcError as e:
                return f"failed to get device plugin options: {go_status(e)}"
            handed_over = True
        finally:
            if not handed_over:  # refused, or the kubelet stopped mid-call
                await channel.close(None)
        endpoint = _Endpoint(request.resource_name, socket, channel, stub, options)
        old = self._endpoints.get(request.resource_name)
        self._endpoints[request.resource_name] = endpoint
        endpoint.task = self._spawn(self._watch(endpoint), f"kubelet ListAndWatch {request.resource_name}")
        if old is not None:
            await self._close_endpoint(old)
        log.info("device plugin registered", extra={"resource": request.resource_name, "socket": str(socket)})
        return None

    async def _close_endpoint(self, endpoint: _Endpoint) -> None:
        endpoint.stopped = True
        task = endpoint.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await endpoint.channel.close(None)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("fake kubelet task %s crashed", t.get_name(), exc_info=t.exception())

        task.add_done_callback(done)
        return task

    async def _watch(self, endpoint: _Endpoint) -> None:
        call = endpoint.stub.ListAndWatch(api_pb2.Empty())
        reason = "stream ended"
        try:
            async for response in call:
                if self._endpoints.get(endpoint.resource) is not endpoint:
                    return
                self._apply(endpoint, response)
        except grpc.aio.AioRpcError as e:
            reason = go_status(e)
        finally:
            call.cancel()
        if self._endpoints.get(endpoint.resource) is endpoint:
            # No redial: the devices stay known but unhealthy until the plugin registers again.
            endpoint.stopped = True
            table = self._tables.setdefault(endpoint.resource, _Table())
            table.devices = {k: replace(d, healthy=False) for k, d in table.devices.items()}
            log.info(
                "ListAndWatch ended unexpectedly for device plugin",
                extra={"resource": endpoint.resource, "reason": reason},
            )
            self._notify()
        # The kubelet disconnects a client whose stream ended; a later Register dials afresh.
        await endpoint.channel.close(None)

    def _apply(self, endpoint: _Endpoint, response: api_pb2.ListAndWatchResponse) -> None:
        table = self._tables.setdefault(endpoint.resource, _Table())
        table.devices = {
            d.ID: DeviceState(id=d.ID, healthy=d.health == HEALTHY, numa_nodes=tuple(n.ID for n in d.topology.nodes))
            for d in response.devices
        }
        table.updates += 1
        endpoint.updates += 1
        self._notify()

    # ------------------------------------------------------------------ admission

    async def admit_pod(self, pod: PodSpec) -> Admission:
        async with self._admit_lock:
            if pod.uid in self._admitted:
                raise ValueError(f"pod uid {pod.uid}: already admitted as {self._admitted[pod.uid].pod.name}")
            self._pending = {}
            try:
                try:
                    await self._allocate_pod(pod)
                except _DeviceManagerError as e:
                    raise AdmissionError(pod, str(e)) from None
                admission = Admission(pod=pod, containers=tuple(self._pending.values()))
                self._check_fits(pod, admission)
            finally:
                self._pending = {}
            self._admitted[pod.uid] = admission
            self._notify()
            return admission

    async def remove_pod(self, uid: str) -> None:
        """The pod is gone: its devices are free again (unknown UIDs are ignored, as the kubelet's GC does)."""
        if self._admitted.pop(uid, None) is not None:
            self._notify()

    async def _allocate_pod(self, pod: PodSpec) -> None:
        reusable: dict[str, set[str]] = {}
        for container in pod.init_containers:
            admitted = await self._allocate_container(container, reusable, init=True)
            for resource, allocation in admitted.resources.items():
                held = reusable.setdefault(resource, set())
                if container.restartable:
                    # A sidecar keeps running: its devices are not handed on.
                    held.difference_update(allocation.device_ids)
                else:
                    held.update(allocation.device_ids)
        for container in pod.containers:
            admitted = await self._allocate_container(container, reusable, init=False)
            for resource, allocation in admitted.resources.items():
                reusable.setdefault(resource, set()).difference_update(allocation.device_ids)
        for admitted in self._pending.values():
            await self._pre_start(admitted)

    async def _allocate_container(
        self, container: ContainerSpec, reusable: Mapping[str, set[str]], *, init: bool
    ) -> ContainerAdmission:
        allocations: dict[str, ResourceAllocation] = {}
        for resource, required in container.requests.items():
            if required == 0 or not self._is_device_plugin_resource(resource):
                # Not the device manager's: the node-fit predicate judges it.
                continue
            chosen, preferred, reused = await self._devices_to_allocate(
                resource, required, reusable.get(resource, set())
            )
            response = await self._allocate_rpc(resource, chosen)
            table = self._tables.get(resource)
            numa = {d: table.devices[d].numa_nodes if table and d in table.devices else () for d in chosen}
            allocations[resource] = ResourceAllocation(
                resource=resource,
                device_ids=tuple(sorted(chosen)),
                numa_nodes=MappingProxyType(numa),
                response=response,
                preferred=preferred,
                reused=reused,
            )
        admitted = ContainerAdmission(
            name=container.name,
            init=init,
            restartable=container.restartable,
            resources=MappingProxyType(allocations),
        )
        self._pending[container.name] = admitted
        return admitted

    def _is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self._tables or bool(self._in_use(resource))

    def _in_use(self, resource: str) -> set[str]:
        held: set[str] = set()
        for admission in self._admitted.values():
            held.update(admission.held(resource))
        for container in self._pending.values():
            held.update(container.devices(resource))
        return held

    async def _devices_to_allocate(
        self, resource: str, required: int, reusable: set[str]
    ) -> tuple[list[str], frozenset[str] | None, bool]:
        table = self._tables.get(resource)
        if table is None:
            raise _DeviceManagerError(f"cannot allocate unregistered device {resource}")
        healthy = {d.id for d in table.devices.values() if d.healthy}
        if not healthy:
            raise _DeviceManagerError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        needed = required
        chosen: list[str] = []

        def take(candidates: set[str]) -> bool:
            nonlocal needed
            for device in sorted(candidates - set(chosen)):
                chosen.append(device)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(reusable):
            return chosen, None, True
        available = healthy - self._in_use(resource)
        if len(available) < needed:
            raise _DeviceManagerError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        # No topology manager here, so every device is "no affinity" and the plugin is asked
        # about the whole request: available plus what is already chosen, which it must include.
        preferred = await self._preferred_allocation(resource, available | set(chosen), set(chosen), required)
        if preferred is not None and take(set(preferred) & available):
            return chosen, preferred, False
        if take(available):
            return chosen, preferred, False
        raise _DeviceManagerError(
            f"unexpectedly allocated less resources than required. Requested: {required}, Got: {required - needed}"
        )

    def _endpoint(self, resource: str, missing: str) -> _Endpoint:
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise _DeviceManagerError(missing)
        if endpoint.stopped:
            raise _DeviceManagerError(f"endpoint {endpoint.socket} for {resource} has been stopped")
        return endpoint

    async def _preferred_allocation(
        self, resource: str, available: set[str], must_include: set[str], size: int
    ) -> frozenset[str] | None:
        endpoint = self._endpoint(resource, f"endpoint not found in cache for a registered resource: {resource}")
        if not endpoint.options.get_preferred_allocation_available:
            return None
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=goset.unsorted_list(available),
                    must_include_deviceIDs=goset.unsorted_list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await endpoint.stub.GetPreferredAllocation(request, timeout=self._rpc_timeout)
        except grpc.aio.AioRpcError as e:
            raise _DeviceManagerError(f"device plugin GetPreferredAllocation rpc failed with err: {go_status(e)}") from None
        if response.container_responses:
            return frozenset(response.container_responses[0].deviceIDs)
        return frozenset()

    async def _allocate_rpc(self, resource: str, devices: list[str]) -> api_pb2.ContainerAllocateResponse:
        endpoint = self._endpoint(resource, f"unknown Device Plugin {resource}")
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=sorted(devices))]
        )
        try:
            response = await endpoint.stub.Allocate(request, timeout=self._rpc_timeout)
        except grpc.aio.AioRpcError as e:
            raise _DeviceManagerError(go_status(e)) from None
        if not response.container_responses:
            text = text_format.MessageToString(response, as_one_line=True)
            raise _DeviceManagerError(f"no containers return in allocation response &AllocateResponse{{{text}}}")
        return response.container_responses[0]

    async def _pre_start(self, container: ContainerAdmission) -> None:
        for resource, allocation in container.resources.items():
            endpoint = self._endpoints.get(resource)
            if endpoint is None or not endpoint.options.pre_start_required:
                continue
            request = api_pb2.PreStartContainerRequest(devices_ids=list(allocation.device_ids))
            try:
                await endpoint.stub.PreStartContainer(request, timeout=self._rpc_timeout)
            except grpc.aio.AioRpcError as e:
                raise _DeviceManagerError(
                    f"device plugin PreStartContainer rpc failed with err: {go_status(e)}"
                ) from None

    def _check_fits(self, pod: PodSpec, admission: Admission) -> None:
        # The kubelet's predicate admit handler, which runs after the device manager: node
        # allocatable (raised to what is already allocated) against all admitted pods' requests.
        healthy = self.allocatable()
        for resource, requested in effective_requests(pod).items():
            if not validation.is_extended_resource_name(resource):
                continue  # cpu, memory and the like: this fake node has room for any amount
            allocated = len(self._in_use(resource) | admission.held(resource))
            capacity = max(healthy.get(resource, 0), allocated)
            used = sum(effective_requests(a.pod).get(resource, 0) for a in self._admitted.values())
            if requested + used > capacity:
                message = (
                    f"Node didn't have enough resource: {resource}, requested: {requested}, "
                    f"used: {used}, capacity: {capacity}"
                )
                raise AdmissionError(pod, message, reason=f"OutOf{resource}", message=message)

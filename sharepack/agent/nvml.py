"""The one adapter over NVML: the real `pynvml` module or `agent.nvmlsim`'s simulator.

Everything here blocks (NVML calls do): the agent runs it via `asyncio.to_thread`.

    lib = load_library(None)                  # real driver; or load_library("dgx-a100")
    inventory = read_inventory(lib)           # GPUs, MIG devices, pair scores
    with XidWatcher(lib) as watcher:
        event = watcher.wait(500)             # XidEvent, or None after 500 ms of quiet
    shutdown(lib)

Errors (all `common.errors.SharepackError`):

    NvmlError                an NVML call failed while reading the node (names the call and GPU)
    └── NvmlUnavailable      NVML cannot start: no driver, driver not loaded, no permission
    agent.nvmlsim.MachineError   a bad --simulated-machine (not an NVML problem: always fatal)

The agent honours failOnInitError by catching `NvmlUnavailable` only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import pynvml

from sharepack.common.errors import SharepackError
from sharepack.common.inventory import Gpu, Inventory, MigDevice

MIB = 1 << 20
GIB = 1 << 30
# go-gpuallocator looks at links 0..17 (its NVLINK_MAX_LINKS); newer drivers report up to 36.
NVLINK_MAX_LINKS = 18
NVLINK_SCORE = 100  # per NVLink whose far end is the peer GPU
NO_INSTANCE = 0xFFFFFFFF  # GI/CI ID of an event that concerns the whole GPU

# NVML_TOPOLOGY_* common-ancestor level -> go-gpuallocator P2P link score.
PCIE_SCORES: Mapping[int, int] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: 60,  # SameBoard
    pynvml.NVML_TOPOLOGY_SINGLE: 50,  # SingleSwitch
    pynvml.NVML_TOPOLOGY_MULTIPLE: 40,  # MultiSwitch
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: 30,  # HostBridge
    pynvml.NVML_TOPOLOGY_NODE: 20,  # SameCPU
    pynvml.NVML_TOPOLOGY_SYSTEM: 10,  # CrossCPU
}

# GPU instance profiles that carry the media extensions ("+me" in the profile name).
_MEDIA_EXTENSION_PROFILES = frozenset(
    {pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1}
)


class NvmlError(SharepackError):
    pass


class NvmlUnavailable(NvmlError):
    pass


class NvmlLibrary(Protocol):
    """The pynvml functions this adapter calls; `pynvml` and `SimulatedNvml` both provide them."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetAttributes(self, device: Any) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...


# ---- loading ---------------------------------------------------------------------------------


def load_library(
    simulated_machine: str | None, *, control_file: str | None = None
) -> NvmlLibrary:
    """NVML, initialised: the real driver's (None) or a simulated machine (a built-in name or a
    machine file). `control_file` lets other processes inject XIDs into a simulated machine
    (the composition root passes $SHAREPACK_NVMLSIM_CONTROL). Raises NvmlUnavailable when NVML cannot start, and
    agent.nvmlsim.MachineError for a bad machine."""
    lib: NvmlLibrary
    if simulated_machine is not None:
        from sharepack.agent import nvmlsim  # only simulated runs pay for loading machine descriptions

        machine = nvmlsim.load_machine(simulated_machine)
        lib = nvmlsim.SimulatedNvml(machine, control_file=control_file or None)
        where = f"simulated machine {machine.source}"
    else:
        lib = pynvml
        where = "the NVIDIA driver's NVML (libnvidia-ml.so.1)"
    try:
        lib.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"cannot initialise {where}: {e}") from e
    return lib


def shutdown(lib: NvmlLibrary) -> None:
    """Undo load_library's nvmlInit. Safe to call on a library already shut down."""
    try:
        lib.nvmlShutdown()
    except pynvml.NVMLError_Uninitialized:
        pass


@contextmanager
def _calling(what: str) -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as e:
        raise NvmlError(f"nvml: {what}: {e}") from e


# ---- inventory -------------------------------------------------------------------------------


def read_inventory(lib: NvmlLibrary) -> Inventory:
    """Every GPU with its MIG devices, and go-gpuallocator pair scores. Blocking."""
    with _calling("reading the driver version"):
        driver = lib.nvmlSystemGetDriverVersion()
        cuda = lib.nvmlSystemGetCudaDriverVersion()
        count = lib.nvmlDeviceGetCount()
    gpus: list[Gpu] = []
    handles: list[Any] = []
    for index in range(count):
        with _calling(f"reading GPU {index}"):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            gpus.append(_read_gpu(lib, index, handle))
            handles.append(handle)
    with _calling("reading the GPU topology"):
        scores = _pair_scores(lib, gpus, handles)
    return Inventory(tuple(gpus), scores, driver, cuda)


def _read_gpu(lib: NvmlLibrary, index: int, handle: Any) -> Gpu:
    uuid = lib.nvmlDeviceGetUUID(handle)
    total = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
    major, minor_cc = lib.nvmlDeviceGetCudaComputeCapability(handle)
    mig_enabled = _mig_enabled(lib, handle)
    return Gpu(
        index=index,
        uuid=uuid,
        name=lib.nvmlDeviceGetName(handle),
        memory_mib=total // MIB,
        minor=lib.nvmlDeviceGetMinorNumber(handle),
        pci_bus_id=str(lib.nvmlDeviceGetPciInfo(handle).busId),
        numa_node=_numa_node(lib, handle),
        compute_capability=(int(major), int(minor_cc)),
        mig_enabled=mig_enabled,
        mig_devices=_read_mig_devices(lib, index, uuid, handle, total) if mig_enabled else (),
    )


def _numa_node(lib: NvmlLibrary, handle: Any) -> int | None:
    """The NUMA node nearest the GPU; None when NVML cannot tell or names several."""
    try:
        mask = lib.nvmlDeviceGetMemoryAffinity(handle, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None
    bits = int(mask[0])
    if bits == 0 or bits & (bits - 1):
        return None
    return bits.bit_length() - 1


def _mig_enabled(lib: NvmlLibrary, handle: Any) -> bool:
    try:
        current, _pending = lib.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return False  # a GPU (or driver) without MIG
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _read_mig_devices(
    lib: NvmlLibrary, parent_index: int, parent_uuid: str, parent: Any, parent_total: int
) -> tuple[MigDevice, ...]:
    gi_profiles = _gi_profiles(lib, parent)
    devices = []
    for i in range(lib.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handle = lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        gi_id = lib.nvmlDeviceGetGpuInstanceId(handle)
        ci_id = lib.nvmlDeviceGetComputeInstanceId(handle)
        gi = lib.nvmlDeviceGetGpuInstanceById(parent, gi_id)
        gi_info = lib.nvmlGpuInstanceGetInfo(gi)
        ci = lib.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
        ci_info = lib.nvmlComputeInstanceGetInfo(ci)
        if gi_info.profileId not in gi_profiles:
            raise NvmlError(f"nvml: MIG device {i} of GPU {parent_index}: unknown GPU instance "
                            f"profile id {gi_info.profileId}")
        gi_enum, gi_slices = gi_profiles[gi_info.profileId]
        ci_slices = _ci_slices(lib, gi, ci_info.profileId)
        attributes = lib.nvmlDeviceGetAttributes(handle)
        devices.append(
            MigDevice(
                uuid=lib.nvmlDeviceGetUUID(handle),
                parent_uuid=parent_uuid,
                parent_index=parent_index,
                gi_id=gi_id,
                ci_id=ci_id,
                profile=mig_profile_name(
                    gi_slices, ci_slices, int(attributes.memorySizeMB), parent_total,
                    media_extensions=gi_enum in _MEDIA_EXTENSION_PROFILES,
                ),
                placement_start=int(gi_info.placement.start),
                placement_size=int(gi_info.placement.size),
                memory_mib=int(lib.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                index=i,
            )
        )
    return tuple(devices)


def _gi_profiles(lib: NvmlLibrary, parent: Any) -> dict[int, tuple[int, int]]:
    """GPU instance profile id (as GpuInstanceInfo.profileId reports it) -> (enum, slices)."""
    found: dict[int, tuple[int, int]] = {}
    for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = lib.nvmlDeviceGetGpuInstanceProfileInfo(parent, enum)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue  # this GPU has no such profile
        found.setdefault(int(info.id), (enum, int(info.sliceCount)))
    return found


def _ci_slices(lib: NvmlLibrary, gi: Any, profile_id: int) -> int:
    for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        if int(info.id) == profile_id:
            return int(info.sliceCount)
    raise NvmlError(f"nvml: unknown compute instance profile id {profile_id}")


def mig_memory_gb(parent_total_bytes: int, mig_memory_mb: int) -> int:
    """The "<N>gb" of a MIG profile name, as go-nvlib derives it: the instance's share of the
    GPU's memory rounded up to eighths, times the GPU's memory in whole GiB (rounded up)."""
    fraction = mig_memory_mb * MIB / parent_total_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (parent_total_bytes + GIB - 1) // GIB
    # Go's math.Round takes halves away from zero; Python's round() takes them to even, which
    # names the H200's 3g profile (half of 141 GiB: 70.5) "3g.70gb" instead of "3g.71gb".
    return math.floor(fraction * total_gb + 0.5)


def mig_profile_name(
    gi_slices: int, ci_slices: int, mig_memory_mb: int, parent_total_bytes: int, *,
    media_extensions: bool = False,
) -> str:
    """"1g.5gb", "1c.3g.20gb", "1g.5gb+me": the name resources are called by."""
    gb = mig_memory_gb(parent_total_bytes, mig_memory_mb)
    base = f"{gi_slices}g.{gb}gb" if ci_slices == gi_slices else f"{ci_slices}c.{gi_slices}g.{gb}gb"
    return base + ("+me" if media_extensions else "")


def _bus_key(bus_id: str) -> str:
    # NVML writes an 8-digit domain today and wrote 4 digits once; compare them alike.
    domain, _, rest = bus_id.strip().upper().partition(":")
    return f"{int(domain or '0', 16):08X}:{rest}"


def _nvlink_remotes(lib: NvmlLibrary, handle: Any) -> list[str]:
    remotes = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            if lib.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remotes.append(_bus_key(str(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)))
        except pynvml.NVMLError_NotSupported:
            if link == 0:
                break  # no NVLink on this GPU at all
            continue
        except pynvml.NVMLError_InvalidArgument:
            break  # past this GPU's last link
    return remotes


def _pair_scores(
    lib: NvmlLibrary, gpus: list[Gpu], handles: list[Any]
) -> dict[tuple[str, str], int]:
    """go-gpuallocator's pair score: the PCIe common-ancestor level score plus 100 per NVLink
    from one GPU whose remote PCI bus ID is the other's (links to NVSwitches never match)."""
    remotes = [_nvlink_remotes(lib, h) for h in handles]
    scores: dict[tuple[str, str], int] = {}
    for i, a in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            b = gpus[j]
            try:
                level = lib.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                score = PCIE_SCORES.get(int(level), 0)
            except pynvml.NVMLError_NotSupported:
                score = 0
            score += NVLINK_SCORE * remotes[i].count(_bus_key(b.pci_bus_id))
            if score:
                key = (a.uuid, b.uuid) if a.uuid < b.uuid else (b.uuid, a.uuid)
                scores[key] = score
    return scores


# ---- XID events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str  # the physical GPU ("" when NVML names no device)
    xid: int
    mig_gi: int | None = None  # set when the fault concerns one MIG instance
    mig_ci: int | None = None


class XidWatcher:
    """XID critical-error events of a node's GPUs, one blocking wait at a time.

    Not for concurrent use: one thread waits; close() only after the last wait returned.
    GPUs that cannot report XIDs are listed in `unwatched` (uuid -> why) rather than failing.
    """

    def __init__(self, lib: NvmlLibrary, uuids: Iterable[str] | None = None) -> None:
        self._lib = lib
        wanted = None if uuids is None else set(uuids)
        self.watched: list[str] = []
        self.unwatched: dict[str, str] = {}
        with _calling("creating an event set"):
            self._set: Any = lib.nvmlEventSetCreate()
        try:
            for index in range(lib.nvmlDeviceGetCount()):
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = lib.nvmlDeviceGetUUID(handle)
                if wanted is not None and uuid not in wanted:
                    continue
                try:
                    supported = lib.nvmlDeviceGetSupportedEventTypes(handle)
                    if not supported & pynvml.nvmlEventTypeXidCriticalError:
                        self.unwatched[uuid] = "xid events not supported"
                        continue
                    lib.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, self._set
                    )
                except pynvml.NVMLError_NotSupported as e:
                    self.unwatched[uuid] = f"xid events not supported: {e}"
                    continue
                self.watched.append(uuid)
        except pynvml.NVMLError as e:
            self.close()
            raise NvmlError(f"nvml: registering for xid events: {e}") from e

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none came within `timeout_ms`."""
        if self._set is None:
            raise NvmlError("nvml: waiting for xid events: the watcher is closed")
        try:
            data = self._lib.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError as e:
            raise NvmlError(f"nvml: waiting for xid events: {e}") from e
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        uuid = ""
        if data.device:  # a NULL device: NVML could not say which GPU
            with _calling("naming the GPU of an xid event"):
                uuid = self._lib.nvmlDeviceGetUUID(data.device)
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return XidEvent(
            uuid=uuid,
            xid=int(data.eventData),
            mig_gi=None if gi == NO_INSTANCE else gi,
            mig_ci=None if ci == NO_INSTANCE else ci,
        )

    def close(self) -> None:
        if self._set is None:
            return
        event_set, self._set = self._set, None
        try:
            self._lib.nvmlEventSetFree(event_set)
        except pynvml.NVMLError_Uninitialized:
            pass  # NVML already shut down: nothing left to free

    def __enter__(self) -> XidWatcher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def wait_for_xid(watcher: XidWatcher, timeout_ms: int) -> XidEvent | None:
    """The brief's entry point; the same as watcher.wait(timeout_ms)."""
    return watcher.wait(timeout_ms)

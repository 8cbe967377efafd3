"""An in-process stand-in for the `pynvml` module, backed by a machine description.

`SimulatedNvml(machine)` has pynvml's function names, argument lists and return shapes: the
handles are real `pynvml.c_nvmlDevice_t` / `c_nvmlGpuInstance_t` / `c_nvmlComputeInstance_t` /
`c_nvmlEventSet_t` pointers, structures are real pynvml ctypes structures (`c_nvmlMemory_t`,
`nvmlPciInfo_t` with `.busId`, `c_nvmlGpuInstanceInfo_t`, `c_nvmlEventData_t`, ...), and failures
are the real `pynvml.NVMLError_*` classes, raised where NVML documents them:

* every call but `nvmlInit*` raises `NVMLError_Uninitialized` until `nvmlInit` (reference
  counted, like NVML: each `nvmlShutdown` undoes one `nvmlInit`);
* a machine with `init_error` fails `nvmlInit` with that error (e.g. `NVMLError_LibraryNotFound`,
  what pynvml raises on a node without a driver);
* unknown handles raise `NVMLError_InvalidArgument`; MIG queries on GPUs without MIG raise
  `NVMLError_NotSupported`; an empty MIG slot raises `NVMLError_NotFound`;
* `nvmlEventSetWait[_v2]` raises `NVMLError_Timeout` when nothing arrives in time.

Constants (`NVML_*`, `nvmlEventType*`) and error classes are served from pynvml itself, so
`lib.NVML_FEATURE_ENABLED` works on both. Only the calls defined below are simulated (each with
pynvml's parameter names and defaults, checked by tests/nvml); any other raises AttributeError.

XID injection, for tests and demos:

* in-process: `inject_xid(uuid, xid, gi=None, ci=None)`; a MIG UUID is turned into its parent
  GPU plus GI/CI, as the driver reports a MIG fault;
* from another process: a control file (`control_file=`, or `SHAREPACK_NVMLSIM_CONTROL` via
  `agent.nvml.load_library`) that the simulator tails while an event wait is in progress. One
  command a line, `#` starts a comment; lines are read once each, appended lines are picked up
  within ~20 ms:

      xid <GPU-uuid|MIG-uuid> <xid> [<gi> <ci>]

  `python -m sharepack.agent.nvmlsim xid --control FILE UUID XID` appends such a line.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from sharepack.agent.nvmlsim.descriptions import GpuSpec, Machine, MigInstance
from sharepack.agent.nvmlsim.products import MigProfile

CONTROL_ENV = "SHAREPACK_NVMLSIM_CONTROL"
NO_INSTANCE = 0xFFFFFFFF  # GI/CI ID in event data for a whole-GPU event
SUPPORTED_EVENTS: int = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)
_CONTROL_POLL_S = 0.02

_F = TypeVar("_F", bound=Callable[..., Any])


def _err(code: int) -> pynvml.NVMLError:
    # NVMLError.__new__ maps the code to its generated subclass (NVMLError_NotFound, ...).
    return pynvml.NVMLError(code)


@dataclass(eq=False, slots=True)
class _Gpu:
    spec: GpuSpec
    buf: Any  # the struct a c_nvmlDevice_t handle points at: its address identifies the GPU
    migs: list[_Mig] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Mig:
    parent: _Gpu
    spec: MigInstance
    index: int  # position under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    buf: Any
    gi_buf: Any
    ci_buf: Any


@dataclass(eq=False, slots=True)
class _EventSet:
    buf: Any
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event type mask
    queue: deque[tuple[_Gpu, int, int, int]] = field(default_factory=deque)
    freed: bool = False


def _requires_init(fn: _F) -> _F:
    @functools.wraps(fn)  # keeps pynvml's parameter names visible to inspect.signature
    def wrapper(self: SimulatedNvml, *args: Any, **kwargs: Any) -> Any:
        if self._refcount <= 0:
            raise pynvml.NVMLError_Uninitialized()
        return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class SimulatedNvml:
    """pynvml over a simulated machine. Thread-safe: NVML calls run in worker threads."""

    def __init__(self, machine: Machine, *, control_file: str | Path | None = None) -> None:
        self.machine = machine
        self.control_file = Path(control_file) if control_file else None
        self._control_offset = 0
        self._refcount = 0
        self._cond = threading.Condition()
        self._gpus: list[_Gpu] = []
        self._by_addr: dict[int, _Gpu | _Mig] = {}
        self._gi_by_addr: dict[int, _Mig] = {}
        self._ci_by_addr: dict[int, _Mig] = {}
        self._sets: dict[int, _EventSet] = {}
        for spec in machine.gpus:
            gpu = _Gpu(spec, pynvml.struct_c_nvmlDevice_t())
            self._gpus.append(gpu)
            self._by_addr[ctypes.addressof(gpu.buf)] = gpu
            for i, inst in enumerate(spec.mig_instances):
                mig = _Mig(gpu, inst, i, pynvml.struct_c_nvmlDevice_t(),
                           pynvml.struct_c_nvmlGpuInstance_t(),
                           pynvml.struct_c_nvmlComputeInstance_t())
                gpu.migs.append(mig)
                self._by_addr[ctypes.addressof(mig.buf)] = mig
                self._gi_by_addr[ctypes.addressof(mig.gi_buf)] = mig
                self._ci_by_addr[ctypes.addressof(mig.ci_buf)] = mig

    def __getattr__(self, name: str) -> Any:
        # Constants, structures and error classes come from pynvml itself.
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "c_nvml", "nvmlPciInfo")):
            return getattr(pynvml, name)
        raise AttributeError(f"simulated NVML has no {name}")

    def __repr__(self) -> str:
        return f"SimulatedNvml({self.machine.source})"

    # ---- test and demo controls (not NVML) -------------------------------------------------

    def inject_xid(self, uuid: str, xid: int, gi: int | None = None, ci: int | None = None) -> None:
        """Raise an XID critical error on a GPU (or, with a MIG UUID or gi/ci, one instance)."""
        with self._cond:
            self._inject_locked(uuid, xid, gi, ci)

    def _inject_locked(self, uuid: str, xid: int, gi: int | None, ci: int | None) -> None:
        target = self._find_uuid(uuid)
        if target is None:
            raise KeyError(f"inject xid: no GPU or MIG device {uuid} on {self.machine.name}")
        if isinstance(target, _Mig):
            gpu, gi, ci = target.parent, target.spec.gi_id, target.spec.ci_id
        else:
            gpu = target
        gi_id = NO_INSTANCE if gi is None else gi
        ci_id = NO_INSTANCE if ci is None else ci
        for event_set in self._sets.values():
            mask = event_set.registered.get(gpu.spec.index, 0)
            if mask & pynvml.nvmlEventTypeXidCriticalError and not event_set.freed:
                event_set.queue.append((gpu, xid, gi_id, ci_id))
        self._cond.notify_all()

    def _find_uuid(self, uuid: str) -> _Gpu | _Mig | None:
        for gpu in self._gpus:
            if gpu.spec.uuid == uuid:
                return gpu
            for mig in gpu.migs:
                if mig.spec.uuid == uuid:
                    return mig
        return None

    def _poll_control_locked(self) -> None:
        if self.control_file is None:
            return
        try:
            with self.control_file.open("rb") as f:
                size = f.seek(0, 2)
                if size < self._control_offset:  # truncated or replaced: start over
                    self._control_offset = 0
                f.seek(self._control_offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n")
        if end < 0:  # only a partial line so far
            return
        self._control_offset += end + 1
        for raw in chunk[: end + 1].decode(errors="replace").splitlines():
            self._control_line_locked(raw)

    def _control_line_locked(self, raw: str) -> None:
        words = raw.split("#", 1)[0].split()
        if not words:
            return
        try:
            if words[0] != "xid" or len(words) not in (3, 5):
                raise ValueError("expected: xid <uuid> <xid> [<gi> <ci>]")
            gi, ci = (int(words[3]), int(words[4])) if len(words) == 5 else (None, None)
            self._inject_locked(words[1], int(words[2]), gi, ci)
        except (ValueError, KeyError) as e:
            # A bad line must not stop the watcher: report it where the operator looks.
            import logging

            logging.getLogger(__name__).warning(
                "ignoring nvmlsim control line %r from %s: %s", raw, self.control_file, e
            )

    # ---- handle lookups --------------------------------------------------------------------

    def _handle(self, buf: Any, kind: Any) -> Any:
        return ctypes.pointer(buf) if kind is None else ctypes.cast(ctypes.pointer(buf), kind)

    def _target(self, handle: Any) -> _Gpu | _Mig:
        try:
            target = self._by_addr.get(ctypes.addressof(handle.contents))
        except (AttributeError, TypeError, ValueError):
            target = None
        if target is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return target

    def _gpu(self, handle: Any) -> _Gpu:
        target = self._target(handle)
        if isinstance(target, _Mig):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return target

    def _mig(self, handle: Any) -> _Mig:
        target = self._target(handle)
        if not isinstance(target, _Mig):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return target

    def _lookup(self, table: dict[int, _Mig], handle: Any) -> _Mig:
        try:
            mig = table.get(ctypes.addressof(handle.contents))
        except (AttributeError, TypeError, ValueError):
            mig = None
        if mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig

    def _device_handle(self, target: _Gpu | _Mig) -> Any:
        return ctypes.pointer(target.buf)

    # ---- init and system -------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.machine.init_error is not None:
            raise getattr(pynvml, f"NVMLError_{self.machine.init_error}")()
        with self._cond:
            self._refcount += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    @_requires_init
    def nvmlShutdown(self) -> None:
        with self._cond:
            self._refcount -= 1

    def nvmlErrorString(self, result: int) -> str:
        return str(pynvml.NVMLError._errcode_to_string.get(result, "Unknown Error"))

    @_requires_init
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.machine.driver_version

    @_requires_init
    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12." + self.machine.driver_version

    @_requires_init
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.machine.cuda_driver_version

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    # ---- devices ---------------------------------------------------------------------------

    @_requires_init
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    @_requires_init
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self._gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(self._gpus[index])

    @_requires_init
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        target = self._find_uuid(text)
        if target is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return self._device_handle(target)

    @_requires_init
    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        text = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
        for gpu in self._gpus:
            if gpu.spec.pci_bus_id == text:
                return self._device_handle(gpu)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    @_requires_init
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle).spec.index

    @_requires_init
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._target(handle).spec.uuid

    @_requires_init
    def nvmlDeviceGetName(self, handle: Any) -> str:
        target = self._target(handle)
        if isinstance(target, _Mig):
            return f"{target.parent.spec.product.name} MIG {target.spec.profile.name}"
        return target.spec.product.name

    @_requires_init
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        target = self._target(handle)
        if isinstance(target, _Mig):
            total = target.spec.profile.memory_mb << 20
        else:
            total = target.spec.product.memory_mib << 20
        # An idle GPU still holds a little memory for the driver's own contexts.
        used = min(total, 5 << 20)
        if not version:
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)
        info = pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=0,
                                        free=total - used, used=used)
        return info

    @_requires_init
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle).spec.minor

    @_requires_init
    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        target = self._target(handle)
        gpu = target.parent if isinstance(target, _Mig) else target
        return _pci_info(gpu.spec.pci_bus_id)

    nvmlDeviceGetPciInfo = nvmlDeviceGetPciInfo_v3

    @_requires_init
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        target = self._target(handle)
        gpu = target.parent if isinstance(target, _Mig) else target
        return gpu.spec.product.compute_capability

    @_requires_init
    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return self._gpu(device).spec.product.architecture

    @_requires_init
    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any:
        gpu = self._gpu(handle)
        mask = (ctypes.c_ulonglong * nodeSetSize)()
        node = gpu.spec.numa_node
        if node is not None and node < 64 * nodeSetSize:
            mask[node // 64] = 1 << (node % 64)
        return mask

    @_requires_init
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        # Only platforms whose GPU memory is a NUMA node (Grace Hopper) answer this.
        self._gpu(handle)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # ---- MIG -------------------------------------------------------------------------------

    def _mig_capable(self, handle: Any) -> _Gpu:
        gpu = self._gpu(handle)
        if not gpu.spec.product.mig_capable:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    @_requires_init
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._mig_capable(device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.spec.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_requires_init
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        return ctypes.c_uint(1 if isinstance(self._target(device), _Mig) else 0)

    @_requires_init
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._mig_capable(device)
        return max(p.instance_count for p in gpu.spec.product.mig_profiles)

    @_requires_init
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._mig_capable(device)
        if not 0 <= index < self.nvmlDeviceGetMaxMigDeviceCount(device):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.migs):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return self._device_handle(gpu.migs[index])

    @_requires_init
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        return self._device_handle(self._mig(migDevice).parent)

    @_requires_init
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device).spec.gi_id

    @_requires_init
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device).spec.ci_id

    @_requires_init
    def nvmlDeviceGetAttributes_v2(self, device: Any) -> Any:
        target = self._target(device)
        if isinstance(target, _Mig):
            p = target.spec.profile
            return pynvml.c_nvmlDeviceAttributes(
                multiprocessorCount=p.multiprocessors, gpuInstanceSliceCount=p.slices,
                computeInstanceSliceCount=p.slices, memorySizeMB=p.memory_mb,
            )
        product = target.spec.product
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=product.multiprocessors, memorySizeMB=product.memory_mib
        )

    nvmlDeviceGetAttributes = nvmlDeviceGetAttributes_v2

    def _gi_profile(self, gpu: _Gpu, profile: int) -> MigProfile:
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for p in gpu.spec.product.mig_profiles:
            if p.enum == profile:
                return p
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @_requires_init
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int,
                                            version: int = 2) -> Any:
        gpu = self._mig_capable(device)
        p = self._gi_profile(gpu, profile)
        common = dict(
            id=p.profile_id, isP2pSupported=0, sliceCount=p.slices,
            instanceCount=p.instance_count, multiprocessorCount=p.multiprocessors,
            copyEngineCount=max(1, p.slices), decoderCount=p.slices // 2,
            encoderCount=0, jpegCount=1 if p.media_extensions or p.slices == 7 else 0,
            ofaCount=1 if p.media_extensions or p.slices == 7 else 0, memorySizeMB=p.memory_mb,
        )
        if version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            for key, value in common.items():
                setattr(info, key, value)
            info.name = f"MIG {p.name}"
            return info
        if version == 1:
            return pynvml.c_nvmlGpuInstanceProfileInfo_t(**common)
        raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    @_requires_init
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu = self._mig_capable(device)
        if not gpu.spec.mig_enabled:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for mig in gpu.migs:
            if mig.spec.gi_id == gpuInstanceId:
                return ctypes.pointer(mig.gi_buf)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    @_requires_init
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        mig = self._lookup(self._gi_by_addr, gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._device_handle(mig.parent)
        info.id = mig.spec.gi_id
        info.profileId = mig.spec.profile.profile_id
        info.placement.start = mig.spec.start
        info.placement.size = mig.spec.profile.size
        return info

    @_requires_init
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, device: Any, profile: int,
                                                     engProfile: int, version: int = 2) -> Any:
        mig = self._lookup(self._gi_by_addr, device)
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = _CI_PROFILE_SLICES.get(profile)
        if slices is None or slices > mig.spec.profile.slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gi = mig.spec.profile
        common = dict(
            id=profile, sliceCount=slices, instanceCount=gi.slices // slices,
            multiprocessorCount=gi.multiprocessors * slices // gi.slices,
        )
        if version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            for key, value in common.items():
                setattr(info, key, value)
            info.name = (f"MIG {gi.name}" if slices == gi.slices
                         else f"MIG {slices}c.{gi.name}")
            return info
        if version == 1:
            return pynvml.c_nvmlComputeInstanceProfileInfo_t(**common)
        raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    @_requires_init
    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Any,
                                              computeInstanceId: int) -> Any:
        mig = self._lookup(self._gi_by_addr, gpuInstance)
        if mig.spec.ci_id != computeInstanceId:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.pointer(mig.ci_buf)

    @_requires_init
    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: Any) -> Any:
        mig = self._lookup(self._ci_by_addr, computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = self._device_handle(mig.parent)
        info.gpuInstance = ctypes.pointer(mig.gi_buf)
        info.id = mig.spec.ci_id
        # One compute instance spanning its GPU instance: CI profile enum == slices - 1 here
        # for 1..4 slices, and the 7-slice enum for a 7g instance.
        info.profileId = _CI_PROFILE_BY_SLICES[mig.spec.profile.slices]
        info.placement.start = 0
        info.placement.size = mig.spec.profile.slices
        return info

    nvmlComputeInstanceGetInfo = nvmlComputeInstanceGetInfo_v2

    # ---- topology --------------------------------------------------------------------------

    @_requires_init
    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a, b = self._gpu(device1).spec, self._gpu(device2).spec
        return common_ancestor(a, b)

    def _link(self, device: Any, link: int) -> GpuSpec:
        spec = self._gpu(device).spec
        if spec.product.nvlinks == 0:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < spec.product.nvlinks:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return spec

    @_requires_init
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        spec = self._link(device, link)
        if link < len(spec.nvlink_remotes):
            return int(pynvml.NVML_FEATURE_ENABLED)
        return int(pynvml.NVML_FEATURE_DISABLED)

    @_requires_init
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        spec = self._link(device, link)
        if link >= len(spec.nvlink_remotes):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # an inactive link has no remote end
        return _pci_info(spec.nvlink_remotes[link])


    @_requires_init
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        spec = self._link(handle, link)
        if link >= len(spec.nvlink_remotes):
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)
        remote = spec.nvlink_remotes[link]
        if any(g.spec.pci_bus_id == remote for g in self._gpus):
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    # ---- events ----------------------------------------------------------------------------

    @_requires_init
    def nvmlEventSetCreate(self) -> Any:
        event_set = _EventSet(pynvml.struct_c_nvmlEventSet_t())
        with self._cond:
            self._sets[ctypes.addressof(event_set.buf)] = event_set
        return ctypes.pointer(event_set.buf)

    def _event_set(self, eventSet: Any) -> _EventSet:
        try:
            found = self._sets.get(ctypes.addressof(eventSet.contents))
        except (AttributeError, TypeError, ValueError):
            found = None
        if found is None or found.freed:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    @_requires_init
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle)
        return SUPPORTED_EVENTS

    @_requires_init
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle)
        if eventTypes & ~SUPPORTED_EVENTS:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            event_set = self._event_set(eventSet)
            index = gpu.spec.index
            event_set.registered[index] = event_set.registered.get(index, 0) | eventTypes

    @_requires_init
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        deadline = time.monotonic() + max(0, timeoutms) / 1000
        with self._cond:
            event_set = self._event_set(eventSet)
            while True:
                self._poll_control_locked()
                if event_set.queue:
                    gpu, xid, gi, ci = event_set.queue.popleft()
                    data = pynvml.c_nvmlEventData_t()
                    data.device = self._device_handle(gpu)
                    data.eventType = pynvml.nvmlEventTypeXidCriticalError
                    data.eventData = xid
                    data.gpuInstanceId = gi
                    data.computeInstanceId = ci
                    return data
                if event_set.freed:
                    raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _err(pynvml.NVML_ERROR_TIMEOUT)
                if self.control_file is not None:
                    left = min(left, _CONTROL_POLL_S)
                self._cond.wait(left)

    nvmlEventSetWait = nvmlEventSetWait_v2

    @_requires_init
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        with self._cond:
            event_set = self._event_set(eventSet)
            event_set.freed = True
            event_set.queue.clear()
            del self._sets[ctypes.addressof(event_set.buf)]
            self._cond.notify_all()


# NVML_COMPUTE_INSTANCE_PROFILE_* enum -> compute slices, and back (for full-GI instances).
_CI_PROFILE_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
_CI_PROFILE_BY_SLICES = {slices: enum for enum, slices in _CI_PROFILE_SLICES.items()}


def _pci_info(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    info.busId = bus_id
    info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}"
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(device, 16)
    return info


def common_ancestor(a: GpuSpec, b: GpuSpec) -> int:
    """The NVML_TOPOLOGY_* level joining two GPUs (see descriptions.py for the model)."""
    if a.index == b.index or (a.board is not None and a.board == b.board):
        return int(pynvml.NVML_TOPOLOGY_INTERNAL)
    if a.numa_node != b.numa_node:
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)
    shared = 0
    for x, y in zip(a.pcie_path, b.pcie_path):
        if x != y:
            break
        shared += 1
    if shared == 0:
        return int(pynvml.NVML_TOPOLOGY_NODE)
    if shared == 1:
        return int(pynvml.NVML_TOPOLOGY_HOSTBRIDGE)
    if shared == len(a.pcie_path) == len(b.pcie_path):
        return int(pynvml.NVML_TOPOLOGY_SINGLE)
    return int(pynvml.NVML_TOPOLOGY_MULTIPLE)


def control_line(uuid: str, xid: int, gi: int | None = None, ci: int | None = None) -> str:
    """One control-file command (newline included) injecting an XID."""
    if (gi is None) != (ci is None):
        raise ValueError("control line: give both gi and ci, or neither")
    suffix = "" if gi is None else f" {gi} {ci}"
    return f"xid {uuid} {xid}{suffix}\n"

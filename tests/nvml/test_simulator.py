"""The simulator behaves like pynvml: real handle and structure types, real NVMLError classes,
raised where NVML documents them."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sharepack.agent import nvml
from sharepack.agent.nvmlsim import SimulatedNvml, load_machine
from tests.nvml.driver import driver_present


@pytest.fixture
def t4() -> Iterator[SimulatedNvml]:
    lib = SimulatedNvml(load_machine("t4-pcie"))
    lib.nvmlInit()
    yield lib
    nvml.shutdown(lib)


@pytest.fixture
def mig() -> Iterator[SimulatedNvml]:
    lib = SimulatedNvml(load_machine("dgx-a100-mig"))
    lib.nvmlInit()
    yield lib
    nvml.shutdown(lib)


def test_every_call_before_init_raises_uninitialized() -> None:
    lib = SimulatedNvml(load_machine("dgx-a100"))
    calls: list[Callable[[], Any]] = [
        lib.nvmlDeviceGetCount,
        lib.nvmlSystemGetDriverVersion,
        lambda: lib.nvmlDeviceGetHandleByIndex(0),
        lib.nvmlEventSetCreate,
        lib.nvmlShutdown,
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()


def test_init_is_reference_counted_like_nvml() -> None:
    lib = SimulatedNvml(load_machine("t4-pcie"))
    lib.nvmlInit()
    lib.nvmlInit()
    lib.nvmlShutdown()
    assert lib.nvmlDeviceGetCount() == 4
    lib.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()


@pytest.mark.parametrize(
    "what, call, error",
    [
        ("an index past the last GPU", lambda lib: lib.nvmlDeviceGetHandleByIndex(4),
         pynvml.NVMLError_InvalidArgument),
        ("an unknown UUID", lambda lib: lib.nvmlDeviceGetHandleByUUID("GPU-nope"),
         pynvml.NVMLError_NotFound),
        ("MIG mode of a T4", lambda lib: lib.nvmlDeviceGetMigMode(lib.nvmlDeviceGetHandleByIndex(0)),
         pynvml.NVMLError_NotSupported),
        ("NVLink state of a T4",
         lambda lib: lib.nvmlDeviceGetNvLinkState(lib.nvmlDeviceGetHandleByIndex(0), 0),
         pynvml.NVMLError_NotSupported),
        ("a handle that is not one", lambda lib: lib.nvmlDeviceGetUUID(object()),
         pynvml.NVMLError_InvalidArgument),
        ("a NULL handle", lambda lib: lib.nvmlDeviceGetUUID(pynvml.c_nvmlDevice_t()),
         pynvml.NVMLError_InvalidArgument),
        ("GPU instance ID of a full GPU",
         lambda lib: lib.nvmlDeviceGetGpuInstanceId(lib.nvmlDeviceGetHandleByIndex(0)),
         pynvml.NVMLError_NotSupported),
        ("an event wait with nothing registered",
         lambda lib: lib.nvmlEventSetWait_v2(lib.nvmlEventSetCreate(), 0),
         pynvml.NVMLError_Timeout),
    ],
)
def test_failures_are_pynvml_error_classes(
    t4: SimulatedNvml, what: str, call: Callable[[SimulatedNvml], Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as caught:
        call(t4)
    assert isinstance(caught.value, pynvml.NVMLError)


def test_mig_errors_are_where_nvml_documents_them(mig: SimulatedNvml) -> None:
    gpu3 = mig.nvmlDeviceGetHandleByIndex(3)  # one 7g.40gb instance
    assert mig.nvmlDeviceGetMaxMigDeviceCount(gpu3) == 7
    mig.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        mig.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mig.nvmlDeviceGetMigDeviceHandleByIndex(gpu3, 7)
    with pytest.raises(pynvml.NVMLError_NotFound):
        mig.nvmlDeviceGetGpuInstanceById(gpu3, 5)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        mig.nvmlDeviceGetGpuInstanceProfileInfo(gpu3, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mig.nvmlDeviceGetGpuInstanceProfileInfo(gpu3, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_return_shapes_are_pynvml_structures(mig: SimulatedNvml) -> None:
    handle = mig.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    memory = mig.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == 40960 << 20 and memory.free + memory.used == memory.total
    assert isinstance(mig.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
                      pynvml.c_nvmlMemory_v2_t)
    pci = mig.nvmlDeviceGetPciInfo(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.busId == "00000000:07:00.0" and pci.bus == 0x07
    assert mig.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert mig.nvmlDeviceGetCudaComputeCapability(handle) == (8, 0)
    child = mig.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert isinstance(child, pynvml.c_nvmlDevice_t)
    assert mig.nvmlDeviceIsMigDeviceHandle(child).value == 1
    assert mig.nvmlDeviceIsMigDeviceHandle(handle).value == 0
    parent = mig.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(child)
    assert mig.nvmlDeviceGetUUID(parent) == mig.nvmlDeviceGetUUID(handle)
    assert mig.nvmlDeviceGetName(child) == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    gi = mig.nvmlDeviceGetGpuInstanceById(handle, mig.nvmlDeviceGetGpuInstanceId(child))
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    info = mig.nvmlGpuInstanceGetInfo(gi)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceInfo_t)
    assert (info.profileId, info.placement.start, info.placement.size) == (19, 0, 1)
    assert ctypes.addressof(info.device.contents) == ctypes.addressof(handle.contents)
    profile = mig.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert isinstance(profile, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (profile.id, profile.sliceCount, profile.memorySizeMB, profile.name) == (
        19, 1, 4864, "MIG 1g.5gb")


def test_constants_come_from_pynvml(t4: SimulatedNvml) -> None:
    assert t4.NVML_FEATURE_ENABLED == pynvml.NVML_FEATURE_ENABLED
    assert t4.NVMLError_NotFound is pynvml.NVMLError_NotFound
    with pytest.raises(AttributeError):
        t4.nvmlDeviceGetSomethingUnsimulated  # noqa: B018


def test_handles_of_another_simulator_are_rejected() -> None:
    a = SimulatedNvml(load_machine("t4-pcie"))
    b = SimulatedNvml(load_machine("t4-pcie"))
    a.nvmlInit()
    b.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        b.nvmlDeviceGetUUID(a.nvmlDeviceGetHandleByIndex(0))


def test_a_machine_without_a_driver_fails_init_like_pynvml(tmp_path: Path) -> None:
    path = tmp_path / "nodriver.yaml"
    path.write_text("name: nodriver\ninit_error: LibraryNotFound\nproduct: Tesla T4\n"
                    "gpus: [{pci_bus_id: '00000000:3B:00.0'}]\n")
    with pytest.raises(nvml.NvmlUnavailable, match="cannot initialise simulated machine") as e:
        nvml.load_library(str(path))
    assert isinstance(e.value.__cause__, pynvml.NVMLError_LibraryNotFound)


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present")
def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    with pytest.raises(nvml.NvmlUnavailable, match="NVML Shared Library Not Found") as e:
        nvml.load_library(None)
    assert isinstance(e.value.__cause__, pynvml.NVMLError_LibraryNotFound)


@pytest.mark.skipif(not driver_present(), reason="no NVIDIA driver here")
def test_the_adapter_reads_a_real_driver() -> None:
    lib = nvml.load_library(None)
    try:
        inventory = nvml.read_inventory(lib)
        with nvml.XidWatcher(lib) as watcher:
            assert watcher.wait(10) is None
    finally:
        nvml.shutdown(lib)
    assert inventory.gpus
    for gpu in inventory.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.memory_mib > 0
        for m in gpu.mig_devices:
            assert m.uuid.startswith("MIG-") and "g." in m.profile


def _simulated_functions() -> list[str]:
    return sorted(n for n in dir(SimulatedNvml) if n.startswith("nvml"))


@pytest.mark.parametrize("name", _simulated_functions())
def test_every_simulated_function_has_pynvmls_signature(name: str) -> None:
    import inspect

    real = getattr(pynvml, name)
    simulated = inspect.signature(getattr(SimulatedNvml, name))
    ours = [(p.name, p.default) for p in simulated.parameters.values()][1:]  # less self
    theirs = [(p.name, p.default) for p in inspect.signature(real).parameters.values()]
    assert ours == theirs

"""XID events through the adapter's XidWatcher: injected in-process, or by another process
through the simulator's control file."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharepack.agent import nvml
from sharepack.agent.nvmlsim import SimulatedNvml, control_line
from sharepack.common.inventory import Inventory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def a100() -> Iterator[tuple[SimulatedNvml, Inventory]]:
    lib = nvml.load_library("dgx-a100-mig", control_file="")
    assert isinstance(lib, SimulatedNvml)
    yield lib, nvml.read_inventory(lib)
    nvml.shutdown(lib)


def test_an_injected_xid_is_the_next_event(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, inventory = a100
    gpu = inventory.gpus[7]
    with nvml.XidWatcher(lib) as watcher:
        assert len(watcher.watched) == 8 and not watcher.unwatched
        lib.inject_xid(gpu.uuid, 79)
        assert watcher.wait(1000) == nvml.XidEvent(gpu.uuid, 79, None, None)
        assert watcher.wait(0) is None


def test_a_mig_fault_names_the_parent_and_the_instance(
    a100: tuple[SimulatedNvml, Inventory],
) -> None:
    lib, inventory = a100
    instance = inventory.gpus[2].mig_devices[1]
    with nvml.XidWatcher(lib) as watcher:
        lib.inject_xid(instance.uuid, 94)
        lib.inject_xid(inventory.gpus[2].uuid, 48, gi=1, ci=0)
        assert watcher.wait(1000) == nvml.XidEvent(
            inventory.gpus[2].uuid, 94, instance.gi_id, instance.ci_id
        )
        assert nvml.wait_for_xid(watcher, 1000) == nvml.XidEvent(inventory.gpus[2].uuid, 48, 1, 0)


def test_a_quiet_wait_times_out_with_none(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, _ = a100
    with nvml.XidWatcher(lib) as watcher:
        started = time.monotonic()
        assert watcher.wait(50) is None
        assert time.monotonic() - started >= 0.04  # it did wait; how much longer is load


def test_an_injection_wakes_a_waiting_thread(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, inventory = a100
    uuid = inventory.gpus[0].uuid
    got: list[nvml.XidEvent | None] = []
    with nvml.XidWatcher(lib) as watcher:
        waiter = threading.Thread(target=lambda: got.append(watcher.wait(5000)))
        waiter.start()
        lib.inject_xid(uuid, 63)
        waiter.join(30)
        assert got == [nvml.XidEvent(uuid, 63)]  # woken by the event: a timeout would give None


def test_only_watched_gpus_report(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, inventory = a100
    first, second = inventory.gpus[0].uuid, inventory.gpus[1].uuid
    with nvml.XidWatcher(lib, uuids=[first]) as watcher:
        assert watcher.watched == [first]
        lib.inject_xid(second, 79)
        assert watcher.wait(0) is None
        lib.inject_xid(first, 79)
        assert watcher.wait(0) == nvml.XidEvent(first, 79)


def test_every_event_set_gets_its_own_copy(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, inventory = a100
    uuid = inventory.gpus[4].uuid
    with nvml.XidWatcher(lib) as one, nvml.XidWatcher(lib) as two:
        lib.inject_xid(uuid, 31)
        assert one.wait(0) == two.wait(0) == nvml.XidEvent(uuid, 31)


def test_a_closed_watcher_refuses_to_wait(a100: tuple[SimulatedNvml, Inventory]) -> None:
    lib, _ = a100
    watcher = nvml.XidWatcher(lib)
    watcher.close()
    watcher.close()
    with pytest.raises(nvml.NvmlError, match="closed"):
        watcher.wait(0)


def test_injecting_into_an_unknown_device_is_an_error(
    a100: tuple[SimulatedNvml, Inventory],
) -> None:
    lib, _ = a100
    with pytest.raises(KeyError, match="GPU-nope"):
        lib.inject_xid("GPU-nope", 79)


def test_another_process_injects_through_the_control_file(tmp_path: Path) -> None:
    control = tmp_path / "control"
    lib = nvml.load_library("t4-pcie", control_file=str(control))
    try:
        uuid = nvml.read_inventory(lib).gpus[2].uuid
        with nvml.XidWatcher(lib) as watcher:
            subprocess.run(
                [sys.executable, "-m", "sharepack.agent.nvmlsim", "xid", "--control", str(control),
                 uuid, "79"],
                cwd=ROOT, check=True, timeout=30,
            )
            assert watcher.wait(2000) == nvml.XidEvent(uuid, 79)
            assert watcher.wait(0) is None  # each line is read once
    finally:
        nvml.shutdown(lib)


def test_control_lines_are_read_whole_and_bad_ones_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    control = tmp_path / "control"
    lib = nvml.load_library("t4-pcie", control_file=str(control))
    try:
        uuid = nvml.read_inventory(lib).gpus[0].uuid
        with nvml.XidWatcher(lib) as watcher:
            with control.open("a") as f:
                f.write("# a comment\nxid GPU-nope 79\nbogus\n")
                f.write(control_line(uuid, 48)[:-1])  # no newline yet: not complete
                f.flush()
                assert watcher.wait(100) is None
                f.write(" 1 0\n")  # completes the line: now with gi 1, ci 0
            assert watcher.wait(2000) == nvml.XidEvent(uuid, 48, 1, 0)
        assert "GPU-nope" in caplog.text and "bogus" in caplog.text
    finally:
        nvml.shutdown(lib)


def test_control_line_needs_both_instance_ids() -> None:
    assert control_line("GPU-x", 79) == "xid GPU-x 79\n"
    assert control_line("GPU-x", 79, 1, 0) == "xid GPU-x 79 1 0\n"
    with pytest.raises(ValueError):
        control_line("GPU-x", 79, 1)

"""`python -m sharepack.agent.nvmlsim`: list machines, show one as the adapter reads it, inject an XID.

    python -m sharepack.agent.nvmlsim list
    python -m sharepack.agent.nvmlsim show dgx1-volta            # or a machine file
    python -m sharepack.agent.nvmlsim xid --control FILE GPU-... 79 [--gi 1 --ci 0]
    python -m sharepack.agent.nvmlsim bench                      # adapter and XID latencies
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sharepack.agent.nvmlsim.descriptions import MachineError, builtin_names, load_machine
from sharepack.agent.nvmlsim.simulator import SimulatedNvml, control_line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sharepack.agent.nvmlsim")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="built-in machines")
    show = commands.add_parser("show", help="a machine's GPUs, MIG devices and pair scores")
    show.add_argument("machine", help="a built-in name or a machine file")
    xid = commands.add_parser("xid", help="append an XID to a simulator's control file")
    xid.add_argument("--control", required=True, help="the control file the agent's simulator tails")
    xid.add_argument("uuid", help="GPU-... or MIG-...")
    xid.add_argument("xid", type=int)
    xid.add_argument("--gi", type=int)
    xid.add_argument("--ci", type=int)
    commands.add_parser("bench", help="time read_inventory and XID delivery")
    args = parser.parse_args(argv)

    if args.command == "list":
        for name in builtin_names():
            print(f"{name}: {load_machine(name).description}")
        return 0
    if args.command == "bench":
        _bench()
        return 0
    if args.command == "show":
        from sharepack.agent import gpucheck, nvml  # the adapter, exactly as the agent runs it

        try:
            lib = nvml.load_library(args.machine)
        except MachineError as e:
            print(e, file=sys.stderr)
            return 2
        inventory = nvml.read_inventory(lib)
        nvml.shutdown(lib)
        print("\n".join(gpucheck.inventory_lines(inventory)))
        return 0
    try:
        line = control_line(args.uuid, args.xid, args.gi, args.ci)
    except ValueError as e:
        parser.error(str(e))
    with open(args.control, "a") as f:
        f.write(line)
    return 0


def _bench() -> None:
    import tempfile
    import threading
    import time

    from sharepack.agent import nvml

    def pct(samples: list[float], q: float) -> float:
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    for name in builtin_names():
        lib = nvml.load_library(name, control_file="")
        started = time.perf_counter()
        for _ in range(50):
            nvml.read_inventory(lib)
        print(f"read_inventory {name}: {(time.perf_counter() - started) / 50 * 1e3:.2f} ms")
        nvml.shutdown(lib)

    def blocked_wake(lib: nvml.NvmlLibrary, inject: Callable[[], None], runs: int) -> list[float]:
        woke: list[float] = []
        with nvml.XidWatcher(lib) as watcher:
            def wait() -> None:
                watcher.wait(2000)
                woke.append(time.perf_counter())

            for _ in range(runs):
                waiter = threading.Thread(target=wait)
                waiter.start()
                time.sleep(0.005)  # let the waiter block first
                sent = time.perf_counter()
                inject()
                waiter.join()
                woke[-1] -= sent
        return woke

    lib = nvml.load_library("dgx-a100", control_file="")
    assert isinstance(lib, SimulatedNvml)
    sim = lib
    uuid = nvml.read_inventory(lib).gpus[0].uuid
    lat = blocked_wake(lib, lambda: sim.inject_xid(uuid, 79), 100)
    print(f"inject_xid -> waiting XidWatcher.wait returns: p50 {pct(lat, 0.5) * 1e6:.0f} us, "
          f"p99 {pct(lat, 0.99) * 1e6:.0f} us")
    nvml.shutdown(lib)
    control = Path(tempfile.mkdtemp(dir="/tmp")) / "control"
    lib = nvml.load_library("dgx-a100", control_file=str(control))

    def append() -> None:
        with control.open("a") as f:
            f.write(control_line(uuid, 79))

    uuid = nvml.read_inventory(lib).gpus[0].uuid
    lat = blocked_wake(lib, append, 30)
    print(f"control-file line -> XidWatcher.wait returns: p50 {pct(lat, 0.5) * 1e3:.1f} ms, "
          f"max {max(lat) * 1e3:.1f} ms")
    nvml.shutdown(lib)
    control.unlink()
    control.parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())

"""Where a process's CPU goes: its Python stack sampled at every millisecond of CPU it spends.

    python -m sharepack.sandbox.cpusampler OUT MODULE [ARGS...]

runs MODULE as `python -m MODULE ARGS...` would and, when it exits, writes OUT: one line per
wall-clock second and stack, `SECOND frame;frame;... COUNT` (frames `function (file:line)`,
outermost first). `summary(OUT, start, end)` reads the samples of a time window back, by
function, inclusive and own. `benchmarks/bench_scheduler.py --extender-sample FILE` runs the
extender under it and prints each with phase's window.

Why not cProfile (`--extender-profile`): it times wall clock, so on a busy 2-core machine a
function is charged for the time the process waited for a CPU. Nor py-spy from outside: it
counts a thread in a system call as busy. Here the kernel's profiling timer (ITIMER_PROF)
ticks with the process's own CPU time, user and system, and the handler records the stack.
Python runs the handler at the next bytecode boundary, so time in C code (orjson, TLS, the
event loop's own C under uvloop) counts for the Python frame that runs next: read the C-heavy
frames' share as approximate. The timer's resolution is the kernel's tick (about 4 ms here),
so a window needs some seconds of CPU for its shares to mean much.
"""

from __future__ import annotations

import collections
import re
import runpy
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

INTERVAL_S = 0.001


def _name(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def run(out: Path, module: str, args: Sequence[str]) -> None:
    samples: collections.Counter[tuple[int, str]] = collections.Counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            stack.append(_name(frame))
            frame = frame.f_back
        samples[(int(time.time()), ";".join(reversed(stack)))] += 1

    sys.argv = [module, *args]
    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with out.open("w", encoding="utf-8") as f:
            for (second, stack), count in samples.items():
                f.write(f"{second} {stack} {count}\n")


_FRAME = re.compile(r"(.*) \((.*):(\d+)\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return frame
    function, path, line = m.groups()
    return f"{function} ({Path(path).name}:{line})"


def summary(path: Path, start: float, end: float, top: int = 40) -> str:
    """The samples taken from `start` to `end` (POSIX seconds), by function: the share of them
    it was on the stack (inclusive) and on top (own)."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        second, rest = line.split(" ", 1)
        stack, count = rest.rsplit(" ", 1)
        if not start <= int(second) <= end:
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        return f"no samples between {start:.0f} and {end:.0f} in {path}"
    lines = [f"{total} samples; by function (callers on every stack left out), inclusive % / own %:"]
    ranked = [(f, n) for f, n in inclusive.most_common() if n < total or own[f]][:top]
    lines += [f"  {n / total * 100:5.1f} / {own[f] / total * 100:4.1f}  {f}" for f, n in ranked]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m sharepack.sandbox.cpusampler OUT MODULE [ARGS...]", file=sys.stderr)
        return 2
    out, module, rest = Path(args[0]), args[1], args[2:]
    try:
        run(out, module, rest)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

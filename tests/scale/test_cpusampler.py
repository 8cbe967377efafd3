"""sandbox.cpusampler: a module run under it, its CPU found where it was spent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sharepack.sandbox import cpusampler

BURN = '''
import sys, time

def spin(seconds):
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n

def idle(seconds):
    time.sleep(seconds)

if __name__ == "__main__":
    idle(0.5)  # asleep: no CPU, no samples
    spin(0.6)
    sys.exit(3)
'''


def test_the_samples_find_the_function_that_spent_the_cpu_and_the_exit_status_is_kept(tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(BURN)
    out = tmp_path / "samples"
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "sharepack.sandbox.cpusampler", str(out), "burn"],
                          env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 3, done.stderr
    text = cpusampler.summary(out, started - 1, time.time() + 1)
    rows = {line.rsplit("  ", 1)[1]: line for line in text.splitlines()[1:]}
    spin = next(line for name, line in rows.items() if name.startswith("spin (burn.py:"))
    assert float(spin.split("/")[0]) > 80  # of the samples, nearly all in spin
    assert not any(name.startswith("idle (") for name in rows)  # sleeping costs no CPU
    assert cpusampler.summary(out, started - 100, started - 50).startswith("no samples")


def test_without_a_module_it_says_how_to_call_it() -> None:
    done = subprocess.run([sys.executable, "-m", "sharepack.sandbox.cpusampler", "out-only"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "usage: python -m sharepack.sandbox.cpusampler OUT MODULE" in done.stderr

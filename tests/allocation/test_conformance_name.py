"""The conformance entry points keep their name: `common.allocation` from a checkout is the very
module `sharepack.common.allocation` (one AllocationError class, not a copy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import common.allocation as historic
from common.allocation import AllocationError, aligned_allocation, shared_allocation
import sharepack.common.allocation as real
assert historic is real and AllocationError is real.AllocationError, (historic, real)
try:
    shared_allocation("packed", ["a::0"], ["a::0"], [], 2)
except real.AllocationError as e:
    print(e)
"""


def test_common_allocation_is_sharepack_common_allocation() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "not enough available devices to satisfy allocation\n"

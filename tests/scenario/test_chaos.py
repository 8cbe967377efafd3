"""`sharepack-chaos` for a minute, as CI runs it: churn in bursts, every kind of fault, and the
invariants checked all along (on the real control plane where it is built)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sharepack.sandbox.drivers import chaos

CLOSING = re.compile(
    r"^soak: (\d+) s, (\d+) faults, (\d+) invariant violations, predictions matched (\d+)/(\d+) \(([\d.]+) %\)$", re.M
)
ROW = re.compile(r"^([a-z-]+)\s+(\d+)\s+(\d+)$", re.M)


@pytest.mark.timeout(420)
def test_a_minute_of_churn_and_faults_breaks_no_invariant() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharepack.sandbox.drivers.chaos", "--duration", "60", "--seed", "1"],
        capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    out = done.stdout
    closing = CLOSING.search(out)
    assert closing, f"no closing line:\n{out}\n{done.stderr[-3000:]}"
    _, faults, violations, matched, predicted, _ = (float(x) for x in closing.groups())
    assert violations == 0, out
    assert done.returncode == 0, done.stderr[-3000:]
    table = {kind: (int(injected), int(survived)) for kind, injected, survived in ROW.findall(out)}
    assert set(table) == set(chaos.FAULTS), out
    assert all(injected == survived for injected, survived in table.values()), out
    assert faults >= 5 and sum(i for i, _ in table.values()) == faults, out  # a fault every 3-7 s
    # The issue asks 99 %; a minute gives some 40 predictions outside fault windows, and the
    # 10-minute run measured 97.9 % (README), so one minute is held to 90 % to stay a test of
    # regressions (spread connections give about 50 %), not of luck.
    assert predicted > 0 and matched / predicted >= 0.9, out

"""sandbox.processes: a child that cannot start leaves no open log file behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharepack.sandbox.processes import LoggedProcess


async def test_a_child_that_cannot_start_closes_its_log(tmp_path: Path) -> None:
    proc = LoggedProcess([str(tmp_path / "no-such-program")], tmp_path / "child.log")
    with pytest.raises(FileNotFoundError):
        await proc.start()
    # A file left open fails some later test with a ResourceWarning; check the handle here.
    assert proc._log is None
    assert not proc.exited


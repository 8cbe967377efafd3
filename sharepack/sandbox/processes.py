"""Child processes of the sandbox (agents, the extender): started with their output in a log
file, stopped as a kubelet or a Deployment would stop them (SIGTERM, then SIGKILL after a grace
period), so a demo or a test never leaves one behind. Each child also runs under
`setpriv --pdeathsig KILL` (util-linux): when the owner dies without stopping it (SIGKILL, a
crash), the kernel kills the child too."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

GRACE_S = 10.0
SETPRIV = shutil.which("setpriv")


def orphan_proof(args: Sequence[str]) -> list[str]:
    """`args` run so that the child gets SIGKILL when the process that started it dies. The
    signal follows the thread that forked: asyncio forks on the event loop's thread."""
    return [SETPRIV, "--pdeathsig", "KILL", "--", *args] if SETPRIV else list(args)


class LoggedProcess:
    def __init__(self, args: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.env = dict(env or {})
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    async def start(self) -> None:
        # Under setpriv a missing program is setpriv's exit code 127; say it as exec would.
        if shutil.which(self.args[0]) is None:
            raise FileNotFoundError(errno.ENOENT, "no such program", self.args[0])
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *orphan_proof(self.args),
                stdout=self._log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        except BaseException:
            # Callers register stop() only once start() returned: nothing else would close it.
            self._log.close()
            self._log = None
            raise

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    async def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node crash ends it: no cleanup runs."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    async def stop(self, grace: float = GRACE_S) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                # It may exit between the timeout and the kill (a loaded machine: a 5,000-node
                # benchmark died of the ProcessLookupError): gone is what we wanted.
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

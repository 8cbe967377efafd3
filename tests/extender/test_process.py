"""The real `python -m sharepack.extender` process: the first SIGTERM drains, a second one exits at once."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)  # a real process: its cold start alone can take a while loaded


async def test_a_second_sigterm_exits_at_once_while_the_first_one_drains(tmp_short: Path) -> None:
    # The drain waits (up to the server's shutdown timeout, 2 s) for a request in flight: here
    # one whose body never comes. The server has taken it up once it answers `100 Continue`. A
    # second SIGTERM during that wait exits with status 1; a finished drain exits with 0.
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}  # no API at all
    log_file = tmp_short / "extender.log"
    with log_file.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.extender", "--listen", "127.0.0.1:0", "--insecure-http",
            stderr=log, env=env, cwd=REPO,
        )  # fmt: skip
    writer: asyncio.StreamWriter | None = None
    try:
        port = int((await _logged(log_file, r"serving on 127\.0\.0\.1:(\d+)")).group(1))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\nExpect: 100-continue\r\n\r\n")  # fmt: skip
        assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"HTTP/1.1 100")
        proc.send_signal(signal.SIGTERM)
        await _logged(log_file, r"signal received: draining")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 1, log_file.read_text()
        text = log_file.read_text()
        assert "second signal: exiting now" in text
        assert "Traceback" not in text, text
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if writer is not None:
            writer.close()


async def _logged(path: Path, pattern: str) -> re.Match[str]:
    """The first match of `pattern` in the log another process writes: poll it."""
    async with asyncio.timeout(60):
        while (found := re.search(pattern, path.read_text())) is None:
            await asyncio.sleep(0.01)
    return found

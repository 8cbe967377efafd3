"""The real `python -m extender` process: the first SIGTERM drains, a second one exits at once."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


async def test_a_second_sigterm_exits_at_once_while_the_first_one_drains(tmp_short: Path) -> None:
    # The drain waits for the informers, and an informer stuck in a list call against an API
    # that never answers keeps it waiting (until its request timeout, 10 s, and retries). A
    # second SIGTERM must not wait for that: it exits with status 1; a finished drain exits 0.
    requests = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if await reader.readline():  # the request line: an informer is now waiting for us
            requests.set()

    blackhole = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = blackhole.sockets[0].getsockname()[1]
    kubeconfig = tmp_short / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hole",
        "clusters": [{"name": "hole", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "hole", "user": {"token": "t"}}],
        "contexts": [{"name": "hole", "context": {"cluster": "hole", "user": "hole"}}],
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    log_file = tmp_short / "extender.log"
    with log_file.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig),
            stderr=log, env=env, cwd=REPO,
        )  # fmt: skip
    try:
        await asyncio.wait_for(requests.wait(), 30)
        proc.send_signal(signal.SIGTERM)
        await _logged(log_file, "signal received: draining")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 1, log_file.read_text()
        text = log_file.read_text()
        assert "second signal: exiting now" in text
        assert "Traceback" not in text, text
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for writer in held:
            writer.close()
        blackhole.close()
        await blackhole.wait_closed()


async def _logged(path: Path, text: str) -> None:
    """Another process writes the log: poll it."""
    async with asyncio.timeout(30):
        while text not in path.read_text():
            await asyncio.sleep(0.02)

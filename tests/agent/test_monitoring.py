"""The real `sharepack-agent` process's HTTP endpoint: /healthz, /readyz and /metrics move with
what happens to it (kubelet away, registration, an allocation, an XID, a kubelet restart)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import aiohttp

from sharepack.agent.nvmlsim import CONTROL_ENV, control_line
from sharepack.common.devices import physical_key
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from tests.agent.harness import pod, stop_process
from tests.agent.test_cli import GOOD, _Lines

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "nvidia.com/gpu"
T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 20.0) -> T:
    async with asyncio.timeout(timeout):
        while True:
            value = await probe()
            if value is not None:
                return value
            await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")  # pragma: no cover - asyncio.timeout raises


class Endpoint:
    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{port}"

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as resp:
            return resp.status, await resp.text()

    async def metrics(self) -> dict[str, float]:
        status, text = await self.get("/metrics")
        assert status == 200
        return parse_text(text)

    async def wait_ready(self) -> None:
        async def ready() -> bool | None:
            return True if (await self.get("/readyz"))[0] == 200 else None

        await eventually(ready, "/readyz to answer 200")


@asynccontextmanager
async def agent_process(kubelet: FakeKubelet, control: Path) -> AsyncIterator[tuple[Endpoint, _Lines]]:
    config_file = kubelet.root / "config.yaml"
    config_file.write_text(GOOD)  # time-slicing, 2 replicas per GPU
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARED_", "MIG_", "DEVICE_"))}
    env[CONTROL_ENV] = str(control)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sharepack.agent",
        "--simulated-machine", "t4-pcie",
        "--kubelet-socket", str(kubelet.socket_path),
        "--config-file", str(config_file),
        "--shared-devices-allocation-policy", "packed",
        "--metrics-listen", "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = _Lines(proc.stderr)
    try:
        line = await lines.wait_for(r"serving /metrics, /healthz and /readyz on 127\.0\.0\.1:\d+")
        port = int(re.findall(r":(\d+)", line)[-1])
        async with aiohttp.ClientSession() as session:
            yield Endpoint(session, port), lines
        assert await stop_process(proc) == 0
    finally:
        await stop_process(proc)


async def test_endpoints_follow_registration_allocation_health_and_kubelet_restarts() -> None:
    root = Path(tempfile.mkdtemp(prefix="spm-", dir="/tmp"))
    kubelet = FakeKubelet(root)
    kubelet.device_plugin_dir.mkdir(parents=True)  # the kubelet itself is not up yet
    control = root / "nvml-control"
    control.touch()
    try:
        async with agent_process(kubelet, control) as (http, lines):
            # Serving but not registered: alive, not ready, the failed attempts counted.
            await lines.wait_for(r"register nvidia\.com/gpu .*retrying")
            assert await http.get("/healthz") == (200, "ok\n")
            status, why = await http.get("/readyz")
            assert (status, why) == (503, "not registered with the kubelet: nvidia.com/gpu\n")
            before = await http.metrics()
            assert before[f'sharepack_agent_registered{{resource="{RESOURCE}"}}'] == 0
            assert before[f'sharepack_agent_registrations_total{{outcome="failure",resource="{RESOURCE}"}}'] >= 1
            assert f'sharepack_agent_registrations_total{{outcome="success",resource="{RESOURCE}"}}' not in before

            # The kubelet comes up (removing every socket, as a kubelet does): ready once registered.
            await kubelet.start()
            await lines.wait_for("kubelet restart detected")  # kubelet.sock appeared
            await kubelet.wait_for_resource(RESOURCE, timeout=20)
            await http.wait_ready()
            up = await http.metrics()
            assert up[f'sharepack_agent_registered{{resource="{RESOURCE}"}}'] == 1
            assert up[f'sharepack_agent_registrations_total{{outcome="success",resource="{RESOURCE}"}}'] >= 1
            assert up[f'sharepack_agent_unhealthy_devices{{resource="{RESOURCE}"}}'] == 0

            # One allocation: counted with its resource, policy and outcome, and timed.
            admission = await kubelet.admit_pod(pod("a", RESOURCE))
            (device,) = admission.devices("main", RESOURCE)
            allocated = await http.metrics()
            key = f'sharepack_agent_allocations_total{{outcome="success",policy="packed",resource="{RESOURCE}"}}'
            assert allocated[key] == 1
            assert allocated[f'sharepack_agent_allocate_duration_seconds_count{{resource="{RESOURCE}"}}'] == 1
            preferred = f'sharepack_agent_get_preferred_allocation_duration_seconds_count{{resource="{RESOURCE}"}}'
            assert allocated[preferred] == 1

            # A critical XID on the allocated GPU: both of its replicas unhealthy, the XID counted.
            with control.open("a") as f:
                f.write(control_line(physical_key(device), 79))

            async def xid_seen() -> dict[str, float] | None:
                m = await http.metrics()
                return m if m.get('sharepack_agent_xids_total{code="79",critical="true"}') == 1 else None

            hit = await eventually(xid_seen, "the XID to be counted")
            assert hit[f'sharepack_agent_unhealthy_devices{{resource="{RESOURCE}"}}'] == 2

            # A kubelet restart: counted once, and ready again after registering again.
            restarts = up.get("sharepack_agent_kubelet_restarts_total", 0)
            successes = up[f'sharepack_agent_registrations_total{{outcome="success",resource="{RESOURCE}"}}']
            await kubelet.restart()
            await lines.wait_for("kubelet restart detected")
            await kubelet.wait_for_resource(RESOURCE, timeout=20)
            await http.wait_ready()
            again = await http.metrics()
            assert again["sharepack_agent_kubelet_restarts_total"] == restarts + 1
            key = f'sharepack_agent_registrations_total{{outcome="success",resource="{RESOURCE}"}}'
            assert again[key] == successes + 1
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)

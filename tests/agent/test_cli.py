"""The real `sharepack-agent` process: simulated machine, fake kubelet, SIGHUP and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.apiserver.resources import NODE_GPU_STATES, NODES
from sharepack.sandbox.apiserver.store import ApiError
from tests.agent.harness import fake_kubelet, pod

# Real processes: their cold start (imports) alone can take tens of seconds on a loaded machine.
pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
NO_DRIVER = """name: no-driver
product: Tesla T4
init_error: LibraryNotFound
gpus:
- {pci_bus_id: "00000000:3B:00.0", numa_node: 0, pcie_path: [hb0, sw0]}
"""

GOOD = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
BAD = "version: v2\n"


class _Lines:
    """The agent's stderr, read as it comes; wait for a line matching a pattern."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._stream = stream
        self._seen = 0

    async def wait_for(self, pattern: str, timeout: float = 30.0) -> str:
        rx = re.compile(pattern)
        async with asyncio.timeout(timeout):
            while True:
                while self._seen < len(self.lines):
                    line = self.lines[self._seen]
                    self._seen += 1
                    if rx.search(line):
                        return line
                raw = await self._stream.readline()
                if not raw:
                    raise AssertionError(f"agent exited before logging {pattern!r}:\n" + "".join(self.lines))
                self.lines.append(raw.decode())


async def test_cli_serves_a_simulated_machine_reloads_on_sighup_and_drains_on_sigterm() -> None:
    async with fake_kubelet() as kubelet:
        config_file = kubelet.root / "config.yaml"
        config_file.write_text(GOOD)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARED_", "MIG_", "DEVICE_"))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.agent",
            "--simulated-machine", "dgx-a100",
            "--kubelet-socket", str(kubelet.socket_path), "--metrics-listen", "127.0.0.1:0",
            "--config-file", str(config_file),
            "--shared-devices-allocation-policy", "packed",
            stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
        )
        assert proc.stderr is not None
        lines = _Lines(proc.stderr)
        try:
            await lines.wait_for(r"running with config: .*\"sharedDevicesAllocationPolicy\": \"packed\"")
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=30)
            assert kubelet.capacity() == {"nvidia.com/gpu": 16}

            config_file.write_text(BAD)
            proc.send_signal(signal.SIGHUP)
            line = await lines.wait_for("config reload failed")
            assert "keeping the config in use" in line
            assert str(config_file) in line
            await lines.wait_for("unknown version: v2")
            await kubelet.admit_pod(pod("after-bad-reload", "nvidia.com/gpu"))

            proc.send_signal(signal.SIGTERM)
            await lines.wait_for("draining")
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert not (kubelet.device_plugin_dir / "nvidia-gpu.sock").exists()


async def test_cli_publishes_the_node_state_when_an_api_is_configured() -> None:
    async with fake_kubelet() as kubelet, FakeApiServer() as api:
        api.store.create(NODES, "", {"metadata": {"name": "node-0"}})
        kubeconfig = api.write_kubeconfig(kubelet.root / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.agent",
            "--simulated-machine", "t4-pcie",
            "--kubelet-socket", str(kubelet.socket_path), "--metrics-listen", "127.0.0.1:0",
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--kubeconfig", str(kubeconfig), "--node-name", "node-0", "--log-format", "json",
            stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
        )
        assert proc.stderr is not None
        lines = _Lines(proc.stderr)
        try:
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=30)
            # Another process writes the object: poll the fake API (there is nothing to await).
            async with asyncio.timeout(30):
                while True:
                    try:
                        obj = api.store.get(NODE_GPU_STATES, "", "node-0")
                        if obj.get("status", {}).get("resources"):
                            break
                    except ApiError:  # not created yet
                        pass
                    await asyncio.sleep(0.05)
            (resource,) = obj["status"]["resources"]
            assert resource["name"] == "nvidia.com/gpu"
            assert sum(g["total"] for g in resource["gpus"]) == 4
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if proc.returncode != 0:
                print("".join(lines.lines))


async def test_cli_without_a_driver_honours_fail_on_init_error() -> None:
    async with fake_kubelet() as kubelet:
        machine = kubelet.root / "no-driver.yaml"
        machine.write_text(NO_DRIVER)
        common = ["--simulated-machine", str(machine), "--kubelet-socket", str(kubelet.socket_path),
                  "--metrics-listen", "127.0.0.1:0"]  # fmt: skip

        failing = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.agent", *common, stderr=asyncio.subprocess.PIPE, cwd=REPO
        )
        _, err = await asyncio.wait_for(failing.communicate(), 30)
        assert failing.returncode == 1
        assert "cannot start" in err.decode() and "failOnInitError is true" in err.decode()

        idle = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.agent", *common, "--fail-on-init-error=false",
            stderr=asyncio.subprocess.PIPE, cwd=REPO,
        )
        assert idle.stderr is not None
        try:
            await _Lines(idle.stderr).wait_for("serving nothing until stopped")
            idle.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(idle.wait(), 30) == 0
        finally:
            if idle.returncode is None:
                idle.kill()
                await idle.wait()
        assert kubelet.registrations == ()


async def test_the_state_flags_reach_the_publisher() -> None:
    # --state-heartbeat-seconds (a flag) rewrites an unchanged state; the min write interval
    # (its environment variable) spaces every write. At the defaults (60 s, 0.5 s) neither shows:
    # no rewrite within the test, and a second pod's write follows the first by well under 1.2 s.
    heartbeat_s, min_interval_s = 1.5, 1.2
    async with fake_kubelet() as kubelet, FakeApiServer() as api:
        api.store.create(NODES, "", {"metadata": {"name": "node-0"}})
        kubeconfig = api.write_kubeconfig(kubelet.root / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env["SHAREPACK_STATE_MIN_WRITE_INTERVAL_SECONDS"] = str(min_interval_s)
        log_file = kubelet.root / "agent.log"
        with log_file.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sharepack.agent",
                "--simulated-machine", "t4-pcie",
                "--kubelet-socket", str(kubelet.socket_path),
                "--pod-resources-socket", str(kubelet.pod_resources_socket),
                "--kubeconfig", str(kubeconfig), "--node-name", "node-0",
                "--state-heartbeat-seconds", str(heartbeat_s),
                stderr=log, env=env, cwd=REPO,
            )  # fmt: skip
        try:
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=30)
            first = await _stored_status(api, lambda s: bool(s.get("resources")))
            # Nothing changes, yet the object is rewritten with a later observedAt.
            beat = await _stored_status(api, lambda s: s["observedAt"] > first["observedAt"])
            assert _counts(beat) == _counts(first)
            for i in range(2):  # each pod's write waits for the interval after the write before
                await kubelet.admit_pod(pod(f"p{i}", "nvidia.com/gpu"))
                await _stored_status(api, lambda s, i=i: sum(_counts(s)) == i + 1)
            times = [r.at for r in api.writes("nodegpustates") if r.path.endswith("/status")]
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert len(times) >= 3 and min(gaps) >= min_interval_s, gaps
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if proc.returncode != 0:
                print(log_file.read_text())


async def _stored_status(api: FakeApiServer, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The node-0 NodeGpuState status once `predicate` holds; another process writes it, so poll."""
    async with asyncio.timeout(30):
        while True:
            try:
                status = api.store.get(NODE_GPU_STATES, "", "node-0").get("status")
            except ApiError:  # not created yet
                status = None
            if status and predicate(status):
                return dict(status)
            await asyncio.sleep(0.02)


def _counts(status: dict[str, Any]) -> list[int]:
    return [g["allocated"] for r in status["resources"] for g in r["gpus"]]

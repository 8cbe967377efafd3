"""The real `sharepack-agent` process: simulated machine, fake kubelet, SIGHUP and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from sandbox.apiserver import FakeApiServer
from sandbox.apiserver_resources import NODE_GPU_STATES, NODES
from sandbox.apiserver_store import ApiError
from tests.agent.harness import fake_kubelet, pod

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

    async def wait_for(self, pattern: str, timeout: float = 10.0) -> str:
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
            sys.executable, "-m", "agent",
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
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=10)
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
            assert await asyncio.wait_for(proc.wait(), 10) == 0
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
            sys.executable, "-m", "agent",
            "--simulated-machine", "t4-pcie",
            "--kubelet-socket", str(kubelet.socket_path), "--metrics-listen", "127.0.0.1:0",
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--kubeconfig", str(kubeconfig), "--node-name", "node-0", "--log-format", "json",
            stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
        )
        assert proc.stderr is not None
        lines = _Lines(proc.stderr)
        try:
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=10)
            # Another process writes the object: poll the fake API (there is nothing to await).
            async with asyncio.timeout(10):
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
            assert await asyncio.wait_for(proc.wait(), 10) == 0
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
            sys.executable, "-m", "agent", *common, stderr=asyncio.subprocess.PIPE, cwd=REPO
        )
        _, err = await asyncio.wait_for(failing.communicate(), 20)
        assert failing.returncode == 1
        assert "cannot start" in err.decode() and "failOnInitError is true" in err.decode()

        idle = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", *common, "--fail-on-init-error=false",
            stderr=asyncio.subprocess.PIPE, cwd=REPO,
        )
        assert idle.stderr is not None
        try:
            await _Lines(idle.stderr).wait_for("serving nothing until stopped")
            idle.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(idle.wait(), 10) == 0
        finally:
            if idle.returncode is None:
                idle.kill()
                await idle.wait()
        assert kubelet.registrations == ()

"""The real `sharepack-agent` process with a per-node config: SIGHUP re-applies the named config
in charge instead of falling back to `--config-file` (the wiring in `agent.__main__`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from sharepack.common.config import NODE_CONFIG_LABEL
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.apiserver.resources import CONFIGMAPS, NODES
from tests.agent.harness import fake_kubelet
from tests.agent.test_cli import REPO, _Lines


def time_slicing(policy: str) -> str:
    return (f"version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: {policy}\n"
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n")  # fmt: skip


async def test_sighup_keeps_the_named_config_of_the_node_label() -> None:
    async with fake_kubelet() as kubelet, FakeApiServer() as api:
        api.store.create(NODES, "", {"metadata": {"name": "node-0", "labels": {NODE_CONFIG_LABEL: "packed"}}})
        api.store.create(CONFIGMAPS, "default", {"metadata": {"name": "named"},
                                                 "data": {"packed": time_slicing("packed")}})  # fmt: skip
        config_file = kubelet.root / "config.yaml"
        config_file.write_text(time_slicing("distributed"))
        kubeconfig = api.write_kubeconfig(kubelet.root / "kubeconfig")
        env = {k: v for k, v in os.environ.items()
               if k != "KUBERNETES_SERVICE_HOST" and not k.startswith(("SHARED_", "MIG_", "DEVICE_"))}  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.agent",
            "--simulated-machine", "t4-pcie",
            "--kubelet-socket", str(kubelet.socket_path), "--metrics-listen", "127.0.0.1:0",
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--kubeconfig", str(kubeconfig), "--node-name", "node-0",
            "--node-config-configmap", "default/named", "--config-file", str(config_file),
            stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
        )
        assert proc.stderr is not None
        lines = _Lines(proc.stderr)
        try:
            await lines.wait_for("applied named config packed")
            proc.send_signal(signal.SIGHUP)
            await lines.wait_for("reload: named config packed from configmap default/named")
            line = await lines.wait_for(r"config applied \(policy")
            assert "config applied (policy packed" in line, line
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert not any("policy distributed" in x for x in lines.lines[-20:] if "config applied" in x)

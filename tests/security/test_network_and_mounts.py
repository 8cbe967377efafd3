"""What deploy/ lets sharepack's pods reach and touch (issue 24, items 8-11): the agent mounts the
PodResources directory read-only (and dialling its socket still works through a read-only
mount), gets the driver's management library only (`NVIDIA_DRIVER_CAPABILITIES=utility`), both
pods connect out to DNS and the API server only, and the extender's metrics port admits the
monitoring namespace only. The kustomize base and overlays are read here; the Helm chart renders
the same objects (tests/deploy/test_helm_chart.py holds them equal) and its values are checked
below where helm is built."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharepack.sandbox.kubelet.podresources import PodResourcesServer
from tests.conftest import kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DNS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}  # fmt: skip
DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
API_PORTS = [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomize(target: str) -> list[dict[str, Any]]:
    built = subprocess.run([kubectl(), "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def policy(docs: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == name]
    spec: dict[str, Any] = found["spec"]
    return spec


def agent_container() -> dict[str, Any]:
    (daemonset,) = documents(DEPLOY / "base" / "agent" / "daemonset.yaml")
    container: dict[str, Any] = daemonset["spec"]["template"]["spec"]["containers"][0]
    return container


# --- item 8: the PodResources directory, read-only -------------------------------------------------


def test_the_agent_mounts_the_pod_resources_directory_read_only_and_only_the_device_plugin_one_writable() -> None:
    mounts = {m["mountPath"]: m for m in agent_container()["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"].get("readOnly") is True
    # The kubelet dials the agent's own sockets in device-plugins/: that one must stay writable.
    assert not mounts["/var/lib/kubelet/device-plugins"].get("readOnly")


DIAL = """
import asyncio, sys
from pathlib import Path
from sharepack.agent.podresources import PodResourcesClient

async def main() -> None:
    async with PodResourcesClient(Path(sys.argv[1]), attempts=1) as client:
        print(len(await client.list()))

asyncio.run(main())
"""


class NoPods:
    def admissions(self) -> Sequence[Any]:
        return ()

    def allocatable_devices(self) -> dict[str, Any]:
        return {}


async def test_the_pod_resources_socket_answers_through_a_read_only_mount() -> None:
    """In a mount namespace of its own, the directory bind-mounted read-only over itself (as the
    container runtime mounts a `readOnly` hostPath): the agent's client lists pods, and nothing
    can be created there."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    root = Path(tempfile.mkdtemp(prefix="sp-ro-", dir="/tmp"))
    server = PodResourcesServer(NoPods(), root / "pod-resources" / "kubelet.sock")
    await server.start()
    try:
        directory = root / "pod-resources"
        script = (f"mount --bind -o ro {directory} {directory} && ! touch {directory}/x 2>/dev/null && "
                  f"exec {sys.executable} -c \"$0\" {directory}/kubelet.sock")  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            "unshare", "-m", "sh", "-c", script, DIAL, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        if proc.returncode != 0 and b"unshare" in err and b"Operation not permitted" in err:
            pytest.skip(f"no mount namespaces here: {err.decode().strip()}")
        assert (proc.returncode, out) == (0, b"0\n"), err.decode()
        assert not (directory / "x").exists()
    finally:
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- item 9: NVML's capability only ------------------------------------------------------------------


def test_the_agent_gets_every_gpu_with_the_utility_capability_only() -> None:
    env = {e["name"]: e.get("value") for e in agent_container()["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


# --- item 10: egress to DNS and the API server only ---------------------------------------------------


def egress_to_dns_and_api_server_only(spec: dict[str, Any], api_peers: list[Any] | None) -> None:
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    dns, api = spec["egress"]
    assert dns == {"to": [DNS_PEER], "ports": DNS_PORTS}
    assert api["ports"] == API_PORTS
    assert api.get("to") == api_peers  # None: those ports to any address


@pytest.mark.parametrize("name", ["sharepack-agent", "sharepack-extender"])
def test_both_pods_connect_out_to_dns_and_the_api_servers_ports_only(name: str) -> None:
    egress_to_dns_and_api_server_only(policy(documents(DEPLOY / "base" / name.removeprefix("sharepack-") / "networkpolicy.yaml"), name), None)


@pytest.mark.parametrize("name", ["sharepack-agent", "sharepack-extender"])
def test_the_apiserver_overlay_narrows_egress_to_the_named_addresses(name: str) -> None:
    overlay = DEPLOY / "overlays" / "apiserver-cidrs"
    patch = json.loads((overlay / "apiserver-cidrs.json").read_text())
    (named,) = [op["value"] for op in patch if op["op"] == "add"]
    assert named and all(p["ipBlock"]["cidr"].startswith("192.0.2.") for p in named)  # documentation addresses
    egress_to_dns_and_api_server_only(policy(kustomize("overlays/apiserver-cidrs"), name), named)


# --- item 11: the extender's metrics port, from the monitoring namespace only -------------------------


def test_the_extenders_metrics_port_admits_the_monitoring_namespace_only() -> None:
    spec = policy(documents(DEPLOY / "base" / "extender" / "networkpolicy.yaml"), "sharepack-extender")
    (metrics,) = [r for r in spec["ingress"] if [p["port"] for p in r["ports"]] == [9400]]
    assert metrics["from"] == MONITORING


def test_the_metrics_namespace_overlay_names_another_namespace() -> None:
    spec = policy(kustomize("overlays/metrics-namespace"), "sharepack-extender")
    assert spec["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    assert spec["ingress"][0]["ports"] == [{"port": 9400, "protocol": "TCP"}]


def test_the_chart_renders_its_network_values(helm: Path) -> None:
    sets = ("networkPolicy.apiServerCIDRs={10.0.0.5/32}", "networkPolicy.apiServerPorts={6443}",
            "extender.metricsNamespace=")  # fmt: skip
    args = ["template", "sharepack", str(DEPLOY / "helm" / "sharepack"), "--namespace", "sharepack-system"]
    rendered = subprocess.run([str(helm), *args, *(a for s in sets for a in ("--set", s))],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    for name in ("sharepack-agent", "sharepack-extender"):
        dns, api = policy(docs, name)["egress"]
        assert (dns["ports"], api) == (DNS_PORTS, {"ports": [{"port": 6443, "protocol": "TCP"}],
                                                   "to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}]})  # fmt: skip
    # An empty namespace opens the metrics port to every source, as before.
    assert policy(docs, "sharepack-extender")["ingress"][0] == {"ports": [{"port": 9400, "protocol": "TCP"}]}


@pytest.fixture
def helm() -> Path:
    from tests.deploy.test_helm_chart import cached_helm

    return cached_helm()

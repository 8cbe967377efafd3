"""deploy/ ships the extender with mutual TLS and its network closed: the Deployment reads its
certificates from the Secret it mounts, kube-scheduler's stanza presents a client certificate,
the certificates docs/install.md makes with openssl are the ones both sides accept, and the
NetworkPolicies admit the verbs' port from the operator's CIDRs only (from no one by default)
and the agent's metrics port and nothing else."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import ssl
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509

from sharepack.agent import configwatching
from sharepack.extender import authorizing
from sharepack.extender.__main__ import tls_context
from tests.security.stack import SERVED, tls_exchange, tls_server
from tests.conftest import kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
INSTALL = ROOT / "docs" / "install.md"
CERTS_MARKER = "<!-- tests/security/test_deploy.py runs this block -->"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def extender_container() -> dict[str, Any]:
    (deployment,) = documents(DEPLOY / "base" / "extender" / "deployment.yaml")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def flag(container: dict[str, Any], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{name}=")]
    return value


def stanzas() -> list[dict[str, Any]]:
    """Every extender entry (as shipped: the ranking one, then the bind-only one), one URL."""
    exts: list[dict[str, Any]] = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())["extenders"]
    return exts


def stanza() -> dict[str, Any]:
    (url,) = {e["urlPrefix"] for e in stanzas()}
    return next(e for e in stanzas() if e["urlPrefix"] == url)


def policy(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == name]
    return found


def admitted(pol: dict[str, Any], port: int) -> list[Any] | None:
    """The peers a policy admits on `port`: None for everyone, [] for no one."""
    peers: list[Any] = []
    for rule in pol["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports and port not in [p["port"] for p in ports]:
            continue
        if not rule.get("from"):
            return None  # a rule without peers admits every source
        peers += rule["from"]
    return peers


# --- the extender and the scheduler stanza ---------------------------------------------------------


def test_the_extender_serves_mutual_tls_from_the_secret_it_mounts() -> None:
    container = extender_container()
    (deployment,) = documents(DEPLOY / "base" / "extender" / "deployment.yaml")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/sharepack/tls"]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == "sharepack-extender-tls"
    files = [flag(container, f) for f in ("--tls-cert-file", "--tls-private-key-file", "--client-ca-file")]
    assert [str(PurePosixPath(f).parent) for f in files] == [mount["mountPath"]] * 3
    keys = [PurePosixPath(f).name for f in files]
    assert keys == ["tls.crt", "tls.key", "ca.crt"]
    # The Secret the docs create holds exactly those keys.
    assert "create secret generic sharepack-extender-tls" in INSTALL.read_text()
    assert all(f"--from-file={k}" in INSTALL.read_text() for k in keys)
    assert "--insecure-http" not in container["args"]


def test_the_scheduler_stanza_presents_a_client_certificate_over_https() -> None:
    for ext in stanzas():  # the ranking entry and the bind-only one alike
        assert ext["enableHTTPS"] is True and ext["urlPrefix"].startswith("https://")
        assert set(ext["tlsConfig"]) == {"certFile", "keyFile", "caFile"}  # v1 ExtenderTLSConfig names
        assert [PurePosixPath(ext["tlsConfig"][k]).name for k in ("certFile", "keyFile", "caFile")] == [
            "scheduler.crt", "scheduler.key", "ca.crt",
        ]  # fmt: skip


def certificate_commands() -> str:
    text = INSTALL.read_text()
    at = text.index(CERTS_MARKER)
    block = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    assert block, f"no ```sh block after {CERTS_MARKER} in docs/install.md"
    return block.group(1)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command the docs use")
async def test_the_documented_certificates_let_the_scheduler_in_under_the_service_name(tmp_short: Path) -> None:
    subprocess.run(["bash", "-euo", "pipefail", "-c", certificate_commands()], cwd=tmp_short, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    host = urlsplit(stanza()["urlPrefix"]).hostname
    assert host is not None
    serving = x509.load_pem_x509_certificate((tmp_short / "tls.crt").read_bytes())
    assert host in serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    server_ctx = tls_context(str(tmp_short / "tls.crt"), str(tmp_short / "tls.key"), str(tmp_short / "ca.crt"))

    def client(cert: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(tmp_short / "ca.crt"))
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # refusals inside the handshake
        ctx.load_cert_chain(str(tmp_short / f"{cert}.crt"), str(tmp_short / f"{cert}.key"))
        return ctx

    async with tls_server(server_ctx) as port:

        def exchange(ctx: ssl.SSLContext) -> tuple[str, bytes]:
            # Dial 127.0.0.1 but check the certificate for the stanza's host, as kube-scheduler does.
            return tls_exchange(port, ctx, b"hi", server_hostname=host)

        assert await asyncio.to_thread(exchange, client("scheduler")) == ("reply", SERVED)
        assert await asyncio.to_thread(exchange, client("explain")) == ("reply", SERVED)
        # The serving certificate is for serving only: as a client certificate it is refused.
        assert await asyncio.to_thread(exchange, client("tls")) == ("handshake", b"")
    # Their names are the ones the extender authorizes by default: the scheduler's for the
    # verbs, the explain client's for /explain alone.
    names = {}
    for cert in ("scheduler", "explain"):
        subject = x509.load_pem_x509_certificate((tmp_short / f"{cert}.crt").read_bytes()).subject
        names[cert] = (tuple(a.value for a in subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)),)
    assert names == {"scheduler": (authorizing.DEFAULT_SCHEDULER_CNS,), "explain": (authorizing.DEFAULT_EXPLAIN_CNS,)}


# --- network ------------------------------------------------------------------------------------------


def test_by_default_no_one_reaches_the_verbs_and_only_metrics_ports_are_open() -> None:
    docs = [*documents(DEPLOY / "base" / "extender" / "networkpolicy.yaml"), *documents(DEPLOY / "base" / "agent" / "networkpolicy.yaml")]
    extender, agent = policy(docs, "sharepack-extender"), policy(docs, "sharepack-agent")
    verbs = int(flag(extender_container(), "--listen").rsplit(":", 1)[1])
    metrics = int(flag(extender_container(), "--metrics-listen").rsplit(":", 1)[1])
    assert admitted(extender, verbs) == []
    # Prometheus, plain HTTP, no verb: from the monitoring namespace (the kubelet's probes come
    # from the node, which NetworkPolicy always admits).
    assert admitted(extender, metrics) == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert admitted(agent, 9400) is None
    for pol in (extender, agent):
        assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"]  # egress: tests/security/test_network_and_mounts.py
        # Every rule names its ports: a rule without ports would open all of them.
        assert all(rule.get("ports") for rule in pol["spec"]["ingress"])
    assert [p["port"] for r in agent["spec"]["ingress"] for p in r["ports"]] == [9400]


def test_the_cidr_patch_opens_the_verbs_to_exactly_the_named_addresses() -> None:
    overlay = DEPLOY / "overlays" / "scheduler-cidrs"
    built = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    (patch,) = json.loads((overlay / "scheduler-cidrs.json").read_text())
    named = [peer["ipBlock"]["cidr"] for peer in patch["value"]["from"]]
    assert named and all(c.startswith("192.0.2.") for c in named)  # documentation addresses only
    peers = admitted(policy(docs, "sharepack-extender"), 8888)
    assert peers is not None and [p["ipBlock"]["cidr"] for p in peers] == named
    assert admitted(policy(docs, "sharepack-agent"), 8888) == []


# --- what each service account and container may do -------------------------------------------------


KUSTOMIZE_FILES = ("kustomization.yaml", "kustomizeconfig.yaml")


def granted(account: str) -> dict[str, set[str]]:
    """`resource` (or `resource/subresource`, `group:resource`) -> verbs, over every role bound to
    the service account in deploy/base."""
    docs = [d for p in (DEPLOY / "base").rglob("*.yaml") if p.name not in KUSTOMIZE_FILES for d in documents(p)]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    out: dict[str, set[str]] = {}
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    key = f"{group}:{resource}" if group else resource
                    out.setdefault(key, set()).update(rule["verbs"])
    return out


def test_the_extender_may_read_states_and_pods_and_create_bindings_nothing_else() -> None:
    # No patch of pods: the directed GPUs ride on the Binding (docs/security.md says what it allows).
    # nodes (read only): allocatable CPU and memory for the CPU-aware ranks (sharepack/extender/noderesources.py).
    assert granted("sharepack-extender") == {
        "sharepack.io:nodegpustates": {"get", "list", "watch"},
        "pods": {"get", "list", "watch"},
        "pods/binding": {"create"},
        "nodes": {"get", "list", "watch"},
    }


def test_the_agent_may_not_bind_write_pods_or_read_secrets() -> None:
    rights = granted("sharepack-agent")
    assert rights["pods"] == {"get", "list", "watch"} and rights["nodes"] == {"get", "list", "watch"}
    assert not {"pods/binding", "secrets", "pods/exec", "nodes/proxy"} & set(rights)
    assert all("*" not in verbs and "delete" not in verbs for verbs in rights.values())
    # Its writes: NodeGpuState objects (narrowed to its own node by the admission policy) and
    # core Events, created in `default` only (events about its Node; issue 24.7).
    writers = {r for r, verbs in rights.items() if verbs & {"create", "update", "patch"}}
    assert writers == {"sharepack.io:nodegpustates", "sharepack.io:nodegpustates/status", "events"}
    assert rights["events"] == {"create"}
    (events,) = [d for d in documents(DEPLOY / "base" / "agent-events" / "rbac.yaml")
                 if d["kind"] in ("Role", "ClusterRole") and any("events" in r["resources"] for r in d["rules"])]  # fmt: skip
    assert (events["kind"], events["metadata"]["namespace"]) == ("Role", configwatching.EVENT_NAMESPACE)


def test_the_agent_runs_as_root_without_capabilities_and_sees_two_host_directories() -> None:
    (daemonset,) = documents(DEPLOY / "base" / "agent" / "daemonset.yaml")
    pod = daemonset["spec"]["template"]["spec"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert (sc["runAsUser"], sc["privileged"], sc["allowPrivilegeEscalation"], sc["readOnlyRootFilesystem"]) == (
        0, False, False, True,
    )  # fmt: skip
    assert sc["capabilities"] == {"drop": ["ALL"]}
    host_paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
    assert host_paths == ["/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"]

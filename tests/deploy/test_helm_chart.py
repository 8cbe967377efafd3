"""deploy/helm/sharepack: lints, renders valid and checkov-clean Kubernetes objects for every
values file, and installs exactly what deploy/base (and each overlay) installs.

Helm comes from its Go module (deploy/helm/tool, built once into ~/.cache/sharepack/helm/<key>/ by
scripts/test). Without it these tests skip, saying how to build it (under SHAREPACK_REQUIRE_REAL
they fail)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sharepack.common import config as agent_config
from sharepack.common import policies
from sharepack.extender.bindguard import UnscoredBinds
from tests.conftest import kubectl
from tests.deploy import references

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "sharepack"
BUILDER = DEPLOY / "helm" / "tool" / "build.py"
K8S_VERSION = "1.33.0"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
AGENT_CONFIGMAP = ("ConfigMap", "sharepack-node", "sharepack-agent-config")
# Values files that stand for an overlay: ci/<overlay>-values.yaml renders what deploy/overlays/<overlay> builds.
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
VALUES_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))

def cached_helm() -> Path:
    """The helm built from deploy/helm/tool, or a skip (a failure under SHAREPACK_REQUIRE_REAL,
    as .ci/run sets) that says how to build it. Tests never build: scripts/test does, before
    pytest, outside any test's time budget."""
    probe = subprocess.run(
        [sys.executable, "-c", "import build; print(build.cache_dir() / 'helm')"],
        cwd=BUILDER.parent, capture_output=True, text=True, check=True,
    )  # fmt: skip
    path = Path(probe.stdout.strip())
    if path.exists():
        return path
    why = f"helm is not built: run `python3 {BUILDER.relative_to(ROOT)}` (needs Go; scripts/test does it when Go is present)"
    if os.environ.get("SHAREPACK_REQUIRE_REAL"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def helm() -> Path:
    return cached_helm()


def _helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def _render(helm: Path, *values: str, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", "sharepack", str(CHART), "--include-crds", "--namespace", "sharepack-system"]
    for name in values:
        args += ["--values", str(CHART / "ci" / name)]
    for s in sets:
        args += ["--set", s]
    rendered = _helm(helm, *args)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def _kustomize(target: str) -> list[dict[str, Any]]:
    built = subprocess.run([kubectl(), "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


Key = tuple[str, str, str]
# kubectl's kustomize stamps its namespace on these although they are cluster-scoped (its list of
# cluster-scoped kinds predates them); the API server ignores it there, so the comparison does too.
CLUSTER_SCOPED = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def _by_key(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by (kind, namespace, name), the agent configs parsed: the chart writes them from
    values with toYaml, so key order and quoting differ from the hand-written text, not the meaning."""
    out: dict[Key, dict[str, Any]] = {}
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED and "namespace" in meta:
            meta = {k: v for k, v in meta.items() if k != "namespace"}
            doc = {**doc, "metadata": meta}
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"{key} rendered twice"
        if key == AGENT_CONFIGMAP:
            doc = {**doc, "data": {k: yaml.safe_load(v) for k, v in doc["data"].items()}}
        out[key] = doc
    return out


def _differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in b:
                yield f"{path}.{k}: only in the chart"
            elif k not in a:
                yield f"{path}.{k}: only in kustomize"
            else:
                yield from _differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: chart {a!r} != kustomize {b!r}"


def _assert_same_objects(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    ours, theirs = _by_key(chart), _by_key(kustomized)
    assert sorted(ours) == sorted(theirs), (
        f"only in the chart: {sorted(set(ours) - set(theirs))}; only in kustomize: {sorted(set(theirs) - set(ours))}"
    )
    diffs = [f"{k[0]} {k[2]}{d}" for k in sorted(ours) for d in _differences(ours[k], theirs[k])]
    assert not diffs, "the chart drifted from deploy/ (mirror the change in deploy/helm/sharepack/templates):\n" + "\n".join(diffs)


def _validate(docs: list[dict[str, Any]], where: str) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "sharepack-agent-config":
            for key, text in doc["data"].items():
                agent_config.load_config(file_text=text, file_source=f"{where}:{key}", env={}, flags={})


def test_builder_without_go_says_so_in_one_line(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "SHAREPACK_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, str(BUILDER)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "helm: go is not on PATH; install Go >= 1.24 to build helm from deploy/helm/tool\n"


def test_helm_carries_the_pinned_version_and_its_kubernetes_minor(helm: Path, tmp_path: Path) -> None:
    """The link-time version flags took: without them `helm version` has no patch level and
    templates (and lint's kubeVersion checks) see Kubernetes 1.20."""
    mod = (DEPLOY / "helm" / "tool" / "go.mod").read_text()
    (pinned,) = re.findall(r"helm\.sh/helm/v3 (v\S+)", mod)
    (client_go_minor,) = re.findall(r"k8s\.io/client-go v0\.(\d+)\.", mod)
    assert _helm(helm, "version", "--template", "{{.Version}}").stdout == pinned
    probe = tmp_path / "probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.0.1\n")
    (probe / "templates" / "kube.yaml").write_text("kube: {{ .Capabilities.KubeVersion.Version }}\n")
    rendered = _helm(helm, "template", "probe", str(probe))
    assert rendered.returncode == 0, rendered.stderr
    assert yaml.safe_load(rendered.stdout) == {"kube": f"v1.{client_go_minor}.0"}


@pytest.mark.parametrize("values", ["", *VALUES_FILES], ids=lambda v: f"helm lint --strict with {v or 'defaults'}")
def test_chart_lints_clean(helm: Path, values: str) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(CHART / "ci" / values)] if values else [])
    linted = _helm(helm, *args)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize("values", ["", *VALUES_FILES], ids=lambda v: f"render with {v or 'defaults'} is valid Kubernetes")
def test_render_is_strictly_valid(helm: Path, values: str) -> None:
    docs = _render(helm, *([values] if values else []))
    assert {d["kind"] for d in docs} >= {"DaemonSet", "CustomResourceDefinition", "ConfigMap"}
    _validate(docs, f"chart with {values or 'defaults'}")


def test_default_render_is_the_kustomize_build_of_the_base(helm: Path) -> None:
    _assert_same_objects(_render(helm), _kustomize("base"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: f"ci/{o}-values.yaml renders overlays/{o}")
def test_overlay_values_render_the_overlay(helm: Path, overlay: str) -> None:
    assert f"{overlay}-values.yaml" in VALUES_FILES, f"deploy/overlays/{overlay} has no chart values file"
    _assert_same_objects(_render(helm, f"{overlay}-values.yaml"), _kustomize(f"overlays/{overlay}"))


def test_scheduler_configmap_holds_the_deployed_extender_stanza(helm: Path) -> None:
    docs = _by_key(_render(helm, sets=("scheduler.enabled=true",)))
    text = docs[("ConfigMap", "sharepack-system", "sharepack-scheduler-config")]["data"]["config.yaml"]
    rendered = yaml.safe_load(text)
    deployed = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    # A second scheduler: its own profile name and its own lease, or it would contend for the
    # default scheduler's.
    assert rendered.pop("profiles") == [{"schedulerName": "sharepack-scheduler"}]
    assert rendered.pop("leaderElection") == {
        "leaderElect": True, "resourceName": "sharepack-scheduler", "resourceNamespace": "sharepack-system",
    }  # fmt: skip
    deployed.pop("profiles")
    assert rendered == deployed


def test_a_ranking_list_of_the_gpu_resources_makes_one_entry_that_also_binds(helm: Path) -> None:
    """scheduler.managedResources non-empty: only the GPU resources' pods are ranked, and they are
    the ones the extender binds, so one entry carries all three verbs (two entries may not list
    the same resource)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    gpu = values["scheduler"]["bindResources"]
    docs = _by_key(_render(helm, sets=("scheduler.enabled=true", "scheduler.managedResources={" + ",".join(gpu) + "}")))
    text = docs[("ConfigMap", "sharepack-system", "sharepack-scheduler-config")]["data"]["config.yaml"]
    (ext,) = yaml.safe_load(text)["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert [r["name"] for r in ext["managedResources"]] == gpu


def test_named_configs_become_configmap_keys_the_agent_loads(helm: Path) -> None:
    docs = _by_key(_render(helm, "second-scheduler-values.yaml"))
    data = docs[AGENT_CONFIGMAP]["data"]
    assert sorted(data) == ["a100-mig", "default"]
    cfg = agent_config.load_config(file_text=yaml.safe_dump(data["a100-mig"]), file_source="a100-mig", env={}, flags={})
    assert str(cfg.mig_strategy) == "mixed"
    (container,) = docs[("DaemonSet", "sharepack-node", "sharepack-agent")]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/sharepack/sharepack@sha256:" + "0" * 64
    deployment = docs[("Deployment", "sharepack-system", "sharepack-extender")]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"


def test_second_scheduler_pods_may_be_bound_by_the_extender(helm: Path) -> None:
    """The extender's /bind refuses pods of a schedulerName it does not serve, so the chart names
    the second scheduler next to the control plane's."""
    docs = _by_key(_render(helm, "second-scheduler-values.yaml"))
    (container,) = docs[("Deployment", "sharepack-system", "sharepack-extender")]["spec"]["template"]["spec"]["containers"]
    names = [a for a in container["args"] if a.startswith("--scheduler-name=")]
    assert names == ["--scheduler-name=default-scheduler", "--scheduler-name=sharepack-scheduler"]
    default = _by_key(_render(helm))[("Deployment", "sharepack-system", "sharepack-extender")]
    assert not [a for a in default["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--scheduler-name")]


def test_tls_secret_ports_and_scheduler_sources_come_from_values(helm: Path) -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"component": "sharepack-scheduler"}}}  # fmt: skip
    sets = (
        "extender.tls.secretName=extender-certs", "extender.port=8443", "extender.metricsPort=9500",
        "agent.metricsPort=9600", "extender.unscoredBinds=refuse", "extender.schedulerCIDRs={10.1.0.0/16,fd00::/64}",
        "extender.schedulerPeers[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kube-system",
        "extender.schedulerPeers[0].podSelector.matchLabels.component=sharepack-scheduler",
        "scheduler.enabled=true", "scheduler.tls.serverName=sharepack-extender.sharepack-system.svc",
    )  # fmt: skip
    rendered = _render(helm, sets=sets)
    _validate(rendered, "chart with custom TLS, ports and scheduler sources")
    docs = _by_key(rendered)
    pod = docs[("Deployment", "sharepack-system", "sharepack-extender")]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "extender-certs", "defaultMode": 0o440}}]
    (extender,) = pod["containers"]
    assert {"--listen=0.0.0.0:8443", "--metrics-listen=0.0.0.0:9500", "--unscored-binds=refuse"} <= set(extender["args"])
    assert extender["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                                 {"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]  # fmt: skip
    service = docs[("Service", "sharepack-system", "sharepack-extender")]["spec"]["ports"]
    assert [(p["name"], p["port"]) for p in service] == [("https", 8443), ("metrics", 9500)]
    (agent,) = docs[("DaemonSet", "sharepack-node", "sharepack-agent")]["spec"]["template"]["spec"]["containers"]
    assert "--metrics-listen=0.0.0.0:9600" in agent["args"]
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9600, "protocol": "TCP"}]
    agent_policy = docs[("NetworkPolicy", "sharepack-node", "sharepack-agent")]["spec"]["ingress"]
    assert agent_policy == [{"ports": [{"port": 9600, "protocol": "TCP"}]}]
    extender_policy = docs[("NetworkPolicy", "sharepack-system", "sharepack-extender")]["spec"]["ingress"]
    assert extender_policy == [
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
         "ports": [{"port": 9500, "protocol": "TCP"}]},
        {"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}, {"ipBlock": {"cidr": "fd00::/64"}}, peer],
         "ports": [{"port": 8443, "protocol": "TCP"}]},
    ]  # fmt: skip
    stanza = yaml.safe_load(docs[("ConfigMap", "sharepack-system", "sharepack-scheduler-config")]["data"]["config.yaml"])
    ranking, binder = stanza["extenders"]
    for ext in (ranking, binder):
        assert ext["urlPrefix"] == "https://sharepack-extender.sharepack-system.svc:8443"
        assert ext["tlsConfig"]["serverName"] == "sharepack-extender.sharepack-system.svc"


def test_the_extender_may_not_write_pods_directing_or_not(helm: Path) -> None:
    # Directions ride on the Binding (sharepack/extender/binding.py): no right to patch pods.
    for sets in ((), ("extender.directedGpus=false",)):
        docs = _by_key(_render(helm, sets=sets))
        role = docs[("ClusterRole", "", "sharepack-extender")]
        pods = {v for rule in role["rules"] for v in rule["verbs"] if "pods" in rule["resources"]}
        assert pods == {"get", "list", "watch"}, sets
        args = docs[("Deployment", "sharepack-system", "sharepack-extender")]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert ("--no-directed-gpus" in args) == bool(sets)


def test_extender_off_installs_no_extender_objects(helm: Path) -> None:
    docs = _by_key(_render(helm, sets=("extender.enabled=false",)))
    assert not [k for k in docs if "sharepack-extender" in k[2]]
    # Nor its admission policies (they name its account); the agent's stays.
    assert [k[2] for k in docs if k[0] == "ValidatingAdmissionPolicy"] == ["sharepack-agent-own-node"]
    assert ("DaemonSet", "sharepack-node", "sharepack-agent") in docs


def test_one_replica_gets_no_disruption_budget_that_would_block_every_drain(helm: Path) -> None:
    docs = _by_key(_render(helm, sets=("extender.replicas=1",)))
    assert ("PodDisruptionBudget", "sharepack-system", "sharepack-extender") not in docs
    assert docs[("Deployment", "sharepack-system", "sharepack-extender")]["spec"]["replicas"] == 1


def test_custom_namespaces_reach_every_object_and_the_admission_rules(helm: Path) -> None:
    docs = _render(helm, sets=("namespace.name=ops-system", "namespace.agent=ops-node", "scheduler.enabled=true"))
    assert not list(references.problems(docs))
    # Every object but the agent's Events Role and its binding (the API server files events about
    # a Node in `default` only) is in one of the two namespaces: the agent's in ops-node.
    namespaced = [d for d in docs if "namespace" in d["metadata"] and d["metadata"]["name"] != "sharepack-agent-events"]
    agents = {(d["kind"], d["metadata"]["name"]) for d in namespaced if d["metadata"]["namespace"] == "ops-node"}
    assert agents == {("ServiceAccount", "sharepack-agent"), ("ConfigMap", "sharepack-agent-config"),
                      ("DaemonSet", "sharepack-agent"), ("Role", "sharepack-agent-config"),
                      ("RoleBinding", "sharepack-agent-config"), ("NetworkPolicy", "sharepack-agent")}  # fmt: skip
    assert {d["metadata"]["namespace"] for d in namespaced} == {"ops-node", "ops-system"}
    # The admission policies' parameters are the accounts in their namespaces.
    refs = {d["metadata"]["name"]: d["spec"]["paramRef"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert {k: r["namespace"] for k, r in refs.items()} == {
        "sharepack-agent-own-node": "ops-node", "sharepack-extender-pod-writes": "ops-system",
        "sharepack-gpu-directions": "ops-system",
    }  # fmt: skip
    levels = {d["metadata"]["name"]: d["metadata"]["labels"][references.ENFORCE] for d in docs if d["kind"] == "Namespace"}
    assert levels == {"ops-node": "privileged", "ops-system": "restricted"}


@pytest.mark.parametrize("values", ["", *VALUES_FILES], ids=lambda v: v or "defaults")
def test_every_render_holds_its_references_together(helm: Path, values: str) -> None:
    docs = _render(helm, *([values] if values else []), sets=("scheduler.enabled=true",))
    assert not list(references.problems(docs))


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("config.allocationPolicy=spreadd",), "at '/config/allocationPolicy': value must be one of"),
        (("extender.nodePolicy=best",), "at '/extender/nodePolicy': value must be one of"),
        (("extender.replicas=0",), "at '/extender/replicas': minimum: got 0, want 1"),
        (("agent.bogus=1",), "at '/agent': additional properties 'bogus' not allowed"),
        (("scheduler.enabled=true", "extender.enabled=false"), "scheduler.enabled: the scheduler configuration names the extender"),
        (("config.named.default.version=v1",), "config.named.default: the name `default`"),
        (("extender.unscoredBinds=allow",), "at '/extender/unscoredBinds': value must be one of"),
        (("namespace.agent=sharepack-system",), 'namespace.agent and namespace.name are both "sharepack-system"'),
        (("namespace.agent=Node",), "at '/namespace/agent': 'Node' does not match pattern"),
        (("extender.schedulerCIDRs={10.0.0.1}",), "at '/extender/schedulerCIDRs/0': '10.0.0.1' does not match pattern"),
        (("extender.tls.secretName=Extender_TLS",), "at '/extender/tls/secretName': 'Extender_TLS' does not match pattern"),
        (("scheduler.tls.caFile=ca.crt",), "at '/scheduler/tls/caFile': 'ca.crt' does not match pattern"),
        (("scheduler.enabled=true", "scheduler.managedResources={nvidia.com/gpu}"),
         "scheduler.managedResources: kube-scheduler rejects a resource two extender entries list"),
    ],
    ids=lambda v: str(v),
)
def test_bad_values_fail_naming_the_value(helm: Path, sets: tuple[str, ...], message: str) -> None:
    args = ["template", "sharepack", str(CHART)]
    for s in sets:
        args += ["--set", s]
    rendered = _helm(helm, *args)
    assert rendered.returncode != 0
    assert message in rendered.stderr


def test_values_schema_enums_are_the_code_enums() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert set(schema["config"]["properties"]["allocationPolicy"]["enum"]) == {str(p) for p in policies.Policy}
    assert set(schema["config"]["properties"]["migStrategy"]["enum"]) == {str(p) for p in policies.MigStrategy}
    assert set(schema["extender"]["properties"]["nodePolicy"]["enum"]) == {str(p) for p in policies.NodePolicy}
    assert set(schema["extender"]["properties"]["unscoredBinds"]["enum"]) == {str(u) for u in UnscoredBinds}


@pytest.mark.skipif(not CHECKOV.exists(), reason="checkov's own environment is not installed (scripts/test makes it)")
def test_checkov_finds_nothing_unjustified_in_any_render(helm: Path, tmp_path: Path) -> None:
    for values in ["", *VALUES_FILES]:
        docs = _render(helm, *([values] if values else []))
        (tmp_path / f"{values or 'defaults'}.yaml").write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [str(CHECKOV), "-d", str(tmp_path), "--framework", "kubernetes", "--compact", "--quiet", "--skip-download"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    summary = re.search(r"Passed checks: (\d+), Failed checks: (\d+), Skipped checks: (\d+)", result.stdout)
    assert summary, result.stdout + result.stderr
    assert int(summary.group(2)) == 0, result.stdout
    assert int(summary.group(1)) > 100  # it really checked the workloads

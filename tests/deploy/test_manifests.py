"""deploy/: every manifest is valid for the target Kubernetes version, strictly, and names the
flags, ports, paths and objects the code actually uses (one source of truth, no drift)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sharepack.agent import monitoring, nvml, nvmlsim
from sharepack.agent import options as agent_options
from sharepack.agent.metrics import AgentMetrics
from sharepack.common import addresses
from sharepack.common import config as agent_config
from sharepack.common import resources
from sharepack.common import state
from tests.conftest import kubectl
from tests.deploy import references

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.0"
# deploy/dra needs resource.k8s.io/v1 DeviceClasses with extendedResourceName (Kubernetes >= 1.36).
DRA_K8S_VERSION = "1.37.0"


def _version_for(path: Path) -> str:
    return DRA_K8S_VERSION if "dra" in path.relative_to(DEPLOY).parts else K8S_VERSION


NOT_API_OBJECTS = {"kustomization.yaml", "kustomizeconfig.yaml", "kube-scheduler-config.yaml"}
HELM = DEPLOY / "helm"  # templates, not manifests: tests/deploy/test_helm_chart.py renders and checks them


def _manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name not in NOT_API_OBJECTS and HELM not in p.parents)


def _documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in _manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def _find(kind: str, name: str) -> dict[str, Any]:
    for path, doc in _documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name and "overlays" not in path.parts:
            return doc
    raise AssertionError(f"no {kind} {name} in deploy/")


def _container(kind: str, name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _find(kind, name)["spec"]["template"]["spec"]["containers"]
    return containers[0]


def _help(module: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "path", _manifest_files(), ids=lambda p: f"{p.relative_to(DEPLOY)} is valid Kubernetes {_version_for(p)}"
)
def test_manifest_is_strictly_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kubernetes_validate.validate(doc, _version_for(path), strict=True)


def test_kustomizations_list_files_that_exist() -> None:
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        for entry in [*doc.get("resources", []), *(p["path"] for p in doc.get("patches", []) if "path" in p)]:
            assert (kustomization.parent / entry).exists(), f"{kustomization}: {entry} missing"
    base = {p.resolve() for p in _manifest_files() if "base" in p.relative_to(DEPLOY).parts}
    assert base == _listed(DEPLOY / "base"), "a base manifest is listed by no kustomization under deploy/base"


def _listed(directory: Path) -> set[Path]:
    """The manifest files a kustomization lists, following its resources and components into
    the kustomizations they name."""
    doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    out: set[Path] = set()
    for entry in [*doc.get("resources", []), *doc.get("components", [])]:
        path = (directory / entry).resolve()
        out |= _listed(path) if path.is_dir() else {path}
    return out


@pytest.mark.parametrize("target", ["base", "overlays/time-slicing", "overlays/mig", "overlays/scheduler-cidrs", "dra"])
def test_kustomize_builds_valid_manifests(target: str) -> None:
    built = subprocess.run([kubectl(), "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert {d["kind"] for d in docs} >= {"DaemonSet", "Deployment", "CustomResourceDefinition", "ConfigMap"}
    for doc in docs:
        kubernetes_validate.validate(doc, _version_for(DEPLOY / target), strict=True)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    agent_config.load_config(file_text=cm["data"]["default"], file_source=f"{target}:default", env={}, flags={})


@pytest.mark.parametrize("flag_source", ["agent", "extender"])
def test_manifest_flags_exist_in_the_cli(flag_source: str) -> None:
    kind, name = ("DaemonSet", "sharepack-agent") if flag_source == "agent" else ("Deployment", "sharepack-extender")
    container = _container(kind, name)
    assert container["command"] == [f"sharepack-{flag_source}"]
    flags = _flags(_help(f"sharepack.{flag_source}"))
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        assert flag in flags, f"{kind} {name} passes {flag}, which the CLI lacks"


def test_the_dra_agent_passes_only_flags_the_cli_has_and_runs_in_dra_mode() -> None:
    built = subprocess.run([kubectl(), "kustomize", str(DEPLOY / "dra")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    (daemonset,) = [d for d in yaml.safe_load_all(built.stdout) if d and d["kind"] == "DaemonSet"]
    args = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--mode=dra" in args
    flags = _flags(_help("sharepack.agent"))
    for arg in args:
        assert arg.split("=", 1)[0] in flags, f"deploy/dra passes {arg}, which the CLI lacks"


def _flags(usage: str) -> set[str]:
    """Every whole `--flag` token of a `--help` text (a prefix of a longer flag is not one)."""
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", usage))


def test_a_flag_is_matched_as_a_whole_token_not_as_a_prefix() -> None:
    flags = _flags(_help("sharepack.agent"))
    assert {"--node-name", "--state-heartbeat-seconds"} <= flags
    assert not {"--node", "--state", "--state-heartbeat"} & flags


def test_every_agent_config_in_a_configmap_is_valid() -> None:
    seen = 0
    for path, doc in _documents():
        if doc["kind"] != "ConfigMap" or doc["metadata"]["name"] != "sharepack-agent-config":
            continue
        for key, text in doc["data"].items():
            cfg = agent_config.load_config(file_text=text, file_source=f"{path}:{key}", env={}, flags={})
            assert cfg is not None
            seen += 1
    assert seen >= 3  # base + both overlays


def test_crd_matches_the_state_schema_constants() -> None:
    crd = _find("CustomResourceDefinition", f"{state.PLURAL}.{state.GROUP}")
    spec = crd["spec"]
    assert (spec["group"], spec["names"]["plural"], spec["names"]["kind"], spec["scope"]) == (
        state.GROUP, state.PLURAL, state.KIND, "Cluster",
    )  # fmt: skip
    assert [v["name"] for v in spec["versions"]] == [state.VERSION]


def test_agent_mounts_the_kubelet_socket_directories_it_is_told_to_use() -> None:
    container = _container("DaemonSet", "sharepack-agent")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if flag in ("--kubelet-socket", "--pod-resources-socket"):
            assert str(Path(value).parent) in mounts, f"{flag}={value} is not under a mounted host path"
        if flag == "--config-file":
            assert str(Path(value).parent) in mounts


def test_agent_probes_use_its_http_endpoint_and_node_name_comes_from_the_pod() -> None:
    container = _container("DaemonSet", "sharepack-agent")
    listen = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--metrics-listen="))
    port = addresses.listen_address(listen, flag="--metrics-listen")[1]
    (named,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == port
    probes = {probe: container[probe]["httpGet"] for probe in ("livenessProbe", "readinessProbe")}
    assert probes == {
        "livenessProbe": {"path": "/healthz", "port": "metrics"},
        "readinessProbe": {"path": "/readyz", "port": "metrics"},
    }
    app = monitoring.MonitoringServer(AgentMetrics(), "127.0.0.1", 0).app()
    served = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert {p["path"] for p in probes.values()} <= served
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert agent_options.parse([], {"NODE_NAME": "node-7"}).node_name == "node-7"


def test_extender_port_probes_service_and_scheduler_config_agree() -> None:
    container = _container("Deployment", "sharepack-extender")
    listen = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--listen="))
    port = int(listen.rsplit(":", 1)[1])
    assert container["ports"][0]["containerPort"] == port
    service = _find("Service", "sharepack-extender")
    assert service["spec"]["ports"][0]["port"] == port
    assert {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]} == {
        "/readyz", "/healthz",
    }  # fmt: skip
    # The probes cannot present a client certificate: they use the plain --metrics-listen port.
    probes = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--metrics-listen="))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert named[container[probe]["httpGet"]["port"]] == int(probes.rsplit(":", 1)[1])
    sched = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    ranking, binder = sched["extenders"]
    for ext in (ranking, binder):
        assert ext["urlPrefix"] == f"https://sharepack-extender.sharepack-system.svc:{port}"
        assert ext["nodeCacheCapable"] is True
    assert sched["percentageOfNodesToScore"] == 100
    assert (ranking["filterVerb"], ranking["prioritizeVerb"], ranking.get("bindVerb")) == ("filter", "prioritize", None)
    assert (binder.get("filterVerb"), binder.get("prioritizeVerb"), binder["bindVerb"]) == (None, None, "bind")


def _reaches_extender() -> Callable[[str], bool]:
    """Which resources' pods kube-scheduler sends to the extender for ranking: those the ranking
    entry's `managedResources` lists, or every pod when it lists none (as shipped)."""
    sched = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    (ranking,) = [e for e in sched["extenders"] if e.get("filterVerb") or e.get("prioritizeVerb")]
    listed = ranking.get("managedResources")
    if not listed:
        return lambda name: True
    return {r["name"] for r in listed}.__contains__


def _bound_by_extender() -> Callable[[str], bool]:
    """Which resources' pods kube-scheduler sends to the extender's /bind: those the one entry
    with a bindVerb lists in `managedResources` (as shipped, a bind-only entry); kube-scheduler
    binds every other pod itself."""
    sched = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    (binder,) = [e for e in sched["extenders"] if e.get("bindVerb")]
    return {r["name"] for r in binder["managedResources"]}.__contains__


def test_scheduler_config_manages_every_resource_the_agents_publish() -> None:
    reaches = _reaches_extender()
    expected = {agent_config.GPU_RESOURCE, agent_config.GPU_RESOURCE + agent_config.SHARED_SUFFIX}
    profiles = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    profiles += ("1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    expected |= {agent_config.MIG_RESOURCE_PREFIX + p for p in profiles}
    assert all(map(reaches, expected)), f"not managed: {sorted(r for r in expected if not reaches(r))}"
    bound = _bound_by_extender()
    assert all(map(bound, expected)), f"not bound by the extender: {sorted(r for r in expected if not bound(r))}"


def test_the_shipped_config_has_one_ranking_entry_for_every_pod_and_one_binder_for_gpu_pods() -> None:
    """kube-scheduler sends /bind to one extender entry only, for the pods it is interested in:
    the bind-only entry lists exactly the GPU resources, so CPU-only pods (which the bind guard
    refuses, `no-gpu-request`) are bound by kube-scheduler; the ranking entry lists none, so
    every pod is ranked. kube-scheduler rejects a resource listed by two entries."""
    sched = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    binders = [e for e in sched["extenders"] if e.get("bindVerb")]
    rankers = [e for e in sched["extenders"] if e.get("filterVerb") or e.get("prioritizeVerb")]
    assert len(sched["extenders"]) == 2 and len(binders) == 1 and len(rankers) == 1
    (binder,), (ranker,) = binders, rankers
    assert binder is not ranker and "managedResources" not in ranker
    gpu = {agent_config.GPU_RESOURCE, agent_config.GPU_RESOURCE + agent_config.SHARED_SUFFIX}
    profiles = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
    profiles += ("1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    gpu |= {agent_config.MIG_RESOURCE_PREFIX + p for p in profiles}
    names = [r["name"] for r in binder["managedResources"]]
    assert len(names) == len(set(names)) and set(names) == gpu
    assert all(r["ignoredByScheduler"] is False for r in binder["managedResources"])
    assert set(binder) == {"urlPrefix", "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                           "ignorable", "managedResources"}  # fmt: skip
    for key in ("urlPrefix", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "ignorable"):
        assert binder[key] == ranker[key], key


@pytest.mark.parametrize("machine", nvmlsim.builtin_names())
def test_every_resource_a_deployed_config_serves_on_a_simulated_machine_is_managed(machine: str) -> None:
    """What the agents actually publish, from the ConfigMaps in deploy/ on each built-in machine,
    not a list kept by hand next to the scheduler config."""
    reaches, bound = _reaches_extender(), _bound_by_extender()
    lib = nvml.load_library(machine)
    try:
        inventory = nvml.read_inventory(lib)
    finally:
        nvml.shutdown(lib)
    for path, doc in _documents():
        if doc["kind"] != "ConfigMap" or doc["metadata"]["name"] != "sharepack-agent-config":
            continue
        for key, text in doc["data"].items():
            where = f"{path.relative_to(DEPLOY)}:{key}"
            cfg = agent_config.load_config(file_text=text, file_source=where, env={}, flags={})
            served = {r.name for r in resources.build_resources(inventory, cfg)}
            unmanaged = sorted(r for r in served if not reaches(r))
            assert not unmanaged, f"{where} on {machine} serves unmanaged {unmanaged}"
            unbound = sorted(r for r in served if not bound(r))
            assert not unbound, f"{where} on {machine} serves {unbound}, which the extender does not bind"


def _accounts(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "ServiceAccount"}


BASE_POLICY_ACCOUNTS = {  # each admission policy's binding: the account its parameter must be
    "sharepack-agent-own-node": "sharepack-agent",
    "sharepack-extender-pod-writes": "sharepack-extender",
    "sharepack-gpu-directions": "sharepack-extender",
}
POLICY_ACCOUNTS = {**BASE_POLICY_ACCOUNTS, "sharepack-agent-own-resourceslices": "sharepack-agent"}  # + deploy/dra


def _policy_parameters(docs: list[dict[str, Any]], prefix: str = "") -> dict[str, tuple[str, str]]:
    """Binding name (without `prefix`) -> the (namespace, name) of the ServiceAccount it passes."""
    out = {}
    for d in docs:
        if d["kind"] == "ValidatingAdmissionPolicyBinding":
            ref = d["spec"]["paramRef"]
            assert d["spec"]["policyName"] == d["metadata"]["name"], d["metadata"]["name"]
            out[d["metadata"]["name"].removeprefix(prefix)] = (ref["namespace"], ref["name"])
    return out


def test_admission_policies_and_rbac_name_the_service_accounts_that_exist() -> None:
    docs = [d for _, d in _documents()]
    accounts = _accounts(docs)
    for doc in docs:
        if doc["kind"] == "ValidatingAdmissionPolicy":  # who is who comes from the parameter only
            assert doc["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}
            assert "system:serviceaccount:sharepack" not in yaml.safe_dump(doc["spec"])
    parameters = _policy_parameters(docs)
    assert {k: v[1] for k, v in parameters.items()} == POLICY_ACCOUNTS
    assert set(parameters.values()) <= accounts
    for doc in docs:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            for subject in doc["subjects"]:
                assert (subject["namespace"], subject["name"]) in accounts


BUILDS = ["base", *(f"overlays/{p.name}" for p in sorted((DEPLOY / "overlays").iterdir()) if p.is_dir()), "dra"]


def _build(directory: Path) -> list[dict[str, Any]]:
    built = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


@pytest.mark.parametrize("target", BUILDS)
def test_every_build_holds_its_references_together(target: str) -> None:
    """Every RBAC subject, admission parameter, workload account, ConfigMap reference and
    selector names an object of the build, and the agent runs in a `privileged` namespace, the
    extender in a `restricted` one (tests/deploy/references.py)."""
    docs = _build(DEPLOY / target)
    assert not list(references.problems(docs))
    assert references.namespace_of(docs, "DaemonSet", "sharepack-agent") != references.namespace_of(
        docs, "Deployment", "sharepack-extender"
    )


def test_the_base_puts_the_agent_and_the_extender_in_the_namespaces_the_docs_name() -> None:
    """Issue 24.13: both ran in one `privileged` namespace, so the extender (or anything else
    deployed beside the agent) could run with host paths and as root."""
    docs = _build(DEPLOY / "base")
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Namespace"}
    assert {name: lbl[references.ENFORCE] for name, lbl in labels.items()} == {
        "sharepack-node": "privileged", "sharepack-system": "restricted",
    }  # fmt: skip
    assert all(lbl["pod-security.kubernetes.io/enforce-version"] == "latest" for lbl in labels.values())
    agent_side = {d["kind"] for d in docs if references.object_namespace(d) == "sharepack-node"}
    assert agent_side == {"ServiceAccount", "ConfigMap", "DaemonSet", "Role", "RoleBinding", "NetworkPolicy"}
    assert references.namespace_of(docs, "Deployment", "sharepack-extender") == "sharepack-system"


@pytest.mark.parametrize("target", ["base", "dra"])
def test_one_namespace_over_the_whole_install_is_refused(tmp_path: Path, target: str) -> None:
    """`namespace:` over everything would put the extender in the agent's privileged namespace
    (or the agent in the restricted one): kustomize refuses, as both Namespace objects would get
    the one name. Renaming goes part by part (deploy/overlays/namespaces)."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(DEPLOY / target, overlay)  # kustomize takes no absolute base
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"namespace": "gpu-system", "resources": [base]}))
    built = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert built.returncode != 0 and "namespace transformation produces ID conflict" in built.stderr, built.stderr


def renaming_overlay(tmp: Path, agent_ns: str, extender_ns: str, prefix: str = "") -> Path:
    """deploy/overlays/namespaces with other names, as an operator copies it: the top
    kustomization verbatim, each part's `namespace:` edited (and `namePrefix`, when given)."""
    overlay = tmp / "renamed"
    shutil.copytree(DEPLOY / "overlays" / "namespaces", overlay)
    top = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    here = DEPLOY / "overlays" / "namespaces"
    top["resources"] = [r if not r.startswith("..") else os.path.relpath((here / r).resolve(), overlay) for r in top["resources"]]
    top["components"] = [os.path.relpath((here / c).resolve(), overlay) for c in top["components"]]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(top))
    for part, namespace in (("agent", agent_ns), ("extender", extender_ns)):
        doc = yaml.safe_load((overlay / part / "kustomization.yaml").read_text())
        doc["namespace"] = namespace
        doc["resources"] = [os.path.relpath(DEPLOY / "base" / part, overlay / part)]
        if prefix:
            doc["namePrefix"] = prefix
        (overlay / part / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return overlay


def test_renaming_each_namespace_moves_every_reference_with_it(tmp_path: Path) -> None:
    """Issue 24.3 and 24.13: each part renamed by its own `namespace:`: the Namespace objects keep their Pod Security levels; RBAC subjects, the admission policies'
    parameters, the agent's Events binding (which stays in `default`), the agent's ConfigMap
    reference and the NetworkPolicies all follow; nothing is left in the old namespaces."""
    docs = _build(renaming_overlay(tmp_path, "ops-node", "ops-system"))
    assert not list(references.problems(docs))
    labels = {d["metadata"]["name"]: d["metadata"]["labels"][references.ENFORCE] for d in docs if d["kind"] == "Namespace"}
    assert labels == {"ops-node": "privileged", "ops-system": "restricted"}
    assert not [d for d in docs if references.object_namespace(d) in ("sharepack-node", "sharepack-system")]
    parameters = _policy_parameters(docs)
    assert parameters == {
        policy: ("ops-node" if account == "sharepack-agent" else "ops-system", account)
        for policy, account in BASE_POLICY_ACCOUNTS.items()
    }
    (events,) = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "sharepack-agent-events"]
    assert events["metadata"]["namespace"] == "default"
    assert events["subjects"] == [{"kind": "ServiceAccount", "name": "sharepack-agent", "namespace": "ops-node"}]
    daemonset = references.workload(docs, "DaemonSet", "sharepack-agent")
    args = references.expanded_args(daemonset["spec"]["template"]["spec"]["containers"][0], "ops-node")
    assert "--node-config-configmap=ops-node/sharepack-agent-config" in args


def test_the_shipped_renaming_overlay_builds_what_it_says() -> None:
    docs = _build(DEPLOY / "overlays" / "namespaces")
    assert references.namespace_of(docs, "DaemonSet", "sharepack-agent") == "gpu-node"
    assert references.namespace_of(docs, "Deployment", "sharepack-extender") == "gpu-system"


CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


@pytest.mark.skipif(not CHECKOV.exists(), reason="checkov's own environment is not installed (scripts/test makes it)")
def test_checkov_finds_nothing_unjustified() -> None:
    result = subprocess.run(
        [str(CHECKOV), "-d", ".", "--framework", "kubernetes", "--compact", "--quiet", "--skip-download",
         "--skip-path", str(HELM.relative_to(DEPLOY))],
        capture_output=True, text=True, timeout=600, cwd=DEPLOY,
    )  # fmt: skip
    # Relative paths: --skip-path is a regex on each file's path, and an absolute one matches it
    # wherever the checkout's own path contains "helm" (then checkov scans nothing and says so in no line).
    summary = re.search(r"Passed checks: (\d+), Failed checks: (\d+), Skipped checks: (\d+)", result.stdout)
    assert summary, result.stdout + result.stderr
    assert int(summary.group(2)) == 0, result.stdout
    # Every skip carries its reason in the annotation itself.
    for _, doc in _documents():
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert re.fullmatch(r"CKV2?_K8S_\d+", check) and len(reason) > 20, value

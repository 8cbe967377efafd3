"""Issue 24.13 on the real kube-apiserver: the agent and the extender in namespaces of their own,
each with the Pod Security level it needs, as deploy/base (and an overlay renaming both) applies
them. The API server's PodSecurity admission is the judge: each workload's pod template, made a
Pod, is created with a server-side dry run (admission runs, nothing is stored).

Before, both ran in one `privileged` namespace: the extender, and anything else deployed there,
could run as root with host paths."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharepack.sandbox.controlplane.identities import find
from sharepack.sandbox.controlplane.plane import ControlPlaneUnavailable, RealControlPlane
from tests.deploy import references
from tests.deploy.test_manifests import renaming_overlay

DEPLOY_BASE = Path(__file__).resolve().parents[2] / "deploy" / "base"
AGENT, EXTENDER = ("DaemonSet", "sharepack-agent"), ("Deployment", "sharepack-extender")


def _pod(workload: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The pod its controller would create from `workload`'s template, in `namespace`. Outside
    its own namespace it runs as that namespace's `default` account (its own does not exist
    there, and the ServiceAccount admission would refuse it before Pod Security looks)."""
    template = workload["spec"]["template"]
    spec = dict(template["spec"])
    if namespace != workload["metadata"]["namespace"]:
        spec["serviceAccountName"] = "default"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"{workload['metadata']['name']}-pss", "namespace": namespace},
        "spec": spec,
    }  # fmt: skip


def _dry_run_create(control: RealControlPlane, pod: Mapping[str, Any]) -> str:
    """'' when the API server admits the pod, else its refusal."""
    try:
        asyncio.run(control.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", stdin=json.dumps(pod).encode()))
    except ControlPlaneUnavailable as e:
        return str(e)
    return ""


def _built(control: RealControlPlane, directory: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(asyncio.run(control.kubectl("kustomize", str(directory)))) if d]


def _labels(control: RealControlPlane, namespace: str) -> dict[str, str]:
    got = json.loads(asyncio.run(control.kubectl("get", "namespace", namespace, "-o", "json")))
    return dict(got["metadata"].get("labels", {}))


def test_the_namespaces_carry_the_documented_pod_security_levels(real_control_plane: RealControlPlane) -> None:
    assert _labels(real_control_plane, "sharepack-node")[references.ENFORCE] == "privileged"
    assert _labels(real_control_plane, "sharepack-system")[references.ENFORCE] == "restricted"


def test_the_extender_is_admitted_where_restricted_is_enforced_and_the_agent_is_not(
    real_control_plane: RealControlPlane,
) -> None:
    control = real_control_plane
    docs = _built(control, DEPLOY_BASE)
    extender, agent = find(docs, *EXTENDER), find(docs, *AGENT)
    assert extender["metadata"]["namespace"] == "sharepack-system"
    assert agent["metadata"]["namespace"] == "sharepack-node"
    assert _dry_run_create(control, _pod(extender, "sharepack-system")) == ""
    # The agent needs what `restricted` forbids: why it has a namespace of its own.
    refusal = _dry_run_create(control, _pod(agent, "sharepack-system"))
    assert 'violates PodSecurity "restricted:latest"' in refusal, refusal
    for why in ('use restricted volume type "hostPath"', "runAsNonRoot != true", "runAsUser=0"):
        assert why in refusal, refusal
    assert _dry_run_create(control, _pod(agent, "sharepack-node")) == ""


@pytest.mark.timeout(180)
def test_renamed_namespaces_keep_their_levels_on_the_api_server(
    real_control_plane: RealControlPlane, tmp_short: Path
) -> None:
    """deploy/overlays/namespaces as an operator copies it (other names): the Namespace objects
    it makes enforce the same levels, and each workload is admitted in its own only."""
    control = real_control_plane
    docs = _built(control, renaming_overlay(tmp_short, "pss-node", "pss-system"))
    assert not list(references.problems(docs))
    made = [d for d in docs if d["kind"] in ("Namespace", "ServiceAccount")]
    asyncio.run(control.kubectl("apply", "--server-side", "--field-manager=namespaces-test", "-f", "-",
                                stdin=yaml.safe_dump_all(made).encode()))  # fmt: skip
    try:
        for namespace in ("pss-node", "pss-system"):
            asyncio.run(control.ensure_namespace(namespace))
        agent = references.workload(docs, *AGENT)
        extender = references.workload(docs, *EXTENDER)
        assert _labels(control, "pss-node")[references.ENFORCE] == "privileged"
        assert _labels(control, "pss-system")[references.ENFORCE] == "restricted"
        assert _dry_run_create(control, _pod(agent, "pss-node")) == ""
        assert _dry_run_create(control, _pod(extender, "pss-system")) == ""
        assert 'violates PodSecurity "restricted:latest"' in _dry_run_create(control, _pod(agent, "pss-system"))
    finally:
        asyncio.run(control.kubectl("delete", "namespace", "pss-node", "pss-system", "--ignore-not-found", "--wait=false"))

"""deploy/components/dra-extender: the extender's DRA mode as an overlay gets it (the flag the CLI
knows, read-only access to ResourceSlices and ResourceClaims), valid for the target version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import yaml

from sharepack.extender import __main__ as extender_main
from tests.conftest import kubectl
from tests.deploy.test_manifests import DEPLOY, K8S_VERSION


def dra_overlay(tmp: Path) -> Path:
    """deploy/base with the DRA extender component, as a user's overlay lists it. Kustomize
    accepts only paths inside the build root, so the overlay is built in a copy under `tmp`."""
    root = tmp / "deploy"
    shutil.copytree(DEPLOY / "base", root / "base")
    shutil.copytree(DEPLOY / "components", root / "components")
    overlay = root / "overlays" / "dra"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../../base]\ncomponents: [../../components/dra-extender]\n"
    )
    return overlay


def test_an_overlay_with_the_dra_extender_component_builds_and_grants_read_only_dra_access(tmp_path: Path) -> None:
    overlay = dra_overlay(tmp_path)
    built = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sharepack-extender"]
    dra = [r for r in role["rules"] if r["apiGroups"] == ["resource.k8s.io"]]
    assert dra == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "resourceclaims"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sharepack-extender"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--mode={extender_main.MODE_DRA}" in args
    opts = extender_main.parse_args(
        [a for a in args if not a.startswith(("--tls", "--client-ca"))] + ["--insecure-http"]
    )
    assert opts.mode == extender_main.MODE_DRA and not opts.directed_gpus and opts.state_max_age_s == 0

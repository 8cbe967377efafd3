"""The Helm chart's renders as the real kube-apiserver takes them: a server-side dry-run apply of
every values file the chart ships (defaults, the overlays' equivalents, a second scheduler's),
on the cluster deploy/base was applied to. Schema, defaulting and admission are the server's own;
tests/deploy/test_helm_chart.py checks the renders offline."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from sharepack.sandbox.controlplane.plane import RealControlPlane
from tests.deploy.test_helm_chart import cached_helm  # a skip, or a failure under SHAREPACK_REQUIRE_REAL

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sharepack"


@pytest.mark.parametrize("values", ["", *sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))],
                         ids=lambda v: f"{v or 'defaults'} applies on the real API server")  # fmt: skip
def test_each_render_is_accepted_by_the_real_api_server(real_control_plane: RealControlPlane, values: str) -> None:
    args = [str(cached_helm()), "template", "sharepack", str(CHART), "--include-crds", "--namespace", "sharepack-system"]
    if values:
        args += ["--values", str(CHART / "ci" / values)]
    rendered = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert rendered.returncode == 0, rendered.stderr
    # A dry run creates no Namespace, and the render's other objects live in its namespaces:
    # those are created for real first (the test must not depend on another test having made them).
    namespaces = [d for d in yaml.safe_load_all(rendered.stdout) if d and d.get("kind") == "Namespace"]
    if namespaces:
        made = subprocess.run(
            [str(real_control_plane.binaries.path("kubectl")), f"--kubeconfig={real_control_plane.kubeconfig}",
             "apply", "--server-side", "--force-conflicts", "--field-manager=helm-chart-test", "-f", "-"],
            input=yaml.safe_dump_all(namespaces), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    applied = subprocess.run(
        [str(real_control_plane.binaries.path("kubectl")), f"--kubeconfig={real_control_plane.kubeconfig}",
         "apply", "--server-side", "--dry-run=server", "--force-conflicts", "--field-manager=helm-chart-test",
         "-f", "-"],
        input=rendered.stdout, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    # One line per object, each accepted by the server (not only parsed by kubectl).
    objects = [line for line in applied.stdout.splitlines() if line.strip()]
    assert objects and all(line.endswith("(server dry run)") for line in objects), applied.stdout
    assert any(line.startswith("daemonset.apps/sharepack-agent ") for line in objects)

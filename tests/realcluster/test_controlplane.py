"""The launcher of the real control plane: pinned versions, readiness, and no orphans."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sharepack.sandbox.controlplane import kubebuild
from sharepack.sandbox.controlplane.plane import RealControlPlane
from tests.conftest import REQUIRE_REAL, real_binaries

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_is_keyed_by_the_module_files(tmp_path: Path) -> None:
    """Another go.sum is another cache entry; the same files are the same entry."""
    module = tmp_path / "kube"
    (module / "etcd").mkdir(parents=True)
    for name in kubebuild.MODULE_FILES:
        (module / name).write_bytes((kubebuild.MODULE_DIR / name).read_bytes())
    assert kubebuild.module_hash(module) == kubebuild.module_hash()
    (module / "go.sum").write_bytes((module / "go.sum").read_bytes() + b"example.com/x v1.0.0 h1:x=\n")
    assert kubebuild.module_hash(module) != kubebuild.module_hash()


def test_the_version_is_set_at_link_time_in_both_places_kubectl_reads() -> None:
    flags = kubebuild.ldflags("v1.37.2")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.37.2" in flags
        assert f"-X {package}.gitMinor=37" in flags


def test_kubectl_version_reports_the_pinned_release(real_control_plane: RealControlPlane) -> None:
    kubectl = real_control_plane.binaries.path("kubectl")
    out = subprocess.run(
        [str(kubectl), f"--kubeconfig={real_control_plane.kubeconfig}", "version", "-o", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    versions = json.loads(out.stdout)
    pinned = kubebuild.kubernetes_version()
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["gitVersion"] == pinned


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody reaped yet (a container's init may not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from sharepack.sandbox.controlplane import kubebuild
    from sharepack.sandbox.controlplane.plane import RealControlPlane

    async def main():
        control = RealControlPlane(Path(sys.argv[1]), binaries=kubebuild.cached())
        await control.start()
        await control.start_scheduler("http://127.0.0.1:1")
        print(control.etcd.proc.pid, control.apiserver.proc.pid, control.scheduler.proc.pid, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.mark.timeout(240)
def test_killing_the_owner_leaves_no_orphan(tmp_path: Path) -> None:
    real_binaries()
    with subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as owner:
        try:
            assert owner.stdout is not None and owner.stderr is not None
            line = owner.stdout.readline()
            assert line, f"the owner exited before starting the control plane: {owner.stderr.read()}"
            pids = [int(p) for p in line.split()]
            assert all(_alive(p) for p in pids), "the control plane is not running while its owner is"
            os.kill(owner.pid, signal.SIGKILL)  # no cleanup runs: only the kernel can stop them now
            owner.wait(10)
            deadline = time.monotonic() + 30
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert [p for p in pids if _alive(p)] == [], "etcd, kube-apiserver or kube-scheduler outlived its owner"
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait()


def _module_copy(tmp_path: Path) -> Path:
    module = tmp_path / "kube"
    (module / "etcd").mkdir(parents=True)
    for name in kubebuild.MODULE_FILES:
        (module / name).write_bytes((kubebuild.MODULE_DIR / name).read_bytes())
    return module


def test_without_go_the_build_is_one_line_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kubebuild.CACHE_ENV, str(tmp_path / "cache"))  # nothing cached there
    monkeypatch.setenv("PATH", str(tmp_path))  # no go
    with pytest.raises(kubebuild.ControlPlaneUnavailable) as info:
        kubebuild.build(_module_copy(tmp_path), progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "needs Go >= 1.26 on PATH" in message


def test_a_failed_build_is_one_line_with_go_s_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("go") is None:  # the build needs Go: where the real control plane is required, so does this
        if os.environ.get(REQUIRE_REAL):
            pytest.fail("needs Go on PATH to fail a build")
        pytest.skip("needs Go to fail a build")
    monkeypatch.setenv(kubebuild.CACHE_ENV, str(tmp_path / "cache"))
    module = _module_copy(tmp_path)
    (module / "etcd" / "main.go").write_text("package main\n\nfunc main() { undefinedCall() }\n")
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.37.2\n")
    (module / "go.sum").write_text("")
    with pytest.raises(kubebuild.ControlPlaneUnavailable) as info:
        kubebuild.build(module, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("building the real control plane failed (go build exited 1")
    assert "python -m sharepack.sandbox.controlplane.kubebuild" in message
    assert list((tmp_path / "cache" / "kube").glob(".building-*")) == []  # no half-built entry left

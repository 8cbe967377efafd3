#!/usr/bin/env python3
"""Builds helm from the Go module next to this file, once, and prints the binary's path.

The binary is cached under ~/.cache/sharepack/helm/<sha256 of go.mod + go.sum>/helm ($SHAREPACK_CACHE
instead of ~/.cache/sharepack, as for the control plane sharepack/sandbox/controlplane/kubebuild.py builds), so a new pin
builds a new binary and an unchanged one is reused by every test run and every worktree. Failure
(no Go, a failed build) is one line on stderr and exit status 1.

Usage: python3 deploy/helm/tool/build.py        -> prints /root/.cache/sharepack/helm/<key>/helm
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent
HELM_MAIN = "helm.sh/helm/v3/cmd/helm"


class BuildError(Exception):
    pass


def cache_dir() -> Path:
    base = Path(os.environ.get("SHAREPACK_CACHE") or Path.home() / ".cache" / "sharepack")
    key = hashlib.sha256((MODULE_DIR / "go.mod").read_bytes() + (MODULE_DIR / "go.sum").read_bytes()).hexdigest()
    return base / "helm" / key


def _go(go: str, *args: str) -> str:
    result = subprocess.run([go, *args], cwd=MODULE_DIR, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"helm: go {' '.join(args[:2])} failed in {MODULE_DIR}: {last}")
    return result.stdout.strip()


def _ldflags(go: str) -> str:
    """The version variables helm's own Makefile sets. Without them `helm version` says v3 and
    `helm template`/`helm lint` assume Kubernetes 1.20 (Capabilities.KubeVersion)."""
    helm_version, client_go = _go(go, "list", "-m", "-f", "{{.Version}}", "helm.sh/helm/v3", "k8s.io/client-go").split()
    # client-go v0.37.x is Kubernetes 1.37.
    _, minor, _ = client_go.removeprefix("v").split(".", 2)
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={helm_version}"]
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {package}.k8sVersionMajor=1", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def build() -> Path:
    target = cache_dir() / "helm"
    if os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("helm: go is not on PATH; install Go >= 1.24 to build helm from deploy/helm/tool")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent or interrupted build never leaves a
    # half-written binary where the next run would trust it.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix="helm.partial.")
    os.close(fd)
    log = target.parent / "build.log"
    # -mod=readonly: go.sum is committed, a build must never rewrite it.
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": (os.environ.get("GOFLAGS", "") + " -mod=readonly").strip()}
    # nice: helm is a large build and the machines it runs on are usually busy with other work.
    cmd = ["nice", "-n", "19", go, "build", "-trimpath", "-ldflags", _ldflags(go), "-o", partial, HELM_MAIN]
    result = subprocess.run(cmd, cwd=MODULE_DIR, env=env, capture_output=True, text=True, check=False)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        Path(partial).unlink(missing_ok=True)
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"helm: go build {HELM_MAIN} failed (exit {result.returncode}): {last}; full log {log}")
    os.replace(partial, target)
    return target


def main() -> int:
    try:
        print(build())
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Building the real control plane's binaries from the Go module in sharepack/sandbox/kube.

kube-apiserver, kube-scheduler and kubectl come from the released `k8s.io/kubernetes` module and
etcd from `go.etcd.io/etcd/server/v3`, at the versions sharepack/sandbox/controlplane/kube/go.mod pins. They are built
once into a cache directory named after a hash of the module's files, so a second build of the
same pins costs nothing and a change of pins builds anew beside the old one. A cold build takes
about 15-25 minutes on two cores (mostly kube-apiserver); Go's own build cache makes a rebuild
after a pin change much faster.

Every failure is one `ControlPlaneUnavailable` line that says what failed and what to do.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MODULE_DIR = Path(__file__).parent / "kube"
MODULE_FILES = ("go.mod", "go.sum", "etcd/main.go")
BINARIES = ("kube-apiserver", "kube-scheduler", "kubectl", "etcd")
# Packages of the module that `go build` turns into BINARIES: the go.mod `tool` directives
# (kube-apiserver, kube-scheduler, kubectl from k8s.io/kubernetes, no main of ours) and etcd.
BUILD_TARGETS = ("tool", "./etcd")
# Where kubectl, the servers and `kubectl version` read their version from: the Kubernetes
# release scripts set these at link time, and an unset one reports v0.0.0-master.
VERSION_PACKAGES = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
BUILD_DATE = "2026-01-01T00:00:00Z"  # fixed: reproducible builds, the date is not part of the pins
CACHE_ENV = "SHAREPACK_CACHE"


class ControlPlaneUnavailable(RuntimeError):
    """The real control plane cannot run here: no Go, a failed build, a binary that will not start."""


@dataclass(frozen=True, slots=True)
class Binaries:
    directory: Path
    kubernetes_version: str  # e.g. "v1.37.2"
    etcd_version: str

    def path(self, name: str) -> Path:
        return self.directory / name


def _pinned(module: str, gomod: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.MULTILINE)
    if match is None:
        raise ControlPlaneUnavailable(f"{MODULE_DIR / 'go.mod'} does not require {module}")
    return match.group(1)


def kubernetes_version(module_dir: Path = MODULE_DIR) -> str:
    return _pinned("k8s.io/kubernetes", (module_dir / "go.mod").read_text())


def module_hash(module_dir: Path = MODULE_DIR) -> str:
    digest = hashlib.sha256()
    for name in MODULE_FILES:
        digest.update(name.encode() + b"\0" + (module_dir / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "sharepack"


def ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in VERSION_PACKAGES:
        for key, value in (
            ("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
            ("gitTreeState", "clean"), ("buildDate", BUILD_DATE),
        ):  # fmt: skip
            flags.append(f"-X {package}.{key}={value}")
    return " ".join(flags)


def cached(module_dir: Path = MODULE_DIR) -> Binaries | None:
    """The binaries for these pins when they were built before, else None (no Go needed)."""
    gomod = (module_dir / "go.mod").read_text()
    directory = cache_root() / "kube" / module_hash(module_dir)
    if not all((directory / name).is_file() for name in BINARIES):
        return None
    return Binaries(directory, _pinned("k8s.io/kubernetes", gomod), _pinned("go.etcd.io/etcd/server/v3", gomod))


def build(module_dir: Path = MODULE_DIR, *, progress: bool = True) -> Binaries:
    """The binaries, built now if these pins were never built. Safe to call from several
    processes at once: the first builds, the others wait for it."""
    found = cached(module_dir)
    if found is not None:
        return found
    go = shutil.which("go")
    if go is None:
        raise ControlPlaneUnavailable(
            "the real control plane needs Go >= 1.26 on PATH to build kube-apiserver, kube-scheduler "
            "and etcd (https://go.dev/dl); without it use the in-process API server"
        )
    root = cache_root() / "kube"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same pins
        found = cached(module_dir)
        if found is not None:
            return found
        _build(go, module_dir, root / module_hash(module_dir), progress=progress)
    built = cached(module_dir)
    assert built is not None
    return built


def _build(go: str, module_dir: Path, target: Path, *, progress: bool) -> None:
    version = kubernetes_version(module_dir)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    cmd = [go, "build", "-trimpath", "-ldflags", ldflags(version), "-o", str(staging) + "/", *BUILD_TARGETS]
    if progress:
        print(
            f"building the real control plane (kubernetes {version}, etcd) into {target}: "
            "about 15-25 minutes the first time on two cores, then cached",
            flush=True,
        )
    started = time.monotonic()
    # -mod=readonly: go.sum is committed, a build must never rewrite it.
    env = {**os.environ, "GOFLAGS": (os.environ.get("GOFLAGS", "") + " -mod=readonly").strip()}
    try:
        done = subprocess.run(cmd, cwd=module_dir, env=env, capture_output=True, text=True, check=False)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise ControlPlaneUnavailable(f"could not run {go}: {e}") from e
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ControlPlaneUnavailable(
            f"building the real control plane failed (go build exited {done.returncode} in {module_dir}): "
            f"{tail} -- check Go >= 1.26 and access to the Go module proxy, then run "
            "`python -m sharepack.sandbox.controlplane.kubebuild` to retry"
        )
    staging.rename(target)
    seconds = time.monotonic() - started
    (target / "BUILD_SECONDS").write_text(f"{seconds:.0f}\n")
    if progress:
        print(f"built the real control plane in {seconds:.0f} s", flush=True)


def main() -> int:
    """`python -m sharepack.sandbox.controlplane.kubebuild`: build (or find) the binaries and print where they are."""
    logging.basicConfig(level=logging.INFO)
    try:
        binaries = build()
    except ControlPlaneUnavailable as e:
        print(f"sandbox.kubebuild: {e}")
        return 1
    print(binaries.directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

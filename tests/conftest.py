"""Test hygiene for the whole suite: warnings are errors (pyproject), every test has a time
budget (pytest-timeout), and an asyncio test that leaves a task running fails."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sharepack.sandbox.apiwatch import ApiSession
    from sharepack.sandbox.controlplane import kubebuild
    from sharepack.sandbox.controlplane.plane import RealControlPlane

TESTS = Path(__file__).resolve().parent
LEFTOVER_GRACE_S = 2.0


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a sync test: nothing to check
        yield
        return
    before = asyncio.all_tasks(loop)
    yield
    # Give cancelled tasks one turn to finish unwinding before judging.
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks(loop) - before if t is not current and not t.done()]
    if leftover:
        # Tasks still unwinding (a gRPC call cancelled at teardown finishes when its completion
        # thread answers) get a short grace, which a loaded machine needs; a leak stays a leak.
        await asyncio.wait(leftover, timeout=LEFTOVER_GRACE_S)
        leftover = [t for t in leftover if not t.done()]
    if leftover:
        for task in leftover:
            task.cancel()
        pytest.fail(f"test left asyncio tasks running: {[t.get_name() for t in leftover]}")


@pytest.fixture
def tmp_short() -> Iterator[Path]:
    """A temp dir under /tmp: unix socket paths must stay under ~100 characters, which pytest's
    own tmp_path (deep under /tmp/pytest-of-...) can exceed."""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        yield Path(d)


# --- the real control plane -----------------------------------------------------------------

REQUIRE_REAL = "SHAREPACK_REQUIRE_REAL"  # set by .ci/run: a missing control plane fails, never skips


@pytest.fixture
async def sandbox_api(tmp_path: Path) -> AsyncIterator["ApiSession"]:
    """The sandbox's own API session (`sandbox.apiwatch.ApiSession`) on a fresh in-process API server."""
    from sharepack.sandbox.apiserver.server import FakeApiServer
    from sharepack.sandbox.apiwatch import ApiSession
    from sharepack.sandbox.controlplane import plane as controlplane

    async with FakeApiServer() as server:
        client = controlplane.api_client(server.write_kubeconfig(tmp_path / "kubeconfig"))
        session = ApiSession.of(client)
        try:
            yield session
        finally:
            await session.close()
            client.close()


def real_binaries() -> "kubebuild.Binaries":
    """The built control plane, or a skip (a failure where REQUIRE_REAL is set) that says why.
    Tests never build: scripts/test builds before pytest runs, outside any test's time budget."""
    from sharepack.sandbox.controlplane import kubebuild

    found = kubebuild.cached()
    if found is not None:
        return found
    why = (
        "the real control plane is not built: run `python -m sharepack.sandbox.controlplane.kubebuild` (needs Go >= 1.26; "
        "scripts/test does it when Go is present)"
    )
    if os.environ.get(REQUIRE_REAL):
        pytest.fail(why)
    pytest.skip(why)


def kubectls() -> list[str]:
    """Every kubectl here: the one the real control plane's build made, and the one on PATH."""
    from sharepack.sandbox.controlplane import kubebuild

    built = kubebuild.cached()
    found = [str(built.path("kubectl")) if built is not None else None, shutil.which("kubectl")]
    return list(dict.fromkeys(k for k in found if k and os.access(k, os.X_OK)))


def kubectl() -> str:
    """A kubectl (the built one first), or a skip (a failure where REQUIRE_REAL is set: the
    build makes one) that says why."""
    found = kubectls()
    if found:
        return found[0]
    why = "no kubectl: the real control plane is not built (`python -m sharepack.sandbox.controlplane.kubebuild`) and none is on PATH"
    if os.environ.get(REQUIRE_REAL):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def real_control_plane() -> Iterator["RealControlPlane"]:
    """One kube-apiserver + etcd for the session, with deploy/base applied. Tests that share it
    name their objects so they cannot collide."""
    from sharepack.sandbox.controlplane.plane import BackgroundControlPlane

    # Pod watches straight from etcd (no watch cache for pods), so that a compaction makes a
    # version too old, as the protocol tests' 410 case needs; everything else as a cluster runs.
    background = BackgroundControlPlane(binaries=real_binaries(), apiserver_args=["--watch-cache-sizes=pods#0"])
    control = background.start()
    try:
        background.run(control.apply_deploy_base())
        yield control
    finally:
        background.close()

"""The production image (Dockerfile) holds the agent and the extender only, pinned (issue 24,
item 12): the base image by digest, every dependency by version and hash from
deploy/image/requirements.txt (pyproject.toml's pins), installed with --require-hashes --no-deps,
and only the packages the two processes import. No container engine runs here:
deploy/image/check.sh replays the Dockerfile's install steps in fresh virtual environments
(`SHAREPACK_CHECK_IMAGE=1` runs it as a test; it needs PyPI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE = ROOT / "deploy" / "image"
LOCKS = (IMAGE / "requirements.txt", IMAGE / "build-requirements.txt")
OURS = {"common", "agent", "extender", "proto", "sandbox", "tracesim", "cli", "kube"}  # under sharepack/
NOT_IN_THE_IMAGE = {"numpy", "matplotlib", "kubernetes-validate", "cryptography"}

PROBE = """
import importlib, json, pkgutil, sys
from importlib import metadata
for package in ("sharepack.agent", "sharepack.extender"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
owners = metadata.packages_distributions()
tops = {name.split(".")[0] for name in sys.modules}
ours = {name.split(".")[1] for name in sys.modules if name.startswith("sharepack.")}
print(json.dumps({"modules": sorted(tops), "ours": sorted(ours),
                  "distributions": sorted({d for t in tops for d in owners.get(t, ())})}))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            out[canonical(name)] = version.split()[0].rstrip("\\").strip() if version else ""
    return out


def locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile --generate-hashes file. That the lock is
    complete (every module of the two processes imports from it alone) needs PyPI: check.sh."""
    text = path.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, sep, version = requirement.partition("==")
        assert sep, f"{path.name}: {requirement} is not pinned with =="
        out[canonical(name)] = (version, [o for o in options if o.startswith("--hash=sha256:")])
    return out


def probe() -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


def test_every_base_image_is_pinned_by_digest() -> None:
    froms = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM ")]
    assert len(froms) == 2
    for image in froms:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"not pinned by digest: {image}"
    assert len(set(froms)) == 1  # the build and the runtime stage share one base


def test_the_image_copies_exactly_the_packages_the_agent_and_the_extender_import() -> None:
    copied = {line.split()[1].removeprefix("sharepack/") for line in DOCKERFILE.read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line}  # fmt: skip
    imported = OURS & set(probe()["ours"])
    assert copied & OURS == imported == {"common", "agent", "extender", "kube", "proto"}


def test_every_locked_requirement_has_a_hash_and_a_version() -> None:
    for path in LOCKS:
        entries = locked(path)
        assert entries, path
        for name, (version, hashes) in entries.items():
            assert re.fullmatch(r"[0-9][\w.+!-]*", version), f"{path.name}: {name}=={version}"
            assert hashes, f"{path.name}: {name} has no hash"
            assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), name


def test_the_lock_pins_what_pyproject_pins_and_nothing_the_image_must_not_hold() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = pins(project["dependencies"])
    runtime = pins((IMAGE / "requirements.in").read_text().splitlines())
    lock = locked(IMAGE / "requirements.txt")
    for name, version in runtime.items():
        assert base.get(name) == version, f"requirements.in pins {name}=={version}; pyproject.toml: {base.get(name)}"
        assert lock[name][0] == version, f"requirements.txt has {name}=={lock[name][0]}, requirements.in {version}"
    assert set(base) == set(runtime), "the image's lock and pyproject's base set differ"
    assert not NOT_IN_THE_IMAGE & set(lock)
    build = pins((IMAGE / "build-requirements.in").read_text().splitlines())
    assert set(build) == {"setuptools"} and locked(IMAGE / "build-requirements.txt")["setuptools"][0] == build["setuptools"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requires == ["setuptools>=68"] and int(build["setuptools"].split(".")[0]) >= 68


def test_the_dockerfile_installs_the_locks_with_hashes_and_nothing_else_from_an_index() -> None:
    text = DOCKERFILE.read_text()
    runs = [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line.startswith("RUN ")]
    assert runs == [
        "RUN pip install --require-hashes --no-deps -r /locks/build-requirements.txt",
        "RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .",
        "RUN pip install --require-hashes --no-deps -r /locks/requirements.txt && "
        "pip install --no-deps /wheels/*.whl && rm -rf /wheels /locks",
    ]
    for lock in LOCKS:
        assert f"deploy/image/{lock.name}" in text
    assert "deploy/image/lock.sh" in (IMAGE / "requirements.txt").read_text()  # the command that regenerates it


@pytest.mark.skipif(not os.environ.get("SHAREPACK_CHECK_IMAGE"), reason="needs PyPI: set SHAREPACK_CHECK_IMAGE=1")
@pytest.mark.timeout(900)
def test_the_dockerfiles_steps_install_and_run_in_fresh_environments() -> None:
    done = subprocess.run([str(IMAGE / "check.sh"), sys.executable], capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: sharepack-agent --help and sharepack-extender --help" in done.stdout

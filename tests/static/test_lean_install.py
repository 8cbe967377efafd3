"""A plain install carries what the agent and the extender import, and nothing more: numpy and
matplotlib come with the `sim` extra, cryptography and kubernetes-validate with the `sandbox` extra,
and the scripts that need them say so. The wheel claims one import name, `sharepack`."""

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
SIM_ONLY = ("numpy", "matplotlib")
SANDBOX_ONLY = ("cryptography", "kubernetes-validate")
PRODUCTION = ("sharepack.agent", "sharepack.extender", "sharepack.cli", "sharepack.kube", "sharepack.common")

# In a fresh interpreter: import every module of the packages named on the command line, then
# report which distributions the imported top-level modules come from.
PROBE = """
import importlib, json, os, pkgutil, sys
from importlib import metadata
for blocked in filter(None, os.environ.get("BLOCK", "").split(",")):
    sys.modules[blocked] = None  # an extra's module, absent as in a plain install
for package in sys.argv[1:]:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
owners = metadata.packages_distributions()
tops = {name.split(".")[0] for name in sys.modules}
print(json.dumps({
    "modules": sorted(tops),
    "distributions": sorted({d for top in tops for d in owners.get(top, ())}),
}))
"""


def _canonical(requirement: str) -> str:
    name = re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict[str, object]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert isinstance(project, dict)
    return project


def _probe(*packages: str, block: tuple[str, ...] = ()) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *packages], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
        env={**os.environ, "BLOCK": ",".join(block)},
    )
    probe = json.loads(done.stdout)
    assert isinstance(probe, dict)
    return probe


def test_the_production_processes_import_every_base_dependency_and_no_extra() -> None:
    # Every extra's modules blocked: the production processes import without them (kubernetes'
    # dynamic client would pick up kubernetes-validate if it were there).
    probe = _probe(*PRODUCTION, block=(*SIM_ONLY, "cryptography", "kubernetes_validate"))
    imported = {_canonical(d) for d in probe["distributions"]}
    base = {_canonical(r) for r in _project()["dependencies"]}  # type: ignore[union-attr]
    assert base - imported == set(), "base dependencies the agent and the extender never import"


def test_the_sandbox_extra_is_what_the_sandbox_adds() -> None:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    assert {_canonical(r) for r in extras["sandbox"]} == set(SANDBOX_ONLY)
    assert not {_canonical(r) for r in _project()["dependencies"]} & set(SANDBOX_ONLY)  # type: ignore[union-attr]
    probe = _probe("sharepack.sandbox")
    assert not set(SIM_ONLY) & set(probe["modules"])
    assert "cryptography" in {_canonical(d) for d in probe["distributions"]}


def test_numpy_and_matplotlib_come_with_the_sim_extra_which_the_tests_pull_in() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    assert not {_canonical(r) for r in project["dependencies"]} & set(SIM_ONLY)  # type: ignore[union-attr]
    assert {_canonical(r) for r in extras["sim"]} == set(SIM_ONLY)
    assert "sharepack[sim,sandbox]" in extras["test"]


@pytest.mark.parametrize(
    ("blocked", "entry", "stderr"),
    [
        pytest.param(
            ("numpy", "matplotlib"), "from sharepack.tracesim.__main__ import main; sys.exit(main(['--quiet']))",
            "sharepack-simulate: needs numpy, matplotlib, which a plain install leaves out: pip install 'sharepack[sim]'\n",
            id="the simulator without its extra says what to install",
        ),
        pytest.param(
            ("cryptography", "kubernetes_validate"), "from sharepack.sandbox.entrypoints import demo; sys.exit(demo())",
            "sharepack-demo: needs cryptography, kubernetes_validate, which a plain install leaves out: "
            "pip install 'sharepack[sandbox]'\n",
            id="the demo without its extra says what to install",
        ),
    ],
)
def test_a_script_without_its_extra_says_what_to_install(blocked: tuple[str, ...], entry: str, stderr: str) -> None:
    run = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in blocked) + entry
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode, done.stderr) == (2, stderr)


def test_the_wheel_installs_one_import_name_into_a_fresh_environment(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = wheels.glob("sharepack-*.whl")
    env = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = subprocess.run(
        [env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    before = set(os.listdir(site))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )
    added = set(os.listdir(site)) - before
    assert added == {"sharepack", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, added
    scripts = {p.name for p in (env / "bin").iterdir()}
    assert {"sharepack-agent", "sharepack-extender", "sharepack-demo", "kubectl-sharepack"} <= scripts
    # The Go module the sandbox builds the real control plane from travels with the package.
    assert (Path(site) / "sharepack" / "sandbox" / "controlplane" / "kube" / "go.mod").is_file()

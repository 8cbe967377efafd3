"""A plain install carries what the agent and the extender import, and nothing for the simulator:
numpy and matplotlib come with the `sim` extra only, and `sharepack-simulate` says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM_ONLY = ("numpy", "matplotlib")
# Base dependencies only `sharepack-demo` imports (the real control plane's certificates): a
# plain install still runs the demo. Moving them to an extra would make the agent's image leaner.
DEMO_ONLY = {"cryptography"}

# In a fresh interpreter: import every module of the packages named on the command line, then
# report which distributions the imported top-level modules come from.
PROBE = """
import importlib, json, pkgutil, sys
from importlib import metadata
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


def _probe(*packages: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *packages], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    probe = json.loads(done.stdout)
    assert isinstance(probe, dict)
    return probe


def test_the_agent_and_extender_import_no_simulator_module_and_every_base_dependency() -> None:
    probe = _probe("agent", "extender")
    assert not set(SIM_ONLY) & set(probe["modules"]), probe["modules"]
    imported = {_canonical(d) for d in probe["distributions"]}
    base = {_canonical(r) for r in _project()["dependencies"]}  # type: ignore[union-attr]
    assert base - imported == DEMO_ONLY, "base dependencies the agent and the extender never import"


def test_the_demo_runs_on_a_plain_install_too() -> None:
    probe = _probe("sandbox")
    assert not set(SIM_ONLY) & set(probe["modules"])
    assert DEMO_ONLY <= {_canonical(d) for d in probe["distributions"]}


def test_numpy_and_matplotlib_come_with_the_sim_extra_which_the_tests_pull_in() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    assert not {_canonical(r) for r in project["dependencies"]} & set(SIM_ONLY)  # type: ignore[union-attr]
    assert {_canonical(r) for r in extras["sim"]} == set(SIM_ONLY)
    assert "sharepack[sim]" in extras["test"]


def test_the_simulator_without_its_extra_says_what_to_install() -> None:
    blocked = "import sys; sys.modules['numpy'] = None; sys.modules['matplotlib'] = None\n"
    run = blocked + "from tracesim.__main__ import main; sys.exit(main(['--quiet']))"
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (
        "sharepack-simulate: the simulator needs numpy, matplotlib, which a plain install leaves out: "
        "pip install 'sharepack[sim]'\n"
    )

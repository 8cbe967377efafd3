"""What an optional part of sharepack needs beyond the base install (the agent and the extender).

The simulator (`sim`) and the sandbox (`sandbox`) pull in packages the two production processes
never import, so a plain install and the image leave them out. Their console scripts check here
before importing anything that needs them, and say what to install instead of failing with a
traceback.
"""

from __future__ import annotations

import importlib.util

# extra -> the modules it brings (import names, not distribution names)
MODULES: dict[str, tuple[str, ...]] = {
    "sim": ("numpy", "matplotlib"),
    "sandbox": ("cryptography", "kubernetes_validate"),
}


def missing(extra: str) -> list[str]:
    absent = []
    for name in MODULES[extra]:
        try:
            if importlib.util.find_spec(name) is None:
                absent.append(name)
        except (ImportError, ValueError):  # blocked in sys.modules, or a broken install
            absent.append(name)
    return absent


def problem(program: str, extra: str) -> str | None:
    """The line to print when `program` cannot run for lack of `extra`, else None."""
    absent = missing(extra)
    if not absent:
        return None
    return (
        f"{program}: needs {', '.join(absent)}, which a plain install leaves out: "
        f"pip install 'sharepack[{extra}]'"
    )

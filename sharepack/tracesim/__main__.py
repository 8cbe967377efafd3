"""`sharepack-simulate`: the entry point, importable without the simulator's extra.

numpy and matplotlib come with `pip install 'sharepack[sim]'` only (the agent and the extender
need neither), so this module checks for them before importing the simulator (tracesim.cli)
and says what to install instead of failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

SIM_EXTRA = "sharepack[sim]"
SIM_MODULES = ("numpy", "matplotlib")


def missing_sim_modules() -> list[str]:
    missing = []
    for name in SIM_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):  # blocked in sys.modules, or a broken install
            missing.append(name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    missing = missing_sim_modules()
    if missing:
        print(
            f"sharepack-simulate: the simulator needs {', '.join(missing)}, which a plain install "
            f"leaves out: pip install '{SIM_EXTRA}'",
            file=sys.stderr,
        )
        return 2
    from sharepack.tracesim import cli  # noqa: PLC0415 - only now that numpy is known to be there

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())

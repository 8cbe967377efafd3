"""`sharepack-simulate`: the entry point, importable without the simulator's extra.

numpy and matplotlib come with `pip install 'sharepack[sim]'` only (the agent and the extender
need neither), so this module checks for them before importing the simulator (tracesim.cli).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sharepack import extras


def main(argv: Sequence[str] | None = None) -> int:
    if (problem := extras.problem("sharepack-simulate", "sim")) is not None:
        print(problem, file=sys.stderr)
        return 2
    from sharepack.tracesim import cli  # noqa: PLC0415 - only now that numpy is known to be there

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())

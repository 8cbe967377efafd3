"""The sandbox's console scripts, importable without the `sandbox` extra.

The sandbox needs cryptography (the real control plane's CA, the extender's mTLS files) and
kubernetes-validate (the in-process API server's OpenAPI), which the agent and the extender do
not: `pip install 'sharepack[sandbox]'`. Each script checks for them before importing its driver.
"""

from __future__ import annotations

import importlib
import sys

from sharepack import extras


def _run(program: str, driver: str) -> int:
    if (problem := extras.problem(program, "sandbox")) is not None:
        print(problem, file=sys.stderr)
        return 2
    main = importlib.import_module(f"sharepack.sandbox.drivers.{driver}").main
    return int(main() or 0)


def demo() -> int:
    return _run("sharepack-demo", "demo")


def chaos() -> int:
    return _run("sharepack-chaos", "chaos")


def replay_kube() -> int:
    return _run("sharepack-replay-kube", "kubereplay")

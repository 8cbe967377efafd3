"""The conformance entry points' historic import name: `common.allocation.shared_allocation`.

The code lives in `sharepack.common`; this alias (kept in the repository, never installed by the
wheel, which claims only the `sharepack` import name) makes `common.X` the same module object as
`sharepack.common.X`, so a caller catching `common.allocation.AllocationError` catches what the
code raises.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

from sharepack import common as _real

_PREFIX = __name__ + "."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module("sharepack." + spec.name)

    def exec_module(self, module: ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = _real

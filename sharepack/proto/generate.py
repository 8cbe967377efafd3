"""Regenerate the Python modules from the .proto sources.

Run as `python -m sharepack.proto.generate` from the repository root (or `--check` to fail when the
committed modules are stale). Every upstream file is named `api.proto`; they are compiled under
distinct directory paths (`sharepack/proto/deviceplugin/v1beta1/`, `sharepack/proto/podresources/v1/`,
`sharepack/proto/dra/v1/`, `sharepack/proto/pluginregistration/v1/`) so their descriptors do not collide in one
process.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "sharepack/proto/deviceplugin/v1beta1/api.proto",
    "sharepack/proto/podresources/v1/api.proto",
    "sharepack/proto/dra/v1/api.proto",
    "sharepack/proto/pluginregistration/v1/api.proto",
)
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _generate(out: Path) -> None:
    # protoc finds the mypy plugins (mypy-protobuf) next to this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    for source in SOURCES:
        args = [
            "protoc",
            f"--proto_path={ROOT}",
            f"--python_out={out}",
            f"--mypy_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_grpc_out={out}",
            str(ROOT / source),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {source}")


def _outputs(base: Path) -> list[Path]:
    return [base / src.replace(".proto", suffix) for src in SOURCES for suffix in SUFFIXES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        _generate(out)
        stale = [
            str(committed.relative_to(ROOT))
            for fresh, committed in zip(_outputs(out), _outputs(ROOT), strict=True)
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False)
        ]
        if opts.check:
            if stale:
                print("stale generated modules: " + ", ".join(stale), file=sys.stderr)
                return 1
            return 0
        for fresh, committed in zip(_outputs(out), _outputs(ROOT), strict=True):
            shutil.copyfile(fresh, committed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

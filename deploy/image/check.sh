#!/bin/sh
# Replays the Dockerfile's build and install steps in fresh virtual environments, for hosts
# without a container engine: the build lock builds sharepack's wheel from the five packages the
# image copies, the runtime lock installs with --require-hashes --no-deps, and every module of
# the agent and the extender then imports and both commands answer --help. Needs Python 3.11 and
# PyPI.
#
#     deploy/image/check.sh [python3.11]
set -eu
python=${1:-python3}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/sharepack-image-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The build stage.
"$python" -m venv "$work/build"
"$work/build/bin/pip" install --quiet --require-hashes --no-deps -r "$root/deploy/image/build-requirements.txt"
mkdir "$work/src"
cp "$root/pyproject.toml" "$root/README.md" "$work/src/"
mkdir "$work/src/sharepack"
cp "$root/sharepack/__init__.py" "$work/src/sharepack/"
for package in common agent extender kube proto; do
  cp -r "$root/sharepack/$package" "$work/src/sharepack/$package"
done
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/src" && "$work/build/bin/pip" wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/wheels" .)

# The runtime stage.
"$python" -m venv "$work/runtime"
"$work/runtime/bin/pip" install --quiet --require-hashes --no-deps -r "$root/deploy/image/requirements.txt"
"$work/runtime/bin/pip" install --quiet --no-deps "$work"/wheels/*.whl
cd "$work"  # not the source tree: import what was installed
"$work/runtime/bin/python" - <<'PY'
import importlib, pkgutil, sys
from importlib import metadata
for package in ("sharepack.agent", "sharepack.extender"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
installed = sorted(d.metadata["Name"].lower() for d in metadata.distributions())
print("distributions:", " ".join(installed))
for absent in ("sharepack.sandbox", "sharepack.tracesim", "sharepack.cli", "numpy", "matplotlib", "kubernetes_validate", "cryptography"):
    assert importlib.util.find_spec(absent) is None, f"{absent} is installed"
print("imports: every module of sharepack.agent and sharepack.extender; absent: sharepack.sandbox, "
      "sharepack.tracesim, sharepack.cli, numpy, matplotlib, "
      "kubernetes_validate, cryptography")
PY
"$work/runtime/bin/sharepack-agent" --help > /dev/null
"$work/runtime/bin/sharepack-extender" --help > /dev/null
echo "ok: sharepack-agent --help and sharepack-extender --help"

#!/bin/sh
# Regenerates the image's hash-pinned locks from the two .in files, with pip-tools' pip-compile
# (pip install pip-tools), on Python 3.11 as the image runs: every distribution file PyPI holds
# for each pinned version gets its hash, so the locks serve any platform the image is built for.
#
#     deploy/image/lock.sh
set -eu
cd "$(dirname "$0")"
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
export CUSTOM_COMPILE_COMMAND="deploy/image/lock.sh"
for name in requirements build-requirements; do
  pip-compile --quiet --generate-hashes --allow-unsafe --no-strip-extras --no-emit-find-links --no-emit-index-url \
    --index-url https://pypi.org/simple --output-file "$name.txt" "$name.in"
done

# The production image: the node agent (sharepack-agent) and the scheduler extender
# (sharepack-extender), and only what they import: sharepack's common, agent, extender, kube and
# proto, on
# the locked runtime dependencies. No sandbox, no simulator, no numpy, matplotlib,
# kubernetes-validate or cryptography (tests/static/test_image.py checks all of this).
#
# Pinned: the base image by digest (python:3.11.10-slim-bookworm's multi-arch index; bump tag and
# digest together), every dependency by version and hash (deploy/image/requirements.txt, made by
# deploy/image/lock.sh), installed with --require-hashes --no-deps so that pip fetches nothing
# the lock does not name; sharepack itself is built from this source with the locked setuptools.
FROM docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16 AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY deploy/image/build-requirements.txt /locks/build-requirements.txt
RUN pip install --require-hashes --no-deps -r /locks/build-requirements.txt
COPY pyproject.toml README.md ./
COPY sharepack/__init__.py sharepack/__init__.py
COPY sharepack/common sharepack/common
COPY sharepack/agent sharepack/agent
COPY sharepack/extender sharepack/extender
COPY sharepack/kube sharepack/kube
COPY sharepack/proto sharepack/proto
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

FROM docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY deploy/image/requirements.txt /locks/requirements.txt
COPY --from=build /wheels /wheels
RUN pip install --require-hashes --no-deps -r /locks/requirements.txt \
 && pip install --no-deps /wheels/*.whl \
 && rm -rf /wheels /locks
# The extender runs as 65532 (see deploy/extender); the agent's DaemonSet sets uid 0 because the
# kubelet's device-plugin directory is root-owned.
USER 65532:65532
ENTRYPOINT []
CMD ["sharepack-extender", "--help"]

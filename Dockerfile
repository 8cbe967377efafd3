# One image for the agent (sharepack-agent) and the extender (sharepack-extender).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY common common
COPY agent agent
COPY extender extender
COPY kube kube
COPY cli cli
COPY proto proto
COPY sandbox sandbox
COPY tracesim tracesim
# The lean set: no extras, so no numpy or matplotlib (only sharepack-simulate needs them, with
# `sharepack[sim]`); tests/static/test_lean_install.py checks the two processes import neither.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The extender runs as 65532 (see deploy/extender); the agent's DaemonSet sets uid 0 because the
# kubelet's device-plugin directory is root-owned.
USER 65532:65532
ENTRYPOINT []
CMD ["sharepack-extender", "--help"]

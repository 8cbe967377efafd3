"""The agent's resource.k8s.io/v1 calls, raw JSON in and out (the generated models lag the API
and would drop fields they do not know).

The agent's token is bound to its pod, so it carries the node's name; deploy/overlays/dra's
ValidatingAdmissionPolicy lets it write only ResourceSlices whose `spec.nodeName` is that node,
and RBAC gives it no more than reading claims and writing slices.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import orjson
from kubernetes.aio import client as kclient

from sharepack.common import dradevices
from sharepack.common.errors import ClaimError

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0


class ApiAnswer(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, what: str, status: int, body: bytes) -> None:
        try:
            message = str(orjson.loads(body).get("message") or "")
        except (orjson.JSONDecodeError, AttributeError):
            message = body[:200].decode(errors="replace")
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status = status


async def _send(what: str, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    response = await call(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
    try:
        body: bytes = await response.read()
    finally:
        response.release()
    if response.status >= 300:
        raise ApiAnswer(what, response.status, body)
    return orjson.loads(body) if body else None


class ApiClaimReader:
    def __init__(self, api: kclient.ApiClient) -> None:
        self._resource = kclient.ResourceV1Api(api)

    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            doc = await _send(
                f"reading ResourceClaim {namespace}/{name}",
                self._resource.read_namespaced_resource_claim_without_preload_content, name, namespace,
            )
        except Exception as e:  # noqa: BLE001 - the API away, 404, 403: that claim cannot be prepared now
            raise ClaimError(f"claim {namespace}/{name}: cannot read it: {e}") from e
        if not isinstance(doc, Mapping):
            raise ClaimError(f"claim {namespace}/{name}: the API server answered no object")
        return doc


async def _node_owner(api: kclient.ApiClient, node: str) -> dict[str, str]:
    core = kclient.CoreV1Api(api)
    doc = await _send(f"reading Node {node}", core.read_node_without_preload_content, node)
    return {"name": node, "uid": str(doc["metadata"]["uid"])}


def _same(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    spec, want = existing.get("spec") or {}, wanted["spec"]
    return all(spec.get(k) == want[k] for k in ("driver", "nodeName", "devices")) and (
        (spec.get("pool") or {}).get("resourceSliceCount") == want["pool"]["resourceSliceCount"]
    )


async def publish_slices(
    api: kclient.ApiClient, node: str, devices: Sequence[dradevices.DraDevice], *, unhealthy: Collection[str] = ()
) -> int:
    """Make the node's pool exactly `devices`, in order; returns the pool generation written.

    The existing slices are listed first: when they already hold these devices nothing is
    written (an agent restart does not disturb the allocator); otherwise every slice is written
    with the next generation and leftovers are deleted, so the scheduler never mixes two."""
    resource = kclient.ResourceV1Api(api)
    listed = await _send(
        f"listing ResourceSlices of node {node}",
        resource.list_resource_slice_without_preload_content,
        field_selector=f"spec.nodeName={node},spec.driver={dradevices.DRIVER}",
    )
    existing = {item["metadata"]["name"]: item for item in listed.get("items") or []}
    generation = max([int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in existing.values()] or [0])
    owner = await _node_owner(api, node)
    wanted = dradevices.slice_bodies(node, devices, generation=generation, owner=owner, unhealthy=unhealthy)
    if len(existing) == len(wanted) and all(
        b["metadata"]["name"] in existing and _same(existing[b["metadata"]["name"]], b) for b in wanted
    ):
        log.info("ResourceSlices of node %s are current (generation %d, %d devices)", node, generation, len(devices))
        return generation
    generation += 1
    wanted = dradevices.slice_bodies(node, devices, generation=generation, owner=owner, unhealthy=unhealthy)
    for body in wanted:
        name = body["metadata"]["name"]
        if name in existing:
            body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
            await _send(f"replacing ResourceSlice {name}", resource.replace_resource_slice_without_preload_content, name, body)
        else:
            await _send(f"creating ResourceSlice {name}", resource.create_resource_slice_without_preload_content, body)
    for name in sorted(set(existing) - {b["metadata"]["name"] for b in wanted}):
        await _send(f"deleting ResourceSlice {name}", resource.delete_resource_slice_without_preload_content, name)
    log.info("published %d device(s) of node %s in %d ResourceSlice(s), generation %d",
             len(devices), node, len(wanted), generation)  # fmt: skip
    return generation

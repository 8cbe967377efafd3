"""Directed GPUs at bind: tell the node's agent which physical GPUs the pod was counted on.

`DirectingBinder` wraps the binder: before the Binding is created it assumes the pod on its
node (`ClusterView.direct`, the same step that counts it) and writes the predicted GPUs of each
container into the pod's `sharepack.io/gpus` annotation (format: `common.directions`). The
annotation goes on *before* the binding, so the kubelet, which admits a pod once it sees it
bound, never meets it without; the agent's `GetPreferredAllocation` then answers with devices
on those GPUs (agent.directing). A failed annotation write is logged and the pod is bound
anyway (its agent falls back to its own policy); a failed bind stops counting the pod. Before
directing, it lists the pods bound to the node (one API call per bind), so that a pod another
replica bound a moment ago counts although our pod watch has not delivered it yet.

`--no-directed-gpus` leaves the binder unwrapped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from sharepack.common import directions, podrequests
from sharepack.common.errors import RequestError
from sharepack.common.podrequests import PodRequest
from sharepack.extender.binding import Binder, BindError
from sharepack.extender.caches import ClusterView
from sharepack.extender.protocol import BindingArgs

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class DirectingBinder:
    """A `Binder` that annotates the pod with its directed GPUs before binding it."""

    counts_pods = True  # it assumes the pod on its node (`ClusterView.direct`) before binding

    def __init__(self, inner: Binder, view: ClusterView, api_client: Any, *, timeout_s: float = 10.0) -> None:
        from kubernetes import client  # imported here: only the composition root needs it

        self._inner = inner
        self._view = view
        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout_s
        self.annotated = 0  # pods bound with directions (for tests and logs)

    async def get_pod(self, namespace: str, name: str) -> Any:
        return await self._inner.get_pod(namespace, name)

    async def bind(self, args: BindingArgs) -> None:
        request = self._view.recalled(args.pod_uid) if args.pod_uid else None
        if request is None and args.pod_uid:
            request = await self._read_request(args)
        if request is not None and not request.empty:  # a CPU-only pod has no GPUs to direct
            await self._catch_up(args.node)
        split = self._view.direct(args.pod_uid, args.node, request) if request is not None else ()
        if split:
            await self._annotate(args, directions.encode(directions.from_placements(args.node, split)))
        try:
            await self._inner.bind(args)
        except BindError:
            if split:
                self._view.unassume(args.pod_uid, args.node)  # not bound there: stop counting it
            raise

    async def _catch_up(self, node: str) -> None:
        """Fold in every pod bound to `node` now. Another replica's binds reach us through our
        pod watch, a few milliseconds late; directing on a view without the pod bound just
        before would send this one to GPUs already taken (measured by bench_replicas
        --overlap: 1 bind in 56). One list of the node's pods closes that window."""
        try:
            resp: Any = await asyncio.to_thread(
                self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}",
                _preload_content=False, _request_timeout=self._timeout,
            )  # fmt: skip
            items = orjson.loads(resp.data).get("items") or []
        except Exception as e:  # noqa: BLE001 - directing on the view we have is still useful
            log.debug("listing the pods of node %s before directing failed: %s", node, e)
            return
        for item in items:
            self._view.upsert_pod(item)

    async def _read_request(self, args: BindingArgs) -> PodRequest | None:
        """A pod this replica did not filter or prioritize (another replica behind the same
        Service did): read it, so it is directed all the same."""
        try:
            doc = await self._inner.get_pod(args.pod_namespace, args.pod_name)
            return podrequests.decode_pod_request(doc, self._view.managed)
        except (BindError, RequestError) as e:
            log.warning("pod %s/%s: cannot read it to direct its GPUs (%s); binding it anyway",
                        args.pod_namespace, args.pod_name, e)  # fmt: skip
            return None

    async def _annotate(self, args: BindingArgs, value: str) -> None:
        body = {"metadata": {"annotations": {directions.ANNOTATION: value}}}
        try:
            await asyncio.to_thread(
                self._core.patch_namespaced_pod, args.pod_name, args.pod_namespace, body,
                _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=self._timeout,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - directions are an optimisation: bind regardless
            log.warning("pod %s/%s: cannot write its directed GPUs (%s); binding it anyway, its "
                        "agent will choose by its own policy", args.pod_namespace, args.pod_name,
                        getattr(e, "reason", None) or e)  # fmt: skip
            return
        self.annotated += 1
        log.debug("pod %s/%s directed on node %s: %s", args.pod_namespace, args.pod_name, args.node, value)

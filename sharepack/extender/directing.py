"""Directed GPUs at bind: tell the node's agent which physical GPUs the pod was counted on.

`DirectingBinder` wraps the binder: before the Binding is created it assumes the pod on its
node (`ClusterView.direct`, the same step that counts it) and puts the predicted GPUs of each
container in the Binding's `sharepack.io/gpus` annotation (format: `common.directions`), which
kube-apiserver merges into the pod in the same write that binds it. So the kubelet, which admits
a pod once it sees it bound, never meets it without its directions, and a bind costs one write
(it used to be a patch, then the Binding); the agent's `GetPreferredAllocation` then answers
with devices on those GPUs (agent.directing). A failed bind stops counting the pod.

Where another binder may be about (`DirectingBinder.must_list`: another replica's binds seen,
or a pause in our own), it first lists the pods bound to the node (one API call), so that a pod
another replica bound a moment ago counts although our pod watch has not delivered it yet; pods
the watch already delivered are skipped unread. That list starts as the bind arrives
(`prefetch`), beside the bind guard's check of the pod. A replica binding alone skips it: the
bind guard reads the pod from the pod watch (`extender.pendingpods`), so such a bind makes one
API call, the Binding (kube-scheduler gives a bind `httpTimeout`, 2 s as shipped, then fails
it). Every call goes through the binder's asyncio client (`extender.binding.ApiBinder`): no
thread per bind.

`--no-directed-gpus` leaves the binder unwrapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sharepack.common import directions, podrequests
from sharepack.common.errors import RequestError
from sharepack.common.podrequests import PodRequest
from sharepack.extender.binding import Binder, BindError
from sharepack.extender.caches import ClusterView
from sharepack.extender.protocol import BindingArgs
from sharepack.extender.roomwait import wait_for_room

log = logging.getLogger(__name__)

# After a sign that another replica binds (`DirectingBinder.must_list`), every bind lists its
# node's pods for this long; and a replica whose own binds paused this long lists again.
SHARED_S = 30.0
QUIET_S = 5.0


class PodApi(Binder, Protocol):
    """What directing needs of the binder beyond binding (`extender.binding.ApiBinder`)."""

    async def pods_on(self, node: str) -> list[Any]: ...


class DirectingBinder:
    """A `Binder` whose Bindings carry the pod's directed GPUs (an annotation the API merges into the pod)."""

    counts_pods = True  # it assumes the pod on its node (`ClusterView.direct`) before binding

    def __init__(self, inner: PodApi, view: ClusterView, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        self._view = view
        self._clock = clock
        self.annotated = 0  # pods bound with directions (for tests and logs)
        self.lists = 0  # binds that listed their node's pods (for tests and logs)
        self._lists: dict[tuple[str, str], asyncio.Task[list[Any]]] = {}  # (pod UID, node) -> its list
        self._last_bind = -math.inf  # `clock` at this binder's last bind
        self._foreign_until = -math.inf  # list at every bind until then: another binder is about

    def must_list(self) -> bool:
        """Whether a bind now lists its node's pods first (`_catch_up`). Only another binder's
        pods can be missing from our view (ours are counted the moment we direct them), so a
        replica that binds steadily, with no sign of another, skips the list: the one API call
        a bind then makes is the Binding. Signs: a GPU pod bound that this view did not count,
        seen by the pod watch (`ClusterView.last_foreign_bind`) or met as a bind for a pod this
        replica did not score, in the last `SHARED_S`; and a pause of `QUIET_S` in our own
        binds, after which another replica may have taken over and handed back (failover, a
        rollout)."""
        now = self._clock()
        foreign = max(self._foreign_until, self._view.last_foreign_bind + SHARED_S)
        return now < foreign or now - self._last_bind > QUIET_S

    def prefetch(self, args: BindingArgs) -> None:
        """Start listing the pods of the bind's node now, where it must (`must_list`); `bind`
        uses the answer, `discard` drops it when the bind goes no further."""
        key = (args.pod_uid, args.node)
        if args.pod_uid and args.node and key not in self._lists and self.must_list():
            self._lists[key] = asyncio.get_running_loop().create_task(
                self._inner.pods_on(args.node), name=f"extender-list-pods-{args.node}"
            )

    async def discard(self, args: BindingArgs) -> None:
        task = self._lists.pop((args.pod_uid, args.node), None)
        if task is not None:
            await self.discard_task(task)

    async def get_pod(self, namespace: str, name: str) -> Any:
        return await self._inner.get_pod(namespace, name)

    async def bind(self, args: BindingArgs, annotations: Mapping[str, str] | None = None) -> None:
        listing = self._lists.pop((args.pod_uid, args.node), None)
        request = self._view.recalled(args.pod_uid) if args.pod_uid else None
        if request is None and args.pod_uid:
            self._foreign_until = self._clock() + SHARED_S  # another replica scored this pod
            request = await self._read_request(args)
        if request is not None and not request.empty:  # a CPU-only pod has no GPUs to direct
            if listing is not None or self.must_list():
                await self._catch_up(args.node, listing)
            # A bind to this node just before may have taken the room the guard saw; a release
            # on its way may give it back (extender.roomwait).
            await wait_for_room(self._view, args.node, request)
        elif listing is not None:
            await self.discard_task(listing)
        split = self._view.direct(args.pod_uid, args.node, request) if request is not None else ()
        self._view.refresh_node(args.node)  # the pod's CPU in its node's scorer before the Binding (a no-op after `direct`)
        directed = dict(annotations or {})
        if split:
            directed[directions.ANNOTATION] = directions.encode(directions.from_placements(args.node, split))
        self._last_bind = self._clock()
        try:
            await self._inner.bind(args, directed)
        except BindError:
            if split:
                self._view.unassume(args.pod_uid, args.node)  # not bound there: stop counting it
            raise
        if split:
            self.annotated += 1
            log.debug("pod %s/%s directed on node %s: %s", args.pod_namespace, args.pod_name, args.node,
                      directed[directions.ANNOTATION])  # fmt: skip

    @staticmethod
    async def discard_task(task: asyncio.Task[list[Any]]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, BindError):
            await task

    async def _catch_up(self, node: str, listing: asyncio.Task[list[Any]] | None = None) -> None:
        """Fold in every pod bound to `node` now. Another replica's binds reach us through our
        pod watch, a few milliseconds late; directing on a view without the pod bound just
        before would send this one to GPUs already taken (measured by bench_replicas
        --overlap: 1 bind in 56). One list of the node's pods closes that window."""
        self.lists += 1
        try:
            items = await (listing if listing is not None else self._inner.pods_on(node))
        except BindError as e:  # directing on the view we have is still useful
            log.debug("%s; directing on what the pod watch delivered", e)
            return
        known = self._view.pods
        for item in items:
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            if isinstance(meta, Mapping) and meta.get("uid") in known and not meta.get("deletionTimestamp"):
                continue  # the watch delivered it: counted already
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

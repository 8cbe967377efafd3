"""The fake kubelet's duties towards the API server, as pkg/kubelet does them:

* registers its Node (labels, addresses, node info) and posts the status: capacity and
  allocatable (cpu, memory, pods, and what the device plugins' ListAndWatch advertise), a Ready
  condition; again whenever a device plugin changes what it advertises;
* renews its Lease in `kube-node-lease` every `LEASE_RENEW_S` (the node heartbeat);
* watches the pods bound to it (`spec.nodeName`), admits each new one through the fake
  kubelet's device manager, and writes the status a started pod has (Running, Ready, container
  statuses); a pod it rejects gets `Failed` / `UnexpectedAdmissionError`, as the kubelet's
  admission failure reads;
* frees the devices of a pod that is deleted or finished, and completes a graceful deletion (the
  API server only marks a bound pod; its kubelet deletes it with grace period 0 once the
  containers are gone).

It runs with whatever credentials its client has; on the real control plane, the node's own
(`system:node:<name>`), so the Node authorizer and NodeRestriction check every write.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes

from sharepack.sandbox.apiwatch import ApiSession, reflect
from sharepack.sandbox.controlplane.plane import TRANSIENT_API_ERRORS
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.dra import DraManager, DraPrepareError
from sharepack.sandbox.kubelet.pods import AdmissionError, PodSpec

log = logging.getLogger(__name__)

LEASE_RENEW_S = 10.0  # as the kubelet: a quarter of the lease duration
LEASE_DURATION_S = 40
CAPACITY_POLL_S = 0.2
DEFAULT_NODE_RESOURCES = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def running_status(pod: Mapping[str, Any], started: str) -> dict[str, Any]:
    """The status the kubelet writes once every container of the pod has started."""
    spec = pod.get("spec") or {}

    def condition(kind: str) -> dict[str, Any]:
        return {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}

    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": started,
        "conditions": [
            condition(k) for k in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": f"sandbox://{(pod.get('metadata') or {}).get('uid')}/{c['name']}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for c in spec.get("containers") or []
        ],
    }


class KubeletApi:
    def __init__(
        self,
        name: str,
        kubelet: FakeKubelet,
        api: Any,  # kubernetes.client.ApiClient with the node's credentials
        *,
        labels: Mapping[str, str],
        kubelet_version: str,
        pod_spec: Callable[[Mapping[str, Any]], PodSpec],
        resources: Mapping[str, str] = DEFAULT_NODE_RESOURCES,
        dra: DraManager | None = None,
    ) -> None:
        """`dra`: the kubelet's DRA part (claims prepared before a pod starts), or None."""
        self.name = name
        self.dra = dra
        self.kubelet = kubelet
        self._api = api
        self._core: Any = kubernetes.client.CoreV1Api(api)
        self._coordination: Any = kubernetes.client.CoordinationV1Api(api)
        self._labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}
        self._version = kubelet_version
        self._pod_spec = pod_spec
        self._resources = dict(resources)
        self._published: tuple[dict[str, str], dict[str, str]] | None = None
        self._handled: set[str] = set()  # pod UIDs admitted or rejected
        self._lock = asyncio.Lock()
        self.rejected: dict[str, str] = {}  # pod UID -> admission error
        self._unreported: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}  # uid -> (meta, status)
        self._undeleted: dict[str, Mapping[str, Any]] = {}  # uid -> meta of a deletion to finish
        self._unadmitted: dict[str, Mapping[str, Any]] = {}  # uid -> pod whose admission broke
        self.pods_seen = asyncio.Event()  # set after the first list of this node's pods

    # -- the Node --------------------------------------------------------------------------

    async def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self._labels},
        }
        try:
            await asyncio.to_thread(self._core.create_node, body)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        await self.sync_status(force=True)
        try:
            await self.renew_lease()
        except kubernetes.client.ApiException as e:  # the heartbeat loop tries again
            log.warning("node %s: creating its lease failed: %s", self.name, e.reason)

    def _capacities(self) -> tuple[dict[str, str], dict[str, str]]:
        capacity = {**self._resources, **{k: str(v) for k, v in self.kubelet.capacity().items()}}
        allocatable = {**self._resources, **{k: str(v) for k, v in self.kubelet.allocatable().items()}}
        return capacity, allocatable

    async def sync_status(self, *, force: bool = False) -> None:
        """Post capacity and allocatable when they changed since the last post (or `force`)."""
        current = self._capacities()
        if not force and current == self._published:
            return
        capacity, allocatable = current
        stamp = now()
        status = {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
                },
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {
                "kubeletVersion": self._version, "kubeProxyVersion": "",
                "containerRuntimeVersion": "sandbox://0.1.0", "operatingSystem": "linux", "architecture": "amd64",
                "osImage": "sharepack sandbox", "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": "",
            },
        }  # fmt: skip
        # Strategic merge on the status subresource, as the kubelet patches it; conditions are
        # merged by type there.
        await asyncio.to_thread(self._core.patch_node_status, self.name, {"status": status})
        self._published = current

    async def renew_lease(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now_micro()},
        }
        try:
            # A patch: Leases refuse updates without a resourceVersion, and the renewal is
            # this node's alone.
            await asyncio.to_thread(
                self._coordination.patch_namespaced_lease, self.name, "kube-node-lease", {"spec": body["spec"]}
            )
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
            await asyncio.to_thread(self._coordination.create_namespaced_lease, "kube-node-lease", body)

    # -- the loops -------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: status on change, the lease heartbeat, the pods bound here."""
        api = ApiSession.of(self._api)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._status_loop(), name=f"kubelet-status-{self.name}")
                group.create_task(self._lease_loop(), name=f"kubelet-lease-{self.name}")
                if self.dra is not None:
                    group.create_task(self.dra.run(), name=f"kubelet-dra-{self.name}")
                group.create_task(
                    reflect(api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.name}"}, self._on_pod),
                    name=f"kubelet-pods-{self.name}",
                )
        finally:
            await api.close()

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(CAPACITY_POLL_S)
            with contextlib.suppress(*TRANSIENT_API_ERRORS):
                await self.sync_status()
            for uid, (meta, status) in list(self._unreported.items()):
                with contextlib.suppress(*TRANSIENT_API_ERRORS):
                    await self._report(meta, status)
                    self._unreported.pop(uid, None)
            for pod in list(self._unadmitted.values()):
                with contextlib.suppress(Exception):  # logged by admit's caller the first time
                    await self.admit(pod)
            for uid, meta in list(self._undeleted.items()):
                with contextlib.suppress(*TRANSIENT_API_ERRORS):
                    await self._finish_deletion(meta)
                    self._undeleted.pop(uid, None)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            try:
                await self.renew_lease()
            except TRANSIENT_API_ERRORS as e:
                log.warning("node %s: renewing its lease failed: %s", self.name, getattr(e, "reason", e))

    async def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in TERMINAL:
            await self.kubelet.remove_pod(uid)
            await self._unprepare(uid)
            self._unadmitted.pop(uid, None)
            self._unreported.pop(uid, None)
            self._undeleted.pop(uid, None)
            return
        if meta.get("deletionTimestamp"):
            await self.kubelet.remove_pod(uid)
            await self._unprepare(uid)
            self._unadmitted.pop(uid, None)
            try:
                await self._finish_deletion(meta)
            except TRANSIENT_API_ERRORS:  # the API is away: the status loop finishes it later
                self._undeleted[uid] = meta
            return
        await self.admit(pod)

    async def admit(self, pod: Mapping[str, Any]) -> str | None:
        """Admit a pod bound here once; returns the admission error, if it was rejected."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        async with self._lock:
            if uid in self._handled or any(a.pod.uid == uid for a in self.kubelet.admissions()):
                return self.rejected.get(uid)
            self._handled.add(uid)
            if self.dra is not None:
                try:
                    # Before the containers start: the pod's claims, prepared by their drivers.
                    await self.dra.prepare_pod(pod)
                except DraPrepareError as e:
                    # The kubelet keeps the pod waiting and retries; so does the status loop here.
                    log.warning("pod %s/%s: preparing its claims failed: %s; trying again",
                                meta.get("namespace"), meta.get("name"), e)  # fmt: skip
                    self._handled.discard(uid)
                    self._unadmitted[uid] = pod
                    return None
            try:
                await self.kubelet.admit_pod(self._pod_spec(pod))
                status: dict[str, Any] = running_status(pod, now())
            except AdmissionError as e:
                self.rejected[uid] = str(e)
                status = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": str(e)}
            except Exception:
                # Not a verdict on the pod (the kubelet restarting under it, say): admit it again
                # at the next status tick, as the kubelet's pod workers retry.
                self._handled.discard(uid)
                self._unadmitted[uid] = pod
                raise
            self._unadmitted.pop(uid, None)
        try:
            await self._report(meta, status)
        except TRANSIENT_API_ERRORS:  # the API is away: the status loop writes it later
            self._unreported[uid] = (meta, status)
        return self.rejected.get(uid)

    async def _unprepare(self, uid: str) -> None:
        """After the pod's containers are gone: its claims, unprepared by their drivers."""
        if self.dra is not None:
            await self.dra.unprepare_pod(uid)

    async def _report(self, meta: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        try:
            await asyncio.to_thread(
                self._core.patch_namespaced_pod_status, meta["name"], meta["namespace"], {"status": status}
            )
        except kubernetes.client.ApiException as e:
            if e.status != 404:  # deleted meanwhile: nothing to report
                raise

    async def _finish_deletion(self, meta: Mapping[str, Any]) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta.get("uid")}}
        try:
            await asyncio.to_thread(
                self._core.delete_namespaced_pod, meta["name"], meta["namespace"], body=body
            )
        except kubernetes.client.ApiException as e:
            if e.status not in (404, 409):  # gone already, or a new pod of the same name
                raise

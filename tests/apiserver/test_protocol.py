"""The API protocol as clients depend on it (watches, bookmarks, 410 Gone and relist,
resourceVersion, patch types, Table output), run on the sandbox API server and on the real
kube-apiserver alike (the `kube` fixture): where the sandbox's answer differs from the real one's,
the sandbox is wrong."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from sharepack.common import state as gpustate
from tests.apiserver.endpoints import TABLE, Endpoint


def _pod(name: str, *, labels: dict[str, str] | None = None, containers: tuple[str, ...] = ("c",)) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers]},
    }


def _pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def _seen(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def _error(kube: Endpoint, fn: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(client.ApiException) as info:
        await kube.call(fn, *args, **kwargs)
    return int(info.value.status), json.loads(info.value.body)


# -- watches -------------------------------------------------------------------------------------


async def test_a_watch_from_a_version_replays_then_follows(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    await kube.call(core.create_namespaced_pod, ns, _pod("before"))
    rv = (await kube.call(core.list_namespaced_pod, ns)).metadata.resource_version
    await kube.call(core.create_namespaced_pod, ns, _pod("a"))
    await kube.call(core.patch_namespaced_pod, "a", ns, {"metadata": {"labels": {"x": "1"}}})
    await kube.call(core.delete_namespaced_pod, "a", ns, grace_period_seconds=0)
    await kube.call(core.create_namespaced_pod, ns, _pod("b"))
    got = await kube.watch_lines(_pods_path(ns), [("resourceVersion", rv), ("timeoutSeconds", "5")], 5)
    # A pod's deletion is first written (deletionTimestamp), then the pod goes: at once here, as
    # it has no node and a grace period of 0.
    assert _seen(got) == [("ADDED", "a"), ("MODIFIED", "a"), ("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    assert got[2]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    assert got[2]["object"]["metadata"]["deletionTimestamp"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert versions == sorted(versions) and versions[0] > int(rv)


async def test_a_watch_without_a_version_starts_with_the_current_objects(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    for name in ("p1", "p2"):
        await kube.call(core.create_namespaced_pod, ns, _pod(name))
    got = await kube.watch_lines(_pods_path(ns), [("timeoutSeconds", "5")], 2)
    assert sorted(_seen(got)) == [("ADDED", "p1"), ("ADDED", "p2")]


async def test_a_selector_watch_sees_objects_enter_and_leave(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    rv = (await kube.call(core.list_namespaced_pod, ns)).metadata.resource_version
    await kube.call(core.create_namespaced_pod, ns, _pod("p"))
    await kube.call(core.patch_namespaced_pod, "p", ns, {"metadata": {"labels": {"on": "1"}}})
    await kube.call(core.patch_namespaced_pod, "p", ns, {"metadata": {"labels": {"on": "2"}}})
    query = [("resourceVersion", rv), ("labelSelector", "on=1"), ("timeoutSeconds", "5")]
    got = await kube.watch_lines(_pods_path(ns), query, 2)
    assert _seen(got) == [("ADDED", "p"), ("DELETED", "p")]
    # The object as it last matched, at the version of the change that made it leave.
    assert got[1]["object"]["metadata"]["labels"] == {"on": "1"}
    assert int(got[1]["object"]["metadata"]["resourceVersion"]) > int(got[0]["object"]["metadata"]["resourceVersion"])


async def test_binding_shows_up_in_a_node_field_selector_watch(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    node = kube.unique("node")
    rv = (await kube.call(core.list_namespaced_pod, ns)).metadata.resource_version
    await kube.call(core.create_namespaced_pod, ns, _pod("p"))
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": node}}
    await kube.call(core.create_namespaced_pod_binding, "p", ns, binding, _preload_content=False)
    query = [("resourceVersion", rv), ("fieldSelector", f"spec.nodeName={node}"), ("timeoutSeconds", "5")]
    got = await kube.watch_lines(_pods_path(ns), query, 1)
    assert _seen(got) == [("ADDED", "p")]
    assert got[0]["object"]["spec"]["nodeName"] == node


async def test_an_expired_version_answers_410_gone_and_a_relist_recovers(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    expired = await kube.expired_resource_version()
    got = await kube.watch_lines(_pods_path(ns), [("resourceVersion", expired), ("timeoutSeconds", "5")], 1)
    assert [e["type"] for e in got] == ["ERROR"]
    status = got[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    # What an informer does next: list, then watch from the list's version.
    rv = (await kube.call(core.list_namespaced_pod, ns)).metadata.resource_version
    await kube.call(core.create_namespaced_pod, ns, _pod("after"))
    got = await kube.watch_lines(_pods_path(ns), [("resourceVersion", rv), ("timeoutSeconds", "5")], 1)
    assert _seen(got) == [("ADDED", "after")]


async def test_initial_events_end_with_a_bookmark(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    for name in ("p1", "p2"):
        await kube.call(core.create_namespaced_pod, ns, _pod(name))
    rv = (await kube.call(core.list_namespaced_pod, ns)).metadata.resource_version
    query = [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", ""),
             ("allowWatchBookmarks", "true"), ("timeoutSeconds", "5")]  # fmt: skip
    got = await kube.watch_lines(_pods_path(ns), query, 3)
    assert sorted(_seen(got[:2])) == [("ADDED", "p1"), ("ADDED", "p2")]
    bookmark = got[2]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(rv)


async def test_initial_events_need_not_older_than(kube: Endpoint) -> None:
    ns = await kube.new_namespace()
    for query, field in (
        ([("sendInitialEvents", "true"), ("allowWatchBookmarks", "true")], "resourceVersionMatch"),
        ([("resourceVersionMatch", "NotOlderThan")], "resourceVersionMatch"),
    ):
        code, body = await kube.get_json(_pods_path(ns), query=[("watch", "true"), ("timeoutSeconds", "1"), *query])
        assert (code, body["reason"]) == (422, "Invalid"), query
        assert [c["field"] for c in body["details"]["causes"]] == [field]


# -- resource versions ---------------------------------------------------------------------------


async def test_resource_versions_order_writes_and_a_no_op_keeps_its_version(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    created = await kube.call(core.create_namespaced_config_map, ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    changed = await kube.call(core.patch_namespaced_config_map, "cm", ns, {"data": {"a": "2"}})
    same = await kube.call(core.patch_namespaced_config_map, "cm", ns, {"data": {"a": "2"}})
    assert int(changed.metadata.resource_version) > int(created.metadata.resource_version)
    assert same.metadata.resource_version == changed.metadata.resource_version
    read = await kube.call(core.read_namespaced_config_map, "cm", ns)
    assert read.metadata.resource_version == changed.metadata.resource_version
    listed = await kube.call(core.list_namespaced_config_map, ns)
    assert int(listed.metadata.resource_version) >= int(changed.metadata.resource_version)


async def test_an_update_with_a_stale_version_conflicts(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    created = await kube.call(core.create_namespaced_config_map, ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    await kube.call(core.patch_namespaced_config_map, "cm", ns, {"data": {"a": "2"}})
    stale = {"metadata": {"name": "cm", "resourceVersion": created.metadata.resource_version}, "data": {"a": "3"}}
    code, body = await _error(kube, core.replace_namespaced_config_map, "cm", ns, stale)
    assert (code, body["reason"], body["details"]["kind"]) == (409, "Conflict", "configmaps")
    assert "the object has been modified" in body["message"]


# -- patch types ---------------------------------------------------------------------------------

PATCHES = {
    "merge patch null removes a key": (
        "application/merge-patch+json", {"data": {"a": None, "c": "3"}}, {"b": "2", "c": "3"}),
    "strategic merge on a map": ("application/strategic-merge-patch+json", {"data": {"b": "9"}}, {"a": "1", "b": "9"}),
    "json patch": (
        "application/json-patch+json",
        [{"op": "test", "path": "/data/a", "value": "1"}, {"op": "remove", "path": "/data/a"},
         {"op": "add", "path": "/data/z", "value": "26"}],
        {"b": "2", "z": "26"},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("content_type", "patch", "expected"), PATCHES.values(), ids=PATCHES.keys())
async def test_patch_types(kube: Endpoint, content_type: str, patch: Any, expected: dict[str, str]) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    await kube.call(core.create_namespaced_config_map, ns, {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})
    got = await kube.call(core.patch_namespaced_config_map, "cm", ns, patch, _content_type=content_type)
    assert got.data == expected


async def test_a_failed_json_patch_test_changes_nothing(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    await kube.call(core.create_namespaced_config_map, ns, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    patch = [{"op": "test", "path": "/data/a", "value": "2"}, {"op": "remove", "path": "/data/a"}]
    code, _ = await _error(
        kube, core.patch_namespaced_config_map, "cm", ns, patch, _content_type="application/json-patch+json"
    )
    assert code == 422
    assert (await kube.call(core.read_namespaced_config_map, "cm", ns)).data == {"a": "1"}


async def test_strategic_merge_merges_containers_by_name(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    await kube.call(core.create_namespaced_pod, ns, _pod("p", containers=("first", "second")))
    patch = {"spec": {"containers": [{"name": "second", "image": "busybox:2"}]}}
    got = await kube.call(
        core.patch_namespaced_pod, "p", ns, patch, _content_type="application/strategic-merge-patch+json"
    )
    assert [(c.name, c.image) for c in got.spec.containers] == [("first", "busybox"), ("second", "busybox:2")]
    # A merge patch replaces the list: that drops a container, which a pod update may not do.
    code, body = await _error(kube, core.patch_namespaced_pod, "p", ns, patch, _content_type="application/merge-patch+json")
    assert (code, body["reason"]) == (422, "Invalid")


async def test_a_custom_resource_refuses_strategic_merge(kube: Endpoint) -> None:
    custom = client.CustomObjectsApi(kube.api)
    name = kube.unique("ngs")
    body = {"apiVersion": f"{gpustate.GROUP}/{gpustate.VERSION}", "kind": gpustate.KIND, "metadata": {"name": name}}
    await kube.call(custom.create_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, body)
    try:
        code, body = await _error(
            kube, custom.patch_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, name,
            {"metadata": {"labels": {"a": "b"}}}, _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        assert (code, body["reason"]) == (415, "UnsupportedMediaType")
        merged = await kube.call(
            custom.patch_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, name,
            {"metadata": {"labels": {"a": "b"}}}, _content_type="application/merge-patch+json",
        )  # fmt: skip
        assert merged["metadata"]["labels"] == {"a": "b"}
    finally:
        await kube.call(custom.delete_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, name)


async def test_unknown_fields_are_dropped_with_a_warning_and_refused_when_strict(kube: Endpoint) -> None:
    ns = await kube.new_namespace()
    path = f"/api/v1/namespaces/{ns}/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "bogus": 1}, "data": {"a": "1"},
            "extra": True}  # fmt: skip
    code, warnings, created = await kube.post_json(path, body)
    assert code == 201
    assert set(created) == {"kind", "apiVersion", "metadata", "data"} and "bogus" not in created["metadata"]
    assert sorted(warnings) == ['299 - "unknown field \\"extra\\""', '299 - "unknown field \\"metadata.bogus\\""']
    code, _, status = await kube.post_json(path, {**body, "metadata": {"name": "cm2"}}, query=[("fieldValidation", "Strict")])
    assert (code, status["reason"]) == (400, "BadRequest")
    assert 'strict decoding error: unknown field "extra"' in status["message"]
    code, warnings, _ = await kube.post_json(path, {**body, "metadata": {"name": "cm3"}}, query=[("fieldValidation", "Ignore")])
    assert (code, warnings) == (201, [])


# -- Table output (what kubectl get prints) ------------------------------------------------------


async def test_a_pod_table_counts_ready_running_containers(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    node = kube.unique("node")
    pod = _pod("p", containers=("a", "b"))
    pod["spec"]["nodeName"] = node
    await kube.call(core.create_namespaced_pod, ns, pod)
    _, pending = await kube.get_json(f"{_pods_path(ns)}/p", accept=TABLE)
    assert pending["rows"][0]["cells"][:4] == ["p", "0/2", "Pending", "0"]
    running = {"state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}, "image": "busybox", "imageID": "",
               "restartCount": 1, "started": True}  # fmt: skip
    status = {
        "phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "a", "ready": True, **running}, {"name": "b", "ready": False, **running}],
    }  # fmt: skip
    await kube.call(core.patch_namespaced_pod_status, "p", ns, {"status": status})
    code, table = await kube.get_json(_pods_path(ns), accept=TABLE)
    assert code == 200 and (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "string", 0),
        ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1), ("Nominated Node", "string", 1),
        ("Readiness Gates", "string", 1),
    ]  # fmt: skip
    (row,) = table["rows"]
    cells = row["cells"]
    assert cells[:3] == ["p", "1/2", "Running"] and cells[3].startswith("2")
    assert cells[5:] == ["10.1.0.5", node, "<none>", "<none>"]
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["name"] == "p"


async def test_a_node_table_shows_status_roles_and_version(kube: Endpoint) -> None:
    core = client.CoreV1Api(kube.api)
    name = kube.unique("node")
    node = {
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/gpu": ""}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "nodeInfo": {"kubeletVersion": "v1.37.0-test", "osImage": "", "kernelVersion": "",
                                "containerRuntimeVersion": "", "kubeProxyVersion": "", "machineID": "",
                                "systemUUID": "", "bootID": "", "operatingSystem": "linux", "architecture": "amd64"},
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]},
    }  # fmt: skip
    await kube.call(core.create_node, node)
    try:
        await kube.call(core.patch_node, name, {"spec": {"unschedulable": True}})
        code, table = await kube.get_json(f"/api/v1/nodes/{name}", accept=TABLE)
        assert code == 200
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name", "Status", "Roles", "Age", "Version", "Internal-IP", "External-IP", "OS-Image", "Kernel-Version",
            "Container-Runtime",
        ]  # fmt: skip
        cells = table["rows"][0]["cells"]
        assert cells[:3] == [name, "Ready,SchedulingDisabled", "gpu"]
        assert cells[4:] == ["v1.37.0-test", "10.0.0.7", "<none>", "<unknown>", "<unknown> (amd64)", "<unknown>"]
    finally:
        await kube.call(core.delete_node, name)


async def test_an_event_table_and_both_event_apis_share_events(kube: Endpoint) -> None:
    core, events, ns = client.CoreV1Api(kube.api), client.EventsV1Api(kube.api), await kube.new_namespace()
    body = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "p.1"}, "eventTime": "2026-12-01T00:00:00.000000Z",
        "reportingController": "sharepack.io/kubelet", "reportingInstance": "node-a", "action": "Allocate",
        "reason": "Allocated", "note": "devices GPU-1", "type": "Normal",
        "regarding": {"kind": "Pod", "namespace": ns, "name": "p", "apiVersion": "v1"},
    }  # fmt: skip
    # Raw JSON: the client's model would write eventTime as ...+00:00, which a MicroTime refuses.
    code, _, created = await kube.post_json(f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body)
    assert (code, created["eventTime"]) == (201, "2026-12-01T00:00:00.000000Z")
    core_view = await kube.call(core.list_namespaced_event, ns, field_selector="involvedObject.name=p")
    assert [(e.reason, e.message, e.involved_object.kind, e.reporting_component) for e in core_view.items] == [
        ("Allocated", "devices GPU-1", "Pod", "sharepack.io/kubelet")
    ]
    v1_view = await kube.call(events.list_namespaced_event, ns, field_selector="regarding.name=p")
    assert [(e.reason, e.note) for e in v1_view.items] == [("Allocated", "devices GPU-1")]
    code, table = await kube.get_json(f"/api/v1/namespaces/{ns}/events", accept=TABLE)
    assert code == 200
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Last Seen", "Type", "Reason", "Object", "Subobject", "Source", "Message", "First Seen", "Count", "Name",
    ]  # fmt: skip
    cells = table["rows"][0]["cells"]
    assert cells[1:4] == ["Normal", "Allocated", "pod/p"]
    assert cells[5:7] == ["sharepack.io/kubelet, node-a", "devices GPU-1"]
    assert cells[8:] == [1, "p.1"]


async def test_a_nodegpustate_table_has_the_crds_printer_columns(kube: Endpoint) -> None:
    custom = client.CustomObjectsApi(kube.api)
    name = kube.unique("ngs")
    g, v, plural = gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL
    body = {"apiVersion": f"{g}/{v}", "kind": gpustate.KIND, "metadata": {"name": name}}
    obj = await kube.call(custom.create_cluster_custom_object, g, v, plural, body)
    try:
        obj["status"] = {"schemaVersion": 1, "allocationPolicy": "packed",
                         "summary": {"freeGpus": 3, "gpus": 4, "replicas": "4/16"}}  # fmt: skip
        await kube.call(custom.replace_cluster_custom_object_status, g, v, plural, name, obj)
        code, table = await kube.get_json(f"/apis/{g}/{v}/{plural}/{name}", accept=TABLE)
        assert code == 200
        assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
            ("Name", 0), ("Free GPUs", 0), ("Replicas", 0), ("Policy", 0), ("Schema", 1), ("Observed", 1), ("Age", 0),
        ]  # fmt: skip
        assert table["rows"][0]["cells"][:6] == [name, 3, "4/16", "packed", 1, None]
    finally:
        await kube.call(custom.delete_cluster_custom_object, g, v, plural, name)


# -- what the server fills in, and node leases -----------------------------------------------------


async def test_a_created_pod_gets_the_servers_defaults(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    limits = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "full", "image": "busybox:1.36", "resources": {"limits": limits}},
        {"name": "gpu", "image": "busybox", "resources": {"limits": {**limits, "nvidia.com/gpu": "2"}}},
    ]}}  # fmt: skip
    created = await kube.call(core.create_namespaced_pod, ns, pod)
    assert (created.status.phase, created.status.qos_class) == ("Pending", "Guaranteed")
    spec = created.spec
    assert (spec.restart_policy, spec.dns_policy, spec.scheduler_name, spec.termination_grace_period_seconds) == (
        "Always", "ClusterFirst", "default-scheduler", 30)  # fmt: skip
    assert [c.resources.requests for c in spec.containers] == [limits, {**limits, "nvidia.com/gpu": "2"}]
    assert [c.image_pull_policy for c in spec.containers] == ["IfNotPresent", "Always"]
    assert sorted((t.key, t.toleration_seconds) for t in spec.tolerations) == [
        ("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)]  # fmt: skip
    gpu_only = {"metadata": {"name": "q"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}  # fmt: skip
    created = await kube.call(core.create_namespaced_pod, ns, gpu_only)
    assert created.status.qos_class == "BestEffort", "only cpu and memory decide the QoS class"
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}


async def test_a_node_lease_is_created_renewed_and_printed(kube: Endpoint) -> None:
    leases, ns = client.CoordinationV1Api(kube.api), await kube.new_namespace()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "node-a"},
            "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40,
                     "renewTime": "2026-12-01T01:00:00.000000+01:00"}}  # fmt: skip
    code, _, created = await kube.post_json(path, body)
    assert (code, created["spec"]["renewTime"]) == (201, "2026-12-01T00:00:00.000000Z"), "stored in UTC"
    renew = {"spec": {"renewTime": "2026-12-01T00:01:00.000000Z"}}
    renewed = await kube.call(leases.patch_namespaced_lease, "node-a", ns, renew)
    assert int(renewed.metadata.resource_version) > int(created["metadata"]["resourceVersion"])
    for bad in ("2026-12-01T00:02:00Z", "2026-12-01T00:02:00+00:00", "2026-12-01T00:02:00.123Z"):
        code, _, status = await kube.post_json(path, {**body, "metadata": {"name": "x"}, "spec": {"renewTime": bad}})
        assert (code, status["reason"]) == (400, "BadRequest"), bad
        assert f'parsing time "{bad}"' in status["message"]
    code, table = await kube.get_json(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", accept=TABLE)
    assert code == 200
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Holder", "Age"]
    assert table["rows"][0]["cells"][:2] == ["node-a", "node-a"]


async def test_server_side_apply_creates_then_merges_lists_by_their_keys(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    applied = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1"}},
               "spec": {"containers": [{"name": "first", "image": "busybox"}, {"name": "second", "image": "busybox"}]}}
    apply = "application/apply-patch+yaml"
    code, body = await _error(kube, core.patch_namespaced_pod, "p", ns, applied, _content_type=apply)
    assert (code, body["reason"]) == (422, "Invalid"), "apply needs a field manager"
    created = await kube.call(core.patch_namespaced_pod, "p", ns, applied, _content_type=apply, field_manager="me")
    assert [c.name for c in created.spec.containers] == ["first", "second"]
    update = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"b": "2"}},
              "spec": {"containers": [{"name": "second", "image": "busybox:2"}]}}
    # Another manager takes the image over (force: it belongs to "me"); what "me" applied stays.
    got = await kube.call(
        core.patch_namespaced_pod, "p", ns, update, _content_type=apply, field_manager="other", force=True
    )
    assert [(c.name, c.image) for c in got.spec.containers] == [("first", "busybox"), ("second", "busybox:2")]
    assert got.metadata.labels == {"a": "1", "b": "2"}


async def test_events_live_in_the_namespace_of_what_they_are_about(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    node = {"kind": "Node", "name": kube.unique("node"), "apiVersion": "v1"}
    about_node = {"metadata": {"generateName": "n."}, "involvedObject": node, "reason": "R", "message": "m"}
    code, body = await _error(kube, core.create_namespaced_event, ns, about_node)
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "involvedObject.namespace"
    created = await kube.call(core.create_namespaced_event, "default", about_node)
    await kube.call(core.delete_namespaced_event, created.metadata.name, "default")
    about_pod = {"kind": "Pod", "name": "p", "namespace": ns, "apiVersion": "v1"}
    await kube.call(core.create_namespaced_event, ns, {**about_node, "involvedObject": about_pod})
    # events.k8s.io/v1 checks more, eventTime first; a generateName must itself be a valid prefix.
    path = f"/apis/events.k8s.io/v1/namespaces/{ns}/events"
    incomplete = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"generateName": "p."},
                  "regarding": about_pod, "reason": "R", "type": "Normal"}  # fmt: skip
    for extra, fields in (
        ({}, {"metadata.generateName", "eventTime"}),
        ({"metadata": {"generateName": "p-"}, "eventTime": "2026-12-01T00:00:00.000000Z"},
         {"reportingController", "reportingInstance", "action"}),
    ):  # fmt: skip
        code, _, body = await kube.post_json(path, {**incomplete, **extra})
        assert (code, body["reason"]) == (422, "Invalid")
        assert {c["field"] for c in body["details"]["causes"]} == fields


async def test_a_created_namespace_is_active_and_only_some_kinds_have_a_generation(kube: Endpoint) -> None:
    core, ns = client.CoreV1Api(kube.api), await kube.new_namespace()
    namespace = await kube.call(core.read_namespace, ns)
    assert (namespace.status.phase, namespace.spec.finalizers) == ("Active", ["kubernetes"])
    assert namespace.metadata.generation is None
    cm = await kube.call(core.create_namespaced_config_map, ns, {"metadata": {"name": "cm"}})
    pod = await kube.call(core.create_namespaced_pod, ns, _pod("p"))
    assert (cm.metadata.generation, pod.metadata.generation) == (None, 1)
    node = await kube.call(core.create_node, {"metadata": {"name": kube.unique("node")}})
    await kube.call(core.delete_node, node.metadata.name)
    assert node.metadata.generation is None

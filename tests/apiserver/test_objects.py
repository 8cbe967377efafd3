"""CRUD, errors, status subresources, selectors, binding and garbage collection, through the real
kubernetes client over HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from sharepack.sandbox.apiserver.server import FakeApiServer

GROUP, VERSION, PLURAL = "sharepack.io", "v1alpha1", "nodegpustates"


def _pod(name: str, *, node: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _ngs(name: str, owner_uid: str = "", status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": owner_uid}]
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeGpuState", "metadata": meta}
    if status is not None:
        body["status"] = status
    return body


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(client.ApiException) as info:
        await _call(fn, *args, **kwargs)
    return int(info.value.status), json.loads(info.value.body)


# -- create / get / list / delete, per type ------------------------------------------------------


@pytest.mark.parametrize("kind", ["node", "pod", "configmap", "core event", "nodegpustate"])
async def test_a_created_object_can_be_read_listed_and_deleted(api: client.ApiClient, kind: str) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ops: dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any], Callable[[], Any]]] = {
        "node": (
            lambda: core.create_node({"metadata": {"name": "n1"}}),
            lambda: core.read_node("n1"),
            lambda: core.list_node(),
            lambda: core.delete_node("n1"),
        ),
        "pod": (
            lambda: core.create_namespaced_pod("default", _pod("n1")),
            lambda: core.read_namespaced_pod("n1", "default"),
            lambda: core.list_namespaced_pod("default"),
            lambda: core.delete_namespaced_pod("n1", "default"),
        ),
        "configmap": (
            lambda: core.create_namespaced_config_map("default", {"metadata": {"name": "n1"}, "data": {"a": "b"}}),
            lambda: core.read_namespaced_config_map("n1", "default"),
            lambda: core.list_namespaced_config_map("default"),
            lambda: core.delete_namespaced_config_map("n1", "default"),
        ),
        "core event": (
            lambda: core.create_namespaced_event(
                "default", {"metadata": {"name": "n1"}, "involvedObject": {"kind": "Node", "name": "x"}, "reason": "R"}
            ),
            lambda: core.read_namespaced_event("n1", "default"),
            lambda: core.list_namespaced_event("default"),
            lambda: core.delete_namespaced_event("n1", "default"),
        ),
        "nodegpustate": (
            lambda: custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _ngs("n1")),
            lambda: custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1"),
            lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL),
            lambda: custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "n1"),
        ),
    }
    create, read, list_, delete = ops[kind]
    created = await _call(create)
    meta = created["metadata"] if isinstance(created, dict) else created.metadata.to_dict()
    assert meta["uid"] and meta["resource_version" if "resource_version" in meta else "resourceVersion"]
    got = await _call(read)
    got_meta = got["metadata"] if isinstance(got, dict) else got.metadata.to_dict()
    assert got_meta["uid"] == meta["uid"]
    listed = await _call(list_)
    items = listed["items"] if isinstance(listed, dict) else listed.items
    assert len(items) == 1
    await _call(delete)
    code, body = await _error(read)
    assert (code, body["reason"], body["kind"]) == (404, "NotFound", "Status")


# -- errors as Status bodies ---------------------------------------------------------------------


async def test_errors_come_back_as_status_bodies(api: client.ApiClient, server: FakeApiServer) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    await _call(core.create_node, {"metadata": {"name": "n1"}})
    await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n1"))
    stale = (await _call(core.read_node, "n1")).metadata.resource_version
    await _call(core.patch_node, "n1", {"metadata": {"labels": {"a": "b"}}})
    cases: list[tuple[str, Callable[[], Any], int, str]] = [
        ("reading a missing object", lambda: core.read_node("missing"), 404, "NotFound"),
        ("creating a duplicate", lambda: core.create_node({"metadata": {"name": "n1"}}), 409, "AlreadyExists"),
        (
            "updating with a stale resourceVersion",
            lambda: core.replace_node("n1", {"metadata": {"name": "n1", "resourceVersion": stale}}),
            409,
            "Conflict",
        ),
        ("creating with an invalid name", lambda: core.create_node({"metadata": {"name": "Bad_Name"}}), 422, "Invalid"),
        (
            "an ownerReference without uid",
            lambda: custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL,
                {**_ngs("n2"), "metadata": {"name": "n2", "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1"}]}},
            ),
            422,
            "Invalid",
        ),
        (
            "updating a custom object without resourceVersion",
            lambda: custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n1", _ngs("n1")),
            422,
            "Invalid",
        ),
        ("creating in a missing namespace", lambda: core.create_namespaced_pod("nowhere", _pod("p")), 404, "NotFound"),
        (
            "an unsupported field selector",
            lambda: core.list_pod_for_all_namespaces(field_selector="spec.nodeNam=x"),
            400,
            "BadRequest",
        ),
        (
            "a strategic merge patch on a custom object",
            lambda: custom.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, "n1", {"metadata": {}}, _content_type="application/strategic-merge-patch+json"
            ),
            415,
            "UnsupportedMediaType",
        ),
    ]
    for what, call, code, reason in cases:
        got_code, body = await _error(call)
        assert (got_code, body["reason"], body["code"]) == (code, reason, code), what
        assert body["kind"] == "Status" and body["status"] == "Failure", what


# -- status subresource, generation, no-op writes ------------------------------------------------


async def test_status_subresource_separates_status_from_the_rest(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    created = await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n1", status={"schemaVersion": 1}))
    assert "status" not in created, "create must drop status on a custom resource with a status subresource"
    assert created["metadata"]["generation"] == 1

    with_status = {**created, "status": {"schemaVersion": 2}}
    after_main = await _call(custom.replace_cluster_custom_object, GROUP, VERSION, PLURAL, "n1", with_status)
    assert "status" not in after_main, "a write to the main resource must ignore status"

    body = {**after_main, "metadata": {**after_main["metadata"], "labels": {"x": "y"}}, "status": {"schemaVersion": 3}}
    after_status = await _call(custom.replace_cluster_custom_object_status, GROUP, VERSION, PLURAL, "n1", body)
    assert after_status["status"] == {"schemaVersion": 3}
    assert "labels" not in after_status["metadata"], "a write to /status must ignore everything else"
    assert after_status["metadata"]["generation"] == 1, "status writes do not bump generation"

    # The CRD declares no spec: the server prunes it, so nothing changed and generation stays.
    patched = await _call(custom.patch_cluster_custom_object, GROUP, VERSION, PLURAL, "n1", {"spec": {"k": 1}})
    assert "spec" not in patched
    assert patched["metadata"]["generation"] == 1 and patched["status"] == {"schemaVersion": 3}


async def test_a_write_that_changes_nothing_keeps_the_resource_version(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n1"))
    first = await _call(custom.patch_cluster_custom_object_status, GROUP, VERSION, PLURAL, "n1", {"status": {"a": 1}})
    again = await _call(custom.patch_cluster_custom_object_status, GROUP, VERSION, PLURAL, "n1", {"status": {"a": 1}})
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


# -- selectors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field_selector", "label_selector", "expected"),
    [
        ("spec.nodeName=node-a", "", ["a1", "a2"]),
        ("spec.nodeName=", "", ["free"]),
        ("spec.nodeName!=node-a", "", ["b1", "free"]),
        ("", "app=web", ["a1", "b1"]),
        ("", "app in (web,db),tier!=front", ["a2", "b1"]),
        ("", "!app", ["free"]),
        ("spec.nodeName=node-a", "app=web", ["a1"]),
        ("metadata.name=b1", "", ["b1"]),
    ],
    ids=[
        "pods bound to a node",
        "unbound pods",
        "pods not on a node",
        "label equality",
        "label set and inequality",
        "label absence",
        "field and label together",
        "by name",
    ],
)
async def test_list_filters_pods_by_selectors(
    api: client.ApiClient, field_selector: str, label_selector: str, expected: list[str]
) -> None:
    core = client.CoreV1Api(api)
    pods = [
        _pod("a1", node="node-a", labels={"app": "web", "tier": "front"}),
        _pod("a2", node="node-a", labels={"app": "db"}),
        _pod("b1", node="node-b", labels={"app": "web"}),
        _pod("free"),
    ]
    for pod in pods:
        await _call(core.create_namespaced_pod, "default", pod)
    got = await _call(core.list_pod_for_all_namespaces, field_selector=field_selector, label_selector=label_selector)
    assert sorted(p.metadata.name for p in got.items) == expected


async def test_list_pages_with_limit_and_continue(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for i in range(5):
        await _call(core.create_namespaced_config_map, "default", {"metadata": {"name": f"cm{i}"}})
    names: list[str] = []
    token = None
    while True:
        page = await _call(core.list_namespaced_config_map, "default", limit=2, _continue=token)
        names += [c.metadata.name for c in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [f"cm{i}" for i in range(5)]


# -- binding -----------------------------------------------------------------------------------


async def test_binding_assigns_a_pod_once(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await _call(core.create_namespaced_pod, "default", _pod("p"))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-7"}}
    # The server answers a Status (as the real one does), which the client's V1Binding model
    # cannot hold: read it raw.
    raw = await _call(core.create_namespaced_pod_binding, "p", "default", binding, _preload_content=False)
    assert json.loads(raw.data)["status"] == "Success"
    pod = await _call(core.read_namespaced_pod, "p", "default")
    assert pod.spec.node_name == "node-7"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in pod.status.conditions)
    code, body = await _error(core.create_namespaced_pod_binding, "p", "default", binding, _preload_content=False)
    assert (code, body["reason"]) == (409, "Conflict")
    assert "already assigned to node" in body["message"]


async def test_pod_spec_is_immutable_on_update(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await _call(core.create_namespaced_pod, "default", _pod("p"))
    code, body = await _error(core.patch_namespaced_pod, "p", "default", {"spec": {"nodeName": "node-1"}})
    assert (code, body["reason"]) == (422, "Invalid")


# -- garbage collection, finalizers ------------------------------------------------------------


async def _wait_gone(fn: Callable[[], Any], timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await _call(fn)
        except client.ApiException as e:
            if e.status == 404:
                return
            raise
        assert asyncio.get_running_loop().time() < deadline, "object was not collected"
        await asyncio.sleep(0.02)


async def test_deleting_a_node_collects_its_node_gpu_state(api: client.ApiClient) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = await _call(core.create_node, {"metadata": {"name": "n1"}})
    other = await _call(core.create_node, {"metadata": {"name": "n2"}})
    await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n1", node.metadata.uid))
    await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n2", other.metadata.uid))
    await _call(core.delete_node, "n1")
    await _wait_gone(lambda: custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1"))
    assert (await _call(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, "n2"))["metadata"]["name"] == "n2"


async def test_an_object_whose_owner_does_not_exist_is_collected(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    await _call(custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, _ngs("n1", "0000-not-a-node"))
    await _wait_gone(lambda: custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1"))


async def test_finalizers_hold_deletion_until_removed(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await _call(core.create_namespaced_config_map, "default", {"metadata": {"name": "cm", "finalizers": ["x/y"]}})
    await _call(core.delete_namespaced_config_map, "cm", "default")
    held = await _call(core.read_namespaced_config_map, "cm", "default")
    assert held.metadata.deletion_timestamp is not None
    await _call(core.patch_namespaced_config_map, "cm", "default", {"metadata": {"finalizers": None}},
                _content_type="application/merge-patch+json")
    await _wait_gone(lambda: core.read_namespaced_config_map("cm", "default"))


# -- discovery ---------------------------------------------------------------------------------


async def test_discovery_lists_our_group_and_version(api: client.ApiClient) -> None:
    version = await _call(client.VersionApi(api).get_code)
    assert version.major == "1"
    groups = await _call(client.ApisApi(api).get_api_versions)
    assert "sharepack.io" in [g.name for g in groups.groups]
    core_versions = await _call(client.CoreApi(api).get_api_versions)
    assert core_versions.versions == ["v1"]
    listed = await _call(client.CustomObjectsApi(api).get_api_resources, GROUP, VERSION)
    assert {r.name for r in listed.resources} == {"nodegpustates", "nodegpustates/status"}

"""What `kubectl get` needs: discovery and the `meta.k8s.io/v1` Table with the CRD's printer
columns. The Table is checked through HTTP; kubectl itself runs when it is installed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import ClientSession
from kubernetes import client

from sharepack.common import state as gpustate
from sharepack.sandbox.apiserver import printers
from sharepack.sandbox.apiserver.server import FakeApiServer
from tests.conftest import kubectl

CRD = Path(__file__).parents[2] / "deploy" / "base" / "crds" / "nodegpustates.yaml"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
STATUS = {
    "schemaVersion": 1,
    "observedAt": "2026-11-30T03:00:00Z",
    "allocationPolicy": "packed",
    "summary": {"freeGpus": 3, "gpus": 4, "replicasUsed": 4, "replicasTotal": 16, "replicas": "4/16"},
}


async def _seed(api: client.ApiClient) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = await asyncio.to_thread(core.create_node, {"metadata": {"name": "gpu-1"}})
    owner = {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": node.metadata.uid}
    body = {"metadata": {"name": "gpu-1", "ownerReferences": [owner]}}
    obj = await asyncio.to_thread(
        custom.create_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, body
    )
    obj["status"] = STATUS
    await asyncio.to_thread(
        custom.replace_cluster_custom_object_status,
        gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, "gpu-1", obj,
    )  # fmt: skip
    pod = {
        "metadata": {"name": "p1"},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "busybox"}]},
    }
    await asyncio.to_thread(core.create_namespaced_pod, "default", pod)


async def _get(server: FakeApiServer, path: str, accept: str) -> Any:
    async with ClientSession() as s, s.get(server.url + path, headers={"Accept": accept}) as resp:
        assert resp.status == 200, await resp.text()
        return orjson.loads(await resp.read())


def test_the_nodegpustate_columns_are_the_crds_printer_columns() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    want = [
        (c["name"], c["type"], c["jsonPath"], c.get("priority", 0), c.get("description", ""))
        for c in version["additionalPrinterColumns"]
    ]
    got = [(c.name, c.type, c.json_path, c.priority, c.description) for c in printers.NODE_GPU_STATE_COLUMNS]
    assert got == want


CASES = {
    "nodegpustate list": (
        f"/apis/{gpustate.GROUP}/{gpustate.VERSION}/{gpustate.PLURAL}",
        ["Name", "Free GPUs", "Replicas", "Policy", "Schema", "Observed", "Age"],
        ["gpu-1", 3, "4/16", "packed", 1],
    ),
    "one nodegpustate": (
        f"/apis/{gpustate.GROUP}/{gpustate.VERSION}/{gpustate.PLURAL}/gpu-1",
        ["Name", "Free GPUs", "Replicas", "Policy", "Schema", "Observed", "Age"],
        ["gpu-1", 3, "4/16", "packed", 1],
    ),
}


@pytest.mark.parametrize(("path", "columns", "first_cells"), CASES.values(), ids=CASES.keys())
async def test_a_table_request_gets_printer_columns_and_row_metadata(
    api: client.ApiClient, server: FakeApiServer, path: str, columns: list[str], first_cells: list[Any]
) -> None:
    await _seed(api)
    doc = await _get(server, path, TABLE)
    assert (doc["kind"], doc["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in doc["columnDefinitions"]] == columns
    (row,) = doc["rows"]
    assert row["cells"][: len(first_cells)] == first_cells
    assert len(row["cells"]) == len(columns)
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == first_cells[0]


async def test_a_table_watch_streams_one_row_tables(api: client.ApiClient, server: FakeApiServer) -> None:
    await _seed(api)
    url = f"{server.url}/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1"
    async with ClientSession() as s, s.get(url, headers={"Accept": TABLE}) as resp:
        events = [orjson.loads(line) async for line in resp.content if line.strip()]
    assert [e["type"] for e in events] == ["ADDED"]
    table = events[0]["object"]
    assert table["kind"] == "Table" and [r["cells"][:3] for r in table["rows"]] == [["p1", "0/1", "Pending"]]


async def test_a_plain_json_request_still_gets_the_object(api: client.ApiClient, server: FakeApiServer) -> None:
    await _seed(api)
    doc = await _get(server, f"/apis/{gpustate.GROUP}/{gpustate.VERSION}/{gpustate.PLURAL}", "application/json")
    assert doc["kind"] == "NodeGpuStateList"


AGES = {"seconds": (45, "45s"), "minutes": (330, "5m30s"), "hours": (3 * 3600 + 600, "3h10m"), "days": (50 * 86400, "50d")}


@pytest.mark.parametrize(("seconds", "text"), AGES.values(), ids=AGES.keys())
def test_ages_print_as_kubectl_prints_them(seconds: int, text: str) -> None:
    assert printers.human_age(seconds) == text


async def test_kubectl_get_prints_the_printer_columns(
    api: client.ApiClient, server: FakeApiServer, tmp_short: Path
) -> None:
    await _seed(api)
    kubeconfig = server.write_kubeconfig(tmp_short / "kubectl-config")
    proc = await asyncio.create_subprocess_exec(
        kubectl(), "--kubeconfig", str(kubeconfig), "get", "nodegpustates,pods",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(tmp_short), "PATH": "/usr/local/bin:/usr/bin:/bin"},
    )  # fmt: skip
    out_b, err_b = await asyncio.wait_for(proc.communicate(), timeout=30)
    out, err = out_b.decode(), err_b.decode()
    assert proc.returncode == 0, err
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "FREE", "GPUS", "REPLICAS", "POLICY", "AGE"], out
    assert lines[1][:4] == ["nodegpustate.sharepack.io/gpu-1", "3", "4/16", "packed"], out
    assert lines[2] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], out
    assert lines[3][:4] == ["pod/p1", "0/1", "Pending", "0"], out

"""`sharepack-demo --control-plane real --mode dra`: the demo's two stacks in the DRA mode (deploy/dra
applied, agents as DRA kubelet plugins, kube-scheduler allocating, the extender `--mode dra`)
end with every full-GPU pod on a whole GPU under `packed` and none under `distributed`, and the
stack it leaves running (`--keep-running`) shows the shared devices and the allocated claims to
the kubectl command it prints. `--mode dra` without the real control plane is a usage error."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sharepack.common import draslices
from sharepack.sandbox.drivers import demo
from tests.conftest import real_binaries
from tests.scenario.harness import demo_in_its_own_group, processes_mentioning
from tests.scenario.test_demo import PLACED, USER_POD, read_until

NODES = ("node-0", "node-1", "node-2")  # the demo's default: 3 nodes of 4 GPUs x 4 replicas


def test_the_dra_mode_without_the_real_control_plane_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--mode", "dra"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--mode dra needs --control-plane real" in err and "resource.k8s.io" in err, err


@pytest.mark.timeout(480)
def test_the_dra_demo_packs_whole_gpus_and_kubectl_shows_slices_and_allocated_claims() -> None:
    real_binaries()  # a skip, or under SHAREPACK_REQUIRE_REAL a failure, when not built
    with demo_in_its_own_group(["--control-plane", "real", "--mode", "dra", "--keep-running"]) as (proc, roots):
        check_dra_demo_then_interrupt(proc, roots)


def check_dra_demo_then_interrupt(proc: subprocess.Popen[bytes], roots: list[Path]) -> None:
    out = read_until(proc, "Ctrl-C to stop", timeout=420)
    # The two lines, in this order, and the picture between them.
    assert PLACED.findall(out) == [("distributed", "0", "6"), ("packed", "6", "6")], out
    assert "distributed: full-GPU pods placed 0/6\npacked: full-GPU pods placed 6/6" in out, out
    assert re.search(r"GPU\d+ [\u2588\u2591]+ \d+/\d+", out), out
    found = re.search(r"kubeconfig: (\S+)", out)
    printed = re.search(r"try: (\S+) --kubeconfig (\S+) get resourceslices,resourceclaims -A$", out, re.M)
    assert found and printed, out
    kubeconfig = Path(found.group(1))
    assert Path(printed.group(2)) == kubeconfig, out
    roots.append(kubeconfig.parent)
    kubectl = printed.group(1)

    def run(*args: str, stdin: str | None = None) -> str:
        got = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True, text=True,
            timeout=30, env={"HOME": str(kubeconfig.parent), "PATH": os.environ["PATH"]},
        )  # fmt: skip
        assert got.returncode == 0, f"kubectl {' '.join(args)}: {got.stderr}"
        return got.stdout

    # The printed command as a user runs it: every node's slice, and the claims allocated and
    # reserved for the packed stack's 18 pods (12 shared, 6 full-GPU).
    table = run("get", "resourceslices,resourceclaims", "-A")
    for node in NODES:
        assert re.search(rf"^\s*resourceslice\.resource\.k8s\.io/{node}-gpu\.sharepack\.io-\d+\s+{node}\s", table, re.M), table
    claims_shown = re.findall(r"^default\s+resourceclaim\.resource\.k8s\.io/\S+\s+allocated,reserved\s", table, re.M)
    assert len(claims_shown) == 18, table

    # The same objects in full: shared devices (one per replica, 4 per GPU, 16 per node), and
    # claims holding them for their pods.
    doc: dict[str, Any] = json.loads(run("get", "resourceslices,resourceclaims", "-A", "-o", "json"))
    slices = [o for o in doc["items"] if o["kind"] == "ResourceSlice"]
    claims = [o for o in doc["items"] if o["kind"] == "ResourceClaim"]
    for node in NODES:
        devices = draslices.pool_devices(slices, node)
        assert devices is not None, f"no complete pool of slices for {node}"
        assert len(devices) == 16 and all(d.type is draslices.DeviceType.SHARED for d in devices)
        assert len({d.gpu for d in devices}) == 4
    held = [h for c in claims for h in draslices.claim_holdings(c)]
    assert len({h.pods for h in held}) == 18 and all(len(h.pods) == 1 for h in held)
    assert len(held) == 12 * 1 + 6 * 4  # one device per replica asked
    on_one_gpu = 0
    for c in claims:
        holdings = draslices.claim_holdings(c)
        if len(holdings) == 4:  # a full-GPU pod: its 4 replicas are one GPU's (packed: 6/6)
            by_name = {d.name: d for d in draslices.pool_devices(slices, holdings[0].pool) or ()}
            on_one_gpu += len({by_name[h.device].gpu for h in holdings}) == 1
    assert on_one_gpu == 6
    pods = json.loads(run("get", "pods", "-o", "json"))["items"]
    assert len(pods) == 18 and all(p["status"]["phase"] == "Running" for p in pods)
    # A pod the user applies, unchanged from the device-plugin mode, gets a claim the scheduler
    # allocated from a node's slice, and runs.
    run("apply", "-f", "-", stdin=USER_POD)
    deadline = time.monotonic() + 60
    while (pod := json.loads(run("get", "pod", "user-pod", "-o", "json")))["status"].get("phase") != "Running":
        assert time.monotonic() < deadline, f"user-pod is not Running: {pod['status']}"
        time.sleep(0.2)
    mine = json.loads(run("get", "resourceclaim", pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"], "-o", "json"))
    (holding,) = draslices.claim_holdings(mine)
    assert holding.pool == pod["spec"]["nodeName"] and holding.pods == (pod["metadata"]["uid"],)
    assert processes_mentioning(roots), "the stack is not running: the checks above saw nothing"

    os.killpg(proc.pid, signal.SIGINT)
    _, err_bytes = proc.communicate(timeout=60)
    err = err_bytes.decode(errors="replace")
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert processes_mentioning(roots) == []
    assert not roots[0].exists()

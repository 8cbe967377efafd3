"""`sharepack-demo` itself: its run (both policies, the real processes), its error paths, and
that it leaves nothing behind (no child processes, no sockets, no temp dirs)."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sharepack.common import state as gpustate
from sharepack.sandbox.drivers import demo
from tests.conftest import REQUIRE_REAL, kubectls, real_binaries
from tests.scenario.harness import children, demo_in_its_own_group, processes_mentioning, unix_sockets_under

pytestmark = pytest.mark.timeout(150)

PLACED = re.compile(r"^(\w+): full-GPU pods placed (\d+)/(\d+)$", re.M)


@pytest.fixture
def sandbox_dirs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The temp dirs the demo makes (each policy's sandbox, each node's kubelet root)."""
    made: list[Path] = []
    real = tempfile.mkdtemp

    def recording(*args: Any, **kwargs: Any) -> str:
        path: str = real(*args, **kwargs)
        made.append(Path(path))
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", recording)  # the module the demo calls it through
    return made


def test_the_demo_places_every_full_gpu_pod_under_packed_and_none_under_distributed(
    sandbox_dirs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = children(os.getpid())
    rc = demo.main(["--nodes", "1", "--policy", "distributed,packed"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = PLACED.findall(out)
    results = {policy: (int(x), int(y)) for policy, x, y in lines}
    assert [policy for policy, _, _ in lines] == ["distributed", "packed"], out
    (x, y), (lost, total) = results["packed"], results["distributed"]
    assert y > 0 and x == y, out
    assert (lost, total) == (0, y), out
    # The picture: one bar per GPU after the shared wave, e.g. "GPU0 ████ 4/4".
    assert re.search(r"GPU\d+ [\u2588\u2591]+ \d+/\d+", out), out

    # Nothing left behind: the agents and the extender are reaped, no socket is still bound,
    # and every temp dir is gone.
    assert children(os.getpid()) <= before
    assert sandbox_dirs, "the demo made no temp dirs: this test no longer sees what it checks"
    assert processes_mentioning(sandbox_dirs) == []
    assert unix_sockets_under(sandbox_dirs) == []
    assert [p for p in sandbox_dirs if p.exists()] == []


DGX_WORKLOAD = "replicas: 4\nwaves:\n- {name: shared, count: 6, replicas: 1}\n- {name: full-gpu, count: 2, replicas: 4}\n"
BAR = re.compile(r"GPU(\d+) [\u2588\u2591]+ (\d+)/(\d+)")


@pytest.mark.parametrize("machine", ["dgx-a100", "dgx-h100"])
def test_the_demo_runs_two_nodes_of_the_advertised_dgx_machines(
    machine: str, sandbox_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README advertises these machines; a small workload keeps the run short (8-GPU nodes
    # would otherwise get 16 shared and 8 full-GPU pods per policy).
    workload = tmp_path / "workload.yaml"
    workload.write_text(DGX_WORKLOAD)
    before = children(os.getpid())
    rc = demo.main(["--nodes", "2", "--machine", machine, "--policy", "packed", "--workload", str(workload)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"2 nodes ({machine}, 8 GPUs x 4 replicas)" in out, out
    # The picture after the shared wave: both nodes, eight GPUs each, the six replicas on them.
    rows = [line for line in out.splitlines() if line.lstrip().startswith(("node-0 ", "node-1 "))]
    assert [row.split()[0] for row in rows] == ["node-0", "node-1"], out
    bars = [[(int(g), int(used), int(total)) for g, used, total in BAR.findall(row)] for row in rows]
    assert [[g for g, _, _ in row] for row in bars] == [list(range(8))] * 2, out
    assert all(total == 4 for row in bars for _, _, total in row), out
    assert sum(used for row in bars for _, used, _ in row) == 6, out
    assert out.count(": a whole GPU") == 2 and PLACED.findall(out) == [("packed", "2", "2")], out
    assert children(os.getpid()) <= before
    assert processes_mentioning(sandbox_dirs) == []
    assert unix_sockets_under(sandbox_dirs) == []
    assert [p for p in sandbox_dirs if p.exists()] == []


BAD_WORKLOADS = {
    "missing-file": (None, "No such file"),
    "not-yaml": ("replicas: [1,\n", "invalid workload file"),
    "not-a-mapping": ("- 1\n- 2\n", "expected a mapping with replicas and waves"),
    "no-waves": ("replicas: 4\n", "no waves"),
    "zero-replicas": ("replicas: 0\nwaves: [{count: 1}]\n", "replicas must be a positive integer, got 0"),
    "wave-too-big": ("replicas: 2\nwaves: [{count: 1, replicas: 3}]\n", "waves[0].replicas must be 1..2, got 3"),
    "negative-count": ("waves: [{count: -1}]\n", "waves[0].count must be >= 0, got -1"),
}


@pytest.mark.parametrize(("text", "expected"), BAD_WORKLOADS.values(), ids=BAD_WORKLOADS.keys())
def test_a_bad_workload_file_is_a_clear_error_and_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, expected: str
) -> None:
    path = tmp_path / "workload.yaml"
    if text is not None:
        path.write_text(text)
    before = children(os.getpid())
    rc = demo.main(["--nodes", "1", "--workload", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert err.startswith(f"sharepack-demo: invalid workload file {path}: "), err
    assert expected in err
    assert "Traceback" not in err
    assert PLACED.search(out) is None  # refused before any sandbox ran
    assert children(os.getpid()) <= before


def test_an_unknown_machine_fails_fast_naming_it_and_leaves_nothing_behind(
    sandbox_dirs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before = children(os.getpid())
    rc = demo.main(["--nodes", "2", "--policy", "packed", "--machine", "no-such-machine"])
    _, err = capsys.readouterr()
    assert rc == 1, err
    assert err.startswith("sharepack-demo: node node-"), err
    assert "the agent exited with code 1" in err and "invalid simulated machine no-such-machine" in err, err
    assert "Traceback" not in err
    # "exited with code 1" is reported only when the exit beats the agent start timeout
    # (sandbox.nodes), so the demo did not wait that out; no stopwatch needed.
    assert children(os.getpid()) <= before
    assert processes_mentioning(sandbox_dirs) == []
    assert unix_sockets_under(sandbox_dirs) == []
    assert [p for p in sandbox_dirs if p.exists()] == []


VALID_POLICIES = "(choose from distributed, packed, spread)"
BAD_ARGS = {
    "policy-typo": (["--policy", "spreadd"], ("invalid --policy option: spreadd", VALID_POLICIES)),
    "policy-typo-in-list": (["--policy", "packed,spreadd"], ("packed,spreadd", VALID_POLICIES)),
    "zero-nodes": (["--nodes", "0"], ("--nodes must be at least 1, got 0",)),
    "nodes-not-a-number": (["--nodes", "two"], ("argument --nodes: invalid int value: 'two'",)),
}


@pytest.mark.parametrize(("argv", "expected"), BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_bad_options_are_usage_errors_naming_the_value(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        demo.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: sharepack-demo"), err
    assert all(e in err for e in expected), err


def read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """Stdout of `proc` up to `marker`; fails when it exits first or after `timeout`.

    Reads the raw pipe (a buffered reader would hide data from the selector)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while marker.encode() not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {timeout:.0f} s:\n{seen.decode(errors='replace')}"
            if sel.select(left):
                chunk = os.read(fd, 65536)
                assert chunk, f"the demo exited ({proc.wait()}) before {marker!r}:\n{seen.decode(errors='replace')}"
                seen += chunk
    return seen.decode()


SMALL_WORKLOAD = """\
replicas: 2
waves:
- {name: one, count: 2, replicas: 1}
- {name: whole, count: 1, replicas: 2}
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("control_plane", demo.CONTROL_PLANES)
def test_keep_running_serves_a_cluster_a_user_drives_and_ctrl_c_stops_everything(
    tmp_path: Path, control_plane: str
) -> None:
    if control_plane == demo.REAL:
        real_binaries()
    workload = tmp_path / "workload.yaml"
    workload.write_text(SMALL_WORKLOAD)
    argv = [
        "--nodes", "1", "--policy", "packed", "--workload", str(workload), "--keep-running",
        f"--control-plane={control_plane}",
    ]  # fmt: skip
    # Ctrl-C reaches the whole foreground process group: the demo and its agents and extender.
    with demo_in_its_own_group(argv) as (proc, roots):
        drove = check_keep_running_then_interrupt(proc, roots)
    if not drove:
        pytest.skip("no kubectl on PATH and none built: the user-drives-the-cluster block did not run")


def check_keep_running_then_interrupt(proc: subprocess.Popen[bytes], roots: list[Path]) -> bool:
    """True when the user-drives-the-cluster block ran (it needs a kubectl)."""
    out = read_until(proc, "Ctrl-C to stop", timeout=120)
    assert "one: 2 pods x 1 replica(s)" in out and "default/whole-0 -> node-0: a whole GPU" in out, out
    assert PLACED.findall(out) == [("packed", "1", "1")], out  # the results, before the wait
    found = re.search(r"kubeconfig: (\S+)", out)
    assert found, out
    kubeconfig = Path(found.group(1))
    root = kubeconfig.parent
    roots.append(root)

    # What `kubectl --kubeconfig ... get nodegpustates,pods` reads, through the same client.
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    with api:
        custom: Any = kubernetes.client.CustomObjectsApi(api)
        states = custom.list_cluster_custom_object(gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL)
        assert [o["metadata"]["name"] for o in states["items"]] == ["node-0"]
        core: Any = kubernetes.client.CoreV1Api(api)
        pods = core.list_namespaced_pod(demo.NAMESPACE).items
        assert sorted(p.metadata.name for p in pods) == ["one-0", "one-1", "whole-0"]
        assert all(p.spec.node_name == "node-0" and p.status.phase == "Running" for p in pods)
    printed = re.search(r"try: (\S+) --kubeconfig", out)
    assert printed, out
    # The command the demo prints, as a user would run it; on the in-process control plane,
    # with the built kubectl when none is on PATH. None at all: a failure under
    # SHAREPACK_REQUIRE_REAL, else the test skips once the rest is checked.
    kubectl = shutil.which(printed.group(1)) or next(iter(kubectls()), None)
    if kubectl is None and os.environ.get(REQUIRE_REAL):
        pytest.fail(f"no kubectl to drive the cluster with ({printed.group(1)} is not on PATH, and none is built)")
    if kubectl is not None:
        def run(*args: str, stdin: str | None = None) -> str:
            got = subprocess.run(
                [kubectl, "--kubeconfig", str(kubeconfig), *args], input=stdin,
                capture_output=True, text=True, timeout=30, env={"HOME": str(root), "PATH": os.environ["PATH"]},
            )  # fmt: skip
            assert got.returncode == 0, f"kubectl {' '.join(args)}: {got.stderr}"
            return got.stdout

        got = run("get", "nodegpustates,pods")
        assert re.search(r"^nodegpustate\.sharepack\.io/node-0\s+\d+\s+\d+/\d+\s+packed\s", got, re.M), got
        assert re.search(r"^pod/whole-0\s+1/1\s+Running\s", got, re.M), got
        assert re.search(r"^node-0\s+Ready\s+\S+\s+\S+\s+v1\.\d+\.\d+", run("get", "nodes"), re.M)
        # A pod the user applies is scheduled, admitted and counted like the demo's own.
        run("apply", "-f", "-", stdin=USER_POD)
        wait_counted(api_for(kubeconfig), "user-pod")
        described = run("describe", "pod", "user-pod")
        assert "Successfully assigned default/user-pod to node-0" in described, described
        assert re.search(r"^KIND:\s+Pod$", run("explain", "pods"), re.M)
        assert run("auth", "can-i", "create", "pods").strip() == "yes"
        assert re.search(r"\sScheduled\s+pod/user-pod\s", run("get", "events"), re.M)
        # The explain command the demo prints, through the extender's mutual TLS.
        printed_explain = re.search(r"explain a pod: sharepack (.*)$", out, re.M)
        assert printed_explain, out
        args = printed_explain.group(1).replace(" POD ", " user-pod ").split()
        explained = subprocess.run(
            [sys.executable, "-m", "sharepack.cli", *args, "-o", "json"], capture_output=True, text=True, timeout=60
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert json.loads(explained.stdout)["boundTo"] == "node-0"
    assert processes_mentioning([root]), "the stack is not running: the checks below see nothing"

    os.killpg(proc.pid, signal.SIGINT)
    _, err_bytes = proc.communicate(timeout=30)
    err = err_bytes.decode(errors="replace")
    assert proc.returncode == 130, err
    assert "interrupted: sandbox stopped" in err
    assert "Traceback" not in err
    assert processes_mentioning([root]) == []
    assert unix_sockets_under([root]) == []
    assert not root.exists()
    return kubectl is not None


USER_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: user-pod, namespace: default}
spec:
  containers:
  - name: main
    image: busybox
    resources: {limits: {nvidia.com/gpu.shared: "1"}}
"""


def api_for(kubeconfig: Path) -> Any:
    return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def wait_counted(api: Any, name: str, timeout: float = 60) -> None:
    """Until the pod runs and its node's NodeGpuState lists it."""
    with api:
        core: Any = kubernetes.client.CoreV1Api(api)
        custom: Any = kubernetes.client.CustomObjectsApi(api)
        deadline = time.monotonic() + timeout
        while True:
            pod = core.read_namespaced_pod(name, demo.NAMESPACE)
            if pod.status.phase == "Running" and pod.spec.node_name:
                state = custom.get_cluster_custom_object(
                    gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, pod.spec.node_name
                )
                held = {uid for r in state["status"]["resources"] for g in r["gpus"] for uid in g["pods"]}
                if pod.metadata.uid in held:
                    return
            assert time.monotonic() < deadline, f"pod {name} was not scheduled, run and counted: {pod.status}"
            time.sleep(0.2)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigterm_mid_run_stops_the_stack_like_ctrl_c() -> None:
    demo_cmd = [sys.executable, "-m", "sharepack.sandbox.drivers.demo", "--nodes", "1", "--policy", "packed"]
    stack: dict[int, str] = {}
    root: Path | None = None
    with subprocess.Popen(
        demo_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:  # fmt: skip
        try:
            read_until(proc, "   up in ", timeout=60)  # the stack is up; the stream starts
            stack = {pid: cmdline(pid) for pid in children(proc.pid)}
            found = re.search(r"--kubeconfig=(\S+)", " ".join(stack.values()))
            assert found, stack
            root = Path(found.group(1)).parent
            assert len(processes_mentioning([root])) == 2  # the agent and the extender

            proc.send_signal(signal.SIGTERM)  # `kill PID`, a supervisor, `timeout`
            _, err_bytes = proc.communicate(timeout=30)
            err = err_bytes.decode(errors="replace")
            assert proc.returncode == 143, err
            assert "terminated: sandbox stopped" in err
            assert processes_mentioning([root]) == []
            assert not root.exists()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pid, line in stack.items():  # orphans of a demo that died: ours to stop
                if line and cmdline(pid) == line:
                    os.kill(pid, signal.SIGKILL)
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)

"""The real control plane on loopback: etcd, kube-apiserver and kube-scheduler, built by
sandbox.kubebuild from their released Go modules.

kube-apiserver runs as a cluster runs it: TLS with a cluster CA, client-certificate and
service-account-token authentication, `Node,RBAC` authorization with the NodeRestriction and
ValidatingAdmissionPolicy admission plugins, and a service-account issuer, so TokenRequest works
and tokens bound to a pod carry that pod's node name. Two things differ from a cluster, because
no kube-controller-manager runs here: the `default` service account of a namespace is created by
`ensure_namespace` rather than by its controller, and TaintNodesByCondition is off (it taints
every new Node `not-ready`, and only the node lifecycle controller lifts the taint).

Every child runs under `setpriv --pdeathsig KILL`: when the owning process dies, however it dies,
the kernel kills the children, so no etcd or kube-apiserver outlives a test run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import urllib3
import yaml

from sharepack.sandbox.controlplane import kubebuild, pki
from sharepack.sandbox.controlplane.kubebuild import Binaries, ControlPlaneUnavailable
from sharepack.sandbox.processes import LoggedProcess

log = logging.getLogger(__name__)

__all__ = [
    "TRANSIENT_API_ERRORS", "BackgroundControlPlane", "ControlPlaneUnavailable", "RealControlPlane", "free_port",
    "write_kubeconfig",
]

# What the kubernetes client raises when the API server is away (a restart, an outage), beside
# the ApiException of an answer: callers that outlive outages retry on these.
TRANSIENT_API_ERRORS: tuple[type[Exception], ...] = (
    kubernetes.client.ApiException, OSError, urllib3.exceptions.HTTPError,
)
READY_TIMEOUT_S = 120.0
ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.96.0.0/16"
APISERVER_HOSTS = (
    "127.0.0.1", "localhost", "10.96.0.1",
    "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
)  # fmt: skip
ADMIN = "sharepack-admin"
SCHEDULER_USER = "system:kube-scheduler"
DEPLOY_DIR = Path(__file__).resolve().parents[3] / "deploy"
SCHEDULER_CONFIG = DEPLOY_DIR / "scheduler" / "kube-scheduler-config.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(
    path: Path,
    server: str,
    *,
    ca: bytes | None = None,
    client: pki.KeyPair | None = None,
    token: str | None = None,
    context: str = "sandbox",
) -> Path:
    """A kubeconfig with the credentials inline, so it stays valid wherever it is copied."""
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    user: dict[str, Any] = {}
    if client is not None:
        user["client-certificate-data"] = base64.b64encode(client.cert_pem()).decode()
        user["client-key-data"] = base64.b64encode(client.key_pem()).decode()
    if token is not None:
        user["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": user}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def api_client(kubeconfig: Path) -> Any:
    """A kubernetes.client.ApiClient for a kubeconfig (the sandbox holds it untyped)."""
    conf = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)  # type: ignore[no-untyped-call]
    return kubernetes.client.ApiClient(conf)


def scheduler_config(
    extender_url: str, kubeconfig: Path, *, tls: Mapping[str, str] | None = None, source: Path = SCHEDULER_CONFIG
) -> dict[str, Any]:
    """deploy/scheduler's KubeSchedulerConfiguration as shipped, with only the extender's URL,
    the client kubeconfig and (when the extender serves TLS) the certificate paths filled in."""
    doc: dict[str, Any] = yaml.safe_load(source.read_text())
    doc.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    for extender in doc.get("extenders") or []:
        extender["urlPrefix"] = extender_url
        if tls is not None:
            extender["enableHTTPS"] = True
            extender["tlsConfig"] = {**(extender.get("tlsConfig") or {}), **tls}
        else:  # an extender serving plain HTTP: the shipped certificate paths exist on no host here
            extender["enableHTTPS"] = False
            extender.pop("tlsConfig", None)
    return doc


class RealControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) in `workdir`; an async context manager."""

    def __init__(
        self, workdir: Path | None = None, *, binaries: Binaries | None = None, apiserver_args: Sequence[str] = ()
    ) -> None:
        """`apiserver_args`: added to kube-apiserver's flags (tests: `--watch-cache-sizes=pods#0`
        sends pod watches to etcd, so `expire_watch_history` can make a version too old)."""
        self._extra_apiserver_args = list(apiserver_args)
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="sp-kube-", dir="/tmp"))
        self._binaries = binaries
        self.authority: pki.Authority | None = None
        self.etcd: LoggedProcess | None = None
        self.apiserver: LoggedProcess | None = None
        self.scheduler: LoggedProcess | None = None
        self.port = 0
        self.etcd_port = 0
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self._apiserver_args: list[str] = []
        self.scheduler_metrics_url = ""
        self._supervisor: asyncio.Task[None] | None = None
        self.scheduler_restarts = 0

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            raise ControlPlaneUnavailable("the control plane was not started")
        return self._binaries

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def version(self) -> str:
        return self.binaries.kubernetes_version

    async def __aenter__(self) -> RealControlPlane:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._binaries is None:
            self._binaries = await asyncio.to_thread(kubebuild.build)
        self.authority = authority = pki.Authority(self.workdir / "pki")
        serving = authority.issue("apiserver", "kube-apiserver", hosts=APISERVER_HOSTS, client=False, server=True)
        sa = pki.signing_key(authority.directory)
        admin = authority.issue("admin", ADMIN, organizations=("system:masters",))
        write_kubeconfig(self.kubeconfig, "", ca=authority.ca.cert_pem(), client=admin)  # server set below
        await self._start_etcd()
        self.port = free_port()
        self._apiserver_args = [
            str(self.binaries.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            "--advertise-address=127.0.0.1",
            # The endpoint reconciler would publish the advertise address in the `kubernetes`
            # Service's endpoints, which reject loopback addresses; nothing here uses them.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={authority.ca.cert}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *self._extra_apiserver_args,
        ]  # fmt: skip
        await self._start_apiserver()
        write_kubeconfig(self.kubeconfig, self.url, ca=authority.ca.cert_pem(), client=admin)
        await self.ensure_namespace("default")

    async def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        data = self.workdir / "etcd"
        self.etcd = LoggedProcess(
            [
                str(self.binaries.path("etcd")), "--name=sandbox", f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=sandbox=http://127.0.0.1:{peer}",
                # A test cluster: losing the last writes on a machine crash does not matter, and
                # fsync on a shared disk is what makes etcd slow.
                "--unsafe-no-fsync", "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )  # fmt: skip
        await self.etcd.start()
        await self._wait_ready(self.etcd, f"http://127.0.0.1:{self.etcd_port}/health", "etcd", ssl_context=None)

    async def _start_apiserver(self) -> None:
        self.apiserver = LoggedProcess(self._apiserver_args, self.workdir / "kube-apiserver.log")
        await self.apiserver.start()
        await self._wait_ready(self.apiserver, f"{self.url}/readyz", "kube-apiserver", ssl_context=self.admin_ssl())

    async def expire_watch_history(self) -> str:
        """A resourceVersion a watch can no longer start from: the current one, after which etcd
        is compacted past it (as its periodic compaction does). Watches the API server serves
        from its watch cache keep answering from there; see `apiserver_args`."""
        old = await self._current_revision()
        async with aiohttp.ClientSession() as session:
            await self.ensure_namespace(f"expire-{old}")  # a write, so the revision moves past `old`
            new = await self._current_revision()
            url = f"http://127.0.0.1:{self.etcd_port}/v3/kv/compaction"
            async with session.post(url, json={"revision": str(new), "physical": True}) as resp:
                if resp.status != 200:
                    raise ControlPlaneUnavailable(f"etcd compaction at {url} failed: HTTP {resp.status}")
        return str(old)

    async def _current_revision(self) -> int:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{self.etcd_port}/v3/kv/range"
            async with session.post(url, json={"key": "AA=="}) as resp:  # any key: the header has the revision
                doc = await resp.json(content_type=None)
        return int(doc["header"]["revision"])

    async def restart_apiserver(self, downtime: float = 0.0) -> None:
        """Stop kube-apiserver and start it again on the same port; etcd keeps the data."""
        await self.stop_apiserver()
        await asyncio.sleep(downtime)
        await self.start_apiserver()

    async def stop_apiserver(self) -> None:
        """An outage: kube-apiserver stops (nothing listens on its port) until `start_apiserver`."""
        apiserver, self.apiserver = self.apiserver, None
        if apiserver is not None:
            await apiserver.stop()

    async def start_apiserver(self) -> None:
        """kube-apiserver again on the same port, once ready; etcd kept the data."""
        await self._start_apiserver()

    async def stop(self) -> None:
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        for name in ("scheduler", "apiserver", "etcd"):
            process: LoggedProcess | None = getattr(self, name)
            setattr(self, name, None)
            if process is not None:
                await process.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def admin_ssl(self) -> ssl.SSLContext:
        assert self.authority is not None
        context = ssl.create_default_context(cafile=str(self.authority.ca.cert))
        admin = pki.KeyPair(self.authority.directory / "admin.crt", self.authority.directory / "admin.key")
        context.load_cert_chain(str(admin.cert), str(admin.key))
        return context

    async def _wait_ready(
        self, process: LoggedProcess, url: str, what: str, *, ssl_context: ssl.SSLContext | None
    ) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if process.exited:
                    raise ControlPlaneUnavailable(_exit_message(what, process))
                try:
                    async with session.get(url, ssl=ssl_context if ssl_context else False) as resp:
                        if resp.status == 200:
                            return
                        last = f"HTTP {resp.status}: {(await resp.text())[-300:]}"
                except (aiohttp.ClientError, OSError) as e:
                    last = str(e)
                await asyncio.sleep(0.2)
        raise ControlPlaneUnavailable(
            f"{what} did not become ready at {url} within {READY_TIMEOUT_S:.0f} s ({last}); "
            f"its log: {process.log_path}"
        )

    # -- identities ------------------------------------------------------------------------

    def client_kubeconfig(self, filename: str, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as `user` in `groups` with a client certificate."""
        assert self.authority is not None
        pair = self.authority.issue(filename, user, organizations=tuple(groups))
        return write_kubeconfig(
            self.workdir / f"{filename}.kubeconfig", self.url, ca=self.authority.ca.cert_pem(), client=pair
        )

    def node_kubeconfig(self, node: str) -> Path:
        """The credentials a kubelet has: `system:node:<name>` in `system:nodes`."""
        return self.client_kubeconfig(f"node-{node}", f"system:node:{node}", ("system:nodes",))

    def token_kubeconfig(self, filename: str, token: str) -> Path:
        assert self.authority is not None
        return write_kubeconfig(
            self.workdir / f"{filename}.kubeconfig", self.url, ca=self.authority.ca.cert_pem(), token=token
        )

    async def ensure_namespace(self, name: str) -> None:
        """The namespace and its `default` service account (kube-controller-manager's job in a
        cluster: without the account, the ServiceAccount admission refuses every pod)."""
        api = api_client(self.kubeconfig)
        core: Any = kubernetes.client.CoreV1Api(api)
        try:
            for create, args in (
                (core.create_namespace, ({"metadata": {"name": name}},)),
                (core.create_namespaced_service_account, (name, {"metadata": {"name": "default"}})),
            ):
                try:
                    await asyncio.to_thread(create, *args)
                except kubernetes.client.ApiException as e:
                    if e.status != 409:
                        raise
        finally:
            api.close()

    async def service_account_token(
        self, namespace: str, account: str, *, bound_pod: tuple[str, str] | None = None, seconds: int = 86400
    ) -> str:
        """TokenRequest for a service account; bound to a pod (name, uid) when given, as the
        kubelet asks for a pod's projected token, so the token carries the pod's node name."""
        api = api_client(self.kubeconfig)
        core: Any = kubernetes.client.CoreV1Api(api)
        spec: dict[str, Any] = {"audiences": [ISSUER], "expirationSeconds": seconds}
        if bound_pod is not None:
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": bound_pod[0], "uid": bound_pod[1]}
        try:
            resp = await asyncio.to_thread(
                core.create_namespaced_service_account_token, account, namespace, {"spec": spec}
            )
        finally:
            api.close()
        return str(resp.status.token)

    # -- manifests and the scheduler -------------------------------------------------------

    async def kubectl(self, *args: str, stdin: bytes | None = None, kubeconfig: Path | None = None) -> str:
        """Run the kubectl built with this control plane; raises with its stderr on failure."""
        proc = await asyncio.create_subprocess_exec(
            str(self.binaries.path("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(stdin)
        if proc.returncode != 0:
            raise ControlPlaneUnavailable(f"kubectl {' '.join(args)} failed: {err.decode(errors='replace').strip()}")
        return out.decode()

    async def apply_deploy_base(self, directory: Path = DEPLOY_DIR / "base") -> list[dict[str, Any]]:
        """What a user applies: the kustomize build of deploy/base, server-side applied; returns
        the objects. Waits for the CRD to be served."""
        rendered = await self.kubectl("kustomize", str(directory))
        await self.kubectl("apply", "--server-side", "--field-manager=sharepack-sandbox", "-f", "-", stdin=rendered.encode())
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        for doc in docs:
            if doc.get("kind") == "Namespace":
                await self.ensure_namespace(doc["metadata"]["name"])
            if doc.get("kind") == "CustomResourceDefinition":
                await self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{doc['metadata']['name']}")
        return docs

    async def start_scheduler(
        self, extender_url: str, *, tls: Mapping[str, str] | None = None, source: Path = SCHEDULER_CONFIG,
        serve_metrics: bool = False, env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """kube-scheduler configured by `source` (deploy/scheduler/kube-scheduler-config.yaml),
        calling the extender at `extender_url`; returns once it holds its leader lease.

        `serve_metrics`: serve /metrics (and the health paths) on a loopback HTTPS port,
        `scheduler_metrics_url`, to anyone: no delegated authentication or authorization
        lookups (there is nothing here to delegate to); otherwise no port at all. `env`: added to
        its environment (`DISABLE_HTTP2=1` makes its clients speak HTTP/1.1 only)."""
        kubeconfig = self.client_kubeconfig("scheduler", SCHEDULER_USER)
        config = self.workdir / "kube-scheduler-config.yaml"
        config.write_text(yaml.safe_dump(scheduler_config(extender_url, kubeconfig, tls=tls, source=source), sort_keys=False))
        serving = ["--secure-port=0"]
        self.scheduler_metrics_url = ""
        if serve_metrics:
            port = free_port()
            serving = [
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--authentication-skip-lookup",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            ]  # fmt: skip
            self.scheduler_metrics_url = f"https://127.0.0.1:{port}/metrics"
        self.scheduler = LoggedProcess(
            [str(self.binaries.path("kube-scheduler")), f"--config={config}", *serving, "--v=2"],
            self.workdir / "kube-scheduler.log",
            env=env,
        )
        await self.scheduler.start()
        await self._wait_leader(self.scheduler)
        self._supervisor = asyncio.create_task(self._restart_scheduler_when_it_exits(), name="kube-scheduler-supervisor")

    async def _restart_scheduler_when_it_exits(self) -> None:
        """kube-scheduler exits when it cannot renew its leader lease (an API server away for
        longer than the renew deadline): in a cluster the kubelet restarts its static pod."""
        while self.scheduler is not None and self.scheduler.proc is not None:
            code = await self.scheduler.proc.wait()
            scheduler = self.scheduler
            if scheduler is None:
                return
            self.scheduler_restarts += 1
            log.warning("kube-scheduler exited with code %s; starting it again, as the kubelet would", code)
            await scheduler.stop()
            await asyncio.sleep(1.0)
            await scheduler.start()

    async def stop_scheduler(self) -> None:
        """Stop kube-scheduler and forget its leader lease, so the next one leads at once."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        process, self.scheduler = self.scheduler, None
        if process is not None:
            await process.stop()
        await self.kubectl("delete", "lease", "kube-scheduler", "-n", "kube-system", "--ignore-not-found")

    async def _wait_leader(self, process: LoggedProcess) -> None:
        api = api_client(self.kubeconfig)
        coordination: Any = kubernetes.client.CoordinationV1Api(api)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if process.exited:
                    raise ControlPlaneUnavailable(_exit_message("kube-scheduler", process))
                with contextlib.suppress(kubernetes.client.ApiException):
                    lease = await asyncio.to_thread(coordination.read_namespaced_lease, "kube-scheduler", "kube-system")
                    if lease.spec.holder_identity:
                        return
                await asyncio.sleep(0.2)
        finally:
            api.close()
        raise ControlPlaneUnavailable(f"kube-scheduler did not take its leader lease; its log: {process.log_path}")


def _exit_message(what: str, process: LoggedProcess) -> str:
    tail = process.log_tail(3000)
    hint = ""
    if "address already in use" in tail:
        hint = " (a port it needs is in use: stop whatever holds it, or retry: ports are picked anew each start)"
    last = " | ".join(line for line in tail.strip().splitlines()[-4:])
    return f"{what} exited at start{hint}: {last} (log: {process.log_path})"


class BackgroundControlPlane:
    """A RealControlPlane on an event loop of its own thread, for synchronous callers (a test
    session shares one). The children die with that thread's process, as any other."""

    def __init__(
        self, workdir: Path | None = None, *, binaries: Binaries | None = None, apiserver_args: Sequence[str] = ()
    ) -> None:
        self.control = RealControlPlane(workdir, binaries=binaries, apiserver_args=apiserver_args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="control-plane", daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float = READY_TIMEOUT_S * 2) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> RealControlPlane:
        try:
            self.run(self.control.start())
        except BaseException:
            self.close()
            raise
        return self.control

    def close(self) -> None:
        try:
            self.run(self.control.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

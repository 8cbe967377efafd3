"""The agent's HTTP endpoint (`--metrics-listen`, port 9400 named `metrics` in deploy/).

* `/healthz`: answered by the event loop itself, so a loop stuck in a blocking call (or dead)
  does not answer and the DaemonSet's liveness probe restarts the agent.
* `/readyz`: 200 once every resource the agent serves is registered with the kubelet
  (`Agent.readiness`); 503 with the reason before that, after a kubelet restart until the
  agent registered again, and while draining.
* `/metrics`: the process's `AgentMetrics` registry, Prometheus text format 0.0.4.

It starts before NVML is read, so the probes answer (not ready) while the agent starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from sharepack.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]


def starting() -> tuple[bool, str]:
    return False, "starting: reading the GPUs"


class MonitoringServer:
    def __init__(self, metrics: AgentMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port  # the bound port once started (0 picks one)
        self.readiness: Readiness = starting  # the root hands over to the Agent's once it runs
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        """Raises OSError when the address cannot be bound."""
        runner = self._runner = web.AppRunner(self.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port, reuse_address=True).start()
        except BaseException:
            await self.stop()
            raise
        self.port = runner.addresses[0][1]  # the bound port (0 picks one)
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ready, why = self.readiness()
        return web.Response(status=200 if ready else 503, text=why + "\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

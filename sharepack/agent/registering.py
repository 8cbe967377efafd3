"""Talking to the kubelet's Registration service, and noticing when the kubelet restarts.

Protocol facts this module relies on (kubelet device manager):
* `RegisterRequest.endpoint` is a bare file name; the kubelet joins it to its own directory, so
  plugin sockets live next to `kubelet.sock`.
* The kubelet dials the plugin back inside `Register`, so the plugin must already be serving.
* On restart the kubelet deletes every socket in its directory and re-creates `kubelet.sock`,
  possibly with the same inode number. We therefore treat as a restart: `kubelet.sock` changing
  identity (inode, device *or* ctime), or one of our own plugin sockets disappearing.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import grpc

from sharepack.agent.errors import RegistrationError, ServingError
from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
# gRPC's default reconnect backoff starts at 1 s: too slow to re-register within 2 s of a kubelet
# that comes back while we wait for it.
FAST_RECONNECT = (("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500))
VENDOR_DOMAIN = "nvidia.com/"


def socket_name(resource_name: str) -> str:
    """`nvidia.com/gpu.shared` -> `nvidia-gpu-shared.sock` (one socket per resource).

    Differs from upstream, which keeps the dots (`nvidia-gpu.shared.sock`,
    `nvidia-mig-1g.5gb.sock`): any bare file name works, since the kubelet only joins the
    endpoint to its own directory, but tools that look for upstream's socket names will not
    find ours."""
    short = resource_name.removeprefix(VENDOR_DOMAIN)
    return "nvidia-" + short.replace("/", "-").replace(".", "-") + ".sock"


def unix_target(path: Path) -> str:
    return f"unix://{os.path.abspath(path)}"


async def dial(path: Path, *, timeout: float) -> None:
    """Connect to a unix-socket gRPC server and hang up: proves it is serving."""
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError as e:
            raise ServingError(f"dial {path}: not serving after {timeout:.1f}s") from e


async def register(
    kubelet_socket: Path, endpoint: str, resource_name: str, *, timeout: float = 5.0
) -> None:
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    async with grpc.aio.insecure_channel(unix_target(kubelet_socket), options=FAST_RECONNECT) as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            raise RegistrationError(
                f"register {resource_name} (endpoint {endpoint}) with {kubelet_socket}: "
                f"{e.code().name}: {e.details()}"
            ) from e


async def register_until_done(
    kubelet_socket: Path,
    endpoint: str,
    resource_name: str,
    *,
    first_delay: float = 0.05,
    max_delay: float = 2.0,
    attempt_timeout: float = 5.0,
    on_attempt: Callable[[bool], None] = lambda ok: None,
) -> None:
    """Register, retrying with capped backoff: the kubelet may not be up yet (or restarting).
    `on_attempt(ok)` hears of every attempt (the agent counts them)."""
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            await register(kubelet_socket, endpoint, resource_name, timeout=attempt_timeout)
        except RegistrationError as e:
            on_attempt(False)
            level = logging.INFO if attempt == 1 else logging.WARNING
            log.log(level, "%s; retrying in %.2fs", e, delay, extra={"resource": resource_name})
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
        else:
            on_attempt(True)
            log.info(
                "registered %s with the kubelet as %s", resource_name, endpoint,
                extra={"resource": resource_name, "attempts": attempt},
            )
            return


Identity = tuple[int, int, int]


def socket_identity(path: Path) -> Identity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


async def watch_kubelet(
    kubelet_socket: Path,
    plugin_sockets: Callable[[], Iterable[Path]],
    on_restart: Callable[[str], Awaitable[None]],
    *,
    busy: Callable[[], bool] = lambda: False,
    interval: float = 0.1,
) -> None:
    """Forever: call `on_restart(reason)` when the kubelet restarted.

    Polls (no inotify in the stdlib); at 0.1 s the re-registration fits well within 2 s. While
    `busy()` (the agent itself is replacing its servers) missing plugin sockets are expected.
    A restart is acted on only once the new `kubelet.sock` exists.
    """
    seen = socket_identity(kubelet_socket)
    while True:
        await asyncio.sleep(interval)
        if busy():
            continue
        now = socket_identity(kubelet_socket)
        if now is None:
            continue
        reason = ""
        if now != seen:
            reason = f"{kubelet_socket} was re-created"
        else:
            lost = [p for p in plugin_sockets() if not os.path.exists(p)]
            if lost:
                reason = f"plugin socket {lost[0]} was removed"
        if reason:
            log.warning("kubelet restart detected: %s; restarting every plugin server", reason)
            await on_restart(reason)
            seen = socket_identity(kubelet_socket)

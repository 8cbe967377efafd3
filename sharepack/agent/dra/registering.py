"""Plugin registration with the kubelet (the pluginwatcher API): the agent serves
`pluginregistration.Registration` on a socket in the kubelet's plugins_registry directory; the
kubelet finds the socket, calls GetInfo (plugin type `DRAPlugin`, the driver name, the DRA
socket's path, the DRA services served) and reports the outcome with NotifyRegistrationStatus.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Final

import grpc

from sharepack.common import dradevices
from sharepack.proto.pluginregistration.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
# The kubelet picks the first service it knows from this list (v1 since Kubernetes 1.34).
DRA_SERVICES: Final = ("v1.DRAPlugin",)


def registration_socket(registry_dir: Path) -> Path:
    return registry_dir / f"{dradevices.DRIVER}-reg.sock"


def dra_socket(plugins_dir: Path) -> Path:
    return plugins_dir / dradevices.DRIVER / "dra.sock"


class RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self._endpoint = endpoint
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.PluginInfo:
        return api_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=dradevices.DRIVER, endpoint=str(self._endpoint), supported_versions=list(DRA_SERVICES)
        )

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", dradevices.DRIVER)
            self.last_error = ""
            self.registered.set()
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("the kubelet refused the registration of DRA driver %s: %s", dradevices.DRIVER, request.error)
        return api_pb2.RegistrationStatusResponse()

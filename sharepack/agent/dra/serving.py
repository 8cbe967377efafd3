"""The kubelet's DRA gRPC service (k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin), translated to and
from `Preparer`. A claim that cannot be prepared is that claim's `error` in the answer (the
kubelet retries it and fails the pod's start with it); the call itself never fails for one claim.
"""

from __future__ import annotations

import logging

import grpc

from sharepack.agent.dra.preparing import Preparer
from sharepack.common import draclaims
from sharepack.common.errors import SharepackError
from sharepack.proto.dra.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


def _ref(claim: api_pb2.Claim) -> draclaims.ClaimRef:
    return draclaims.ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)


class DraService(api_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.NodePrepareResourcesResponse:
        answer = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = _ref(claim)
            try:
                prepared = await self._preparer.prepare(ref)
            except SharepackError as e:
                log.warning("cannot prepare claim %s: %s", ref, e)
                answer.claims[claim.uid].error = str(e)
                continue
            except Exception as e:  # noqa: BLE001 - one claim's bug must not fail the others
                log.exception("preparing claim %s failed", ref)
                answer.claims[claim.uid].error = f"internal error preparing claim {ref}: {e}"
                continue
            devices = [
                api_pb2.Device(
                    request_names=[d.request], pool_name=d.pool, device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids), share_id=d.share_id,
                )
                for d in prepared
            ]  # fmt: skip
            answer.claims[claim.uid].devices.extend(devices)
        return answer

    async def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        answer = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = _ref(claim)
            try:
                await self._preparer.unprepare(ref)
            except Exception as e:  # noqa: BLE001 - reported to the kubelet, which retries
                log.exception("unpreparing claim %s failed", ref)
                answer.claims[claim.uid].error = f"cannot unprepare claim {ref}: {e}"
                continue
            answer.claims[claim.uid].SetInParent()
        return answer

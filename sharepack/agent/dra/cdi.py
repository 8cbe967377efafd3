"""CDI spec files for prepared claims: what the container runtime injects for a claim's devices.

One spec file per claim (`<cdi root>/k8s.gpu.sharepack.io-claim_<claim uid>.json`) with one CDI
device per request of the claim: the request's devices are given to a container together, and
their edits (`NVIDIA_VISIBLE_DEVICES` listing every GPU once, device nodes, the MPS pipe
directory and shm) are the device-plugin mode's Allocate answer for the same devices
(`agent.responses.container_response`), so both modes hand a container the same things.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from sharepack.agent.responses import CDI_STRATEGIES, ContainerResponse, ResponseOptions, container_response
from sharepack.common.resources import Resource

CDI_VERSION: Final = "0.6.0"
VENDOR: Final = "k8s.gpu.sharepack.io"
CLASS: Final = "claim"
KIND: Final = f"{VENDOR}/{CLASS}"


def device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{request}"


def device_id(claim_uid: str, request: str) -> str:
    """The fully qualified CDI name the kubelet hands the runtime."""
    return f"{KIND}={device_name(claim_uid, request)}"


def spec_path(root: Path, claim_uid: str) -> Path:
    return root / f"{VENDOR}-{CLASS}_{claim_uid}.json"


def container_edits(response: ContainerResponse) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if response.envs:
        edits["env"] = [f"{k}={v}" for k, v in sorted(response.envs.items())]
    if response.devices:
        edits["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions} for d in response.devices
        ]
    if response.mounts:
        edits["mounts"] = [
            {"hostPath": m.host_path, "containerPath": m.container_path,
             "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
            for m in response.mounts
        ]  # fmt: skip
    return edits


def claim_spec(
    claim_uid: str, requests: Mapping[str, tuple[Resource, Sequence[str]]], options: ResponseOptions
) -> dict[str, Any]:
    """`requests`: request name -> (the resource its devices belong to, their device IDs).

    The edits are the envvar strategy's whatever `deviceListStrategy` says: a CDI device is
    itself the CDI route, so naming `nvidia.com/gpu` CDI devices from it would ask the runtime
    for a second injection."""
    strategies = tuple(s for s in options.device_list_strategy if s not in CDI_STRATEGIES) or ("envvar",)
    plain = ResponseOptions(
        device_list_strategy=strategies, device_id_strategy=options.device_id_strategy,
        pass_device_specs=options.pass_device_specs, dev_root=options.dev_root, mps_root=options.mps_root,
        node_exists=options.node_exists,
    )  # fmt: skip
    devices = []
    for request, (resource, ids) in sorted(requests.items()):
        response = container_response(resource, ids, plain, response_id=device_name(claim_uid, request))
        devices.append({"name": device_name(claim_uid, request), "containerEdits": container_edits(response)})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices}


def write_spec(root: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Atomically (a runtime reading the directory never sees half a file)."""
    root.mkdir(parents=True, exist_ok=True)
    path = spec_path(root, claim_uid)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def remove_spec(root: Path, claim_uid: str) -> bool:
    try:
        spec_path(root, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def prepared_claims(root: Path) -> list[str]:
    """Claim UIDs with a spec on disk: what an agent restarted under the kubelet had prepared."""
    prefix, suffix = f"{VENDOR}-{CLASS}_", ".json"
    if not root.is_dir():
        return []
    return sorted(p.name[len(prefix):-len(suffix)] for p in root.iterdir()
                  if p.name.startswith(prefix) and p.name.endswith(suffix))  # fmt: skip

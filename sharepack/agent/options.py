"""The agent's command line and environment, parsed into plain values.

Two kinds of settings:
* config settings (`--mig-strategy`, `--shared-devices-allocation-policy`, ...) go, unparsed, to
  `common.config.load_config` as `flags` (only those given: the file wins over defaults, never
  over an explicit flag). Their env vars are read by `load_config` itself.
* process settings (`--kubelet-socket`, `--node-name`, `--log-format`, ...) are resolved here,
  flag > env > default.

Names follow the upstream NVIDIA device plugin where it has them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from sharepack.agent.errors import OptionsError
from sharepack.common import addresses, dradevices
from sharepack.common import config as configs

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LOG_FORMATS = ("text", "json")
DEVICE_PLUGIN_MODE, DRA_MODE = "device-plugin", "dra"
MODES = (DEVICE_PLUGIN_MODE, DRA_MODE)
DEFAULT_PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
# The port deploy/ names `metrics` (probes, NetworkPolicy, scrape config); the pod has its own
# network namespace, so it cannot clash with a host service on the same port.
DEFAULT_METRICS_LISTEN = "0.0.0.0:9400"


@dataclass(frozen=True, slots=True)
class _Process:
    flag: str
    env: str
    default: str | None
    help: str


_PROCESS = (
    _Process("kubelet-socket", "KUBELET_SOCKET", DEFAULT_KUBELET_SOCKET,
             "the kubelet's device-plugin registration socket; plugin sockets go next to it"),
    _Process("pod-resources-socket", "POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET,
             "the kubelet's PodResources socket (which pod holds which device)"),
    _Process("node-name", "NODE_NAME", None, "this node's name (for the published state)"),
    _Process("kubeconfig", "KUBECONFIG", None,
             "kubeconfig for the Kubernetes API; in-cluster config when absent; no API at all: "
             "the device plugin still serves, nothing is published"),
    _Process("simulated-machine", "SHAREPACK_SIMULATED_MACHINE", None,
             "run on the NVML simulator: a built-in machine name (dgx-a100, ...) or a YAML file"),
    _Process("node-config-configmap", "SHAREPACK_NODE_CONFIG_CONFIGMAP", None,
             "NAMESPACE/NAME of a ConfigMap of named config files; the node label "
             "nvidia.com/device-plugin.config picks one, applied live"),
    _Process("log-format", "LOG_FORMAT", "text", "text or json"),
    _Process("mode", "SHAREPACK_MODE", DEVICE_PLUGIN_MODE,
             "device-plugin (the kubelet device-plugin API) or dra (a DRA kubelet plugin publishing "
             "ResourceSlices; needs the Kubernetes API and --node-name)"),
    _Process("plugins-registry", "SHAREPACK_PLUGINS_REGISTRY", DEFAULT_PLUGINS_REGISTRY,
             "dra mode: the kubelet's plugin registration directory"),
    _Process("plugins-dir", "SHAREPACK_PLUGINS_DIR", DEFAULT_PLUGINS_DIR,
             "dra mode: the kubelet's plugins directory (the DRA socket goes in <dir>/gpu.sharepack.io/)"),
    _Process("cdi-root", "SHAREPACK_CDI_ROOT", DEFAULT_CDI_ROOT,
             "dra mode: where CDI specs of prepared claims are written for the container runtime"),
    _Process("dra-device-order", "SHAREPACK_DRA_DEVICE_ORDER", dradevices.STATIC_ORDER,
             "dra mode: the order of the node's devices in its ResourceSlices, which the scheduler's "
             "first-fit allocator follows: static (the allocation policy's, written once) or fresh-first "
             "(GPUs no prepared claim holds first, then the fullest; republished as claims are prepared)"),
    _Process("metrics-listen", "SHAREPACK_METRICS_LISTEN", DEFAULT_METRICS_LISTEN,
             "HOST:PORT of the HTTP endpoint: /metrics (Prometheus), /healthz, /readyz"),
    _Process("unhealthy-recovery-seconds", "SHAREPACK_UNHEALTHY_RECOVERY_SECONDS", "0",
             "a device with no critical XID for this long becomes healthy again (0: never)"),
    _Process("state-heartbeat-seconds", "SHAREPACK_STATE_HEARTBEAT_SECONDS", "60",
             "rewrite the NodeGpuState with a fresh observedAt this often even when nothing "
             "changed, so schedulers can tell a quiet node from a dead agent (0: never)"),
    _Process("directed-gpus", "SHAREPACK_DIRECTED_GPUS", "true",
             "allocate on the GPUs the extender wrote into the pod's sharepack.io/gpus annotation "
             "when they are available (true or false)"),
    _Process("state-min-write-interval-seconds", "SHAREPACK_STATE_MIN_WRITE_INTERVAL_SECONDS", "0.5",
             "at most one NodeGpuState write per this interval; a burst of changes in between "
             "becomes one write"),
)

_CONFIG_HELP = {
    "mig-strategy": "none, single or mixed (MIG_STRATEGY)",
    "fail-on-init-error": "exit when NVML cannot start; else serve nothing (FAIL_ON_INIT_ERROR)",
    "nvidia-driver-root": "root of the driver's device nodes on the host (NVIDIA_DRIVER_ROOT)",
    "mps-root": "MPS daemon root on the host (MPS_ROOT)",
    "pass-device-specs": "pass device nodes in Allocate responses (PASS_DEVICE_SPECS)",
    "device-list-strategy": "envvar, volume-mounts, cdi-annotations, cdi-cri; comma-separated "
                            "(DEVICE_LIST_STRATEGY)",
    "device-id-strategy": "uuid or index (DEVICE_ID_STRATEGY)",
    "cdi-annotation-prefix": "prefix of CDI annotation keys (CDI_ANNOTATION_PREFIX)",
    "shared-devices-allocation-policy": "distributed, packed or spread; default packed, as deploy/ ships "
                                        "(SHARED_DEVICES_ALLOCATION_POLICY)",
}
_BOOL_FLAGS = frozenset({"fail-on-init-error", "pass-device-specs"})


@dataclass(frozen=True, slots=True)
class Options:
    config_flags: Mapping[str, object]  # for load_config: only the config flags given
    config_file: str | None
    kubelet_socket: Path
    pod_resources_socket: Path
    node_name: str | None
    kubeconfig: str | None
    simulated_machine: str | None
    log_format: str
    unhealthy_recovery_s: float
    node_config_configmap: tuple[str, str] | None = None  # (namespace, name)
    state_heartbeat_s: float = 60.0  # 0: write only on change
    state_min_write_interval_s: float = 0.5
    metrics_listen: tuple[str, int] = addresses.listen_address(DEFAULT_METRICS_LISTEN, flag="--metrics-listen")
    directed_gpus: bool = True
    mode: str = DEVICE_PLUGIN_MODE
    plugins_registry: Path = Path(DEFAULT_PLUGINS_REGISTRY)
    plugins_dir: Path = Path(DEFAULT_PLUGINS_DIR)
    cdi_root: Path = Path(DEFAULT_CDI_ROOT)
    dra_device_order: str = dradevices.STATIC_ORDER
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise OptionsError(f"invalid command line: {message}")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="sharepack-agent",
        description="Kubernetes device plugin for NVIDIA GPUs that packs shared GPUs.",
    )
    for flag in configs.FLAG_NAMES:
        if flag in _BOOL_FLAGS:
            # `--pass-device-specs` alone means true; `--pass-device-specs=false` is accepted too.
            p.add_argument(f"--{flag}", nargs="?", const="true", default=None, help=_CONFIG_HELP.get(flag))
        else:
            p.add_argument(f"--{flag}", default=None, help=_CONFIG_HELP.get(flag))
    p.add_argument(f"--{configs.CONFIG_FILE_FLAG}", default=None,
                   help=f"upstream `version: v1` YAML config ({configs.CONFIG_FILE_ENV})")
    for proc in _PROCESS:
        p.add_argument(f"--{proc.flag}", default=None, help=f"{proc.help} ({proc.env})")
    return p


def _seconds(process: Callable[[str], tuple[str | None, str]], flag: str) -> float:
    """A process setting in seconds, >= 0 (finite); OptionsError naming where it came from."""
    raw, origin = process(flag)
    try:
        value = float(raw or "0")
        if not 0 <= value < math.inf:  # also rejects nan and inf
            raise ValueError
    except ValueError:
        raise OptionsError(f"invalid --{flag} option: {raw} (from {origin}; want seconds >= 0)") from None
    return value


def parse(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Raises OptionsError naming the bad option and where its value came from."""
    ns = vars(parser().parse_args(list(argv)))

    def process(flag: str) -> tuple[str | None, str]:
        proc = next(p for p in _PROCESS if p.flag == flag)
        value = ns.get(flag.replace("-", "_"))
        if value is not None:
            return value, f"--{flag}"
        if env.get(proc.env):
            return env[proc.env], f"env {proc.env}"
        return proc.default, "default"

    log_format, origin = process("log-format")
    if log_format not in LOG_FORMATS:
        raise OptionsError(f"invalid --log-format option: {log_format} (from {origin}; want text or json)")
    recovery = _seconds(process, "unhealthy-recovery-seconds")
    heartbeat = _seconds(process, "state-heartbeat-seconds")
    min_write_interval = _seconds(process, "state-min-write-interval-seconds")
    configmap: tuple[str, str] | None = None
    raw_configmap, origin = process("node-config-configmap")
    if raw_configmap:
        namespace, _, name = raw_configmap.partition("/")
        if not namespace or not name or "/" in name:
            raise OptionsError(
                f"invalid --node-config-configmap option: {raw_configmap} (from {origin}; want NAMESPACE/NAME)"
            )
        configmap = (namespace, name)
    raw_listen, origin = process("metrics-listen")
    assert raw_listen is not None  # it has a default
    try:
        metrics_listen = addresses.listen_address(raw_listen, flag="--metrics-listen")
    except ValueError as e:
        raise OptionsError(f"{e} (from {origin})") from None
    raw_directed, origin = process("directed-gpus")
    directed = str(raw_directed).strip().lower()
    if directed not in ("true", "false"):
        raise OptionsError(f"invalid --directed-gpus option: {raw_directed} (from {origin}; want true or false)")
    mode, origin = process("mode")
    if mode not in MODES:
        raise OptionsError(f"invalid --mode option: {mode} (from {origin}; want device-plugin or dra)")
    device_order, origin = process("dra-device-order")
    if device_order not in dradevices.DEVICE_ORDERS:
        raise OptionsError(
            f"invalid --dra-device-order option: {device_order} (from {origin}; want {' or '.join(dradevices.DEVICE_ORDERS)})"
        )
    kubelet_socket, _ = process("kubelet-socket")
    pod_resources, _ = process("pod-resources-socket")
    assert kubelet_socket is not None and pod_resources is not None  # they have defaults
    flags = {f: ns[f.replace("-", "_")] for f in configs.FLAG_NAMES if ns.get(f.replace("-", "_")) is not None}
    if ns.get("config_file") is not None:
        flags[configs.CONFIG_FILE_FLAG] = ns["config_file"]
    return Options(
        config_flags=MappingProxyType(flags),
        config_file=configs.config_file_path(env=env, flags=flags),
        kubelet_socket=Path(kubelet_socket),
        pod_resources_socket=Path(pod_resources),
        node_name=process("node-name")[0],
        kubeconfig=process("kubeconfig")[0],
        simulated_machine=process("simulated-machine")[0],
        log_format=log_format,
        unhealthy_recovery_s=recovery,
        node_config_configmap=configmap,
        state_heartbeat_s=heartbeat,
        state_min_write_interval_s=min_write_interval,
        metrics_listen=metrics_listen,
        directed_gpus=directed == "true",
        mode=mode,
        plugins_registry=Path(str(process("plugins-registry")[0])),
        plugins_dir=Path(str(process("plugins-dir")[0])),
        cdi_root=Path(str(process("cdi-root")[0])),
        dra_device_order=str(device_order),
        env=MappingProxyType(dict(env)),
    )

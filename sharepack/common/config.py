"""The agent's configuration: upstream's `version: v1` YAML, env vars and flags, merged into one
frozen `Config`.

Precedence, per setting: command-line flag > environment variable > config file > default. The
file is upstream NVIDIA k8s-device-plugin's format, so existing ConfigMaps keep working::

    version: v1
    flags:
      migStrategy: none                       # none | single | mixed        (MIG_STRATEGY)
      failOnInitError: true                   #                              (FAIL_ON_INIT_ERROR)
      nvidiaDriverRoot: /                     #                              (NVIDIA_DRIVER_ROOT)
      mpsRoot: /run/nvidia/mps                #                              (MPS_ROOT)
      plugin:
        passDeviceSpecs: false                #                              (PASS_DEVICE_SPECS)
        deviceListStrategy: envvar            # one or a list of envvar, volume-mounts,
                                              #   cdi-annotations, cdi-cri   (DEVICE_LIST_STRATEGY)
        deviceIDStrategy: uuid                # uuid | index                 (DEVICE_ID_STRATEGY)
        cdiAnnotationPrefix: cdi.k8s.io/      #                              (CDI_ANNOTATION_PREFIX)
        sharedDevicesAllocationPolicy: packed # distributed | packed | spread
                                              #                  (SHARED_DEVICES_ALLOCATION_POLICY)
    sharing:
      timeSlicing:                            # or `mps:` (the two are exclusive)
        renameByDefault: false                # serve replicas as `<name>.shared`
        failRequestsGreaterThanOne: false     # reject a container asking for more than one
                                              #   replica (default: false; true for mps)
        resources:
        - name: nvidia.com/gpu                # or nvidia.com/mig-<profile>
          replicas: 4
          devices: all                        # all | a count | a list of GPU indices ("0"),
                                              #   MIG indices ("0:1"), GPU or MIG UUIDs

Our extension, per-GPU replica counts (upstream issue #1786): `perGpu` maps a device reference
(the same forms as `devices`: GPU index, MIG index, GPU or MIG UUID) to that device's replica
count. A GPU reference also covers every MIG instance of that GPU::

        - name: nvidia.com/gpu
          replicas: 2            # every selected GPU not named below
          perGpu:
            "0": 8               # GPU 0 (an A100) gets 8 replicas
            GPU-6e5b0c8d-4f3a-4b7e-9a51-1f2d3c4b5a69: 1
          devices: all

If `replicas` is left out, `perGpu` alone selects the devices: only those it names are shared
(`devices` must then be left out too). A `perGpu` entry must name a selected device. Each count
obeys the same minimum as `replicas`.

Where upstream has an error text we use it (`invalid --shared-devices-allocation-policy option:
spreadd`, `no replicas specified`, `using --mig-strategy=mixed is not supported with
MPS`, ...), followed by where the value came from. Where we differ from upstream on purpose:

* every problem is reported at once (`ConfigError.problems`), not just the first;
* an empty environment variable counts as unset;
* replicas: time-slicing needs >= 1 (upstream rejects 0 too, but its text says ">= 0"), MPS
  needs >= 2 (one MPS client per GPU shares nothing);
* MPS does not require a CDI device-list strategy (our agent injects the MPS environment and
  mounts itself); timeSlicing and mps together are an error rather than mps silently winning;
* `rename` on a shared resource is ignored with a warning, as upstream does; unknown keys are
  warnings (upstream ignores them silently). Warnings land in `Config.warnings` for the agent to
  log.

Per-node named configs (a ConfigMap holding several config files, one picked by a node label)
are served by `select_named_config` and `parse_named_configs`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

import yaml

from sharepack.common import shipped, state
from sharepack.common.errors import ConfigError
from sharepack.common.policies import MigStrategy, Policy, Sharing

VERSION: Final = "v1"
RESOURCE_PREFIX: Final = "nvidia.com"
GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
SHARED_SUFFIX: Final = ".shared"
# Extended resource names are qualified names: the part after the prefix is at most 63 chars.
MAX_RESOURCE_NAME_LENGTH: Final = 63
DEVICE_LIST_STRATEGIES: Final = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES: Final = ("uuid", "index")
CONFIG_FILE_FLAG: Final = "config-file"
CONFIG_FILE_ENV: Final = "CONFIG_FILE"
NO_FILE_SOURCE: Final = "command line and environment"


class _Unset:
    """Marks a layer (flag, env, file) that does not set a value, so defaults never win over it."""

    __slots__ = ()
    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Final = _Unset()

ALL: Final = "all"
DeviceSelection: TypeAlias = Literal["all"] | int | tuple[str, ...]
"""`"all"`, a count (the first N devices), or device references (GPU index "0", MIG index "0:1",
GPU UUID, MIG UUID)."""


@dataclass(frozen=True, slots=True)
class ReplicatedResource:
    name: str  # the resource to share: "nvidia.com/gpu" or "nvidia.com/mig-<profile>"
    replicas: int | None  # replicas of each selected device; None when only per_gpu selects
    devices: DeviceSelection = ALL
    # Mappings do not hash: left out of __hash__ (still compared), so configs stay hashable.
    per_gpu: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), hash=False)


@dataclass(frozen=True, slots=True)
class SharingConfig:
    mode: Sharing  # TIME_SLICING or MPS
    rename_by_default: bool
    fail_requests_greater_than_one: bool
    resources: tuple[ReplicatedResource, ...]


@dataclass(frozen=True, slots=True)
class Config:
    mig_strategy: MigStrategy = MigStrategy.NONE
    fail_on_init_error: bool = True
    nvidia_driver_root: str = "/"
    mps_root: str = "/run/nvidia/mps"
    allocation_policy: Policy = shipped.AGENT_POLICY  # what deploy/ ships (upstream's default: distributed)
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    time_slicing: SharingConfig | None = None
    mps: SharingConfig | None = None
    # Where each flag setting came from ("--mig-strategy", "env MIG_STRATEGY",
    # "config flags.migStrategy", "default"), for the "running with config" log line.
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    warnings: tuple[str, ...] = ()

    @property
    def sharing(self) -> SharingConfig | None:
        """The active sharing section (at most one of time_slicing / mps is set)."""
        return self.mps if self.mps is not None else self.time_slicing

    @property
    def sharing_mode(self) -> Sharing:
        active = self.sharing
        return Sharing.NONE if active is None else active.mode

    def describe(self) -> dict[str, object]:
        """The effective config in the file's own shape (plus `sources`), JSON-friendly: logged
        once at start, and, without `sources`, a config file that loads back to this config."""
        def sharing(s: SharingConfig) -> dict[str, object]:
            resources: list[dict[str, object]] = []
            for r in s.resources:
                entry: dict[str, object] = {"name": r.name}
                if r.replicas is not None:
                    entry["replicas"] = r.replicas
                    devices = r.devices
                    entry["devices"] = list(devices) if isinstance(devices, tuple) else devices
                if r.per_gpu:
                    entry["perGpu"] = dict(r.per_gpu)
                resources.append(entry)
            return {"renameByDefault": s.rename_by_default,
                    "failRequestsGreaterThanOne": s.fail_requests_greater_than_one,
                    "resources": resources}

        sections = {"timeSlicing": self.time_slicing, "mps": self.mps}
        return {
            "version": VERSION,
            "flags": {
                "migStrategy": str(self.mig_strategy),
                "failOnInitError": self.fail_on_init_error,
                "nvidiaDriverRoot": self.nvidia_driver_root,
                "mpsRoot": self.mps_root,
                "plugin": {
                    "passDeviceSpecs": self.pass_device_specs,
                    "deviceListStrategy": list(self.device_list_strategy),
                    "deviceIDStrategy": self.device_id_strategy,
                    "cdiAnnotationPrefix": self.cdi_annotation_prefix,
                    "sharedDevicesAllocationPolicy": str(self.allocation_policy),
                },
            },
            "sharing": {k: sharing(v) for k, v in sections.items() if v is not None},
            "sources": dict(self.sources),
        }


# --- YAML -------------------------------------------------------------------------------------

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers: `1:0` (a MIG index) must stay a string,
    not become 60. Octal/hex/underscore forms go too; upstream's decoder has none of them."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_INT_TAG, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"
               r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def _parse_yaml(text: str) -> object:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


# --- value parsing ----------------------------------------------------------------------------

# Go's strconv.ParseBool, which upstream's flag library uses for env vars and flags.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class _Bad(Exception):
    """A value that fails parsing; the message is the upstream-style problem text."""


def _type_name(value: object) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _as_bool(value: object, *, from_text: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_text and isinstance(value, str):
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise _Bad(f"not a boolean: {value!r}")
    raise _Bad(f"expected a boolean, got {_type_name(value)} {value!r}")


def _as_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise _Bad(f"expected a string, got {_type_name(value)} {value!r}")


def _as_str_list(value: object, *, from_text: bool) -> tuple[str, ...]:
    # Upstream accepts a single string or a list in the file; env and flags are comma-separated.
    if isinstance(value, str):
        items = value.split(",") if from_text else [value]
        return tuple(s.strip() for s in items)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        out: list[str] = []
        for v in value:
            out += [s.strip() for s in v.split(",")] if from_text else [v]
        return tuple(out)
    raise _Bad(f"invalid deviceListStrategy: {value!r}")


@dataclass(frozen=True, slots=True)
class _Setting:
    attr: str  # Config attribute
    flag: str  # CLI flag without dashes
    env: str
    path: tuple[str, ...]  # where it lives in the file
    kind: Literal["bool", "str", "list"]
    check: Callable[[object], str | None] | None = None  # -> problem text, or None when fine


def _check_choice(option: str, choices: Sequence[str]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        return None if value in choices else f"invalid --{option} option: {value}"

    return check


def _check_mig_strategy(value: object) -> str | None:
    return None if value in tuple(MigStrategy) else f"unknown mig strategy: {value}"


def _check_device_list(value: object) -> str | None:
    assert isinstance(value, tuple)
    if not value or value == ("",):
        return "invalid --device-list-strategy option: empty device list strategy"
    bad = [s for s in value if s not in DEVICE_LIST_STRATEGIES]
    if bad:
        return f"invalid --device-list-strategy option: invalid strategy: {bad[0]}"
    return None


_SETTINGS: Final = (
    _Setting("mig_strategy", "mig-strategy", "MIG_STRATEGY", ("flags", "migStrategy"), "str",
             _check_mig_strategy),
    _Setting("fail_on_init_error", "fail-on-init-error", "FAIL_ON_INIT_ERROR",
             ("flags", "failOnInitError"), "bool"),
    _Setting("nvidia_driver_root", "nvidia-driver-root", "NVIDIA_DRIVER_ROOT",
             ("flags", "nvidiaDriverRoot"), "str"),
    _Setting("mps_root", "mps-root", "MPS_ROOT", ("flags", "mpsRoot"), "str"),
    _Setting("pass_device_specs", "pass-device-specs", "PASS_DEVICE_SPECS",
             ("flags", "plugin", "passDeviceSpecs"), "bool"),
    _Setting("device_list_strategy", "device-list-strategy", "DEVICE_LIST_STRATEGY",
             ("flags", "plugin", "deviceListStrategy"), "list", _check_device_list),
    _Setting("device_id_strategy", "device-id-strategy", "DEVICE_ID_STRATEGY",
             ("flags", "plugin", "deviceIDStrategy"), "str",
             _check_choice("device-id-strategy", DEVICE_ID_STRATEGIES)),
    _Setting("cdi_annotation_prefix", "cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
             ("flags", "plugin", "cdiAnnotationPrefix"), "str"),
    _Setting("allocation_policy", "shared-devices-allocation-policy",
             "SHARED_DEVICES_ALLOCATION_POLICY",
             ("flags", "plugin", "sharedDevicesAllocationPolicy"), "str",
             _check_choice("shared-devices-allocation-policy", tuple(Policy))),
)
FLAG_NAMES: Final = tuple(s.flag for s in _SETTINGS)
ENV_NAMES: Final = tuple(s.env for s in _SETTINGS) + (CONFIG_FILE_ENV,)

_KNOWN_FLAGS_KEYS: Final = frozenset({"migStrategy", "failOnInitError", "nvidiaDriverRoot",
                                      "mpsRoot", "plugin", "gdsEnabled", "mofedEnabled", "gfd",
                                      "deviceDiscoveryStrategy"})
_KNOWN_PLUGIN_KEYS: Final = frozenset({"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy",
                                       "cdiAnnotationPrefix", "sharedDevicesAllocationPolicy",
                                       "nvidiaCTKPath", "containerDriverRoot"})


def _flag_value(flags: Mapping[str, object], name: str) -> object:
    """A flag's value from whatever the composition root passes: keys "x-y", "--x-y" or "x_y";
    None and UNSET both mean "not given on the command line"."""
    for key in (name, f"--{name}", name.replace("-", "_")):
        if key in flags:
            value = flags[key]
            if value is not None and value is not UNSET:
                return value
    return UNSET


def _env_value(env: Mapping[str, str], name: str) -> object:
    value = env.get(name)
    return UNSET if value is None or value == "" else value


def config_file_path(*, env: Mapping[str, str], flags: Mapping[str, object]) -> str | None:
    """`--config-file` > `CONFIG_FILE`; None when neither names a file."""
    value = _flag_value(flags, CONFIG_FILE_FLAG)
    if value is UNSET:
        value = _env_value(env, CONFIG_FILE_ENV)
    return None if value is UNSET else str(value)


# --- the file ---------------------------------------------------------------------------------

def _file_value(doc: Mapping[str, object], path: tuple[str, ...]) -> object:
    node: object = doc
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return UNSET
        node = node[key]
    return UNSET if node is None else node


_GPU_INDEX = re.compile(r"^[0-9]+$")
_MIG_INDEX = re.compile(r"^[0-9]+:[0-9]+$")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def is_gpu_uuid(ref: str) -> bool:
    return ref.startswith("GPU-") and _is_uuid(ref[4:])


def is_mig_uuid(ref: str) -> bool:
    """`MIG-<uuid>` (R470+ drivers) or `MIG-GPU-<uuid>/<gi>/<ci>` (older drivers)."""
    if not ref.startswith("MIG-"):
        return False
    rest = ref[4:]
    if _is_uuid(rest):
        return True
    parts = rest.split("/")
    return (len(parts) == 3 and is_gpu_uuid(parts[0])
            and all(p.isascii() and p.isdigit() for p in parts[1:]))


def is_gpu_index(ref: str) -> bool:
    return bool(_GPU_INDEX.match(ref))


def is_mig_index(ref: str) -> bool:
    return bool(_MIG_INDEX.match(ref))


def _device_ref(item: object) -> str:
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return str(item)
    if isinstance(item, str) and (is_gpu_index(item) or is_mig_index(item)
                                  or is_gpu_uuid(item) or is_mig_uuid(item)):
        return item
    raise _Bad(f"unsupported type for device in devices list: {item}")


def _devices(value: object) -> DeviceSelection:
    if value is UNSET:
        return ALL
    if isinstance(value, str):
        if value != ALL:
            raise _Bad(f"devices set as '{value}' but the only valid string input is 'all'")
        return ALL
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise _Bad(f"devices set as '{value}' but a count of devices must be > 0")
        return value
    if isinstance(value, list):
        refs = tuple(_device_ref(item) for item in value)
        twice = sorted({r for r in refs if refs.count(r) > 1})
        if twice:
            raise _Bad(f"device {twice[0]} listed twice")
        return refs
    raise _Bad(f"unrecognized type for devices spec: {value}")


def normalize_resource_name(name: str) -> str:
    """Upstream's NewResourceName: add the `nvidia.com/` prefix when missing, then check the
    length and that the name part is a DNS subdomain. Raises ValueError with upstream's text."""
    if not name.startswith(RESOURCE_PREFIX + "/"):
        name = f"{RESOURCE_PREFIX}/{name}"
    if len(name) > MAX_RESOURCE_NAME_LENGTH:
        raise ValueError(f"fully-qualified resource name must be {MAX_RESOURCE_NAME_LENGTH} "
                         f"characters or less: {name}")
    short = name.split("/", 1)[1]
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", short):
        raise ValueError(f"incorrect format for resource name '{name}': a lowercase RFC 1123 "
                         "subdomain must consist of lower case alphanumeric characters, '-' or "
                         "'.', and must start and end with an alphanumeric character")
    return name


def is_shareable_name(name: str) -> bool:
    return name == GPU_RESOURCE or (name.startswith(MIG_RESOURCE_PREFIX)
                                    and len(name) > len(MIG_RESOURCE_PREFIX))


_RESOURCE_KEYS: Final = frozenset({"name", "replicas", "devices", "perGpu", "rename"})
_SHARING_KEYS: Final = frozenset({"renameByDefault", "failRequestsGreaterThanOne", "resources"})


def _replica_count(value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"replicas must be an integer, got {_type_name(value)} {value!r}")
    if value < minimum:
        raise _Bad(f"number of replicas must be >= {minimum}, got {value}")
    if value > state.MAX_DEVICES_PER_GPU:  # the published state (and its CRD) holds no more
        raise _Bad(f"number of replicas must be <= {state.MAX_DEVICES_PER_GPU}, got {value}")
    return value


def _sharing_section(mode: Sharing, where: str, raw: object, problems: list[str],
                     warnings: list[str]) -> SharingConfig | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping, got {_type_name(raw)}")
        return None
    for key in raw:
        if key not in _SHARING_KEYS:
            warnings.append(f"{where}.{key}: unknown key, ignored")
    # failRequestsGreaterThanOne: time-slicing leaves it false when unset (backward compatible);
    # MPS always takes one replica per container, as upstream's ValidateRequest does whatever
    # the file says.
    defaults = {"renameByDefault": False, "failRequestsGreaterThanOne": mode is Sharing.MPS}
    flags: dict[str, bool] = {}
    for key, default in defaults.items():
        value = raw.get(key)
        try:
            flags[key] = default if value is None else _as_bool(value, from_text=False)
        except _Bad as e:
            problems.append(f"{where}.{key}: {e}")
            flags[key] = default
    if mode is Sharing.MPS and not flags["failRequestsGreaterThanOne"]:
        warnings.append(f"{where}.failRequestsGreaterThanOne: false is ignored: MPS gives a "
                        "container at most one replica (as upstream)")
        flags["failRequestsGreaterThanOne"] = True
    raw_resources = raw.get("resources")
    if not raw_resources:
        problems.append(f"{where}: no resources specified")
        raw_resources = []
    if not isinstance(raw_resources, list):
        problems.append(f"{where}.resources: expected a list, got {_type_name(raw_resources)}")
        raw_resources = []
    # Time-slicing: upstream v0.15+ accepts 1 (a GPU listed but not shared yet; its rejection
    # text for 0 says ">= 0", a typo we do not copy). MPS splits a GPU's memory and threads
    # between its clients: one replica shares nothing, so 2 is its minimum.
    minimum = 1 if mode is Sharing.TIME_SLICING else 2
    resources: list[ReplicatedResource] = []
    seen: set[str] = set()
    for i, raw_r in enumerate(raw_resources):
        rw = f"{where}.resources[{i}]"
        resource = _replicated_resource(rw, raw_r, minimum, problems, warnings)
        if resource is None:
            continue
        if resource.name in seen:
            problems.append(f"{rw}: duplicate resource name: {resource.name}")
            continue
        seen.add(resource.name)
        resources.append(resource)
    return SharingConfig(mode, flags["renameByDefault"], flags["failRequestsGreaterThanOne"],
                         tuple(resources))


def _replicated_resource(where: str, raw: object, minimum: int, problems: list[str],
                         warnings: list[str]) -> ReplicatedResource | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping, got {_type_name(raw)}")
        return None
    before = len(problems)
    for key in raw:
        if key not in _RESOURCE_KEYS:
            warnings.append(f"{where}.{key}: unknown key, ignored")
    if "rename" in raw:
        warnings.append(f"{where}.rename: renaming a shared resource is not supported, ignored "
                        "(as upstream); use renameByDefault")

    name = ""
    raw_name = raw.get("name")
    if raw_name is None:
        problems.append(f"{where}: no resource name specified")
    elif not isinstance(raw_name, str):
        problems.append(f"{where}.name: expected a string, got {_type_name(raw_name)}")
    else:
        try:
            name = normalize_resource_name(raw_name)
        except ValueError as e:
            problems.append(f"{where}.name: {e}")
        else:
            if not is_shareable_name(name):
                problems.append(f"{where}.name: cannot share {name}: only {GPU_RESOURCE} and "
                                f"{MIG_RESOURCE_PREFIX}<profile> can be shared")

    replicas: int | None = None
    if raw.get("replicas") is not None:
        try:
            replicas = _replica_count(raw["replicas"], minimum)
        except _Bad as e:
            problems.append(f"{where}.replicas: {e}")

    devices: DeviceSelection = ALL
    try:
        devices = _devices(UNSET if raw.get("devices") is None else raw["devices"])
    except _Bad as e:
        problems.append(f"{where}.devices: {e}")

    per_gpu: dict[str, int] = {}
    raw_per_gpu = raw.get("perGpu")
    if raw_per_gpu is not None:
        if not isinstance(raw_per_gpu, Mapping) or not raw_per_gpu:
            problems.append(f"{where}.perGpu: expected a non-empty mapping of GPU index or UUID "
                            "to replicas")
        else:
            for key, count in raw_per_gpu.items():
                try:
                    ref = _device_ref(key)
                except _Bad:
                    problems.append(f"{where}.perGpu: unsupported device reference: {key}")
                    continue
                if ref in per_gpu:
                    problems.append(f"{where}.perGpu: device {ref} given twice")
                    continue
                try:
                    per_gpu[ref] = _replica_count(count, minimum)
                except _Bad as e:
                    problems.append(f"{where}.perGpu[{ref}]: {e}")

    if "replicas" not in raw or raw.get("replicas") is None:
        if raw_per_gpu is None:
            problems.append(f"{where}: no replicas specified")
        elif raw.get("devices") is not None:
            problems.append(f"{where}: devices needs replicas (without replicas, perGpu alone "
                            "selects the devices)")
    if len(problems) > before:
        return None
    return ReplicatedResource(name, replicas, devices, MappingProxyType(per_gpu))


# --- merging ----------------------------------------------------------------------------------

def _parse_layer(setting: _Setting, value: object, *, from_text: bool) -> object:
    if setting.kind == "bool":
        return _as_bool(value, from_text=from_text)
    if setting.kind == "list":
        return _as_str_list(value, from_text=from_text)
    if from_text and not isinstance(value, str):
        value = str(value)
    return _as_str(value)


def _load_file(text: str, problems: list[str], warnings: list[str]) -> Mapping[str, object]:
    try:
        doc = _parse_yaml(text)
    except yaml.YAMLError as e:
        problems.append(f"not valid YAML: {' '.join(str(e).split())}")
        return {}
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        problems.append(f"expected a mapping at the top level, got {_type_name(doc)}")
        return {}
    version = doc.get("version")
    if version is not None and version != VERSION:
        problems.append(f"unknown version: {version}")
    for key in doc:
        if key not in ("version", "flags", "sharing", "resources"):
            warnings.append(f"{key}: unknown key, ignored")
    if "resources" in doc:
        warnings.append("resources: customizing resource names is not supported, ignored "
                        "(as upstream)")
    flags_section = doc.get("flags")
    if flags_section is not None:
        if not isinstance(flags_section, Mapping):
            problems.append(f"flags: expected a mapping, got {_type_name(flags_section)}")
        else:
            for key in flags_section:
                if key not in _KNOWN_FLAGS_KEYS:
                    warnings.append(f"flags.{key}: unknown key, ignored")
            plugin = flags_section.get("plugin")
            if plugin is not None and not isinstance(plugin, Mapping):
                problems.append(f"flags.plugin: expected a mapping, got {_type_name(plugin)}")
            elif isinstance(plugin, Mapping):
                for key in plugin:
                    if key not in _KNOWN_PLUGIN_KEYS:
                        warnings.append(f"flags.plugin.{key}: unknown key, ignored")
    sharing = doc.get("sharing")
    if sharing is not None and not isinstance(sharing, Mapping):
        problems.append(f"sharing: expected a mapping, got {_type_name(sharing)}")
    elif isinstance(sharing, Mapping):
        for key in sharing:
            if key not in ("timeSlicing", "mps"):
                warnings.append(f"sharing.{key}: unknown key, ignored")
    return doc


def load_config(*, file_text: str | None, file_source: str = "config file",
                env: Mapping[str, str], flags: Mapping[str, object]) -> Config:
    """Merge flags > env > file > defaults into one `Config`; raise `ConfigError` listing every
    problem. `flags` holds only what the command line set (None / UNSET values count as unset);
    keys are flag names ("mig-strategy", "--mig-strategy" or "mig_strategy"); unknown keys are
    ignored, so a composition root may pass its whole argument namespace."""
    problems: list[str] = []
    warnings: list[str] = []
    doc: Mapping[str, object] = {}
    if file_text is not None:
        doc = _load_file(file_text, problems, warnings)

    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for s in _SETTINGS:
        layers: tuple[tuple[object, str, bool], ...] = (
            (_flag_value(flags, s.flag), f"--{s.flag}", True),
            (_env_value(env, s.env), f"env {s.env}", True),
            (_file_value(doc, s.path), f"config {'.'.join(s.path)}", False),
        )
        for raw, origin, from_text in layers:
            if raw is UNSET:
                continue
            try:
                value = _parse_layer(s, raw, from_text=from_text)
            except _Bad as e:
                problems.append(f"invalid --{s.flag} option: {e} (from {origin})")
                break
            problem = s.check(value) if s.check else None
            if problem:
                problems.append(f"{problem} (from {origin})")
                break
            values[s.attr] = value
            sources[s.attr] = origin
            break
        else:
            sources[s.attr] = "default"

    sharing = doc.get("sharing")
    time_slicing = mps = None
    if isinstance(sharing, Mapping):
        if sharing.get("timeSlicing") is not None:
            time_slicing = _sharing_section(Sharing.TIME_SLICING, "sharing.timeSlicing",
                                            sharing["timeSlicing"], problems, warnings)
        if sharing.get("mps") is not None:
            mps = _sharing_section(Sharing.MPS, "sharing.mps", sharing["mps"], problems, warnings)
    if time_slicing is not None and mps is not None:
        problems.append("sharing: timeSlicing and mps cannot be used together")
    if mps is not None:
        if values.get("mig_strategy", MigStrategy.NONE) == MigStrategy.MIXED:
            problems.append("using --mig-strategy=mixed is not supported with MPS")
        if values.get("mps_root", "/run/nvidia/mps") == "":
            problems.append("using MPS requires --mps-root to be specified")

    if problems:
        raise ConfigError(file_source if file_text is not None else NO_FILE_SOURCE, problems)

    if "mig_strategy" in values:
        values["mig_strategy"] = MigStrategy(str(values["mig_strategy"]))
    if "allocation_policy" in values:
        values["allocation_policy"] = Policy(str(values["allocation_policy"]))
    return Config(time_slicing=time_slicing, mps=mps, sources=MappingProxyType(sources),
                  warnings=tuple(warnings), **values)  # type: ignore[arg-type]


# --- per-node named configs -------------------------------------------------------------------

NODE_CONFIG_LABEL: Final = "nvidia.com/device-plugin.config"
DEFAULT_CONFIG_NAME: Final = "default"


def select_named_config(configs: Mapping[str, str], label_value: str | None,
                        default_name: str = DEFAULT_CONFIG_NAME, *,
                        source: str = "named configs") -> tuple[str, str]:
    """Pick one config file out of a ConfigMap's data, as upstream's config manager does.

    A label value names the config and must exist (a typo must not silently fall back). Without
    one: the config named `default_name`, else the only config. Returns (name, file text).
    """
    if label_value:
        if label_value in configs:
            return label_value, configs[label_value]
        have = ", ".join(sorted(configs)) or "none"
        raise ConfigError(source, [f"node label {NODE_CONFIG_LABEL}={label_value} names a config "
                                   f"that does not exist (have: {have})"])
    if default_name and default_name in configs:
        return default_name, configs[default_name]
    if len(configs) == 1:
        (name, text), = configs.items()
        return name, text
    if not configs:
        raise ConfigError(source, ["no named configs to choose from"])
    raise ConfigError(source, [
        f"no config selected: node label {NODE_CONFIG_LABEL} is not set, there is no "
        f"'{default_name}' config, and {len(configs)} configs to choose from "
        f"({', '.join(sorted(configs))})"])


def parse_named_configs(configs: Mapping[str, str], *, source: str = "named configs",
                        env: Mapping[str, str] | None = None,
                        flags: Mapping[str, object] | None = None) -> Mapping[str, Config]:
    """Load every named config (each merged with the same env and flags), so a bad one is
    reported when the ConfigMap changes, not only when a node switches to it. Raises one
    `ConfigError` with every problem, each prefixed by its config's name."""
    loaded: dict[str, Config] = {}
    problems: list[str] = []
    for name in sorted(configs):
        try:
            loaded[name] = load_config(file_text=configs[name], file_source=f"{source}/{name}",
                                       env=env or {}, flags=flags or {})
        except ConfigError as e:
            problems += [f"{name}: {p}" for p in e.problems]
    if problems:
        raise ConfigError(source, problems)
    return MappingProxyType(loaded)


def load_named_config(configs: Mapping[str, str], label_value: str | None, *,
                      env: Mapping[str, str], flags: Mapping[str, object],
                      default_name: str = DEFAULT_CONFIG_NAME,
                      source: str = "named configs") -> tuple[str, Config]:
    """`select_named_config`, then `load_config` on the chosen file: (name, Config)."""
    name, text = select_named_config(configs, label_value, default_name, source=source)
    return name, load_config(file_text=text, file_source=f"{source}/{name}", env=env, flags=flags)

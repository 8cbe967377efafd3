"""Config: upstream's v1 file, env and flags merged flag > env > file > default, every problem
reported at once with upstream's texts."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import config, shipped
from sharepack.common.config import UNSET, Config, ReplicatedResource, load_config
from sharepack.common.errors import ConfigError
from sharepack.common.policies import MigStrategy, Policy, Sharing

GPU_UUID = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
MIG_UUID = "MIG-3eb87630-93d5-b2b6-b8ff-9b359caf4ee2"
OLD_MIG_UUID = "MIG-GPU-662077db-fa3f-0d8f-9502-21ab0ef058a2/10/0"


def load(text: str | None = None, *, env: Mapping[str, str] | None = None,
         flags: Mapping[str, object] | None = None) -> Config:
    return load_config(file_text=None if text is None else textwrap.dedent(text),
                       file_source="cfg.yaml", env=env or {}, flags=flags or {})


def problems(text: str | None = None, *, env: Mapping[str, str] | None = None,
             flags: Mapping[str, object] | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        load(text, env=env, flags=flags)
    return info.value.problems


def ts(resources: str, extra: str = "") -> str:
    """A file with a timeSlicing section holding `resources` (YAML list items)."""
    body = textwrap.indent(textwrap.dedent(resources).strip(), "      ")
    return f"version: v1\nsharing:\n  timeSlicing:\n{extra}    resources:\n{body}\n"


# --- defaults and precedence ------------------------------------------------------------------

def test_no_file_no_env_no_flags_gives_upstream_defaults_and_the_shipped_policy() -> None:
    c = load()
    assert (c.mig_strategy, c.fail_on_init_error, c.nvidia_driver_root, c.pass_device_specs,
            c.device_list_strategy, c.device_id_strategy) == (MigStrategy.NONE, True, "/", False, ("envvar",), "uuid")
    # Upstream allocates `distributed` by default; ours is what deploy/ ships.
    assert c.allocation_policy is shipped.AGENT_POLICY is Policy.PACKED
    assert c.sharing is None and c.sharing_mode is Sharing.NONE
    assert set(c.sources.values()) == {"default"}
    assert c == Config(sources=c.sources)


FULL_FILE = """
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [volume-mounts, cdi-cri]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    sharedDevicesAllocationPolicy: packed
"""


def test_every_flag_is_read_from_its_upstream_place_in_the_file() -> None:
    c = load(FULL_FILE)
    assert (c.mig_strategy, c.fail_on_init_error, c.nvidia_driver_root, c.pass_device_specs,
            c.device_list_strategy, c.device_id_strategy, c.cdi_annotation_prefix,
            c.allocation_policy) == (
        MigStrategy.MIXED, False, "/run/nvidia/driver", True, ("volume-mounts", "cdi-cri"),
        "index", "cdi.example.com/", Policy.PACKED)
    assert c.sources["allocation_policy"] == "config flags.plugin.sharedDevicesAllocationPolicy"
    assert c.warnings == ()


@pytest.mark.parametrize(
    ("env", "flags", "want", "source"),
    [
        pytest.param({}, {}, Policy.PACKED, "config flags.plugin.sharedDevicesAllocationPolicy",
                     id="the file wins over the default"),
        pytest.param({"SHARED_DEVICES_ALLOCATION_POLICY": "spread"}, {}, Policy.SPREAD,
                     "env SHARED_DEVICES_ALLOCATION_POLICY", id="env wins over the file"),
        pytest.param({"SHARED_DEVICES_ALLOCATION_POLICY": "spread"},
                     {"shared-devices-allocation-policy": "distributed"}, Policy.DISTRIBUTED,
                     "--shared-devices-allocation-policy", id="a flag wins over env and file"),
        pytest.param({}, {"shared_devices_allocation_policy": "spread"}, Policy.SPREAD,
                     "--shared-devices-allocation-policy",
                     id="argparse-style flag keys are accepted"),
        pytest.param({}, {"--shared-devices-allocation-policy": "spread"}, Policy.SPREAD,
                     "--shared-devices-allocation-policy", id="dashed flag keys are accepted"),
        pytest.param({}, {"shared-devices-allocation-policy": None}, Policy.PACKED,
                     "config flags.plugin.sharedDevicesAllocationPolicy",
                     id="a flag left at None does not override the file"),
        pytest.param({}, {"shared-devices-allocation-policy": UNSET}, Policy.PACKED,
                     "config flags.plugin.sharedDevicesAllocationPolicy",
                     id="a flag left UNSET does not override the file"),
        pytest.param({"SHARED_DEVICES_ALLOCATION_POLICY": ""}, {}, Policy.PACKED,
                     "config flags.plugin.sharedDevicesAllocationPolicy",
                     id="an empty env var counts as unset"),
    ],
)
def test_precedence_is_flag_then_env_then_file_then_default(
    env: dict[str, str], flags: dict[str, object], want: Policy, source: str
) -> None:
    c = load(FULL_FILE, env=env, flags=flags)
    assert c.allocation_policy is want
    assert c.sources["allocation_policy"] == source


@pytest.mark.parametrize(
    ("env", "attr", "want"),
    [
        pytest.param({"MIG_STRATEGY": "single"}, "mig_strategy", MigStrategy.SINGLE,
                     id="MIG_STRATEGY sets the mig strategy"),
        pytest.param({"FAIL_ON_INIT_ERROR": "false"}, "fail_on_init_error", False,
                     id="FAIL_ON_INIT_ERROR parses like Go's ParseBool"),
        pytest.param({"FAIL_ON_INIT_ERROR": "F"}, "fail_on_init_error", False,
                     id="FAIL_ON_INIT_ERROR accepts Go's short false"),
        pytest.param({"PASS_DEVICE_SPECS": "1"}, "pass_device_specs", True,
                     id="PASS_DEVICE_SPECS accepts 1"),
        pytest.param({"NVIDIA_DRIVER_ROOT": "/drv"}, "nvidia_driver_root", "/drv",
                     id="NVIDIA_DRIVER_ROOT sets the driver root"),
        pytest.param({"DEVICE_LIST_STRATEGY": "envvar,cdi-annotations"}, "device_list_strategy",
                     ("envvar", "cdi-annotations"), id="DEVICE_LIST_STRATEGY is comma-separated"),
        pytest.param({"DEVICE_ID_STRATEGY": "index"}, "device_id_strategy", "index",
                     id="DEVICE_ID_STRATEGY sets the id strategy"),
        pytest.param({"CDI_ANNOTATION_PREFIX": "x/"}, "cdi_annotation_prefix", "x/",
                     id="CDI_ANNOTATION_PREFIX sets the annotation prefix"),
        pytest.param({"MPS_ROOT": "/mps"}, "mps_root", "/mps", id="MPS_ROOT sets the mps root"),
        pytest.param({"SHARED_DEVICES_ALLOCATION_POLICY": "packed"}, "allocation_policy",
                     Policy.PACKED, id="SHARED_DEVICES_ALLOCATION_POLICY sets the policy"),
    ],
)
def test_each_upstream_env_var_sets_its_setting(env: dict[str, str], attr: str,
                                                 want: object) -> None:
    assert getattr(load(env=env), attr) == want


@pytest.mark.parametrize(
    ("flags", "attr", "want"),
    [
        pytest.param({"fail-on-init-error": False}, "fail_on_init_error", False,
                     id="a boolean flag may be a real bool"),
        pytest.param({"pass-device-specs": "true"}, "pass_device_specs", True,
                     id="a boolean flag may be text"),
        pytest.param({"device-list-strategy": ["envvar", "cdi-cri"]}, "device_list_strategy",
                     ("envvar", "cdi-cri"), id="a repeated list flag gives a list"),
        pytest.param({"device-list-strategy": ["envvar,cdi-cri"]}, "device_list_strategy",
                     ("envvar", "cdi-cri"), id="list flag items are comma-split as upstream"),
        pytest.param({"mig-strategy": MigStrategy.MIXED}, "mig_strategy", MigStrategy.MIXED,
                     id="an enum value is accepted as a flag"),
        pytest.param({"kubelet-socket": "/x", "node_name": "n"}, "mig_strategy", MigStrategy.NONE,
                     id="flags that are not config settings are ignored"),
    ],
)
def test_flags_accept_what_a_composition_root_passes(flags: dict[str, object], attr: str,
                                                     want: object) -> None:
    assert getattr(load(flags=flags), attr) == want


def test_device_list_strategy_in_the_file_may_be_a_single_string() -> None:
    c = load("flags: {plugin: {deviceListStrategy: cdi-annotations}}")
    assert c.device_list_strategy == ("cdi-annotations",)


@pytest.mark.parametrize(
    ("env_var", "value"),
    [
        ("MIG_STRATEGY", "mixed"),
        ("FAIL_ON_INIT_ERROR", "false"),
        ("DEVICE_ID_STRATEGY", "index"),
        ("SHARED_DEVICES_ALLOCATION_POLICY", "spread"),
    ],
    ids=["mig strategy", "fail on init error", "device id strategy", "allocation policy"],
)
def test_a_bad_file_value_overridden_by_env_is_not_reported(env_var: str, value: str) -> None:
    bad = """
    flags:
      migStrategy: bogus
      failOnInitError: bogus
      plugin: {deviceIDStrategy: bogus, sharedDevicesAllocationPolicy: bogus}
    """
    got = problems(bad, env={env_var: value})
    assert len(got) == 3 and not any(env_var in p for p in got)


@given(
    file=st.one_of(st.none(), st.sampled_from(list(Policy))),
    env=st.one_of(st.none(), st.sampled_from(list(Policy))),
    flag=st.one_of(st.none(), st.sampled_from(list(Policy))),
)
def test_the_highest_layer_that_sets_a_value_always_wins(
    file: Policy | None, env: Policy | None, flag: Policy | None
) -> None:
    text = None if file is None else f"flags: {{plugin: {{sharedDevicesAllocationPolicy: {file}}}}}"
    c = load(text, env={} if env is None else {"SHARED_DEVICES_ALLOCATION_POLICY": str(env)},
             flags={"shared-devices-allocation-policy": flag})
    want = next((v for v in (flag, env, file) if v is not None), shipped.AGENT_POLICY)
    assert c.allocation_policy is want


def test_config_file_path_prefers_the_flag_over_config_file_env() -> None:
    assert config.config_file_path(env={"CONFIG_FILE": "/e"}, flags={"config_file": "/f"}) == "/f"
    assert config.config_file_path(env={"CONFIG_FILE": "/e"}, flags={"config-file": None}) == "/e"
    assert config.config_file_path(env={"CONFIG_FILE": ""}, flags={}) is None


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        load().mig_strategy = MigStrategy.MIXED  # type: ignore[misc]


# --- flag validation (upstream texts) ---------------------------------------------------------

@pytest.mark.parametrize(
    ("env", "flags", "text", "want"),
    [
        pytest.param({}, {"shared-devices-allocation-policy": "spreadd"}, None,
                     "invalid --shared-devices-allocation-policy option: spreadd "
                     "(from --shared-devices-allocation-policy)",
                     id="an unknown allocation policy flag is rejected with upstream's text"),
        pytest.param({"SHARED_DEVICES_ALLOCATION_POLICY": "tight"}, {}, None,
                     "invalid --shared-devices-allocation-policy option: tight "
                     "(from env SHARED_DEVICES_ALLOCATION_POLICY)",
                     id="an unknown allocation policy from env names the env var"),
        pytest.param({}, {}, "flags: {plugin: {sharedDevicesAllocationPolicy: Packed}}",
                     "invalid --shared-devices-allocation-policy option: Packed "
                     "(from config flags.plugin.sharedDevicesAllocationPolicy)",
                     id="policy names are case-sensitive, as upstream's"),
        pytest.param({"MIG_STRATEGY": "all"}, {}, None,
                     "unknown mig strategy: all (from env MIG_STRATEGY)",
                     id="an unknown mig strategy is rejected"),
        pytest.param({}, {"device-id-strategy": "serial"}, None,
                     "invalid --device-id-strategy option: serial (from --device-id-strategy)",
                     id="an unknown device id strategy is rejected with upstream's text"),
        pytest.param({"DEVICE_LIST_STRATEGY": "envvar,cdi"}, {}, None,
                     "invalid --device-list-strategy option: invalid strategy: cdi "
                     "(from env DEVICE_LIST_STRATEGY)",
                     id="an unknown device list strategy is rejected with upstream's text"),
        pytest.param({}, {}, "flags: {plugin: {deviceListStrategy: []}}",
                     "invalid --device-list-strategy option: empty device list strategy "
                     "(from config flags.plugin.deviceListStrategy)",
                     id="an empty device list strategy is rejected"),
        pytest.param({}, {}, "flags: {plugin: {deviceListStrategy: {a: 1}}}",
                     "invalid --device-list-strategy option: invalid deviceListStrategy: "
                     "{'a': 1} (from config flags.plugin.deviceListStrategy)",
                     id="a device list strategy that is neither string nor list is rejected"),
        pytest.param({"FAIL_ON_INIT_ERROR": "yes"}, {}, None,
                     "invalid --fail-on-init-error option: not a boolean: 'yes' "
                     "(from env FAIL_ON_INIT_ERROR)",
                     id="a boolean env var outside Go's ParseBool is rejected"),
        pytest.param({}, {}, "flags: {failOnInitError: 'true'}",
                     "invalid --fail-on-init-error option: expected a boolean, got string "
                     "'true' (from config flags.failOnInitError)",
                     id="a quoted boolean in the file is rejected, as upstream's decoder does"),
        pytest.param({}, {}, "flags: {nvidiaDriverRoot: [a]}",
                     "invalid --nvidia-driver-root option: expected a string, got list ['a'] "
                     "(from config flags.nvidiaDriverRoot)",
                     id="a list where a string belongs is rejected"),
    ],
)
def test_a_bad_setting_is_reported_with_its_origin(env: dict[str, str],
                                                   flags: dict[str, object], text: str | None,
                                                   want: str) -> None:
    assert problems(text, env=env, flags=flags) == (want,)


def test_every_problem_is_reported_at_once() -> None:
    text = ts("- {name: nvidia.com/gpu, replicas: 0}")
    got = problems(text, env={"MIG_STRATEGY": "x", "DEVICE_ID_STRATEGY": "y"},
                   flags={"shared-devices-allocation-policy": "z"})
    assert got == (
        "unknown mig strategy: x (from env MIG_STRATEGY)",
        "invalid --device-id-strategy option: y (from env DEVICE_ID_STRATEGY)",
        "invalid --shared-devices-allocation-policy option: z "
        "(from --shared-devices-allocation-policy)",
        "sharing.timeSlicing.resources[0].replicas: number of replicas must be >= 1, got 0",
    )


def test_config_error_names_the_file_and_lists_problems() -> None:
    with pytest.raises(ConfigError) as info:
        load("version: v2")
    assert info.value.source == "cfg.yaml"
    assert str(info.value) == "invalid config from cfg.yaml:\n  - unknown version: v2"


def test_without_a_file_the_error_source_says_command_line_and_environment() -> None:
    with pytest.raises(ConfigError) as info:
        load(env={"MIG_STRATEGY": "x"})
    assert info.value.source == "command line and environment"


# --- the file's shape -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("version: v2", "unknown version: v2", id="an unknown version is rejected"),
        pytest.param("[1, 2]", "expected a mapping at the top level, got list",
                     id="a top level that is not a mapping is rejected"),
        pytest.param("flags: [a]", "flags: expected a mapping, got list",
                     id="flags that are not a mapping are rejected"),
        pytest.param("flags: {plugin: 3}", "flags.plugin: expected a mapping, got integer",
                     id="a plugin section that is not a mapping is rejected"),
        pytest.param("sharing: 3", "sharing: expected a mapping, got integer",
                     id="a sharing section that is not a mapping is rejected"),
        pytest.param("sharing: {timeSlicing: [a]}",
                     "sharing.timeSlicing: expected a mapping, got list",
                     id="a timeSlicing section that is not a mapping is rejected"),
        pytest.param("flags: {a: [}", "not valid YAML: ", id="broken YAML is reported"),
    ],
)
def test_a_malformed_file_is_rejected(text: str, want: str) -> None:
    got = problems(text)
    assert len(got) == 1 and got[0].startswith(want)


@pytest.mark.parametrize(
    "text",
    ["", "version: v1", "# only a comment\n", "version: v1\nflags:\nsharing:\n"],
    ids=["an empty file", "only a version", "only a comment", "empty sections"],
)
def test_an_empty_file_means_defaults(text: str) -> None:
    assert load(text) == Config(sources=load().sources)


def test_unknown_keys_and_upstream_only_sections_become_warnings() -> None:
    c = load("""
    version: v1
    colour: blue
    resources: {gpus: []}
    flags: {gfd: {oneshot: true}, plugin: {nvidiaCTKPath: /x, bogus: 1}, bogus: 2}
    sharing:
      spaceSlicing: {}
      timeSlicing:
        extra: 1
        resources: [{name: nvidia.com/gpu, replicas: 2, rename: gpu.x, weird: 1}]
    """)
    assert c.warnings == (
        "colour: unknown key, ignored",
        "resources: customizing resource names is not supported, ignored (as upstream)",
        "flags.bogus: unknown key, ignored",
        "flags.plugin.bogus: unknown key, ignored",
        "sharing.spaceSlicing: unknown key, ignored",
        "sharing.timeSlicing.extra: unknown key, ignored",
        "sharing.timeSlicing.resources[0].weird: unknown key, ignored",
        "sharing.timeSlicing.resources[0].rename: renaming a shared resource is not supported, "
        "ignored (as upstream); use renameByDefault",
    )


# --- sharing ----------------------------------------------------------------------------------

def test_time_slicing_is_read_with_upstream_defaults() -> None:
    c = load(ts("- name: nvidia.com/gpu\n  replicas: 4"))
    assert c.sharing == config.SharingConfig(
        Sharing.TIME_SLICING, rename_by_default=False, fail_requests_greater_than_one=False,
        resources=(ReplicatedResource("nvidia.com/gpu", 4),))
    assert c.sharing_mode is Sharing.TIME_SLICING and c.time_slicing is c.sharing


def test_mps_is_read_with_its_flags() -> None:
    c = load("""
    sharing:
      mps:
        renameByDefault: true
        failRequestsGreaterThanOne: true
        resources: [{name: gpu, replicas: 3}]
    """)
    assert c.mps is not None and c.time_slicing is None
    assert (c.sharing_mode, c.mps.rename_by_default, c.mps.fail_requests_greater_than_one,
            c.mps.resources) == (Sharing.MPS, True, True,
                                 (ReplicatedResource("nvidia.com/gpu", 3),))


@pytest.mark.parametrize(
    ("devices", "want"),
    [
        pytest.param("all", "all", id="devices all"),
        pytest.param("2", 2, id="a count of devices"),
        pytest.param("[0, 1]", ("0", "1"), id="a list of GPU indices as numbers"),
        pytest.param('["0", "1:0", 1:2]', ("0", "1:0", "1:2"),
                     id="MIG indices stay text, even unquoted (no base-60 numbers)"),
        pytest.param(f"[{GPU_UUID}, {MIG_UUID}, '{OLD_MIG_UUID}']",
                     (GPU_UUID, MIG_UUID, OLD_MIG_UUID), id="GPU and both MIG UUID forms"),
    ],
)
def test_devices_take_every_upstream_form(devices: str, want: object) -> None:
    c = load(ts(f"- {{name: nvidia.com/gpu, replicas: 2, devices: {devices}}}"))
    assert c.sharing is not None and c.sharing.resources[0].devices == want


def test_a_missing_devices_means_all() -> None:
    c = load(ts("- {name: nvidia.com/gpu, replicas: 2}"))
    assert c.sharing is not None and c.sharing.resources[0].devices == "all"


def test_names_without_a_prefix_get_nvidia_com() -> None:
    c = load(ts("- {name: mig-1g.5gb, replicas: 2}"))
    assert c.sharing is not None and c.sharing.resources[0].name == "nvidia.com/mig-1g.5gb"


def test_per_gpu_counts_are_read_by_index_and_uuid() -> None:
    c = load(ts(f"""
    - name: nvidia.com/gpu
      replicas: 2
      perGpu:
        0: 8
        "1": 3
        {GPU_UUID}: 1
    """))
    assert c.sharing is not None
    assert dict(c.sharing.resources[0].per_gpu) == {"0": 8, "1": 3, GPU_UUID: 1}


def test_per_gpu_alone_selects_the_devices() -> None:
    c = load(ts("- {name: nvidia.com/gpu, perGpu: {0: 4, 2: 2}}"))
    assert c.sharing is not None
    r = c.sharing.resources[0]
    assert (r.replicas, r.devices, dict(r.per_gpu)) == (None, "all", {"0": 4, "2": 2})


R0 = "sharing.timeSlicing.resources[0]"


@pytest.mark.parametrize(
    ("resources", "want"),
    [
        pytest.param("- {replicas: 2}", f"{R0}: no resource name specified",
                     id="a resource without a name is rejected"),
        pytest.param("- {name: nvidia.com/gpu}", f"{R0}: no replicas specified",
                     id="a resource without replicas is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 0}",
                     f"{R0}.replicas: number of replicas must be >= 1, got 0",
                     id="zero time-slicing replicas are rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: -1}",
                     f"{R0}.replicas: number of replicas must be >= 1, got -1",
                     id="negative replicas are rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: two}",
                     f"{R0}.replicas: replicas must be an integer, got string 'two'",
                     id="replicas that are not a number are rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: true}",
                     f"{R0}.replicas: replicas must be an integer, got boolean True",
                     id="a boolean is not a replica count"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: some}",
                     f"{R0}.devices: devices set as 'some' but the only valid string input "
                     "is 'all'", id="a devices string other than all is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: -2}",
                     f"{R0}.devices: devices set as '-2' but a count of devices must be > 0",
                     id="a non-positive device count is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: 2.0}",
                     f"{R0}.devices: unrecognized type for devices spec: 2.0",
                     id="a fractional device count is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: [-1]}",
                     f"{R0}.devices: unsupported type for device in devices list: -1",
                     id="a negative GPU index is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: [GPU-UUID]}",
                     f"{R0}.devices: unsupported type for device in devices list: GPU-UUID",
                     id="a GPU UUID that is not a UUID is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: [MIG-GPU-4cf8db2d-06c0-"
                     "7d70-1a51-e59b25b2c16c]}",
                     f"{R0}.devices: unsupported type for device in devices list: "
                     "MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
                     id="an old-style MIG UUID without GI and CI is rejected"),
        pytest.param("- {name: nvidia.com/gpu, replicas: 2, devices: [0, '0']}",
                     f"{R0}.devices: device 0 listed twice",
                     id="a device listed twice is rejected"),
        pytest.param("- {name: $invalid$, replicas: 2}",
                     f"{R0}.name: incorrect format for resource name 'nvidia.com/$invalid$': a "
                     "lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                     "characters, '-' or '.', and must start and end with an alphanumeric "
                     "character", id="a malformed resource name is rejected with upstream's text"),
        pytest.param(f"- {{name: mig-{'x' * 60}, replicas: 2}}",
                     f"{R0}.name: fully-qualified resource name must be 63 characters or less: "
                     f"nvidia.com/mig-{'x' * 60}", id="an over-long resource name is rejected"),
        pytest.param("- {name: nvidia.com/tpu, replicas: 2}",
                     f"{R0}.name: cannot share nvidia.com/tpu: only nvidia.com/gpu and "
                     "nvidia.com/mig-<profile> can be shared",
                     id="a resource the agent never serves cannot be shared"),
        pytest.param("- {name: 7, replicas: 2}", f"{R0}.name: expected a string, got integer",
                     id="a resource name that is not a string is rejected"),
        pytest.param("- [a]", f"{R0}: expected a mapping, got list",
                     id="a resource that is not a mapping is rejected"),
        pytest.param("- {name: gpu, replicas: 2}\n- {name: nvidia.com/gpu, replicas: 3}",
                     "sharing.timeSlicing.resources[1]: duplicate resource name: nvidia.com/gpu",
                     id="the same resource shared twice is rejected"),
        pytest.param("- {name: gpu, perGpu: [0]}",
                     f"{R0}.perGpu: expected a non-empty mapping of GPU index or UUID to "
                     "replicas", id="perGpu that is not a mapping is rejected"),
        pytest.param("- {name: gpu, perGpu: {}}",
                     f"{R0}.perGpu: expected a non-empty mapping of GPU index or UUID to "
                     "replicas", id="an empty perGpu is rejected"),
        pytest.param("- {name: gpu, perGpu: {x: 2}}",
                     f"{R0}.perGpu: unsupported device reference: x",
                     id="a perGpu key that is no device reference is rejected"),
        pytest.param("- {name: gpu, perGpu: {0: 2, '0': 3}}",
                     f"{R0}.perGpu: device 0 given twice",
                     id="a perGpu device given twice is rejected"),
        pytest.param("- {name: gpu, perGpu: {0: 0}}",
                     f"{R0}.perGpu[0]: number of replicas must be >= 1, got 0",
                     id="a perGpu count below the minimum is rejected"),
        pytest.param("- {name: gpu, perGpu: {0: 2}, devices: [0]}",
                     f"{R0}: devices needs replicas (without replicas, perGpu alone selects "
                     "the devices)", id="devices without replicas is rejected"),
    ],
)
def test_a_bad_shared_resource_is_rejected(resources: str, want: str) -> None:
    assert problems(ts(resources)) == (want,)


@pytest.mark.parametrize(
    ("section", "want"),
    [
        pytest.param("timeSlicing: {}", "sharing.timeSlicing: no resources specified",
                     id="time slicing without resources is rejected"),
        pytest.param("timeSlicing: {resources: []}", "sharing.timeSlicing: no resources specified",
                     id="time slicing with an empty resource list is rejected"),
        pytest.param("timeSlicing: {resources: {a: 1}}",
                     "sharing.timeSlicing.resources: expected a list, got mapping",
                     id="resources that are not a list are rejected"),
        pytest.param("timeSlicing: {renameByDefault: 1, resources: [{name: gpu, replicas: 2}]}",
                     "sharing.timeSlicing.renameByDefault: expected a boolean, got integer 1",
                     id="a non-boolean renameByDefault is rejected"),
        pytest.param("mps: {resources: [{name: gpu, replicas: 1}]}",
                     "sharing.mps.resources[0].replicas: number of replicas must be >= 2, got 1",
                     id="one MPS replica is rejected: it shares nothing"),
        pytest.param("mps: {resources: [{name: gpu, replicas: 2}]}\n  timeSlicing: "
                     "{resources: [{name: gpu, replicas: 2}]}",
                     "sharing: timeSlicing and mps cannot be used together",
                     id="time slicing and MPS together are rejected"),
    ],
)
def test_a_bad_sharing_section_is_rejected(section: str, want: str) -> None:
    assert problems(f"sharing:\n  {section}\n") == (want,)


def test_mps_with_mixed_mig_strategy_is_rejected_with_upstreams_text() -> None:
    got = problems("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
                   env={"MIG_STRATEGY": "mixed"})
    assert got == ("using --mig-strategy=mixed is not supported with MPS",)


def test_mps_with_an_empty_mps_root_is_rejected_with_upstreams_text() -> None:
    got = problems("flags: {mpsRoot: ''}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}")
    assert got == ("using MPS requires --mps-root to be specified",)


def test_time_slicing_accepts_one_replica() -> None:
    c = load(ts("- {name: gpu, replicas: 1}"))
    assert c.sharing is not None and c.sharing.resources[0].replicas == 1


def test_describe_gives_the_effective_config_in_the_files_shape() -> None:
    c = load(ts("- {name: gpu, replicas: 2, devices: [0], perGpu: {0: 3}}"),
             env={"DEVICE_ID_STRATEGY": "index"})
    view = c.describe()
    assert view["sharing"] == {"timeSlicing": {
        "renameByDefault": False, "failRequestsGreaterThanOne": False,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": ["0"],
                       "perGpu": {"0": 3}}]}}
    assert view["flags"] == {
        "migStrategy": "none", "failOnInitError": True, "nvidiaDriverRoot": "/",
        "mpsRoot": "/run/nvidia/mps",
        "plugin": {"passDeviceSpecs": False, "deviceListStrategy": ["envvar"],
                   "deviceIDStrategy": "index", "cdiAnnotationPrefix": "cdi.k8s.io/",
                   "sharedDevicesAllocationPolicy": "packed"}}
    assert view["sources"] == dict(c.sources)
    assert isinstance(view["sources"], dict)
    assert view["sources"]["device_id_strategy"] == "env DEVICE_ID_STRATEGY"


_refs = st.one_of(st.integers(0, 15).map(str),
                  st.tuples(st.integers(0, 15), st.integers(0, 6)).map(lambda t: f"{t[0]}:{t[1]}"),
                  st.sampled_from([GPU_UUID, MIG_UUID, OLD_MIG_UUID]))


@st.composite
def _resources(draw: st.DrawFn, minimum: int) -> dict[str, object]:
    entry: dict[str, object] = {"name": draw(st.sampled_from(
        ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]))}
    per_gpu = draw(st.dictionaries(_refs, st.integers(minimum, 16), max_size=3))
    if not per_gpu or draw(st.booleans()):
        entry["replicas"] = draw(st.integers(minimum, 64))
        entry["devices"] = draw(st.one_of(st.just("all"), st.integers(1, 8),
                                          st.lists(_refs, min_size=1, max_size=4, unique=True)))
    if per_gpu:
        entry["perGpu"] = per_gpu
    return entry


@st.composite
def _files(draw: st.DrawFn) -> dict[str, object]:
    mode = draw(st.sampled_from(["timeSlicing", "mps"]))
    minimum = 2 if mode == "mps" else 1
    resources = draw(st.lists(_resources(minimum), min_size=1, max_size=3,
                              unique_by=lambda r: r["name"]))
    return {
        "version": "v1",
        "flags": {
            "migStrategy": draw(st.sampled_from(["none", "single"] if mode == "mps"
                                                else [str(m) for m in MigStrategy])),
            "failOnInitError": draw(st.booleans()),
            "plugin": {
                "deviceListStrategy": draw(st.lists(st.sampled_from(
                    config.DEVICE_LIST_STRATEGIES), min_size=1, max_size=3)),
                "deviceIDStrategy": draw(st.sampled_from(config.DEVICE_ID_STRATEGIES)),
                "sharedDevicesAllocationPolicy": draw(st.sampled_from([str(p) for p in Policy])),
            },
        },
        "sharing": {mode: {"renameByDefault": draw(st.booleans()),
                           # MPS ignores false (and warns), so only true round-trips there.
                           "failRequestsGreaterThanOne": (draw(st.booleans())
                                                          if mode == "timeSlicing" else True),
                           "resources": resources}},
    }


@settings(max_examples=80, deadline=None)
@given(_files())
def test_a_valid_file_loads_and_its_description_loads_back_to_the_same_config(
    doc: dict[str, object]
) -> None:
    first = load(yaml.safe_dump(doc))
    view = first.describe()
    del view["sources"]
    again = load(yaml.safe_dump(view))
    assert dataclasses.replace(again, sources=first.sources) == first
    # The sharing section survives unchanged, apart from upstream's name normalisation.
    assert view["sharing"] == {k: {**v, "resources": [
        {**r, "devices": r.get("devices", "all")} if "replicas" in r else r
        for r in v["resources"]]} for k, v in doc["sharing"].items()}  # type: ignore[attr-defined]


# --- device reference forms ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("ref", "kind"),
    [
        ("0", "gpu index"),
        ("12", "gpu index"),
        ("0:0", "mig index"),
        (GPU_UUID, "gpu uuid"),
        (MIG_UUID, "mig uuid"),
        (OLD_MIG_UUID, "mig uuid"),
        ("GPU-UUID", "none"),
        ("MIG-UUID", "none"),
        ("0:", "none"),
        ("a:0", "none"),
    ],
    ids=lambda v: str(v),
)
def test_device_references_are_classified_as_upstream_does(ref: str, kind: str) -> None:
    got = [name for name, check in (("gpu index", config.is_gpu_index),
                                    ("mig index", config.is_mig_index),
                                    ("gpu uuid", config.is_gpu_uuid),
                                    ("mig uuid", config.is_mig_uuid)) if check(ref)]
    assert got == ([] if kind == "none" else [kind])


def test_configs_hash_and_compare_by_value() -> None:
    text = ts("- {name: gpu, replicas: 2, perGpu: {0: 3}}")
    assert load(text) == load(text) and hash(load(text)) == hash(load(text))
    assert load(text) != load(ts("- {name: gpu, replicas: 2, perGpu: {0: 4}}"))


@pytest.mark.parametrize(
    ("section", "want"),
    [
        pytest.param("timeSlicing: {resources: [{name: gpu, replicas: 2}]}", False,
                     id="time slicing leaves failRequestsGreaterThanOne off by default"),
        pytest.param("mps: {resources: [{name: gpu, replicas: 2}]}", True,
                     id="mps turns failRequestsGreaterThanOne on by default, as upstream"),
        pytest.param("mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, "
                     "replicas: 2}]}", True,
                     id="mps keeps failRequestsGreaterThanOne on even when set false, as upstream"),
    ],
)
def test_fail_requests_greater_than_one_defaults_per_sharing_mode(section: str,
                                                                  want: bool) -> None:
    c = load(f"sharing:\n  {section}\n")
    assert c.sharing is not None and c.sharing.fail_requests_greater_than_one is want


def test_mps_with_fail_requests_greater_than_one_false_warns_that_it_is_ignored() -> None:
    c = load("sharing:\n  mps: {failRequestsGreaterThanOne: false, resources: [{name: gpu, "
             "replicas: 2}]}\n")
    assert c.warnings == ("sharing.mps.failRequestsGreaterThanOne: false is ignored: MPS gives "
                          "a container at most one replica (as upstream)",)


def test_the_global_yaml_safe_loader_is_left_alone() -> None:
    load(ts("- {name: gpu, replicas: 2, devices: ['1:0']}"))
    assert yaml.safe_load("a: 1:0") == {"a": 60}

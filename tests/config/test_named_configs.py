"""Per-node named configs: one ConfigMap, several config files, one picked per node by label."""

from __future__ import annotations

import pytest

from sharepack.common import config
from sharepack.common.errors import ConfigError
from sharepack.common.policies import Policy, Sharing

PACKED = "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}"
SHARED = "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}"
BAD = "flags: {migStrategy: sideways}"


@pytest.mark.parametrize(
    ("configs", "label", "want"),
    [
        pytest.param({"default": "a", "t4": "b"}, "t4", "t4",
                     id="the node label names the config"),
        pytest.param({"default": "a", "t4": "b"}, None, "default",
                     id="without a label the default config is used"),
        pytest.param({"default": "a", "t4": "b"}, "", "default",
                     id="an empty label counts as no label"),
        pytest.param({"only": "a"}, None, "only",
                     id="without a label or default the only config is used"),
        pytest.param({"default": "a"}, "default", "default",
                     id="the label may name the default explicitly"),
    ],
)
def test_select_named_config_picks_by_label_then_default_then_the_only_one(
    configs: dict[str, str], label: str | None, want: str
) -> None:
    assert config.select_named_config(configs, label) == (want, configs[want])


def test_select_named_config_honours_a_custom_default_name() -> None:
    assert config.select_named_config({"a": "x", "b": "y"}, None, "b") == ("b", "y")


@pytest.mark.parametrize(
    ("configs", "label", "want"),
    [
        pytest.param({"default": "a", "t4": "b"}, "a100",
                     "node label nvidia.com/device-plugin.config=a100 names a config that does "
                     "not exist (have: default, t4)",
                     id="a label naming a missing config is an error, not a silent fallback"),
        pytest.param({}, "a100",
                     "node label nvidia.com/device-plugin.config=a100 names a config that does "
                     "not exist (have: none)", id="a label with no configs at all is an error"),
        pytest.param({}, None, "no named configs to choose from",
                     id="no configs and no label is an error"),
        pytest.param({"a": "x", "b": "y"}, None,
                     "no config selected: node label nvidia.com/device-plugin.config is not set, "
                     "there is no 'default' config, and 2 configs to choose from (a, b)",
                     id="several configs without label or default is an error"),
    ],
)
def test_select_named_config_fails_when_no_config_applies(configs: dict[str, str],
                                                           label: str | None, want: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.select_named_config(configs, label, source="configmap gpu-configs")
    assert info.value.source == "configmap gpu-configs"
    assert info.value.problems == (want,)


def test_parse_named_configs_loads_every_config() -> None:
    loaded = config.parse_named_configs({"default": PACKED, "shared": SHARED},
                                        env={"DEVICE_ID_STRATEGY": "index"})
    assert loaded["default"].allocation_policy is Policy.PACKED
    assert loaded["shared"].sharing_mode is Sharing.TIME_SLICING
    assert {c.device_id_strategy for c in loaded.values()} == {"index"}


def test_parse_named_configs_reports_every_bad_config_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        config.parse_named_configs({"good": PACKED, "bad": BAD, "worse": "version: v9"},
                                   source="configmap gpu-configs")
    assert info.value.source == "configmap gpu-configs"
    assert info.value.problems == (
        "bad: unknown mig strategy: sideways (from config flags.migStrategy)",
        "worse: unknown version: v9",
    )


def test_load_named_config_selects_then_loads_with_env_and_flags() -> None:
    name, c = config.load_named_config({"default": PACKED, "shared": SHARED}, "shared",
                                       env={}, flags={"shared-devices-allocation-policy": "spread"})
    assert name == "shared"
    assert c.sharing_mode is Sharing.TIME_SLICING and c.allocation_policy is Policy.SPREAD


def test_load_named_config_names_the_config_in_its_error() -> None:
    with pytest.raises(ConfigError) as info:
        config.load_named_config({"default": BAD}, None, env={}, flags={}, source="cm")
    assert info.value.source == "cm/default"

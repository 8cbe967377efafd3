"""Command line and environment: config flags pass through unparsed, process options resolve here."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharepack.agent import options
from sharepack.agent.__main__ import config_loader
from sharepack.agent.errors import OptionsError
from sharepack.common.config import load_config
from sharepack.common.errors import ConfigError
from sharepack.common.policies import MigStrategy, Policy


def test_only_given_config_flags_reach_load_config_and_win_over_env() -> None:
    opts = options.parse(
        ["--shared-devices-allocation-policy", "packed", "--pass-device-specs", "--mig-strategy=mixed"],
        {"SHARED_DEVICES_ALLOCATION_POLICY": "spread", "DEVICE_ID_STRATEGY": "index"},
    )
    assert dict(opts.config_flags) == {
        "shared-devices-allocation-policy": "packed",
        "pass-device-specs": "true",
        "mig-strategy": "mixed",
    }
    config = load_config(file_text=None, env=opts.env, flags=opts.config_flags)
    assert config.allocation_policy is Policy.PACKED, "flag beats env"
    assert config.device_id_strategy == "index", "env applies where no flag is given"
    assert config.mig_strategy is MigStrategy.MIXED
    assert config.pass_device_specs is True


@pytest.mark.parametrize(
    ("argv", "env", "attr", "expected"),
    [
        pytest.param([], {}, "kubelet_socket", Path(options.DEFAULT_KUBELET_SOCKET), id="kubelet socket defaults to the kubelet's"),
        pytest.param([], {"KUBELET_SOCKET": "/x/k.sock"}, "kubelet_socket", Path("/x/k.sock"), id="kubelet socket from env"),
        pytest.param(["--kubelet-socket", "/y/k.sock"], {"KUBELET_SOCKET": "/x/k.sock"}, "kubelet_socket", Path("/y/k.sock"), id="flag beats env"),
        pytest.param([], {"NODE_NAME": "gpu-7"}, "node_name", "gpu-7", id="node name from env as upstream"),
        pytest.param(["--simulated-machine", "dgx-a100"], {}, "simulated_machine", "dgx-a100", id="simulated machine"),
        pytest.param([], {"CONFIG_FILE": "/etc/c.yaml"}, "config_file", "/etc/c.yaml", id="config file from env"),
        pytest.param(["--config-file", "/a.yaml"], {"CONFIG_FILE": "/b.yaml"}, "config_file", "/a.yaml", id="config file flag beats env"),
        pytest.param(["--log-format=json"], {}, "log_format", "json", id="json logs"),
        pytest.param([], {}, "unhealthy_recovery_s", 0.0, id="recovery off by default"),
        pytest.param([], {}, "state_heartbeat_s", 60.0, id="state heartbeat every minute by default"),
        pytest.param([], {"SHAREPACK_STATE_HEARTBEAT_SECONDS": "15"}, "state_heartbeat_s", 15.0, id="state heartbeat from env"),
        pytest.param(["--state-heartbeat-seconds", "0"], {"SHAREPACK_STATE_HEARTBEAT_SECONDS": "15"}, "state_heartbeat_s", 0.0, id="state heartbeat flag beats env and 0 turns it off"),
        pytest.param([], {"SHAREPACK_STATE_MIN_WRITE_INTERVAL_SECONDS": "2"}, "state_min_write_interval_s", 2.0, id="write interval from env"),
        pytest.param([], {}, "state_min_write_interval_s", 0.5, id="write interval default is half a second"),
        pytest.param([], {}, "metrics_listen", ("0.0.0.0", 9400), id="metrics on every address at port 9400 by default"),
        pytest.param([], {"SHAREPACK_METRICS_LISTEN": "127.0.0.1:9500"}, "metrics_listen", ("127.0.0.1", 9500), id="metrics address from env"),
        pytest.param(["--metrics-listen", "[::1]:0"], {"SHAREPACK_METRICS_LISTEN": "127.0.0.1:9500"}, "metrics_listen", ("::1", 0), id="metrics flag beats env and takes ipv6"),
    ],
)
def test_process_options(argv: list[str], env: dict[str, str], attr: str, expected: object) -> None:
    assert getattr(options.parse(argv, env), attr) == expected


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(["--log-format", "xml"], {}, "invalid --log-format option: xml (from --log-format", id="bad log format names the flag"),
        pytest.param([], {"LOG_FORMAT": "xml"}, "(from env LOG_FORMAT", id="bad env value names the env var"),
        pytest.param(["--unhealthy-recovery-seconds", "-1"], {}, "invalid --unhealthy-recovery-seconds option: -1", id="negative recovery"),
        pytest.param([], {"SHAREPACK_STATE_HEARTBEAT_SECONDS": "soon"}, "invalid --state-heartbeat-seconds option: soon (from env SHAREPACK_STATE_HEARTBEAT_SECONDS", id="bad heartbeat names the env var"),
        pytest.param(["--state-heartbeat-seconds", "nan"], {}, "invalid --state-heartbeat-seconds option: nan", id="nan heartbeat"),
        pytest.param(["--state-min-write-interval-seconds", "-1"], {}, "invalid --state-min-write-interval-seconds option: -1", id="negative write interval"),
        pytest.param([], {"SHAREPACK_METRICS_LISTEN": "9400"}, "invalid --metrics-listen option: '9400' (want HOST:PORT) (from env SHAREPACK_METRICS_LISTEN", id="metrics address without a host names the env var"),
        pytest.param(["--metrics-listen", "0.0.0.0:70000"], {}, "invalid --metrics-listen option: '0.0.0.0:70000'", id="metrics port out of range"),
        pytest.param(["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag", id="unknown flag"),
    ],
)
def test_bad_options_say_what_and_where(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(OptionsError, match=None) as info:
        options.parse(argv, env)
    assert message in str(info.value)


def test_a_config_file_that_is_not_utf8_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"version: v1\nflags: {migStrategy: \xff}\n")
    load = config_loader(options.parse(["--config-file", str(path)], {}))
    # A ConfigError (not UnicodeDecodeError) is what start-up and SIGHUP report and survive.
    with pytest.raises(ConfigError, match=r"invalid config from .*config\.yaml:\n  - not valid UTF-8"):
        load()

"""SIGHUP re-applies the config source in charge: the named per-node config while the agent
follows one, else `--config-file` (through the agent's real loader, `agent.__main__.config_loader`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharepack.agent import options
from sharepack.agent.__main__ import config_loader
from sharepack.agent.configwatching import ConfigSource
from sharepack.agent.reloading import ConfigReloader
from sharepack.common.config import Config
from sharepack.common.errors import ConfigError
from sharepack.common.policies import Policy
from sharepack.sandbox.apiserver import resources as kinds
from tests.publishing.harness import config, gpus, node, time_slicing, wait_object
from tests.publishing.test_configwatching import SOURCE, _label, _setup

MISSING = ConfigSource(namespace="default", configmap="no-such-configmap")


@pytest.fixture
def config_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = Path(d) / "config.yaml"
        path.write_text(time_slicing(4, "distributed"))
        yield path


def reloader_for(path: Path) -> ConfigReloader:
    return ConfigReloader(config_loader(options.parse(["--config-file", str(path)], {})))


async def test_sighup_reapplies_the_named_config_in_charge_not_the_file(config_file: Path) -> None:
    async with node(config(config_file.read_text()), gpus(2), config_source=SOURCE,
                    before_start=_setup("packed"), reloader=reloader_for(config_file)) as n:
        await n.wait_state(lambda s: s.allocation_policy is Policy.PACKED)
        config_file.write_text(time_slicing(4, "spread"))  # an edit to the file must not win
        assert await n.agent.reload() is True
        assert n.agent.config.allocation_policy is Policy.PACKED
        state = await n.wait_state(lambda s: True)
        assert state.allocation_policy is Policy.PACKED


async def test_sighup_selects_again_from_the_label_last_seen(config_file: Path) -> None:
    """The label now names a broken config (rejected, the packed one still serves): a reload
    re-selects it and fails the same way, instead of quietly serving the file."""
    async with node(config(config_file.read_text()), gpus(2), config_source=SOURCE,
                    before_start=_setup("packed"), reloader=reloader_for(config_file)) as n:
        await n.wait_state(lambda s: s.allocation_policy is Policy.PACKED)
        _label(n.server, "broken")
        await wait_object(n.server, kinds.EVENTS, lambda e: e.get("reason") == "InvalidConfig")
        assert await n.agent.reload() is False
        assert n.agent.config.allocation_policy is Policy.PACKED
        _label(n.server, "distributed")
        await n.wait_state(lambda s: s.allocation_policy is Policy.DISTRIBUTED)
        config_file.write_text(time_slicing(4, "spread"))
        assert await n.agent.reload() is True
        assert n.agent.config.allocation_policy is Policy.DISTRIBUTED


async def test_without_a_configmap_sighup_rereads_the_file(config_file: Path) -> None:
    async with node(config(config_file.read_text()), gpus(2), config_source=MISSING,
                    reloader=reloader_for(config_file)) as n:
        await n.wait_state(lambda s: s.allocation_policy is Policy.DISTRIBUTED)
        config_file.write_text("version: v2\n")
        assert await n.agent.reload() is False
        config_file.write_text(time_slicing(4, "packed"))
        assert await n.agent.reload() is True
        assert n.agent.config.allocation_policy is Policy.PACKED
        await n.wait_state(lambda s: s.allocation_policy is Policy.PACKED)
        reloads = "sharepack_agent_config_reloads_total"
        assert n.agent.metrics.value(reloads, source="sighup", outcome="failure") == 1
        assert n.agent.metrics.value(reloads, source="sighup", outcome="success") == 1


class Named:
    def __init__(self, answer: Config | None) -> None:
        self.answer = answer

    def reload_config(self) -> Config | None:
        if self.answer is None:
            return None
        return self.answer


def test_the_reloader_reads_the_file_unless_a_named_config_is_in_charge() -> None:
    file_config = config(time_slicing(2, "distributed"))
    named_config = config(time_slicing(2, "packed"))
    reloader = ConfigReloader(lambda: file_config)
    assert reloader() is file_config
    reloader.follow(Named(named_config))
    assert reloader() is named_config
    reloader.follow(Named(None))  # watching, but no ConfigMap: the file is in charge
    assert reloader() is file_config
    reloader.follow(None)
    assert reloader() is file_config


def test_a_failing_named_config_is_an_error_not_a_fallback_to_the_file() -> None:
    class Broken:
        def reload_config(self) -> Config | None:
            raise ConfigError("configmap default/x", ["unknown policy: spreadd"])

    reloader = ConfigReloader(lambda: config(time_slicing(2)))
    reloader.follow(Broken())
    with pytest.raises(ConfigError, match="spreadd"):
        reloader()

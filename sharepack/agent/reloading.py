"""What SIGHUP re-applies: the config source that is in charge now.

Without per-node configs that is `--config-file` (merged with the flags and environment the agent
started with). With `--node-config-configmap`, once the ConfigMap has been seen, the named
config is in charge: a SIGHUP that re-read the file would silently replace it with the file's
config until the label or the ConfigMap next changed. So SIGHUP then re-selects the named config
from the label and ConfigMap last seen (`ConfigWatcher.reload_config`), and re-applies that.

The loader runs in a worker thread (`Agent.reload` keeps file I/O off the event loop): the named
source hands over an immutable snapshot of what it last saw, and selecting from it is pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sharepack.common.config import Config


class NamedConfigSource(Protocol):
    def reload_config(self) -> Config | None:
        """The named config selected again from the inputs last seen; None when no named
        config is in charge (not watching, or no ConfigMap). Raises ConfigError."""


class ConfigReloader:
    """`Agent(config_loader=...)`: the named config when one is in charge, else the file."""

    def __init__(self, read_file: Callable[[], Config]) -> None:
        self._read_file = read_file
        self._named: NamedConfigSource | None = None

    def follow(self, named: NamedConfigSource | None) -> None:
        """Set (None: clear) the per-node config source; publication does it while it runs."""
        self._named = named

    def __call__(self) -> Config:
        named = self._named
        if named is not None:
            config = named.reload_config()
            if config is not None:
                return config
        return self._read_file()

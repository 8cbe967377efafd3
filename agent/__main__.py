"""`sharepack-agent`: the composition root. Only here are argv and the environment read.

    sharepack-agent --simulated-machine dgx-a100 --kubelet-socket /tmp/x/kubelet.sock

Signals: SIGHUP reloads the config file (a bad one is logged, the old config keeps serving);
the first SIGTERM/SIGINT drains gracefully, a second one exits at once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent import nvml, options
from agent.errors import OptionsError
from agent.health import XidLike, XidPolicy
from agent.running import Agent, Settings
from common.config import Config, load_config
from common.errors import SharepackError

log = logging.getLogger("agent")

# Attributes every LogRecord has; anything else came in through `extra=` and is context.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if context:
            text += " " + " ".join(f"{k}={v}" for k, v in context.items())
        return text


def setup_logging(log_format: str, *, stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def config_loader(opts: options.Options) -> Callable[[], Config]:
    """Reads the file on every call (SIGHUP), merged with the same flags and env as at start."""

    def load() -> Config:
        text = None
        if opts.config_file is not None:
            text = Path(opts.config_file).read_text()
        return load_config(
            file_text=text, file_source=opts.config_file or "config file",
            env=opts.env, flags=opts.config_flags,
        )

    return load


def xid_source(lib: object, inventory: object) -> Callable[[int], XidLike | None]:
    """A blocking `wait(timeout_ms)` over the NVML adapter's XID events."""
    waiter = nvml.XidWaiter(lib, inventory)  # type: ignore[arg-type]

    def wait(timeout_ms: int) -> XidLike | None:
        return waiter.wait(timeout_ms)

    return wait


async def serve(opts: options.Options, config: Config) -> int:
    loop = asyncio.get_running_loop()
    try:
        lib = await asyncio.to_thread(nvml.load_library, opts.simulated_machine)
        inventory = await asyncio.to_thread(nvml.read_inventory, lib)
        wait = xid_source(lib, inventory)
    except SharepackError as e:
        if config.fail_on_init_error:
            log.error("cannot start: %s", e)
            return 1
        log.error("cannot start: %s; failOnInitError is false, so serving nothing until stopped", e)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        return 0
    log.info(
        "found %d GPU(s): %s", len(inventory.gpus),
        ", ".join(f"{g.index}:{g.name}" + (" (MIG)" if g.mig_enabled else "") for g in inventory.gpus),
    )
    settings = Settings(
        kubelet_socket=opts.kubelet_socket,
        xid_policy=XidPolicy.from_env(opts.env),
        recovery_after_s=opts.unhealthy_recovery_s,
    )
    agent = Agent(settings, config, inventory, wait_for_xid=wait, config_loader=config_loader(opts))
    stops = 0

    def on_stop(signum: int) -> None:
        nonlocal stops
        stops += 1
        if stops == 1:
            log.info("%s: draining (send it again to exit at once)", signal.Signals(signum).name)
            agent.request_stop()
        else:
            log.warning("%s again: exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, agent.request_reload)
    await agent.run()
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    try:
        opts = options.parse(sys.argv[1:] if argv is None else argv, env)
    except OptionsError as e:
        print(f"sharepack-agent: {e}", file=sys.stderr)
        return 2
    setup_logging(opts.log_format)
    try:
        config = config_loader(opts)()
    except (SharepackError, OSError) as e:
        log.error("cannot start: %s", e)
        return 1
    for warning in config.warnings:
        log.warning("config: %s", warning)
    log.info("running with config: %s", json.dumps(config.describe(), sort_keys=True),
             extra={"kubelet_socket": str(opts.kubelet_socket)})
    try:
        return asyncio.run(serve(opts, config))
    except SharepackError as e:
        log.error("agent failed: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())

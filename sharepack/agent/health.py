"""Device health: which XIDs count, which devices an XID hits, and when a device heals.

Policy (upstream NVIDIA device plugin semantics, kept on purpose):
* XIDs 13, 31, 43, 45, 68, 109 are application errors and never make a device unhealthy.
* `DP_DISABLE_HEALTHCHECKS`: a comma-separated list of extra XIDs to ignore; an entry `all` or
  `xids` anywhere in it switches XID checks off. Entries that are not non-negative integers are
  skipped, as upstream does.
* `DP_ENABLE_HEALTHCHECKS`: XIDs to count even if ignored above; an entry `all` or `xids` counts
  every XID. This also re-enables single XIDs when `DP_DISABLE_HEALTHCHECKS=all` (upstream's
  documented intent; its `IsAllDisabled` still switches checks off then, a bug we do not copy).

An XID hits every device of the physical GPU it names (all replicas of it); for MIG, only the
instance it names, or all instances of the GPU for a whole-device event (no GI/CI). An event
that names no GPU hits every device, because we cannot tell which one is broken. Health is
kept per GPU or MIG instance (its UUID), so every replica of it, now or after a config reload,
shares it.

Beyond upstream (which never heals a device): with a quiet period configured, a device with no
new critical XID for that long becomes healthy again. Off by default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sharepack.common.inventory import Inventory
from sharepack.common.resources import Resource

log = logging.getLogger(__name__)

ENV_DISABLE = "DP_DISABLE_HEALTHCHECKS"
ENV_ENABLE = "DP_ENABLE_HEALTHCHECKS"
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


_ALL_XIDS = frozenset({"all", "xids"})  # entries upstream reads as "every XID"


def parse_xids(text: str) -> frozenset[int]:
    xids = set()
    for part in text.split(","):
        part = part.strip()
        # isascii: ParseUint takes only ASCII digits; isdigit alone lets "٣" through.
        if part.isascii() and part.isdigit():  # rejects "", "-68", "not-an-int" like upstream
            xids.add(int(part))
    return frozenset(xids)


def _names_all(text: str) -> bool:
    return any(part.strip() in _ALL_XIDS for part in text.split(","))


@dataclass(frozen=True, slots=True)
class XidPolicy:
    ignored: frozenset[int] = APPLICATION_XIDS
    forced: frozenset[int] = frozenset()
    ignore_all: bool = False
    force_all: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> XidPolicy:
        disable = env.get(ENV_DISABLE, "").strip().lower()
        enable = env.get(ENV_ENABLE, "").strip().lower()
        ignore_all = _names_all(disable)
        force_all = _names_all(enable)
        return cls(
            ignored=APPLICATION_XIDS | (frozenset() if ignore_all else parse_xids(disable)),
            forced=frozenset() if force_all else parse_xids(enable),
            ignore_all=ignore_all,
            force_all=force_all,
        )

    @property
    def checks_off(self) -> bool:
        """No XID can ever count: the agent need not watch for events at all."""
        return self.ignore_all and not self.force_all and not self.forced

    def is_critical(self, xid: int) -> bool:
        if self.force_all or xid in self.forced:
            return True
        if self.ignore_all:
            return False
        return xid not in self.ignored

    def describe(self) -> str:
        if self.checks_off:
            return "xid health checks disabled"
        if self.force_all:
            return "every xid counts"
        ignored = "all" if self.ignore_all else ",".join(map(str, sorted(self.ignored - self.forced)))
        return f"ignoring xids {ignored}" + (
            f"; forced {','.join(map(str, sorted(self.forced)))}" if self.forced else ""
        )


class XidLike(Protocol):
    """What an NVML XID event carries (agent.nvml.XidEvent)."""

    @property
    def uuid(self) -> str: ...
    @property
    def xid(self) -> int: ...
    @property
    def mig_gi(self) -> int | None: ...
    @property
    def mig_ci(self) -> int | None: ...


def mig_instances(inventory: Inventory) -> dict[str, tuple[int, int]]:
    """MIG device UUID -> (GPU instance ID, compute instance ID)."""
    return {m.uuid: (m.gi_id, m.ci_id) for g in inventory.gpus for m in g.mig_devices}


def affected_devices(
    event: XidLike, resources: Iterable[Resource], instances: Mapping[str, tuple[int, int]]
) -> frozenset[str]:
    hit: set[str] = set()
    for resource in resources:
        for device in resource.devices:
            if not event.uuid:
                hit.add(device.id)
            elif device.uuid in instances:  # a MIG instance: match the parent, then GI/CI
                gi, ci = instances[device.uuid]
                if device.physical_key != event.uuid:
                    continue
                if event.mig_gi is not None and event.mig_gi != gi:
                    continue
                if event.mig_ci is not None and event.mig_ci != ci:
                    continue
                hit.add(device.id)
            elif device.uuid == event.uuid or device.physical_key == event.uuid:
                hit.add(device.id)
    return frozenset(hit)


class HealthBook:
    """Which health units (GPU or MIG instance UUIDs) are unhealthy, and since when they last
    saw a critical XID.

    Plain data (no I/O, no clock of its own): callers pass `now` (monotonic seconds).
    """

    def __init__(self) -> None:
        self._last_hit: dict[str, float] = {}

    def is_healthy(self, unit: str) -> bool:
        return unit not in self._last_hit

    @property
    def unhealthy(self) -> frozenset[str]:
        return frozenset(self._last_hit)

    def mark(self, units: Iterable[str], now: float) -> frozenset[str]:
        """Record a critical hit; returns the units that *became* unhealthy."""
        changed = set()
        for unit in units:
            if unit not in self._last_hit:
                changed.add(unit)
            self._last_hit[unit] = now
        return frozenset(changed)

    def recover(self, now: float, quiet_s: float) -> frozenset[str]:
        """Heal units quiet for at least `quiet_s`; returns them. `quiet_s <= 0`: never heal."""
        if quiet_s <= 0:
            return frozenset()
        healed = frozenset(d for d, t in self._last_hit.items() if now - t >= quiet_s)
        for unit in healed:
            del self._last_hit[unit]
        return healed

    def next_recovery(self, quiet_s: float) -> float | None:
        """When (monotonic) the next unit may heal; None when none will."""
        if quiet_s <= 0 or not self._last_hit:
            return None
        return min(self._last_hit.values()) + quiet_s

    def retain(self, units: Iterable[str]) -> None:
        """Forget units no longer served (after a config reload)."""
        keep = set(units)
        for unit in [d for d in self._last_hit if d not in keep]:
            del self._last_hit[unit]


WaitForXid = Callable[[int], "XidLike | None"]


async def watch_xids(
    wait: WaitForXid, on_event: Callable[[XidLike], None], *, timeout_ms: int = 500
) -> None:
    """Forever: wait (in a worker thread, NVML blocks) for the next XID event and report it.

    On cancellation the wait in flight is let finish (at most `timeout_ms`), so that no thread
    is left inside NVML when the caller goes on to close the event set or shut NVML down.
    """
    while True:
        pending = asyncio.ensure_future(asyncio.to_thread(wait, timeout_ms))
        try:
            event = await asyncio.shield(pending)
        except asyncio.CancelledError:
            await asyncio.wait([pending])
            if not pending.cancelled():
                pending.exception()  # retrieved: it no longer matters
            raise
        if event is not None:
            on_event(event)

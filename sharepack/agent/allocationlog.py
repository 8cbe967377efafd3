"""The agent's Allocate log on disk, so that a restarted agent still knows what it allocated.

Why: PodResources never lists a plain init container's devices, yet the kubelet keeps them for
the pod until it ends; the publisher recovers them from the agent's own Allocate log
(`statebuilding.with_init_container_devices`). Kept only in memory, that log died with the
agent, and a restarted agent published those devices as free.

Where: `<device-plugins dir>/sharepack/allocations.log`, beside the sockets. The kubelet, when it
restarts, deletes the sockets in that directory but not directories, and the agent's DaemonSet
already mounts it read-write. One JSON line per Allocate: `{"r": resource, "d": [device IDs],
"t": wall-clock seconds}`. Wall-clock time, because the monotonic clock does not survive a
reboot of the agent's container; only the gaps between entries matter to the reader.

Appends are small unbuffered writes (no fsync: the file must survive the agent, not the node;
a node reboot ends the pods too). The file is rewritten from the kept entries when it grows
past twice their number. Any I/O error is logged once and turns the file off: Allocate never
fails because of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import orjson

log = logging.getLogger(__name__)

DIRECTORY = "sharepack"
FILE = "allocations.log"

Entry = tuple[str, tuple[str, ...], float]  # (resource, device IDs, wall-clock seconds)


def path_beside(plugin_dir: Path) -> Path:
    return plugin_dir / DIRECTORY / FILE


class AllocationLog:
    def __init__(self, path: Path, *, keep: int) -> None:
        self.path = path
        self.keep = keep
        self._lines = 0
        self._broken = False

    def load(self) -> list[Entry]:
        """The last `keep` entries (oldest first); unreadable lines are skipped and counted in
        the log, a missing file is an empty log."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            self._give_up("read", e)
            return []
        entries: list[Entry] = []
        bad = 0
        for line in raw.splitlines():
            try:
                doc = orjson.loads(line)
                entry = (str(doc["r"]), tuple(str(d) for d in doc["d"]), float(doc["t"]))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                bad += 1
                continue
            entries.append(entry)
        if bad:
            log.warning("allocation log %s: skipped %d unreadable line(s)", self.path, bad)
        self._lines = len(entries) + bad
        return entries[-self.keep :]

    def append(self, resource: str, device_ids: Sequence[str], at_wall: float, kept: Iterable[Entry]) -> None:
        """Record one Allocate; `kept`: every entry the agent keeps now (for a rewrite)."""
        if self._broken:
            return
        try:
            if self._lines >= 2 * self.keep:
                self._rewrite(kept)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "ab", buffering=0) as f:
                    f.write(_line((resource, tuple(device_ids), at_wall)))
                self._lines += 1
        except OSError as e:
            self._give_up("write", e)

    def _rewrite(self, entries: Iterable[Entry]) -> None:
        body = b"".join(_line(e) for e in entries)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, self.path)
        self._lines = body.count(b"\n")

    def _give_up(self, what: str, e: OSError) -> None:
        self._broken = True
        log.warning("cannot %s the allocation log %s: %s; a restarted agent will not know the "
                    "devices of finished init containers", what, self.path, e.strerror or e)  # fmt: skip


def _line(entry: Entry) -> bytes:
    resource, ids, at = entry
    return orjson.dumps({"r": resource, "d": list(ids), "t": at}) + b"\n"

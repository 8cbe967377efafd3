"""The order in which the real kubelet lists a set of device IDs: none in particular.

The kubelet keeps device IDs in a Go `sets.Set[string]` (a map) and sends `UnsortedList()`, in
an order that has nothing to do with the IDs. Handing them sorted would hide a plugin whose answer
depends on the order, so the sandbox shuffles them. The shuffle is seeded by the set itself: the
same set always comes in the same (unsorted) order, so a failure it provokes replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Iterable


def unsorted_list(members: Iterable[str]) -> list[str]:
    items = sorted(members)
    # random.Random seeds a str through SHA-512: the same on every run, whatever PYTHONHASHSEED.
    random.Random("\n".join(items)).shuffle(items)
    return items

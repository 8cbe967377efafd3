"""The order in which the real kubelet lists a set of device IDs: none in particular.

The kubelet keeps device IDs in a Go `sets.Set[string]` (a map) and sends `UnsortedList()`, whose
order changes from call to call. Handing them sorted would hide a plugin whose answer depends on
the order, so the sandbox shuffles them. The global `random` is used on purpose: pytest-randomly
reseeds it per test and prints the seed, so a failure it provokes can be replayed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable


def unsorted_list(members: Iterable[str]) -> list[str]:
    items = sorted(members)  # from a known order, so a given seed gives a given shuffle
    random.shuffle(items)
    return items

"""CPU and memory: a pod's requests and a node's allocatable, as kube-scheduler counts them.

The CPU-aware node ranks (`fragaware`, and `packed` through `common.stranding`) need each
node's CPU and memory left, so that a GPU the node can no longer use for lack of CPU counts as
fragment. kube-scheduler's NodeResourcesFit counts a pod as `max(sum of app containers and
sidecars, the largest init container plus the sidecars started before it)` plus `spec.overhead`,
requests only (the API server defaults a missing request to its limit); a node has its
`status.allocatable`. Units here: milli-CPU and MiB (requests rounded up, allocatable down, so
the room is never overstated).

Quantities come from the API server, which has validated them; one that does not parse anyway
counts as 0 (and is reported by `QuantityError` to callers that ask), never an exception on a
watch path.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

CPU = "cpu"
MEMORY = "memory"
MIB = 1 << 20
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+)?$")
_SUFFIX = {
    None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}  # fmt: skip


class QuantityError(ValueError):
    pass


def quantity(value: Any, where: str) -> Decimal:
    """A resource.Quantity (a string such as "500m", "1.5", "4Gi", "1e3", or a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise QuantityError(f"invalid quantity at {where}: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise QuantityError(f"invalid quantity at {where}: {value!r}")
    try:
        number = Decimal(m.group(1))
        suffix = m.group(2)
        scale = Decimal(10) ** int(suffix[1:]) if suffix and suffix[0] in "eE" and suffix != "E" else _SUFFIX[suffix]
    except (InvalidOperation, ValueError, KeyError):
        raise QuantityError(f"invalid quantity at {where}: {value!r}") from None
    return number * scale


def _amount(resources: Mapping[str, Any], name: str, *, up: bool) -> int:
    """`name` of a requests/allocatable map in milli-CPU or MiB (0 when absent or unreadable)."""
    raw = resources.get(name)
    if raw is None:
        return 0
    if isinstance(raw, str | int | float):
        return _units(raw, name == CPU, up)
    return 0  # not a quantity at all (`quantity` would say so; here it counts as 0)


@functools.lru_cache(maxsize=4096)
def _units(raw: str | int | float, cpu: bool, up: bool) -> int:
    """A quantity in milli-CPU (`cpu`) or MiB, rounded up or down. Cached: every pod event is
    counted again, and a cluster's pods repeat a few dozen request values."""
    try:
        q = quantity(raw, "")
    except QuantityError:
        return 0
    units = q * 1000 if cpu else q / MIB
    return max(math.ceil(units) if up else math.floor(units), 0)


def _requests(container: Any) -> tuple[int, int]:
    resources = container.get("resources") if isinstance(container, Mapping) else None
    requests = resources.get("requests") if isinstance(resources, Mapping) else None
    if not isinstance(requests, Mapping):
        return 0, 0
    return _amount(requests, CPU, up=True), _amount(requests, MEMORY, up=True)


def _list(value: Any) -> list[Any]:
    """A container list, or none for anything else (the pod decoder names that error)."""
    return value if isinstance(value, list) else []


def pod_requests(doc: Any) -> tuple[int, int]:
    """(milli-CPU, MiB) the pod requests as kube-scheduler counts it (0, 0 for anything but a pod)."""
    spec = doc.get("spec") if isinstance(doc, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0, 0
    apps = [0, 0]
    for c in _list(spec.get("containers")):
        for k, v in enumerate(_requests(c)):
            apps[k] += v
    sidecars = [0, 0]
    init_peak = [0, 0]
    for c in _list(spec.get("initContainers")):
        got = _requests(c)
        restartable = isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
        for k, v in enumerate(got):
            if restartable:
                sidecars[k] += v
                init_peak[k] = max(init_peak[k], sidecars[k])
            else:
                init_peak[k] = max(init_peak[k], v + sidecars[k])
    overhead = spec.get("overhead")
    extra = (0, 0)
    if isinstance(overhead, Mapping):
        extra = (_amount(overhead, CPU, up=True), _amount(overhead, MEMORY, up=True))
    cpu = max(apps[0] + sidecars[0], init_peak[0]) + extra[0]
    memory = max(apps[1] + sidecars[1], init_peak[1]) + extra[1]
    return cpu, memory


def node_allocatable(doc: Any) -> tuple[int, int] | None:
    """(milli-CPU, MiB) a Node offers pods (`status.allocatable`); None when it says nothing."""
    status = doc.get("status") if isinstance(doc, Mapping) else None
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or (CPU not in allocatable and MEMORY not in allocatable):
        return None
    return (_amount(allocatable, CPU, up=False),
            _amount(allocatable, MEMORY, up=False))  # fmt: skip

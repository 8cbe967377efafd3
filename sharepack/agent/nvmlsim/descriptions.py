"""Machine descriptions for the NVML simulator: the YAML schema, its validation, built-ins.

A machine file (see machines/*.yaml for complete examples)::

    name: dgx1-volta                      # required
    description: free text
    driver_version: "535.161.08"          # nvmlSystemGetDriverVersion
    cuda_driver_version: 12020            # nvmlSystemGetCudaDriverVersion
    product: Tesla V100-SXM2-16GB         # default product of every GPU (see products.py)
    init_error: LibraryNotFound           # optional: nvmlInit fails like a node without a driver
                                          #   (LibraryNotFound | DriverNotLoaded | NoPermission)
    gpus:                                 # in NVML enumeration order (index 0, 1, ...)
    - pci_bus_id: "00000000:06:00.0"      # required, NVML's format
      numa_node: 0                        # optional (null: no NUMA affinity)
      pcie_path: [hb0, sw0]               # PCIe path below the NUMA node: a host bridge, then
                                          #   the switches down to the GPU (root first)
      product: ...                        # optional, overrides the default
      uuid: GPU-...                       # optional; derived from name + index when absent
      minor: 0                            # optional; defaults to the index
      board: b0                           # optional; GPUs sharing a board are TOPOLOGY_INTERNAL
      mig:                                # optional; only on MIG-capable products
        enabled: true
        instances:
        - {profile: 3g.20gb, start: 4}    # placement start in memory slices
    nvlinks:                              # direct GPU-GPU NVLinks
    - {gpus: [0, 1], links: 2}
    nvswitches:                           # NVLinks to NVSwitches (never count as GPU peers)
      pci_bus_ids: ["00000000:C4:00.0", ...]
      links_per_gpu: 12

The PCIe common ancestor of two GPUs follows from (numa_node, pcie_path): another NUMA node is
TOPOLOGY_SYSTEM, another host bridge TOPOLOGY_NODE, the same host bridge but no common switch
TOPOLOGY_HOSTBRIDGE, the same parent switch TOPOLOGY_SINGLE, a common switch higher up
TOPOLOGY_MULTIPLE, the same `board` TOPOLOGY_INTERNAL.

Every problem in a file is reported at once, each naming the file and the field.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sharepack.agent.nvmlsim.products import COMPUTE_SLICES, MEMORY_SLICES, PRODUCTS, MigProfile, Product
from sharepack.common.errors import SharepackError

BUILTIN_PACKAGE = "sharepack.agent.nvmlsim.machines"
INIT_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "NoPermission")
_BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
_UUID_NAMESPACE = uuidlib.UUID("6f1d2a8e-4c5b-4e0f-9a57-1c3e2b7d9f10")


class MachineError(SharepackError):
    """A machine description that cannot be used; lists every problem found."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid simulated machine {source}:\n{lines}")


@dataclass(frozen=True, slots=True)
class MigInstance:
    profile: MigProfile
    start: int
    gi_id: int
    ci_id: int
    uuid: str

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.profile.size)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    product: Product
    pci_bus_id: str
    minor: int
    numa_node: int | None
    pcie_path: tuple[str, ...]
    board: str | None
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...]
    nvlink_remotes: tuple[str, ...]  # remote PCI bus ID per active NVLink, by link number


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    source: str  # where it came from: "built-in dgx-a100" or a file path
    description: str
    driver_version: str
    cuda_driver_version: int
    init_error: str | None
    gpus: tuple[GpuSpec, ...]


def builtin_names() -> tuple[str, ...]:
    root = resources.files(BUILTIN_PACKAGE)
    return tuple(sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml")))


def load_machine(name_or_path: str) -> Machine:
    """A built-in machine by name, or a machine file by path."""
    if name_or_path in builtin_names():
        text = resources.files(BUILTIN_PACKAGE).joinpath(f"{name_or_path}.yaml").read_text()
        return parse_machine(text, f"built-in {name_or_path}")
    path = Path(name_or_path)
    try:
        text = path.read_text()
    except OSError as e:
        raise MachineError(
            name_or_path,
            [f"neither a built-in machine ({', '.join(builtin_names())}) nor a readable file: "
             f"{e.strerror or e}"],
        ) from e
    return parse_machine(text, str(path))


def parse_machine(text: str, source: str) -> Machine:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MachineError(source, [f"not valid YAML: {e}"]) from e
    return _Parser(source).machine(doc)


def gi_id_for(profile: MigProfile, start: int) -> int:
    """The GPU instance ID a placement gets: NVML numbers GIs by placement (7g: 0, 4-slice: 1-2,
    2-slice: 3-6, 1-slice: 7-13), so equal layouts get equal IDs on every GPU."""
    if profile.size == MEMORY_SLICES:
        return 0
    if profile.size == 4:
        return 1 + start // 4
    if profile.size == 2:
        return 3 + start // 2
    return 7 + start


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def fail(self, where: str, why: str) -> None:
        self.problems.append(f"{where}: {why}")

    def mapping(self, value: object, where: str, known: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {_show(value)}")
            return {}
        for key in value:
            if key not in known:
                self.fail(f"{where}.{key}" if where else str(key),
                          f"unknown field (known: {', '.join(known)})")
        return value

    def integer(self, value: object, where: str, *, minimum: int = 0) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(where, f"must be an integer, got {_show(value)}")
            return None
        if value < minimum:
            self.fail(where, f"must be >= {minimum}, got {value}")
            return None
        return value

    def string(self, value: object, where: str) -> str | None:
        if not isinstance(value, str) or not value:
            self.fail(where, f"must be a non-empty string, got {_show(value)}")
            return None
        return value

    def product(self, value: object, where: str) -> Product | None:
        name = self.string(value, where)
        if name is None:
            return None
        if name not in PRODUCTS:
            self.fail(where, f"unknown product {name!r} (known: {', '.join(PRODUCTS)})")
            return None
        return PRODUCTS[name]

    def bus_id(self, value: object, where: str) -> str | None:
        text = self.string(value, where)
        if text is None:
            return None
        if not _BUS_ID.match(text.upper()):
            self.fail(where, f"{text!r} is not a PCI bus ID like 00000000:07:00.0")
            return None
        return text.upper()

    def machine(self, doc: object) -> Machine:
        top = self.mapping(
            doc, "",
            ("name", "description", "driver_version", "cuda_driver_version", "product",
             "init_error", "gpus", "nvlinks", "nvswitches"),
        )
        if not isinstance(doc, dict):
            raise MachineError(self.source, self.problems)
        name = self.string(top.get("name"), "name") or "unnamed"
        description = str(top.get("description", ""))
        driver_version = str(top.get("driver_version", "550.54.15"))
        cuda = self.integer(top.get("cuda_driver_version", 12040), "cuda_driver_version") or 0
        init_error = top.get("init_error")
        if init_error is not None and init_error not in INIT_ERRORS:
            self.fail("init_error", f"{_show(init_error)} is not one of {', '.join(INIT_ERRORS)}")
            init_error = None
        default_product = (
            self.product(top["product"], "product") if "product" in top else None
        )
        raw_gpus = top.get("gpus")
        if not isinstance(raw_gpus, list) or not raw_gpus:
            self.fail("gpus", f"must be a non-empty list, got {_show(raw_gpus)}")
            raw_gpus = []
        gpus = [self.gpu(name, i, g, default_product, "product" in top)
                for i, g in enumerate(raw_gpus)]
        remotes = self.links(top, gpus)
        self.unique(gpus)
        if self.problems:
            raise MachineError(self.source, self.problems)
        done = tuple(
            GpuSpec(
                index=g.index, uuid=g.uuid, product=g.product, pci_bus_id=g.pci_bus_id,
                minor=g.minor, numa_node=g.numa_node, pcie_path=g.pcie_path, board=g.board,
                mig_enabled=g.mig_enabled, mig_instances=g.mig_instances,
                nvlink_remotes=tuple(remotes[g.index]),
            )
            for g in gpus
            if isinstance(g, GpuSpec)
        )
        return Machine(name, self.source, description, driver_version, cuda,
                       init_error if isinstance(init_error, str) else None, done)

    def gpu(
        self, machine: str, index: int, raw: object, default: Product | None, has_default: bool
    ) -> GpuSpec | None:
        where = f"gpus[{index}]"
        known = ("pci_bus_id", "numa_node", "pcie_path", "product", "uuid", "minor", "board", "mig")
        fields = self.mapping(raw, where, known)
        if not isinstance(raw, dict):
            return None
        ok = True
        if "product" in fields:
            product = self.product(fields["product"], f"{where}.product")
        elif default is None:
            if not has_default:  # a bad top-level product is reported once, above
                self.fail(f"{where}.product", "missing (and no top-level product)")
            product = None
        else:
            product = default
        bus_id = self.bus_id(fields.get("pci_bus_id"), f"{where}.pci_bus_id")
        numa = fields.get("numa_node")
        numa_node = None if numa is None else self.integer(numa, f"{where}.numa_node")
        if numa is not None and numa_node is None:
            ok = False
        path_raw = fields.get("pcie_path", [])
        if not isinstance(path_raw, list) or not all(isinstance(p, str) and p for p in path_raw):
            self.fail(f"{where}.pcie_path", f"must be a list of names, got {_show(path_raw)}")
            path_raw = []
        uuid = fields.get("uuid") or f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{machine}/{index}')}"
        if not isinstance(uuid, str) or not uuid.startswith("GPU-"):
            self.fail(f"{where}.uuid", f"{_show(uuid)} must start with 'GPU-'")
            ok = False
        minor = self.integer(fields.get("minor", index), f"{where}.minor")
        board = fields.get("board")
        if board is not None and not isinstance(board, str):
            self.fail(f"{where}.board", f"must be a string, got {_show(board)}")
            ok = False
        mig_enabled = False
        instances: tuple[MigInstance, ...] = ()
        if "mig" in fields and product is not None:
            mig_enabled, instances = self.mig(fields["mig"], f"{where}.mig", product, str(uuid))
        if product is None or bus_id is None or minor is None or not ok:
            return None
        return GpuSpec(index, str(uuid), product, bus_id, minor, numa_node, tuple(path_raw),
                       board, mig_enabled, instances, ())

    def mig(
        self, raw: object, where: str, product: Product, parent_uuid: str
    ) -> tuple[bool, tuple[MigInstance, ...]]:
        fields = self.mapping(raw, where, ("enabled", "instances"))
        if not isinstance(raw, dict):
            return False, ()
        if not product.mig_capable:
            self.fail(where, f"{product.name} does not support MIG")
            return False, ()
        enabled = fields.get("enabled", True)
        if not isinstance(enabled, bool):
            self.fail(f"{where}.enabled", f"must be true or false, got {_show(enabled)}")
            return False, ()
        raw_instances = fields.get("instances", [])
        if not isinstance(raw_instances, list):
            self.fail(f"{where}.instances", f"must be a list, got {_show(raw_instances)}")
            return enabled, ()
        if raw_instances and not enabled:
            self.fail(f"{where}.instances", "MIG instances need `enabled: true`")
            return enabled, ()
        used: dict[int, str] = {}
        compute = 0
        instances: list[MigInstance] = []
        for i, item in enumerate(raw_instances):
            at = f"{where}.instances[{i}]"
            entry = self.mapping(item, at, ("profile", "start", "uuid"))
            name = self.string(entry.get("profile"), f"{at}.profile")
            if name is None:
                continue
            profile = product.mig_profile(name)
            if profile is None:
                known = ", ".join(p.name for p in product.mig_profiles)
                self.fail(f"{at}.profile", f"{name!r} is not a MIG profile of {product.name} "
                                           f"(known: {known})")
                continue
            start = self.integer(entry.get("start"), f"{at}.start")
            if start is None:
                continue
            if start not in profile.starts:
                self.fail(f"{at}.start", f"{start} is not a valid placement for {name} "
                                         f"(valid starts: {', '.join(map(str, profile.starts))})")
                continue
            clash = sorted({used[s] for s in range(start, start + profile.size) if s in used})
            if clash:
                self.fail(f"{at}.start", f"{name} at {start}:{profile.size} overlaps "
                                         f"{', '.join(clash)}")
                continue
            same = sum(1 for m in instances if m.profile.name == name)
            if same >= profile.instance_count:
                self.fail(at, f"at most {profile.instance_count} {name} per GPU")
                continue
            compute += profile.slices
            if compute > COMPUTE_SLICES:
                self.fail(at, f"the instances need more than {COMPUTE_SLICES} compute slices")
                continue
            for s in range(start, start + profile.size):
                used[s] = f"instances[{i}] ({name})"
            gi = gi_id_for(profile, start)
            mig_uuid = entry.get("uuid") or (
                f"MIG-{uuidlib.uuid5(_UUID_NAMESPACE, f'{parent_uuid}/gi{gi}/ci0')}"
            )
            if not isinstance(mig_uuid, str) or not mig_uuid.startswith("MIG-"):
                self.fail(f"{at}.uuid", f"{_show(mig_uuid)} must start with 'MIG-'")
                continue
            instances.append(MigInstance(profile, start, gi, 0, mig_uuid))
        # NVML enumerates MIG devices by GPU instance, then compute instance.
        return enabled, tuple(sorted(instances, key=lambda m: (m.gi_id, m.ci_id)))

    def links(self, top: Mapping[str, Any], gpus: Sequence[GpuSpec | None]) -> list[list[str]]:
        remotes: list[list[str]] = [[] for _ in gpus]
        raw_links = top.get("nvlinks", [])
        if not isinstance(raw_links, list):
            self.fail("nvlinks", f"must be a list, got {_show(raw_links)}")
            raw_links = []
        for i, item in enumerate(raw_links):
            at = f"nvlinks[{i}]"
            entry = self.mapping(item, at, ("gpus", "links"))
            pair = entry.get("gpus")
            count = self.integer(entry.get("links", 1), f"{at}.links", minimum=1)
            if (
                not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(x, int) and 0 <= x < len(gpus) for x in pair)
                or pair[0] == pair[1]
            ):
                self.fail(f"{at}.gpus", f"must be two distinct GPU indices below {len(gpus)}, "
                                        f"got {_show(pair)}")
                continue
            a, b = gpus[pair[0]], gpus[pair[1]]
            if a is None or b is None or count is None:
                continue
            remotes[a.index] += [b.pci_bus_id] * count
            remotes[b.index] += [a.pci_bus_id] * count
        switches = top.get("nvswitches")
        if switches is not None:
            entry = self.mapping(switches, "nvswitches", ("pci_bus_ids", "links_per_gpu"))
            ids_raw = entry.get("pci_bus_ids")
            if not isinstance(ids_raw, list) or not ids_raw:
                self.fail("nvswitches.pci_bus_ids", f"must be a non-empty list, got "
                                                    f"{_show(ids_raw)}")
                ids_raw = []
            ids = [self.bus_id(x, f"nvswitches.pci_bus_ids[{i}]") for i, x in enumerate(ids_raw)]
            per_gpu = self.integer(entry.get("links_per_gpu"), "nvswitches.links_per_gpu",
                                   minimum=1)
            good = [x for x in ids if x is not None]
            if per_gpu is not None and good:
                for remote in remotes:
                    remote += [good[link % len(good)] for link in range(per_gpu)]
        for gpu in gpus:
            if gpu is not None and len(remotes[gpu.index]) > gpu.product.nvlinks:
                self.fail(f"gpus[{gpu.index}]", f"{len(remotes[gpu.index])} NVLinks, but "
                                                f"{gpu.product.name} has {gpu.product.nvlinks}")
        return remotes

    def unique(self, gpus: Sequence[GpuSpec | None]) -> None:
        seen: dict[str, str] = {}
        for gpu in gpus:
            if gpu is None:
                continue
            keys = [
                ("uuid", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id), ("minor", str(gpu.minor)),
                *(("mig uuid", m.uuid) for m in gpu.mig_instances),
            ]
            for what, value in keys:
                key = f"{what}={value}"
                if key in seen:
                    self.fail(f"gpus[{gpu.index}]", f"{what} {value} already used by {seen[key]}")
                else:
                    seen[key] = f"gpus[{gpu.index}]"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The closed sets of names users write in flags and config files."""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """How shared devices (replicas, MIG instances) are chosen on a node.

    The same names score nodes in the extender (`--node-policy`).
    """

    DISTRIBUTED = "distributed"  # upstream default: spread replicas over GPUs
    PACKED = "packed"  # fewest physical GPUs, so whole GPUs stay free
    SPREAD = "spread"  # most distinct GPUs per request


class NodePolicy(StrEnum):
    """How the extender ranks nodes (`--node-policy`): the allocation policies' names, which
    rank as `common.scoring` documents, plus `fragaware`, which ranks by the FGD study's
    fragmentation gradient (`common.fragmentation`). Not an allocation policy: the agent's
    `Policy` stays as is, and a NodePolicy equals the Policy of the same name.
    """

    DISTRIBUTED = "distributed"
    PACKED = "packed"
    SPREAD = "spread"
    FRAGAWARE = "fragaware"


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class Sharing(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"

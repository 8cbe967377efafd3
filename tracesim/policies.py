"""Policy names on the command line and in the CSV's `sc_policy` column, and what runs them."""

from __future__ import annotations

from dataclasses import dataclass

from tracesim import baselines, fragaware, sharing
from tracesim.baselines import Scorer
from tracesim.errors import PolicyError
from tracesim.sharing import ShareModel

STUDY = tuple(baselines.BASELINES)  # random, dotprod, clustering, packing, bestfit, fgd
OURS = ("packed", "distributed", fragaware.NAME)
NAMES = STUDY + OURS


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str  # as written in the CSV's sc_policy column
    scorer: Scorer
    replicas: int | None = None  # set: the replica model (feasibility and charging in replicas)

    @property
    def label(self) -> str:
        return self.name if self.replicas is None else f"{self.name}@r{self.replicas}"


def resolve(name: str, *, model: ShareModel = ShareModel.MILLI, replicas: int = sharing.DEFAULT_REPLICAS) -> PolicySpec:
    """`name` in `model`; the study's policies and `ours` exist only in the study's (milli) model."""
    if name in baselines.BASELINES:
        return PolicySpec(name, baselines.BASELINES[name])
    if name == fragaware.NAME:
        return PolicySpec(name, fragaware.FragAwareScorer())
    if name in ("packed", "distributed"):
        scorer = sharing.shared_scorer(name, model, replicas)
        return PolicySpec(name, scorer, replicas if model is ShareModel.REPLICAS else None)
    raise PolicyError(f"invalid --policy {name}: expected one of {', '.join(NAMES)}")

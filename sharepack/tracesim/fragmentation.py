"""GPU fragmentation of a node, as the FGD study defines it, vectorised over many node states.

For each typical pod shape s (frequency p_s), a node's idle GPU milli is counted as fragment when
s cannot run there: the shape needs no GPU (the study counts all idle GPU as fragment for such
shapes), the node's GPU model is not allowed, the node lacks CPU, or fewer than `num_gpu` GPUs
each have the per-GPU share left. When s *can* run, only the GPUs with less than s's share left
are fragment. The node's fragmentation is sum_s p_s x fragment_s; the cluster's is the sum over
nodes. Memory plays no part (as in the study).

Everything here works on *counts* so that a state change can be applied without rescanning GPUs:
per node and shape, `fits` = GPUs with at least the shape's share left, and `small` = milli left
on the GPUs below the share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sharepack.tracesim.traces import NodeList, accessible
from sharepack.tracesim.workloads import TypicalWorkload

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class FragModel:
    cpu: IntArray  # [S]
    milli: IntArray  # [S]
    num_gpu: IntArray  # [S]
    freq: FloatArray  # [S]
    gpu_shape: BoolArray  # [S] shapes that need a GPU
    access: BoolArray  # [N, S] node's model admits the shape (and the shape needs a GPU)
    spec: tuple[str, ...] = ()  # [S] the GPU models each shape allows, joined by "|" ("" any)
    node_model: tuple[str, ...] = ()  # [N] each node's GPU model ("" for CPU-only nodes)

    @classmethod
    def build(cls, typical: TypicalWorkload, nodes: NodeList) -> FragModel:
        shapes = typical.shapes
        milli = np.array([s.milli for s in shapes], dtype=np.int64)
        gpu_shape = milli > 0
        access = np.array(
            [[g and accessible(model, s.spec) for s, g in zip(shapes, gpu_shape, strict=True)]
             for model in nodes.model],
            dtype=np.bool_,
        ).reshape(len(nodes), len(shapes))
        return cls(
            cpu=np.array([s.cpu for s in shapes], dtype=np.int64),
            milli=milli,
            num_gpu=np.array([s.num_gpu for s in shapes], dtype=np.int64),
            freq=typical.freq.astype(np.float64),
            gpu_shape=gpu_shape,
            access=access,
            spec=tuple(s.spec for s in shapes),
            node_model=tuple(nodes.model),
        )

    def counts(self, gpu_left: IntArray) -> tuple[IntArray, IntArray]:
        """`fits` and `small` ([B, S]) for GPU states `gpu_left` ([B, G], absent GPUs as 0)."""
        ge = gpu_left[:, :, None] >= self.milli[None, None, :]
        fits = ge.sum(axis=1, dtype=np.int64)
        small = np.where(ge, 0, gpu_left[:, :, None]).sum(axis=1, dtype=np.int64)
        return fits, small

    def frag(
        self,
        cpu_left: IntArray,
        fits: IntArray,
        small: IntArray,
        total: IntArray,
        access: BoolArray,
    ) -> FloatArray:
        """Fragmentation ([B], milli-GPU) of B node states given their counts.

        Always computed by this one function, row by row in shape order, so the same state gives
        bit-identical values wherever it is evaluated (FGD's integer scores depend on exact ties).
        """
        ok = access & (fits >= self.num_gpu[None, :]) & (cpu_left[:, None] >= self.cpu[None, :])
        amount = np.where(ok, small, total[:, None]).astype(np.float64)
        out: FloatArray = (amount * self.freq[None, :]).sum(axis=1)
        return out

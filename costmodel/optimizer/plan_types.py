"""The optimizer plan contract between the optimizer models and the step engines.

An :class:`OptimizerPlan` says, per pipeline stage, how gradients are reduced and parameters
gathered (``buckets``, in backprop order), what optimizer work every GPU of the stage does
(``ranks``) and every collective one GPU issues per step (``collectives``, byte-exact, in the
:class:`workloads.comm.CollectiveCall` convention shared with the reference backend).
Engines schedule bucket collectives themselves (overlap with backward / next forward); the
optimizer step's own time on a GPU is ``RankWork.total_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from workloads.comm import CollectiveCall


@dataclass(frozen=True)
class Bucket:
    """One gradient/parameter bucket of one pipeline stage (sizes are whole-bucket, all ranks)."""

    stage: int
    chunk: int
    dp_group: Literal["dp", "expert_dp"]
    group_size: int
    numel: int  # padded elements in the bucket
    grad_bytes: int  # numel x grad element size (nccl-tests size of the reduce)
    param_bytes: int  # numel x param element size (nccl-tests size of the gather)
    reduce_op: Literal["reduce_scatter", "all_reduce"]
    gather_op: Literal["all_gather", "all_gather_v"] | None
    order: int = 0  # position in backprop order within the stage (0 = reduced first)


@dataclass(frozen=True)
class RankWork:
    """Optimizer-step work of one GPU (seconds are modelled times on that GPU)."""

    rank: int  # index of the GPU within the stage's representative set (see StageOptimizerPlan)
    owned_numel: int
    newton_schulz_flops: float
    newton_schulz_s: float
    elementwise_s: float  # AdamW / Muon momentum / weight update, memory-bound
    tp_comm_s: float  # Newton-Schulz TP collectives on the critical path (duplicated / distributed)

    @property
    def total_s(self) -> float:
        return self.newton_schulz_s + self.elementwise_s + self.tp_comm_s


@dataclass(frozen=True)
class StageOptimizerPlan:
    stage: int
    buckets: tuple[Bucket, ...]
    ranks: tuple[RankWork, ...]
    collectives: tuple[CollectiveCall, ...]  # per GPU per step, merged (see workloads.comm.merge_calls)
    padding_overhead: float = 0.0  # padded / unpadded elements - 1

    @property
    def max_rank_s(self) -> float:
        return max((r.total_s for r in self.ranks), default=0.0)

    @property
    def mean_rank_s(self) -> float:
        return sum(r.total_s for r in self.ranks) / len(self.ranks) if self.ranks else 0.0


@dataclass(frozen=True)
class OptimizerPlan:
    kind: str
    distribution: str
    layout: str | None
    tp_mode: str | None
    load_balance: str | None
    stages: tuple[StageOptimizerPlan, ...]
    notes: tuple[str, ...] = field(default=())

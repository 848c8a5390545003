"""The StepReport's optimizer section from an :class:`OptimizerPlan` (what ``--json`` shows).

Per-rank statistics, imbalance and the time lost to it are taken over the GPUs of the critical
stage (the stage whose slowest GPU finishes the optimizer step last: it sets the step time).
Newton–Schulz FLOPs are over every GPU of the job (``total``) and per GPU (``per_rank_max``,
``per_rank_mean``). ``collectives`` is the list one GPU issues per step: the critical GPU's; ``kernels`` that GPU's
kernel launches by part, its GPU and host-issue seconds (:mod:`costmodel.optimizer.kernel_sequence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import mul

from costmodel.optimizer.plan_types import OptimizerPlan, RankWork, StageOptimizerPlan, rank_column
from costmodel.report import CollectiveOut, OptimizerKernelsOut, OptimizerReport, Stats


def per_rank_loads_s(stage: StageOptimizerPlan) -> list[tuple[int, float, int]]:
    """(first GPU, optimizer seconds, multiplicity) of each rank class of ``stage``."""
    ranks = stage.ranks
    return list(zip(rank_column(ranks, "rank"), rank_column(ranks, "total_s"), rank_column(ranks, "multiplicity"),
                    strict=True))


def imbalance_of(stage: StageOptimizerPlan) -> float:
    """max / mean per-GPU optimizer time of a stage (1.0 when empty or idle)."""
    mean = stage.mean_rank_s
    return stage.max_rank_s / mean if mean > 0 else 1.0


def kernels_out(rank: RankWork, stage: StageOptimizerPlan) -> OptimizerKernelsOut:
    """The kernel section of one GPU's optimizer step (``stage``: its pipeline stage's plan)."""
    parts = {k: round(v) for k, v in rank.kernel_counts.items()}  # launch counts: whole numbers held as floats
    per_tensor = parts.get("newton_schulz_gemm", 0) + parts.get("muon_elementwise", 0)
    return OptimizerKernelsOut(
        launches=round(rank.kernels), by_part=parts, muon_tensors=rank.muon_tensors,
        launches_per_muon_tensor=per_tensor / rank.muon_tensors if rank.muon_tensors else None,
        gpu_s=rank.gpu_s, issue_s=rank.issue_s, host_idle_s=rank.host_idle_s,
        grad_prescale_launches=sum(1 for b in stage.buckets if b.prescaled))


def newton_schulz_figures(stages: Sequence[StageOptimizerPlan]) -> tuple[int, float, float]:
    """(GPUs, Newton-Schulz FLOPs over every GPU, Newton-Schulz FLOPs of the busiest GPU) of ``stages``.

    The FLOPs total is the sum over the stages, in order, of each rank class's FLOPs times its
    multiplicity (from 0, class by class); the products, the GPUs and the largest FLOPs are made once
    per distinct rank table (the stages with the same tensors share their plan's ``ranks``), the sum
    then adds the same products in the same order as a walk over every stage."""
    figures: dict[int, tuple[int, list[float], list[float]]] = {}  # id(ranks) -> (GPUs, products, [largest FLOPs])
    for s in stages:
        if id(s.ranks) not in figures:
            fs, ms = rank_column(s.ranks, "newton_schulz_flops"), rank_column(s.ranks, "multiplicity")
            figures[id(s.ranks)] = (sum(ms), list(map(mul, fs, ms)), [max(fs)] if fs else [])
    per_stage = [figures[id(s.ranks)] for s in stages]
    # the walk over every stage meets its first largest value in the first distinct table holding it
    return (sum(g for g, _, _ in per_stage), sum(chain.from_iterable(p for _, p, _ in per_stage)),
            max(chain.from_iterable(f for _, _, f in figures.values()), default=0.0))


def optimizer_report(plan: OptimizerPlan, exposed_s: float, hidden_s: float) -> OptimizerReport:
    """Fill :class:`costmodel.report.OptimizerReport` from ``plan`` and the engine's exposed/hidden seconds."""
    crit = plan.critical_stage
    loads = rank_column(crit.ranks, "total_s") or [0.0]
    mean = crit.mean_rank_s
    gpus, flops_total, flops_max = newton_schulz_figures(plan.stages)
    used = sum(b.used_numel for s in plan.stages for b in s.buckets)
    padded = sum(b.numel for s in plan.stages for b in s.buckets)
    collectives = [
        CollectiveOut(op=c.op, group=c.group, group_size=c.group_size, dtype=c.dtype, bytes=c.bytes, count=c.count,
                      phase=c.phase, time_s=t)
        for c, t in zip(crit.collectives, crit.collective_times_s or [None] * len(crit.collectives), strict=True)
    ]
    notes = list(plan.notes)
    if len(plan.stages) > 1:
        notes.append(f"per-rank statistics over the {crit.gpus} GPUs of pipeline stage {crit.stage} (the critical stage)")
    return OptimizerReport(
        kind=plan.kind, distribution=plan.distribution, layout=plan.layout, tp_mode=plan.tp_mode,
        load_balance=plan.load_balance, hypothetical=plan.hypothetical,
        per_rank_compute_s=Stats(min=min(loads), mean=mean, max=max(loads)),
        imbalance_ratio=imbalance_of(crit), imbalance_lost_s=max(loads) - mean,
        exposed_s=exposed_s, hidden_s=hidden_s,
        newton_schulz_flops={"total": flops_total, "per_rank_max": flops_max,
                             "per_rank_mean": flops_total / gpus if gpus else 0.0},
        padding_overhead_pct=100.0 * (padded / used - 1) if used else 0.0,
        kernels=kernels_out(crit.ranks[crit.critical_rank], crit) if crit.ranks else None,
        collectives=collectives, notes=notes,
    )

"""The analytic engine: closed-form step time and breakdown (microseconds per scenario).

Step = parameter-gather head + forward/backward phase (:func:`costmodel.pipeline.pipeline_time_s`)
+ exposed gradient reduction + optimizer step (+ synchronous parameter gather) + overlap slowdown.

- The forward/backward phase uses the busiest stage's compute-stream time per micro-batch
  (compute + exposed TP/CP/EP communication) and the schedule's fill/drain.
- Drain: stage ``s`` finishes its last backward ``Σ_{j<s}`` (chunk backward + one transfer) before
  stage 0. Gradient buckets become ready during each chunk's last backward (at their position in
  backprop order) and are reduced one after another on the DP stream; what runs past the end of the
  stage's backward is exposed. A shared embedding's all-reduce between the first and the last stage
  (MTP with pp > 1) follows both stages' reductions. All stages meet at the gradient-norm
  synchronisation, then run the optimizer step (the plan's critical GPU: Newton-Schulz + element-wise + its TP collectives).
- Parameter gather: synchronous after the optimizer step, or (``hide_param_gather``) queued per
  bucket in forward order and waited for by the next step's first forward pass of each chunk.
  With ``align_param_gather`` (or ``overlap_param_gather_with_optimizer_step``, which dispatches
  the first chunk's gather right at the end of the optimizer step) every stage queues its gathers
  when the step starts, so stages > 0 hide them in the pipeline fill; without it (Megatron's
  default) a stage dispatches a chunk's gathers when that chunk's first forward pass starts, so each
  stage's wait delays the fill of the stages after it (the waits add up). (Megatron dispatches one
  bucket ahead from forward pre-hooks; prefetching the chunk's whole queue is the modelling choice
  that keeps an overlapped gather never slower than a synchronous one.)
- Overlapped DP traffic slows concurrent compute by ``overlap_compute_slowdown`` (reported as
  ``other``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.pipeline import p2p_exposed_s, pipeline_time_s
from costmodel.report import Breakdown, StepReport
from costmodel.step_structure import StageCost, StepStructure, build_step_structure

if TYPE_CHECKING:
    from workloads.scenario import Scenario


@dataclass(frozen=True)
class AnalyticTiming:
    """Step seconds, its breakdown, optimizer-related exposed/hidden seconds, forward/backward phase."""

    step_time_s: float
    breakdown: Breakdown
    optimizer_exposed_s: float
    optimizer_hidden_s: float
    pipeline_s: float


def _grad_done_s(stage: StageCost, end_s: float, overlap: bool) -> float:
    """When the last gradient bucket of ``stage`` is reduced, its backward ending at ``end_s``."""
    chunk_end = {}
    t = end_s
    for ch in stage.chunks:  # chunk 0's last backward runs last
        chunk_end[ch.chunk] = t
        t -= ch.bwd.time_s
    busy = 0.0
    for b in stage.backward_buckets:
        bwd = stage.chunks[b.chunk].bwd.time_s
        ready = chunk_end[b.chunk] - (1.0 - b.bwd_ready_fraction) * bwd if overlap else end_s
        busy = max(busy, ready) + b.reduce_s
    return max(end_s, busy)


def _gather_head_s(stage: StageCost, fill_s: float, pp: int, aligned: bool = True) -> float:
    """Delay the hidden parameter all-gather adds to a stage's first forward passes.

    Aligned (``align_param_gather``): every bucket's all-gather is queued on the DP stream when the
    step starts, on every stage at once, in the order the forward needs them. Not aligned: a
    chunk's gathers are dispatched only when its first forward pass starts (Megatron's forward
    pre-hooks), after the previous chunk's. Compute waits at a bucket until its parameters have
    arrived.
    """
    t = fill_s
    chunk_start = {}
    for ch in stage.chunks:
        chunk_start[ch.chunk] = t
        t += pp * ch.fwd.time_s if pp > 1 else ch.fwd.time_s
    delay, arrive, chunk = 0.0, 0.0, None
    for b in stage.forward_buckets:
        if not aligned and b.chunk != chunk:
            chunk = b.chunk
            arrive = max(arrive, chunk_start[b.chunk] + delay)
        arrive += b.gather_s
        nominal = chunk_start[b.chunk] + b.fwd_need_fraction * stage.chunks[b.chunk].fwd.time_s
        delay = max(delay, arrive - nominal)
    return delay


def analytic_timing(st: StepStructure) -> AnalyticTiming:
    """Closed-form timing of a :class:`StepStructure`."""
    m, pp, vpp = st.microbatches, st.pp, st.vpp
    work = [s.work_s for s in st.stages]
    cf = [sum(c.fwd.time_s for c in s.chunks) / vpp for s in st.stages]
    cb = [sum(c.bwd.time_s for c in s.chunks) / vpp for s in st.stages]
    # the gradient buckets' 1/dp pre-scaling runs on the compute stream at the end of the last backward
    t_pipe = pipeline_time_s(work, cf, cb, m, vpp, st.p2p_s) + max(s.grad_prescale_s for s in st.stages)
    crit = st.stages[max(range(pp), key=lambda s: work[s])]
    compute = m * sum(c.fwd.compute_s + c.bwd.compute_s for c in crit.chunks) + crit.grad_prescale_s
    exposed: dict[str, float] = {}
    for c in crit.chunks:
        for part in (c.fwd, c.bwd):
            for k, v in part.exposed_by_kind().items():
                exposed[k] = exposed.get(k, 0.0) + m * v
    exposed["pp"] = p2p_exposed_s(pp, vpp, m, st.p2p_s)
    bubble = max(0.0, t_pipe - compute - sum(exposed.values()))
    # drain: stage s ends its last backward before stage 0 by the chunk backwards and transfers between
    ends, slack = [], 0.0
    for s in range(pp):
        ends.append(t_pipe - slack)
        slack += st.stages[s].chunks[0].bwd.time_s + st.p2p_s
    done = [_grad_done_s(stage, ends[s], st.overlap_grad_reduce) for s, stage in enumerate(st.stages)]
    barrier = max(done)
    embd = [s for s, stage in enumerate(st.stages) if stage.embedding_grad_s > 0]
    if embd:  # the shared embedding's all-reduce starts when both of its stages have reduced their grads
        barrier = max(barrier, max(done[s] for s in embd) + max(st.stages[s].embedding_grad_s for s in embd))
    dp_grad = barrier - t_pipe
    reduce_total = [sum(b.reduce_s for b in s.buckets) for s in st.stages]
    gather_total = [sum(b.gather_s for b in s.buckets) for s in st.stages]
    sync_gather = [0.0 if st.hide_param_gather else g for g in gather_total]
    tails = [s.optimizer_compute_s + s.optimizer_tp_s + sync_gather[i] for i, s in enumerate(st.stages)]
    tail_stage = max(range(pp), key=lambda s: tails[s])
    head = 0.0
    if st.hide_param_gather and st.align_param_gather:  # every stage gathers from the start: the fill hides it
        fill = 0.0
        for stage in st.stages:
            head = max(head, _gather_head_s(stage, fill, pp))
            fill += stage.chunks[0].fwd.time_s + st.p2p_s
    elif st.hide_param_gather:  # each stage gathers when its first forward arrives: the delays add up the fill
        head = sum(_gather_head_s(stage, 0.0, pp, aligned=False) for stage in st.stages)
    hidden_grad = max(0.0, reduce_total[crit.stage] - max(0.0, done[crit.stage] - ends[crit.stage]))
    hidden_gather = max(0.0, gather_total[crit.stage] - head) if st.hide_param_gather else 0.0
    other = st.compute_slowdown * (hidden_grad + hidden_gather)
    exposed["dp_grad"] = dp_grad
    exposed["dp_param"] = head + sync_gather[tail_stage]
    exposed["optimizer_tp"] = st.stages[tail_stage].optimizer_tp_s
    optimizer = st.stages[tail_stage].optimizer_compute_s
    step = head + barrier + tails[tail_stage] + other
    breakdown = Breakdown(compute=compute, pipeline_bubble=bubble, exposed_comm=exposed, optimizer=optimizer, other=other)
    opt_exposed = optimizer + exposed["optimizer_tp"] + dp_grad + exposed["dp_param"]
    return AnalyticTiming(step, breakdown, opt_exposed, hidden_grad + hidden_gather, t_pipe)


def run_analytic(scenario: Scenario, overlap: bool = True) -> StepReport:
    """Predict one step of ``scenario`` in closed form (``overlap=False``: every overlap off)."""
    from costmodel.report_builder import build_report

    st = build_step_structure(scenario, overlap=overlap)
    timing = analytic_timing(st)
    return build_report(scenario, "analytic", timing.step_time_s, timing.breakdown, st.plan,
                        timing.optimizer_exposed_s, timing.optimizer_hidden_s, warnings=list(st.warnings))

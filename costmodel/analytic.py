"""The analytic engine: closed-form step time and breakdown (microseconds per scenario).

Step = parameter-gather head + forward/backward phase (:func:`costmodel.pipeline.pipeline_time_s`)
+ exposed gradient reduction + optimizer step (+ synchronous parameter gather) + overlap slowdown.

- The forward/backward phase uses the busiest stage's compute-stream time per micro-batch
  (compute + exposed TP/CP/EP communication) and the schedule's fill/drain; interleaved, the
  longest path through Megatron's order of the chunks' passes (unequal virtual stages stall it).
- Drain: stage ``s`` finishes its last backward ``Σ_{j<s}`` (chunk backward + one transfer) before
  stage 0. Gradient buckets become ready during each chunk's last backward (at their position in
  backprop order) and are reduced one after another on the DP stream; what runs past the end of the
  stage's backward is exposed.
- Gradient pre-scaling (``grad_data *= 1/dp``, unless ``average_in_collective``): Megatron-Core's
  ``start_grad_sync`` runs it on the compute stream right before each bucket's reduction. With
  ``overlap_grad_reduce`` that is inside the chunk's last backward (the backward hook
  ``register_grad_ready``), so it delays the rest of that backward and the input gradient sent to
  the previous virtual stage: along the drain (the last micro-batch's backward through the virtual
  stages nv−1 … 0) every virtual stage's scaling delays all those after it (:func:`_prescale_delays_s`).
  Without it, ``finish_grad_sync`` scales then reduces bucket after bucket once the backward is done.
  Either way the time is booked as ``dp_grad`` (gradient synchronisation; the DES does the same). A shared embedding's all-reduce between the first and the last stage
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

from costmodel.pipeline import p2p_exposed_s, pipeline_lower_bound_s, pipeline_time_s
from costmodel.report import Breakdown, StepReport
from costmodel.stage_buckets import BucketViews, bucket_views
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


def _prescale_delays_s(st: StepStructure, views: list[BucketViews]) -> list[list[float]]:
    """[stage][chunk]: how much later that chunk's last backward ends because of the overlapped 1/dp
    pre-scaling (Megatron's ``register_grad_ready`` → ``start_grad_sync`` on the compute stream).

    The last micro-batch's backward runs through the virtual stages ``v = chunk·pp + stage`` from
    nv−1 down to 0, each waiting for the previous one's input gradient; a virtual stage's scaling
    kernels run inside that backward, before the gradient is sent on. So virtual stage ``v`` ends
    later by the scaling of every virtual stage ``≥ v`` (zeros without ``overlap_grad_reduce``:
    the scaling then follows the backward, :func:`_grad_done_s`); ``views[s]``: stage ``s``'s
    :func:`~costmodel.stage_buckets.bucket_views`.
    """
    pp, vpp = st.pp, st.vpp
    if not st.overlap_grad_reduce:
        return [[0.0] * vpp for _ in range(pp)]
    per_virtual = [0.0] * (pp * vpp)
    for s, view in enumerate(views):
        for chunk, seconds in view.prescale_by_chunk_s.items():
            per_virtual[chunk * pp + s] += seconds
    after = [sum(per_virtual[v:]) for v in range(pp * vpp)]
    return [[after[c * pp + s] for c in range(vpp)] for s in range(pp)]


def _grad_done_s(stage: StageCost, view: BucketViews, end_s: float, overlap: bool, delays_s: list[float]) -> float:
    """When the last gradient bucket of ``stage`` (its bucket views ``view``) is reduced; ``end_s``:
    when its last backward would end without gradient pre-scaling, ``delays_s[chunk]``: how much
    later each chunk's last backward ends with it (:func:`_prescale_delays_s`).

    Overlapped: a bucket is scaled (``prescale_s``, compute stream) when its gradients are complete
    in its chunk's last backward, then reduced on the DP stream after the buckets before it. Not
    overlapped (``finish_grad_sync`` after the backward): every bucket is scaled, then reduced
    synchronously, one after another.
    """
    if not overlap:
        return end_s + sum(b.prescale_s + b.reduce_s for b in stage.buckets)
    scaling = view.prescale_by_chunk_s
    chunk_start = {}
    t = end_s
    for ch in stage.chunks:  # chunk 0's last backward runs last
        chunk_start[ch.chunk] = t + delays_s[ch.chunk] - ch.bwd.time_s - scaling.get(ch.chunk, 0.0)
        t -= ch.bwd.time_s
    bwd_s = [ch.bwd.time_s for ch in stage.chunks]
    busy = 0.0
    scaled: dict[int, float] = {}
    for b in view.backward:  # hundreds in a layer-wise stage: plain locals, no call per bucket
        c = b.chunk
        done = scaled[c] = scaled.get(c, 0.0) + b.prescale_s  # its own and the earlier buckets' scaling
        ready = chunk_start[c] + b.bwd_ready_fraction * bwd_s[c] + done
        if ready > busy:  # busy = max(busy, ready)
            busy = ready
        busy += b.reduce_s
    return max(end_s + delays_s[0], busy)


def _gather_head_s(stage: StageCost, view: BucketViews, fill_s: float, pp: int, aligned: bool = True) -> float:
    """Delay the hidden parameter all-gather adds to a stage's first forward passes (``view``: its
    bucket views).

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
    for b in view.forward:
        if not aligned and b.chunk != chunk:
            chunk = b.chunk
            arrive = max(arrive, chunk_start[b.chunk] + delay)
        arrive += b.gather_s
        nominal = chunk_start[b.chunk] + b.fwd_need_fraction * stage.chunks[b.chunk].fwd.time_s
        delay = max(delay, arrive - nominal)
    return delay


def _pipeline_inputs(st: StepStructure) -> tuple[list[float], list[float], list[float], list[list[tuple[float, float]]]]:
    """Per stage: work per micro-batch, mean chunk forward and backward, and (forward, backward) per chunk (seconds)."""
    vpp = st.vpp
    work = [s.work_s for s in st.stages]
    cf = [sum(c.fwd.time_s for c in s.chunks) / vpp for s in st.stages]
    cb = [sum(c.bwd.time_s for c in s.chunks) / vpp for s in st.stages]
    passes = [[(c.fwd.time_s, c.bwd.time_s) for c in s.chunks] for s in st.stages]
    return work, cf, cb, passes


def pipeline_lower_bound_of(st: StepStructure) -> float:
    """A lower bound (seconds) on ``analytic_timing(st).pipeline_s`` that simulates no interleaved order
    (:func:`costmodel.pipeline.pipeline_lower_bound_s`; equal to it without interleaving): the planner's
    pruning bound."""
    work, cf, cb, passes = _pipeline_inputs(st)
    delays = _prescale_delays_s(st, [bucket_views(s.buckets) for s in st.stages])
    return pipeline_lower_bound_s(work, cf, cb, st.microbatches, st.vpp, st.p2p_s, passes) + delays[0][0]


def analytic_timing(st: StepStructure) -> AnalyticTiming:
    """Analytic timing of a :class:`StepStructure` (closed form but for the interleaved order's longest path)."""
    m, pp, vpp = st.microbatches, st.pp, st.vpp
    work, cf, cb, passes = _pipeline_inputs(st)
    t_base = pipeline_time_s(work, cf, cb, m, vpp, st.p2p_s, passes)
    # overlapped 1/dp pre-scaling delays the drain (booked as dp_grad below, not compute or bubble)
    views = [bucket_views(s.buckets) for s in st.stages]
    delays = _prescale_delays_s(st, views)
    t_pipe = t_base + delays[0][0]
    crit = st.stages[max(range(pp), key=lambda s: work[s])]
    compute = m * sum(c.fwd.compute_s + c.bwd.compute_s for c in crit.chunks)
    exposed: dict[str, float] = {}
    for c in crit.chunks:
        for part in (c.fwd, c.bwd):
            for k, v in part.exposed_by_kind().items():
                exposed[k] = exposed.get(k, 0.0) + m * v
    exposed["pp"] = p2p_exposed_s(pp, vpp, m, st.p2p_s)
    bubble = max(0.0, t_base - compute - sum(exposed.values()))
    # drain: stage s ends its last backward before stage 0 by the chunk backwards and transfers between
    ends, slack = [], 0.0
    for s in range(pp):
        ends.append(t_base - slack)
        slack += st.stages[s].chunks[0].bwd.time_s + st.p2p_s
    done = [_grad_done_s(stage, views[s], ends[s], st.overlap_grad_reduce, delays[s]) for s, stage in enumerate(st.stages)]
    ends = [end + delays[s][0] for s, end in enumerate(ends)]
    barrier = max(done)
    embd = [s for s, stage in enumerate(st.stages) if stage.embedding_grad_s > 0]
    if embd:  # the shared embedding's all-reduce starts when both of its stages have reduced their grads
        barrier = max(barrier, max(done[s] for s in embd) + max(st.stages[s].embedding_grad_s for s in embd))
    dp_grad = barrier - t_base  # the exposed reductions and every pre-scaling on the critical path
    reduce_total = [v.reduce_s for v in views]
    gather_total = [v.gather_s for v in views]
    sync_gather = [0.0 if st.hide_param_gather else g for g in gather_total]
    tails = [s.optimizer_compute_s + s.optimizer_tp_s + sync_gather[i] for i, s in enumerate(st.stages)]
    tail_stage = max(range(pp), key=lambda s: tails[s])
    head = 0.0
    if st.hide_param_gather and st.align_param_gather:  # every stage gathers from the start: the fill hides it
        fill = 0.0
        for stage, view in zip(st.stages, views, strict=True):
            head = max(head, _gather_head_s(stage, view, fill, pp))
            fill += stage.chunks[0].fwd.time_s + st.p2p_s
    elif st.hide_param_gather:  # each stage gathers when its first forward arrives: the delays add up the fill
        head = sum(_gather_head_s(stage, view, 0.0, pp, aligned=False) for stage, view in zip(st.stages, views, strict=True))
    tail_scaling = 0.0 if st.overlap_grad_reduce else crit.grad_prescale_s  # synchronous: after the backward
    hidden_grad = max(0.0, reduce_total[crit.stage] - max(0.0, done[crit.stage] - ends[crit.stage] - tail_scaling))
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

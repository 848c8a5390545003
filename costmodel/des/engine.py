"""``run_des``: the discrete-event engine's StepReport (steady-state step of a two-step run).

The reported step is the second one, from the moment the last rank finished step 1 to the moment
the last rank finished step 2, so the overlap across the step boundary (parameter all-gather hidden
behind the next forward) is real. The breakdown is measured on the busiest stage's representative
GPU: its compute, the exposed collective time on its compute stream, and its waits, attributed to
what it waited for (activations in flight: pp; activations not yet produced: pipeline bubble,
unless their sender was itself held up by its parameter gather, which is then booked as dp_param
on every rank it delays, as in the analytic engine, or by its gradients' 1/dp pre-scaling, booked
as dp_grad; gradient pre-scaling, reduction and the global gradient sync: dp_grad; parameter
gather: dp_param).
Without a timeline (``record=False``) long schedules are simulated short and extrapolated over
the periodic 1F1B steady state (:func:`simulate`; within 0.3 % of the full simulation on the
45 distinct published configurations, 5x faster).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from costmodel.des.simulation import DesResult, StepSimulation
from costmodel.errors import UnsupportedScenario
from costmodel.report import Breakdown, StepReport, TimelineEvent
from costmodel.step_structure import StepStructure, build_step_structure

if TYPE_CHECKING:
    from workloads.scenario import Scenario

EXPOSED_KINDS = ("tp", "cp", "ep", "dp_fsdp", "offload", "pp", "dp_grad", "dp_param", "optimizer_tp")


STEADY_GROUPS = 4  # micro-batch groups of pp simulated before the steady state is extrapolated


def _lerp(a: float, b: float, x: float) -> float:
    return a + (b - a) * x


def _extrapolate(r1: DesResult, r2: DesResult, x: float) -> DesResult:
    """``r1 + x (r2 - r1)`` field by field (times and attributed seconds; no timeline)."""
    att = [[{k: _lerp(a1.get(k, 0.0), a2.get(k, 0.0), x) for k in a1.keys() | a2.keys()}
            for a1, a2 in zip(row1, row2, strict=True)] for row1, row2 in zip(r1.attribution, r2.attribution, strict=True)]
    return DesResult(step_ends_s=[_lerp(a, b, x) for a, b in zip(r1.step_ends_s, r2.step_ends_s, strict=True)],
                     rank_ends_s=[[_lerp(a, b, x) for a, b in zip(e1, e2, strict=True)]
                                  for e1, e2 in zip(r1.rank_ends_s, r2.rank_ends_s, strict=True)],
                     attribution=att, events=[])


def simulate(st: StepStructure, contention: bool = True, steps: int = 2, record: bool = True) -> DesResult:
    """Run the discrete-event simulation of ``steps`` consecutive steps.

    Without a timeline (``record=False``) and with many micro-batches, the 1F1B steady state is
    exploited: every steady-state micro-batch group of ``pp`` repeats the same passes, so times and
    attributed seconds are linear in the number of groups. Two short runs with ``m1`` and ``m1 + pp``
    micro-batches (same ``m mod pp``, hence the same warm-up, cool-down and gradient tail) are
    simulated and extrapolated linearly to ``m``. With contention this is exact as long as the
    steady state is periodic (the layer flows of a pass do not depend on its index).
    """
    m, pp = st.microbatches, st.pp
    m1 = m % pp + STEADY_GROUPS * pp
    if record or m <= m1 + 2 * pp:
        return StepSimulation(st, steps=steps, contention=contention, record=record).run()
    r1 = StepSimulation(replace(st, microbatches=m1), steps=steps, contention=contention, record=False).run()
    r2 = StepSimulation(replace(st, microbatches=m1 + pp), steps=steps, contention=contention, record=False).run()
    return _extrapolate(r1, r2, (m - m1) / pp)


def des_breakdown(st: StepStructure, res: DesResult) -> tuple[float, Breakdown]:
    """(steady-state step time s, breakdown) from a finished simulation."""
    last = len(res.step_ends_s) - 1
    step = res.step_ends_s[last] - (res.step_ends_s[last - 1] if last > 0 else 0.0)
    rows = res.attribution[last]
    crit = max(range(len(rows)), key=lambda s: rows[s].get("compute", 0.0))
    a = rows[crit]
    exposed = {k: a.get(k, 0.0) for k in EXPOSED_KINDS if a.get(k, 0.0) > 0 or k in ("pp", "dp_grad", "dp_param")}
    accounted = a.get("compute", 0.0) + a.get("pipeline_bubble", 0.0) + sum(exposed.values()) + a.get("optimizer", 0.0)
    other = step - accounted
    return step, Breakdown(compute=a.get("compute", 0.0), pipeline_bubble=a.get("pipeline_bubble", 0.0),
                           exposed_comm=exposed, optimizer=a.get("optimizer", 0.0), other=other)


def run_des(scenario: Scenario, contention: bool = True, overlap: bool = True, record: bool = True) -> StepReport:
    """Predict one steady-state step of ``scenario`` by discrete-event simulation.

    ``contention=False`` gives every flow its link's full bandwidth; ``overlap=False`` turns every
    overlap off (the mode in which this engine must agree with the analytic one).
    """
    report, raw = run_des_untimed(scenario, contention, overlap, record)
    return with_timeline(report, raw)


RawRow = tuple[int, str, str, float, float, str, int, float]  # RawEvent's fields, in order


def run_des_untimed(scenario: Scenario, contention: bool = True, overlap: bool = True,
                    record: bool = True) -> tuple[StepReport, list[RawRow]]:
    """(:func:`run_des`'s report without its timeline events, the raw timeline as plain tuples).

    :func:`with_timeline` puts the events in. A process pool sends the tuples: pickling the ~12,000
    TimelineEvent models of a Kimi K2 report took ~30 ms in the sender and as long in the receiver.
    """
    from costmodel.report_builder import build_report

    st = build_step_structure(scenario, overlap=overlap)
    res = simulate(st, contention=contention, record=record)
    step, breakdown = des_breakdown(st, res)
    if not step > 0.0:  # the order deadlocked: no rank finished the step
        raise UnsupportedScenario(
            f"the discrete-event engine cannot run Megatron's interleaved order with {st.microbatches} micro-batches "
            f"on pp {st.pp} (a last group of 1 to pp-1 micro-batches waits on passes scheduled after it; Megatron-Core "
            "0.16 refuses it too); use --engine analytic, or a global batch size giving a multiple of pp "
            "micro-batches per pipeline")
    raw = [(e.rank, e.stream, e.name, e.start_s, e.duration_s, e.category, e.step, e.bytes) for e in res.events]
    b = breakdown
    opt_exposed = b.optimizer + sum(b.exposed_comm.get(k, 0.0) for k in ("optimizer_tp", "dp_grad", "dp_param"))
    dp_total = sum(bk.reduce_s + bk.gather_s for s in st.stages for bk in s.buckets) / max(len(st.stages), 1)
    hidden = max(0.0, dp_total - b.exposed_comm.get("dp_grad", 0.0) - b.exposed_comm.get("dp_param", 0.0))
    report = build_report(scenario, "des", step, breakdown, st.plan, opt_exposed, hidden, events=[],
                          warnings=list(st.warnings))
    return report, raw


def with_timeline(report: StepReport, raw: list[RawRow]) -> StepReport:
    """``report`` (from :func:`run_des_untimed`) with the timeline events of ``raw``."""
    if not raw:
        return report
    events = [TimelineEvent(rank=f"pp{rank}", stream=stream, name=name, start_s=start_s, duration_s=duration_s,
                            category=category, step=step + 1, bytes=size or None)
              for rank, stream, name, start_s, duration_s, category, step, size in raw]
    return report.model_copy(update={"events": events})

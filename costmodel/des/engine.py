"""``run_des``: the discrete-event engine's StepReport (steady-state step of a two-step run).

The reported step is the second one, from the moment the last rank finished step 1 to the moment
the last rank finished step 2, so the overlap across the step boundary (parameter all-gather hidden
behind the next forward) is real. The breakdown is measured on the busiest stage's representative
GPU: its compute, the exposed collective time on its compute stream, and its waits, attributed to
what it waited for (activations in flight: pp; activations not yet produced: pipeline bubble;
gradient reduction and the global gradient sync: dp_grad; parameter gather: dp_param).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.des.simulation import DesResult, StepSimulation
from costmodel.report import Breakdown, StepReport, TimelineEvent
from costmodel.step_structure import StepStructure, build_step_structure

if TYPE_CHECKING:
    from workloads.scenario import Scenario

EXPOSED_KINDS = ("tp", "cp", "ep", "pp", "dp_grad", "dp_param", "optimizer_tp")


def simulate(st: StepStructure, contention: bool = True, steps: int = 2, record: bool = True) -> DesResult:
    """Run the discrete-event simulation of ``steps`` consecutive steps."""
    return StepSimulation(st, steps=steps, contention=contention, record=record).run()


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
    from costmodel.report_builder import build_report

    st = build_step_structure(scenario, overlap=overlap)
    res = simulate(st, contention=contention, record=record)
    step, breakdown = des_breakdown(st, res)
    events = [TimelineEvent(rank=f"pp{e.rank}", stream=e.stream, name=e.name, start_s=e.start_s,
                            duration_s=e.duration_s, category=e.category, step=e.step + 1) for e in res.events]
    b = breakdown
    opt_exposed = b.optimizer + sum(b.exposed_comm.get(k, 0.0) for k in ("optimizer_tp", "dp_grad", "dp_param"))
    dp_total = sum(bk.reduce_s + bk.gather_s for s in st.stages for bk in s.buckets) / max(len(st.stages), 1)
    hidden = max(0.0, dp_total - b.exposed_comm.get("dp_grad", 0.0) - b.exposed_comm.get("dp_param", 0.0))
    return build_report(scenario, "des", step, breakdown, st.plan, opt_exposed, hidden, events=events,
                        warnings=list(st.warnings))

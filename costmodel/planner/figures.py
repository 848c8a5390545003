"""plotly figures of a plan (imported lazily): all evaluated plans, the Pareto front, top breakdowns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from costmodel.planner.plan import PlanOutcome

MAX_BREAKDOWNS = 6


def scatter_figure(outcome: PlanOutcome) -> Any:
    """Step time vs memory per GPU of every evaluated plan, the Pareto front, the budget and the reference."""
    import plotly.graph_objects as go

    res = outcome.result
    fig = go.Figure()
    by_kind: dict[str, list[Any]] = {}
    for e in outcome.evaluations:
        if e.fits and e.timed:
            by_kind.setdefault(e.candidate.optimizer, []).append(e)
    for kind, evs in sorted(by_kind.items()):
        fig.add_trace(go.Scattergl(
            x=[e.memory_bytes / 1e9 for e in evs], y=[e.step_time_s for e in evs], mode="markers", name=f"{kind} plans",
            text=[e.candidate.label() for e in evs], marker={"size": 5, "opacity": 0.6},
            hovertemplate="%{text}<br>%{x:.1f} GB, %{y:.3f} s<extra></extra>"))
    front = res.pareto_front
    if front:
        fig.add_trace(go.Scatter(x=[r.memory_per_gpu_bytes / 1e9 for r in front], y=[r.step_time_s for r in front],
                                 mode="lines+markers", name="Pareto front", line={"shape": "hv"},
                                 text=[r.label for r in front], hovertemplate="%{text}<extra></extra>"))
    ref = res.reference.row
    if ref is not None:
        fig.add_trace(go.Scatter(x=[ref.memory_per_gpu_bytes / 1e9], y=[ref.step_time_s], mode="markers",
                                 name="reference scenario", marker={"symbol": "star", "size": 14},
                                 text=[ref.label], hovertemplate="%{text}<extra></extra>"))
    fig.add_vline(x=res.memory_budget_bytes / 1e9, line_dash="dash", annotation_text="memory budget")
    fig.update_layout(title="evaluated plans: analytic step time vs memory per GPU", xaxis_title="memory per GPU (GB)",
                      yaxis_title="step time (s)", height=520)
    return fig


def breakdown_figure(outcome: PlanOutcome) -> Any:
    """Stacked step-time breakdown of the top plans (and the reference scenario)."""
    import plotly.graph_objects as go

    from costmodel.report import breakdown_term_rows

    res = outcome.result
    rows = list(res.ranking[:MAX_BREAKDOWNS])
    if res.reference.row is not None and not any(r.reference for r in rows):
        rows.append(res.reference.row)
    names = [f"#{r.rank or '?'} {'(reference) ' if r.reference else ''}{r.label}" for r in rows]
    by_row = [dict(breakdown_term_rows(r.breakdown_s)) for r in rows]
    terms = list(dict.fromkeys(k for row in by_row for k in row))
    fig = go.Figure()
    for term in terms:
        fig.add_trace(go.Bar(y=names, x=[row.get(term, 0.0) for row in by_row], name=term, orientation="h"))
    fig.update_layout(barmode="stack", title="where the step time goes (analytic, s)", xaxis_title="seconds",
                      yaxis={"autorange": "reversed"}, height=160 + 45 * len(rows))
    return fig


def plan_html(outcome: PlanOutcome) -> str:
    """A self-contained HTML page with the plan's figures."""
    parts = [scatter_figure(outcome).to_html(include_plotlyjs=True, full_html=False),
             breakdown_figure(outcome).to_html(include_plotlyjs=False, full_html=False)]
    from workloads.models import model_label

    sc = outcome.result.scenario
    title = f"muonsim plan: {model_label(sc.get('model'))} on {sc.get('gpus')} × {sc.get('system')}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><h2>{title}</h2>{''.join(parts)}</body></html>")

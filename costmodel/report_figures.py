"""Plotly pages of step reports: ``predict --html`` (DES timeline beside the breakdown) and
``compare --html`` (every variant's step-time breakdown, then per-GPU optimizer load).

Every page embeds plotly.js (it renders offline) and names its scenario and calibration in the
title. The timeline has one row per pipeline stage × stream (compute, TP/CP/EP, PP, DP, optimizer),
over the simulated steps; hovering a bar shows the operation, its times and the bytes it moves.
plotly is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.report import StepReport, breakdown_rows

if TYPE_CHECKING:
    from costmodel.optimizer.plan_types import OptimizerPlan

STREAM_ORDER = ("compute", "tp", "cp", "ep", "dp_fsdp", "pp", "dp", "optimizer")
CATEGORY_COLORS = {
    "compute": "#4c78a8", "tp": "#f58518", "cp": "#e45756", "ep": "#72b7b2", "dp_fsdp": "#b279a2", "pp": "#54a24b",
    "dp": "#eeca3b", "optimizer": "#9d755d",
}
BREAKDOWN_COLORS = {
    "compute": "#4c78a8", "pipeline bubble": "#bab0ac", "exposed comm: tp": "#f58518", "exposed comm: cp": "#e45756",
    "exposed comm: ep": "#72b7b2", "exposed comm: dp_fsdp": "#b279a2", "exposed comm: pp": "#54a24b",
    "exposed comm: dp_grad": "#eeca3b", "exposed comm: dp_param": "#ff9da6", "exposed comm: optimizer_tp": "#9c755f",
    "optimizer step": "#9d755d", "other": "#d3d3d3",
}
BREAKDOWN_FALLBACK = ("#79706e", "#d67195", "#8cd17d", "#b6992d", "#499894", "#86bcb6")


def scenario_title(report: StepReport) -> str:
    """One line naming the scenario and calibration, e.g. 'kimi-k2 on 256 × gb300-nvl72, mxfp8, tp1 pp4 ...'."""
    from workloads.models import model_label

    sc = report.scenario
    p = sc.get("parallelism", {})
    o = sc.get("optimizer", {})
    par = " ".join(f"{k}{p.get(k)}" for k in ("tp", "pp", "vpp", "cp", "ep") if p.get(k) is not None)
    return (f"{model_label(sc.get('model'))} on {sc.get('gpus')} × {sc.get('system')}, {sc.get('precision')}, {par}, "
            f"mbs {p.get('micro_batch_size')} gbs {p.get('global_batch_size')} seq {p.get('seq_length')}, "
            f"{o.get('kind', 'muon')}; calibration: {report.calibration}")


def _breakdown_colors(labels: list[str]) -> list[str]:
    spare = iter(BREAKDOWN_FALLBACK * 4)
    return [BREAKDOWN_COLORS.get(label) or next(spare) for label in labels]


def _bytes_text(size: float | None) -> str:
    if not size:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.2f} {unit}"
    return f"{size:,.0f} B"


def timeline_rows(report: StepReport) -> list[str]:
    """The timeline's row labels, top to bottom: every stage's streams in :data:`STREAM_ORDER`."""
    present = {(e.rank, e.stream) for e in report.events}
    ranks = sorted({e.rank for e in report.events}, key=lambda r: (len(r), r))
    order = {s: i for i, s in enumerate(STREAM_ORDER)}
    rows = []
    for rank in ranks:
        streams = sorted({s for r, s in present if r == rank}, key=lambda s: (order.get(s, len(order)), s))
        rows += [f"{rank} {stream}" for stream in streams]
    return rows


def add_timeline(fig: Any, report: StepReport, row: int = 1, col: int = 1) -> None:
    """Horizontal bars of every timeline event, one trace per category (hover: operation, times, bytes)."""
    import plotly.graph_objects as go

    by_cat: dict[str, list[Any]] = {}
    for ev in report.events:
        by_cat.setdefault(ev.category or ev.stream, []).append(ev)
    order = {s: i for i, s in enumerate(STREAM_ORDER)}
    for cat in sorted(by_cat, key=lambda c: (order.get(c, len(order)), c)):
        evs = by_cat[cat]
        fig.add_trace(go.Bar(
            x=[e.duration_s for e in evs], base=[e.start_s for e in evs], y=[f"{e.rank} {e.stream}" for e in evs],
            orientation="h", name=cat, marker={"color": CATEGORY_COLORS.get(cat), "line": {"width": 0}}, legendgroup=cat,
            customdata=[[e.name, _bytes_text(e.bytes), e.step] for e in evs],
            hovertemplate="%{customdata[0]}<br>step %{customdata[2]}, start %{base:.4f} s, "
                          "duration %{x:.5f} s<br>bytes per GPU: %{customdata[1]}<extra>%{y}</extra>"),
            row=row, col=col)
    rows = timeline_rows(report)
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1], row=row, col=col)
    fig.update_xaxes(title_text="time (s) over the simulated steps", row=row, col=col)
    ends: dict[int, float] = {}
    for ev in report.events:
        ends[ev.step] = max(ends.get(ev.step, 0.0), ev.start_s + ev.duration_s)
    for step, end in sorted(ends.items())[:-1]:
        fig.add_vline(x=end, line_dash="dot", line_color="#888", row=row, col=col,
                      annotation_text=f"end of step {step}", annotation_position="bottom right")


def add_breakdown(fig: Any, report: StepReport, row: int, col: int) -> None:
    """The additive breakdown of the step time as horizontal bars (seconds)."""
    import plotly.graph_objects as go

    items = [(k, v) for k, v in breakdown_rows(report) if v > 0 or not k.startswith("exposed")]
    labels = [k for k, _ in items]
    fig.add_trace(go.Bar(x=[v for _, v in items], y=labels, orientation="h", showlegend=False,
                         marker_color=_breakdown_colors(labels), name="breakdown",
                         hovertemplate="%{y}: %{x:.4f} s<extra></extra>"), row=row, col=col)
    fig.update_yaxes(autorange="reversed", row=row, col=col)
    fig.update_xaxes(title_text="seconds per step", row=row, col=col)


def predict_html(report: StepReport, timeline: StepReport | None = None) -> str:
    """The ``predict --html`` page: the DES timeline (``timeline`` or ``report`` itself when it has
    events) beside the breakdown of ``report``; the title names the scenario and calibration."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    source = timeline if timeline is not None and timeline.events else report
    has_events = bool(source.events)
    head = (f"muonsim predict: {report.step_time_s:.3f} s/step ({report.engine} engine), "
            f"{report.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {report.mfu_fraction * 100:.1f} %")
    sub = scenario_title(report)
    if not has_events:
        fig = go.Figure()
        add_breakdown(fig, report, None, None)  # type: ignore[arg-type]
        fig.update_layout(title={"text": f"{head}<br><sup>{sub}</sup>"}, height=500)
        return fig.to_html(include_plotlyjs=True, full_html=True)
    des_note = "" if source is report else f" (discrete-event engine: {source.step_time_s:.3f} s/step)"
    fig = make_subplots(rows=1, cols=2, column_widths=[0.74, 0.26], horizontal_spacing=0.12,
                        subplot_titles=[f"timeline: pipeline stage × stream{des_note}",
                                        f"step-time breakdown: {report.step_time_s:.3f} s ({report.engine})"])
    add_timeline(fig, source, 1, 1)
    add_breakdown(fig, report, 1, 2)
    rows = len(timeline_rows(source))
    fig.update_layout(barmode="overlay", height=max(520, 160 + 22 * rows), legend={"orientation": "h", "y": -0.12},
                      title={"text": f"{head}<br><sup>{sub}</sup>"})
    return fig.to_html(include_plotlyjs=True, full_html=True)


def compare_html(labels: list[str], reports: list[StepReport], plans: list[OptimizerPlan], title: str) -> str:
    """The ``compare --html`` page: each variant's step-time breakdown (stacked, seconds), then the
    per-GPU optimizer load of each variant's critical stage."""
    from costmodel.optimizer.figures import optimizer_load_figure

    fig = breakdowns_figure(labels, reports, title)
    loads = optimizer_load_figure(list(zip(labels, plans, strict=True)))
    return ("<html><head><meta charset='utf-8'><title>muonsim compare</title></head><body>"
            + fig.to_html(include_plotlyjs=True, full_html=False)
            + loads.to_html(include_plotlyjs=False, full_html=False) + "</body></html>")


def breakdowns_figure(labels: list[str], reports: list[StepReport], title: str) -> Any:
    """One stacked horizontal bar per variant: its step-time breakdown in seconds."""
    import plotly.graph_objects as go

    parts = [dict(breakdown_rows(r)) for r in reports]
    keys = [k for k in dict.fromkeys(k for p in parts for k in p) if any(p.get(k, 0.0) > 0 for p in parts)]
    fig = go.Figure()
    for key, color in zip(keys, _breakdown_colors(keys), strict=True):
        fig.add_trace(go.Bar(y=labels, x=[p.get(key, 0.0) for p in parts], name=key, orientation="h",
                             marker_color=color, hovertemplate=f"{key}: %{{x:.4f}} s<extra>%{{y}}</extra>"))
    for label, r in zip(labels, reports, strict=True):
        fig.add_annotation(x=r.step_time_s, y=label, text=f" {r.step_time_s:.3f} s", showarrow=False, xanchor="left")
    fig.update_layout(barmode="stack", title={"text": f"{title}<br><sup>step-time breakdown of every variant</sup>"},
                      xaxis_title="seconds per step", yaxis={"autorange": "reversed"},
                      height=max(360, 140 + 60 * len(labels)), legend={"orientation": "h", "y": -0.2})
    return fig

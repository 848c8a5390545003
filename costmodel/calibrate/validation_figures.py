"""Plotly figures for validation: predicted vs measured scatter and the error histogram.

plotly is imported inside the functions (it is slow to import and only needed for ``--html`` and
the notebooks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from costmodel.calibrate.validation import RunResult


def scatter_figure(rows: Sequence[RunResult], title: str = "Predicted vs measured step time") -> Any:
    """Log-log scatter of predicted vs measured step time (s), one colour per system, with y = x."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for system in sorted({r.system for r in rows}):
        members = [r for r in rows if r.system == system]
        fig.add_trace(go.Scatter(
            x=[r.measured_step_time_s for r in members], y=[r.predicted_step_time_s for r in members],
            mode="markers", name=system, text=[f"{r.run_id}<br>error {r.error_pct:+.1f} %" for r in members],
            hovertemplate="%{text}<br>measured %{x:.3f} s<br>predicted %{y:.3f} s<extra></extra>"))
    if rows:
        lo = min(min(r.measured_step_time_s, r.predicted_step_time_s) for r in rows) * 0.8
        hi = max(max(r.measured_step_time_s, r.predicted_step_time_s) for r in rows) * 1.25
        for scale, dash, label in ((1.0, "solid", "y = x"), (1.1, "dot", "±10 %"), (0.9, "dot", None)):
            fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * scale, hi * scale], mode="lines", name=label or "",
                                     showlegend=label is not None, line={"color": "grey", "dash": dash, "width": 1},
                                     hoverinfo="skip"))
    fig.update_layout(title=title, xaxis_title="measured step time (s)", yaxis_title="predicted step time (s)",
                      xaxis_type="log", yaxis_type="log", template="plotly_white", width=720, height=600)
    return fig


def histogram_figure(rows: Sequence[RunResult], title: str = "Step-time error (predicted − measured) / measured") -> Any:
    """Histogram of the signed error in percent, stacked by system."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for system in sorted({r.system for r in rows}):
        fig.add_trace(go.Histogram(x=[r.error_pct for r in rows if r.system == system], name=system,
                                   xbins={"size": 2.5}))
    fig.update_layout(barmode="stack", title=title, xaxis_title="error (%)", yaxis_title="runs",
                      template="plotly_white", width=720, height=420)
    return fig


def validation_html(rows: Sequence[RunResult], summary: str = "") -> str:
    """A self-contained HTML page with the scatter and the histogram (plotly.js embedded once)."""
    scatter = scatter_figure(rows).to_html(full_html=False, include_plotlyjs=True)
    hist = histogram_figure(rows).to_html(full_html=False, include_plotlyjs=False)
    head = f"<p>{summary}</p>" if summary else ""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>muonsim validate</title></head><body>"
            f"<h2>muonsim validate</h2>{head}{scatter}{hist}</body></html>")

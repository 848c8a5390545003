"""The sweep's HTML summary (plotly, embedded offline): step time, throughput and memory vs GPUs.

One line per series: the points that differ only in their GPU count, named by the other swept
settings (model, optimizer, ...); plan points plot their best plan. A table counts the points by
status and lists the reasons of those that did not run.
"""

from __future__ import annotations

import html
from typing import Any

MAX_REASONS = 50
SERIES_ORDER = ("model", "optimizer", "mode")  # named first; then the other swept keys in file order


def _series_keys(axes: list[str]) -> list[str]:
    keys = [k for k in axes if k != "gpus"]
    return [k for k in SERIES_ORDER if k in keys] + [k for k in keys if k not in SERIES_ORDER]


def _series(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("step_time_s") is None:
            continue
        name = " · ".join(f"{row.get(k)}" if k in ("model", "optimizer", "mode") else f"{k}={row.get(k)}"
                          for k in keys) or "all points"
        out.setdefault(name, []).append(row)
    return {name: sorted(pts, key=lambda r: (r.get("gpus") or 0, r["point"])) for name, pts in out.items()}


def _line_figure(series: dict[str, list[dict[str, Any]]], column: str, scale: float, title: str, y_title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, pts in series.items():
        pts = [r for r in pts if r.get(column) is not None]
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[r["gpus"] for r in pts], y=[r[column] * scale for r in pts], mode="lines+markers", name=name,
            marker={"symbol": ["x-open" if r.get("fits_in_memory") is False else "circle" for r in pts], "size": 8},
            text=[(r.get("best_label") or f"point {r['point']}")
                  + (" (does not fit in memory)" if r.get("fits_in_memory") is False else "") for r in pts],
            hovertemplate="%{text}<br>%{x} GPUs: %{y:.4g}<extra>" + html.escape(name) + "</extra>"))
    gpus = sorted({r["gpus"] for pts in series.values() for r in pts})
    fig.update_layout(title=f"{title} (x: does not fit in memory)", xaxis_title="GPUs", yaxis_title=y_title,
                      height=480, legend={"font": {"size": 10}})
    fig.update_xaxes(type="log", tickvals=gpus)
    return fig


def _status_table(rows: list[dict[str, Any]], total: int) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("status"))] = counts.get(str(row.get("status")), 0) + 1
    missing = total - len(rows)
    head = "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in sorted(counts.items()))
    if missing:
        head += f"<tr><td>not finished</td><td>{missing}</td></tr>"
    failed = [r for r in rows if r.get("status") != "ok"][:MAX_REASONS]
    reasons = "".join(f"<tr><td>{r['point']}</td><td>{html.escape(str(r.get('status')))}</td>"
                      f"<td>{html.escape(str(r.get('message') or ''))}</td></tr>" for r in failed)
    out = f"<h3>points by status</h3><table border='1' cellpadding='4'>{head}</table>"
    if reasons:
        out += ("<h3>points that did not give a result</h3><table border='1' cellpadding='4'>"
                f"<tr><th>point</th><th>status</th><th>reason</th></tr>{reasons}</table>")
    return out


def sweep_html(rows: list[dict[str, Any]], axes: list[str], total: int, title: str) -> str:
    """A self-contained HTML page summarising a sweep's rows (``total``: points in the grid)."""
    series = _series(rows, _series_keys(axes))
    figures = [
        _line_figure(series, "step_time_s", 1.0, "step time vs GPUs", "step time (s)"),
        _line_figure(series, "tokens_per_s_per_gpu", 1.0, "throughput per GPU vs GPUs", "tokens/s per GPU"),
        _line_figure(series, "memory_per_gpu_bytes", 1e-9, "memory per GPU (most loaded) vs GPUs", "GB"),
    ]
    parts = [fig.to_html(include_plotlyjs=(i == 0), full_html=False) for i, fig in enumerate(figures)]
    safe = html.escape(title)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{safe}</title></head><body>"
            f"<h2>{safe}</h2><p>{len(rows)} of {total} points</p>{''.join(parts)}{_status_table(rows, total)}"
            "</body></html>")

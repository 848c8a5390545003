"""Exporters of a :class:`StepReport`: rich table, Perfetto/Chrome trace JSON, plotly HTML.

The trace follows the Chrome Trace Event format (loadable in https://ui.perfetto.dev and
chrome://tracing): one process per representative rank, one thread per stream, ``ph: "X"``
complete events with ``ts`` and ``dur`` in microseconds, ``ph: "M"`` metadata naming them.
plotly is imported lazily (only for HTML).
"""

from __future__ import annotations

import json
from typing import Any

from costmodel.report import OptimizerKernelsOut, StepReport, breakdown_rows

__all__ = ["breakdown_rows", "optimizer_kernels_text", "render_table", "to_chrome_trace", "to_html", "trace_json"]

STREAM_ORDER = ("compute", "tp", "cp", "ep", "pp", "dp", "optimizer")


def optimizer_kernels_text(k: OptimizerKernelsOut) -> str:
    """One line on the optimizer step's kernels on the critical GPU: launches, GPU and host time."""
    per = f", {k.launches_per_muon_tensor:.0f} per Muon tensor x {k.muon_tensors}" if k.launches_per_muon_tensor else ""
    bound = "launch-bound" if k.host_idle_s > 0 else "GPU-bound"
    return (f"{k.launches:,.0f} launches{per}; GPU {k.gpu_s * 1e3:.1f} ms, host issue {k.issue_s * 1e3:.1f} ms "
            f"({bound})")


def render_table(report: StepReport, layout: str | None = None) -> Any:
    """A rich renderable: headline figures and the breakdown of the step time (``layout``: where the
    scenario's layout came from, one line)."""
    from rich.console import Group
    from rich.table import Table

    head = Table(show_header=False, title=f"muonsim predict ({report.engine} engine)")
    from workloads.models import model_label

    sc = report.scenario
    par = sc.get("parallelism", {})
    head.add_row("scenario", f"{model_label(sc.get('model'))} on {sc.get('gpus')} x {sc.get('system')}, {sc.get('precision')}, "
                 f"tp {par.get('tp')} pp {par.get('pp')} vpp {par.get('vpp')} cp {par.get('cp')} ep {par.get('ep')}, "
                 f"mbs {par.get('micro_batch_size')} gbs {par.get('global_batch_size')} seq {par.get('seq_length')}, "
                 f"{sc.get('optimizer', {}).get('kind')}")
    opt = report.optimizer
    if opt is not None and opt.hypothetical:
        reason = next((n for n in opt.notes if n.startswith("hypothetical")), "hypothetical")
        head.add_row("[yellow]hypothetical[/yellow]", reason.removeprefix("hypothetical: "))
    head.add_row("step time", f"{report.step_time_s:.3f} s")
    head.add_row("tokens/s/GPU", f"{report.tokens_per_s_per_gpu:,.0f}")
    head.add_row("model TFLOP/s/GPU", f"{report.model_tflops_per_gpu:,.0f}  (MFU {report.mfu_fraction * 100:.1f} %)")
    mem = report.memory
    if mem is not None:
        head.add_row("memory/GPU", f"{mem.total_bytes / 1e9:,.1f} GB of {mem.capacity_bytes / 1e9:,.0f} GB"
                     + ("" if mem.fits else "  (does NOT fit)"))
    if report.optimizer is not None and report.optimizer.kernels is not None:
        head.add_row("optimizer kernels", optimizer_kernels_text(report.optimizer.kernels))
    head.add_row("calibration", report.calibration)
    if layout:
        head.add_row("layout from", layout.removeprefix("layout: "))
    t = Table(title="where the step time goes")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    total = report.step_time_s
    for label, v in breakdown_rows(report):
        if v == 0 and label.startswith("exposed"):
            continue
        t.add_row(label, f"{v:.4f}", f"{100 * v / total:.1f} %" if total > 0 else "-")
    parts: list[Any] = [head, t]
    if report.warnings:
        parts.append("\n".join(f"[yellow]warning:[/yellow] {w}" for w in report.warnings))
    return Group(*parts)


def to_chrome_trace(report: StepReport) -> dict[str, Any]:
    """The timeline as Chrome Trace Event JSON (``{"traceEvents": [...]}``, times in µs)."""
    ranks: dict[str, int] = {}
    streams: dict[tuple[str, str], int] = {}
    events: list[dict[str, Any]] = []
    for ev in sorted(report.events, key=lambda e: (e.rank, e.start_s)):
        pid = ranks.setdefault(ev.rank, len(ranks))
        key = (ev.rank, ev.stream)
        if key not in streams:
            order = STREAM_ORDER.index(ev.stream) if ev.stream in STREAM_ORDER else len(STREAM_ORDER)
            streams[key] = order
        events.append({"name": ev.name, "cat": ev.category or ev.stream, "ph": "X", "pid": pid, "tid": streams[key],
                       "ts": ev.start_s * 1e6, "dur": max(ev.duration_s * 1e6, 0.0), "args": {"step": ev.step}})
    meta: list[dict[str, Any]] = []
    for rank, pid in ranks.items():
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": rank}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for (rank, stream), tid in streams.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": ranks[rank], "tid": tid, "args": {"name": stream}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"engine": report.engine, "step_time_s": report.step_time_s}}


def trace_json(report: StepReport) -> str:
    """The Chrome trace as a JSON string."""
    return json.dumps(to_chrome_trace(report))


def to_html(report: StepReport, timeline: StepReport | None = None) -> str:
    """A self-contained plotly HTML page: the DES timeline beside the breakdown (see
    :func:`costmodel.report_figures.predict_html`; ``timeline``: a DES report of the same scenario
    when ``report`` has no events)."""
    from costmodel.report_figures import predict_html

    return predict_html(report, timeline)

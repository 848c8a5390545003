"""Terminal rendering of ``muonsim compare``: narrow (fits 80 columns) by default, ``--wide`` as before.

Narrow: the variants are lettered (A is the baseline) and listed above the table; each column is
one variant with compact cells (units in the row labels), as many variants per table as the
terminal fits, further variants stacked in further tables. Every variant's detail (its full
report, breakdown deltas) is in ``--json``; ``--html`` draws the step-time breakdowns.
"""

from __future__ import annotations

import string
from typing import Any

from cli.terminal import no_negative_zero

LABEL_WIDTH = 22  # row-label column
CELL_WIDTH = 12  # one variant column, padding included
SHORT_DISTRIBUTION = {"element_wise": "elem", "layer_wise": "layer", "replicated": "repl"}


def breakdown(report: Any) -> dict[str, float]:
    """(label -> seconds) of a report's additive breakdown."""
    from costmodel.exporters import breakdown_rows

    return dict(breakdown_rows(report))


def breakdown_delta(parts: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``parts - base`` of two breakdowns in the report's JSON form (seconds; ``exposed_comm`` nested by
    kind), with the same keys as the reports' ``breakdown_s``."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys([*base, *parts]):
        a, b = parts.get(key), base.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            out[key] = breakdown_delta(a or {}, b or {})
        else:
            out[key] = float(a or 0.0) - float(b or 0.0)
    return out


def labelled_delta(delta: dict[str, Any]) -> dict[str, float]:
    """(row label -> seconds) of a ``delta_breakdown_s``, labelled as the breakdown rows are."""
    from costmodel.report import breakdown_label

    out: dict[str, float] = {}
    for key, value in delta.items():
        if isinstance(value, dict):
            out |= {breakdown_label(key, kind): v for kind, v in value.items()}
        else:
            out[breakdown_label(key)] = value
    return out


def where_it_comes_from(entry: dict[str, Any], top: int = 4) -> str:
    """One line naming the largest breakdown deltas of a variant, e.g. 'optimizer step +210.0 ms'."""
    deltas = sorted(labelled_delta(entry["delta_breakdown_s"]).items(), key=lambda kv: -abs(kv[1]))
    parts = [f"{k} {v * 1e3:+.1f} ms" for k, v in deltas[:top] if abs(v) >= 5e-5]
    return ", ".join(parts) if parts else "no measurable difference"


def labelled_notes(labels: list[str], reports: list[Any]) -> list[str]:
    """The optimizer notes of all variants; a note that not every variant has names its variants."""
    return _labelled(labels, [set(r.optimizer.notes) if r.optimizer else set() for r in reports])


def labelled_warnings(labels: list[str], reports: list[Any]) -> list[str]:
    """The warnings of all variants; a warning that not every variant has names its variants."""
    return _labelled(labels, [set(r.warnings) for r in reports])


def _labelled(labels: list[str], per: list[set[str]]) -> list[str]:
    out = []
    for note in sorted(set().union(*per)):
        having = [label for label, notes in zip(labels, per, strict=True) if note in notes]
        out.append(note if len(having) == len(per) else f"({', '.join(having)}) {note}")
    return out


def memory_cell(report: Any) -> str:
    mem = report.memory
    if mem is None:
        return "-" if not report.memory_per_gpu_bytes else f"{report.memory_per_gpu_bytes / 1e9:,.1f} GB"
    return f"{mem.total_bytes / 1e9:,.1f} GB" + ("" if mem.fits else " (does NOT fit)")


def letters(n: int) -> list[str]:
    """A, B, ..., Z, AA, AB, ... for ``n`` variants."""
    abc = string.ascii_uppercase
    return [abc[i] if i < 26 else abc[i // 26 - 1] + abc[i % 26] for i in range(n)]


def _footer(data: dict[str, Any], reports: list[Any], names: list[str]) -> list[Any]:
    variants = data["variants"]
    lines: list[Any] = [f"[bold]{name}[/bold] vs {names[0]}: {v['delta_step_time_pct']:+.2f} %; {where_it_comes_from(v)}"
                        for name, v in zip(names[1:], variants[1:], strict=True)]
    lines += [f"[dim]note:[/dim] {n}" for n in labelled_notes([v["label"] for v in variants], reports)]
    if any(r.optimizer and r.optimizer.hypothetical for r in reports):
        lines.append("[dim]note:[/dim] * hypothetical (layout, load balance) pair: Megatron-Core does not have it")
    lines += [f"[yellow]warning:[/yellow] {w}" for w in labelled_warnings([v["label"] for v in variants], reports)]
    return lines


def _rows(data: dict[str, Any], reports: list[Any]) -> list[tuple[str, list[str]] | None]:
    """(row label, one cell per variant); None separates sections."""
    variants = data["variants"]
    rows: list[tuple[str, list[str]] | None] = [
        ("step time s", [f"{v['step_time_s']:.3f}" for v in variants]),
        ("vs baseline", ["-" if i == 0 else f"{v['delta_step_time_pct']:+.2f} %" for i, v in enumerate(variants)]),
        ("tokens/s/GPU", [f"{r.tokens_per_s_per_gpu:,.0f}" for r in reports]),
        ("MFU %", [f"{r.mfu_fraction * 100:.1f}" for r in reports]),
        None,
    ]
    parts = [breakdown(r) for r in reports]
    for key in dict.fromkeys(k for p in parts for k in p):
        if all(abs(p.get(key, 0.0)) < 1e-9 for p in parts):
            continue
        label = key.replace("exposed comm: ", "exposed ").replace("pipeline bubble", "bubble")
        rows.append((f"{label} ms", [f"{p.get(key, 0.0) * 1e3:,.1f}" for p in parts]))
    rows.append(None)
    opt = [r.optimizer for r in reports]
    rows += [
        ("optimizer", [f"{o.kind} {SHORT_DISTRIBUTION.get(o.distribution, o.distribution)}" if o else "-" for o in opt]),
        ("layer-wise layout", [o.layout or "-" if o else "-" for o in opt]),
        ("tp mode", [o.tp_mode or "-" if o else "-" for o in opt]),
        ("load balance", [(o.load_balance or "-") + ("*" if o.hypothetical else "") if o else "-" for o in opt]),
        ("NS TFLOP/GPU max", [f"{o.newton_schulz_flops.get('per_rank_max', 0.0) / 1e12:,.1f}" if o else "-" for o in opt]),
        ("optimizer/GPU max ms", [f"{o.per_rank_compute_s.max * 1e3:,.1f}" if o else "-" for o in opt]),
        ("imbalance", [f"{o.imbalance_ratio:.3f}" if o else "-" for o in opt]),
        ("imbalance lost ms", [f"{o.imbalance_lost_s * 1e3:,.1f}" if o else "-" for o in opt]),
        ("opt. exposed ms", [f"{o.exposed_s * 1e3:,.1f}" if o else "-" for o in opt]),
        ("opt. hidden ms", [f"{o.hidden_s * 1e3:,.1f}" if o else "-" for o in opt]),
        ("opt. kernels (crit. GPU)", [f"{o.kernels.launches:,.0f}" if o and o.kernels else "-" for o in opt]),
        ("kernels per Muon tensor", [f"{o.kernels.launches_per_muon_tensor:.0f}" if o and o.kernels and
                                     o.kernels.launches_per_muon_tensor else "-" for o in opt]),
        ("opt. GPU ms", [f"{o.kernels.gpu_s * 1e3:,.1f}" if o and o.kernels else "-" for o in opt]),
        ("opt. host issue ms", [f"{o.kernels.issue_s * 1e3:,.1f}" if o and o.kernels else "-" for o in opt]),
        ("padding %", [f"{o.padding_overhead_pct:.1f}" if o and o.padding_overhead_pct is not None else "-" for o in opt]),
        None,
        ("memory/GPU GB", [f"{r.memory.total_bytes / 1e9:,.1f}" if r.memory else "-" for r in reports]),
        ("fits in memory", [("yes" if r.memory.fits else "NO") if r.memory else "-" for r in reports]),
    ]
    return rows


def render_narrow(data: dict[str, Any], reports: list[Any], width: int) -> Any:
    """The comparison in ``width`` columns: lettered variants, stacked tables when they do not fit."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    variants = data["variants"]
    names = letters(len(variants))
    per_table = max(1, (width - LABEL_WIDTH) // CELL_WIDTH)
    parts: list[Any] = [f"[bold]muonsim compare[/bold] ({reports[0].engine} engine); baseline {names[0]}"]
    parts += [f"  [bold]{n}[/bold]  {v['label']}" for n, v in zip(names, variants, strict=True)]
    rows = _rows(data, reports)
    for start in range(0, len(variants), per_table):
        cols = range(start, min(start + per_table, len(variants)))
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        t.add_column("", no_wrap=True)
        for i in cols:
            t.add_column(names[i], justify="right", no_wrap=True)
        for row in rows:
            if row is None:
                t.add_section()
            else:
                t.add_row(row[0], *(no_negative_zero(row[1][i]) for i in cols))
        parts.append(t)
    parts += _footer(data, reports, names)
    return Group(*parts)


def render_wide(data: dict[str, Any], reports: list[Any]) -> Any:
    """The comparison as one wide table, one column per variant (``--wide``)."""
    from rich.console import Group
    from rich.table import Table

    variants = data["variants"]
    t = Table(title=f"muonsim compare ({reports[0].engine} engine), baseline: {data['baseline']}")
    t.add_column("")
    for v in variants:
        t.add_column(v["label"], justify="right")

    def row(name: str, cells: list[str]) -> None:
        t.add_row(name, *(no_negative_zero(c) for c in cells))

    row("step time", [f"{v['step_time_s']:.4f} s" for v in variants])
    row("Δ vs baseline", ["-" if i == 0 else f"{v['delta_step_time_s'] * 1e3:+.1f} ms ({v['delta_step_time_pct']:+.2f} %)"
                          for i, v in enumerate(variants)])
    row("tokens/s/GPU", [f"{r.tokens_per_s_per_gpu:,.0f}" for r in reports])
    row("MFU", [f"{r.mfu_fraction * 100:.1f} %" for r in reports])
    label_deltas = [labelled_delta(v["delta_breakdown_s"]) for v in variants]
    keys = list(dict.fromkeys(k for d in label_deltas for k in d))
    parts = [breakdown(r) for r in reports]
    t.add_section()
    for k in keys:
        if all(abs(p.get(k, 0.0)) < 1e-9 for p in parts):
            continue
        cells = []
        for i, p in enumerate(parts):
            d = label_deltas[i].get(k, 0.0)
            cells.append(f"{p.get(k, 0.0) * 1e3:.1f} ms" + ("" if i == 0 or abs(d) < 5e-5 else f" ({d * 1e3:+.1f})"))
        row(k, cells)
    t.add_section()
    opt = [r.optimizer for r in reports]
    row("optimizer", [f"{o.kind} {o.distribution}" + (f" {o.layout}" if o.layout else "") if o else "-" for o in opt])
    row("tp mode / balance", [f"{o.tp_mode or '-'} / {o.load_balance or '-'}" + (" (hypothetical)" if o.hypothetical else "")
                              if o else "-" for o in opt])
    row("NS TFLOP/GPU (max)", [f"{o.newton_schulz_flops.get('per_rank_max', 0.0) / 1e12:,.1f}" if o else "-" for o in opt])
    row("optimizer/GPU max", [f"{o.per_rank_compute_s.max * 1e3:.1f} ms" if o else "-" for o in opt])
    row("imbalance (lost)", [f"{o.imbalance_ratio:.3f} ({o.imbalance_lost_s * 1e3:.1f} ms)" if o else "-" for o in opt])
    row("opt. exposed / hidden", [f"{o.exposed_s * 1e3:.1f} / {o.hidden_s * 1e3:.1f} ms" if o else "-" for o in opt])
    row("opt. kernels (crit. GPU)", [f"{o.kernels.launches:,.0f}" if o and o.kernels else "-" for o in opt])
    row("  per Muon tensor", [f"{o.kernels.launches_per_muon_tensor:.0f} x {o.kernels.muon_tensors}"
                              if o and o.kernels and o.kernels.launches_per_muon_tensor else "-" for o in opt])
    row("  GPU / host issue", [f"{o.kernels.gpu_s * 1e3:.1f} / {o.kernels.issue_s * 1e3:.1f} ms" if o and o.kernels
                               else "-" for o in opt])
    row("padding overhead", [f"{o.padding_overhead_pct:.1f} %" if o and o.padding_overhead_pct is not None else "-"
                             for o in opt])
    t.add_section()
    row("memory/GPU", [memory_cell(r) for r in reports])
    labels = [v["label"] for v in variants]
    lines: list[Any] = [f"[bold]{v['label']}[/bold] vs baseline: {v['delta_step_time_pct']:+.2f} %; {where_it_comes_from(v)}"
                        for v in variants[1:]]
    lines += [f"[dim]note:[/dim] {n}" for n in labelled_notes(labels, reports)]
    lines += [f"[yellow]warning:[/yellow] {w}" for w in labelled_warnings(labels, reports)]
    return Group(t, *lines)

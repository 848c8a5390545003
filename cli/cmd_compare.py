"""``muonsim compare``: two or more scenario variants side by side.

Any scenario flag may hold comma-separated values (``--optimizer adamw,muon``, ``--tp-mode
duplicated,distributed,blockwise``, ``--load-balance none,lpt``, ``--hide-param-gather off,on``);
the variants are the cartesian product, in the order given, and the first is the baseline. Each
variant is predicted with :func:`costmodel.engine.predict`; the table shows step time, its
difference to the baseline, where the difference comes from (breakdown deltas), the optimizer
section and memory. ``--json`` prints the same; ``--html`` writes a plotly figure of per-GPU
optimizer load. Every variant is resolved before anything runs, and files are written only after
every prediction succeeded.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import (
    SCENARIO_FLAGS,
    CalibrationOpt,
    CliError,
    EngineOpt,
    JsonOpt,
    ReleaseOpt,
    ScenarioFileArg,
    check_engine,
    check_output_paths,
    check_release,
    print_json,
    resolve_release_scenario,
    user_errors,
    with_scenario_flags,
)

MAX_VARIANTS = 24
_FLAG_OF = {key: "--" + flag.replace("_", "-") for flag, (key, _, _) in SCENARIO_FLAGS.items()}


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command."""
    app.command("compare")(compare)


def expand_variants(flags: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """(label, flags) of every variant: the cartesian product of comma-separated flag values."""
    options: dict[str, list[str]] = {}
    for key, raw in flags.items():
        values = [v.strip() for v in str(raw).split(",")]
        if any(not v for v in values):
            raise CliError(f"{_FLAG_OF.get(key, key)} has an empty value in '{raw}'")
        options[key] = values
    varying = [k for k, vs in options.items() if len(vs) > 1]
    if not varying:
        raise CliError("compare needs at least one scenario flag with comma-separated values, "
                       "e.g. --optimizer adamw,muon or --tp-mode duplicated,distributed,blockwise")
    count = 1
    for k in varying:
        count *= len(options[k])
    if count > MAX_VARIANTS:
        raise CliError(f"{count} variants requested; compare runs at most {MAX_VARIANTS}")
    fixed = {k: vs[0] for k, vs in options.items() if len(vs) == 1}
    out = []
    for combo in itertools.product(*(options[k] for k in varying)):
        chosen = dict(zip(varying, combo, strict=True))
        label = " ".join(f"{_FLAG_OF.get(k, k).lstrip('-')}={v}" for k, v in chosen.items())
        out.append((label, fixed | chosen))
    return out


def _breakdown(report: Any) -> dict[str, float]:
    from costmodel.exporters import breakdown_rows

    return dict(breakdown_rows(report))


def comparison_data(labels: list[str], reports: list[Any]) -> dict[str, Any]:
    """The ``--json`` document: every variant's report and its deltas to the first."""
    base = reports[0]
    base_rows = _breakdown(base)
    variants = []
    for label, rep in zip(labels, reports, strict=True):
        rows = _breakdown(rep)
        keys = list(dict.fromkeys([*base_rows, *rows]))
        delta = {k: rows.get(k, 0.0) - base_rows.get(k, 0.0) for k in keys}
        variants.append({
            "label": label,
            "step_time_s": rep.step_time_s,
            "delta_step_time_s": rep.step_time_s - base.step_time_s,
            "delta_step_time_pct": 100.0 * (rep.step_time_s / base.step_time_s - 1.0),
            "delta_breakdown_s": delta,
            "delta_memory_per_gpu_bytes": rep.memory_per_gpu_bytes - base.memory_per_gpu_bytes,
            "report": rep.to_json_dict(),
        })
    return {"baseline": labels[0], "variants": variants}


def where_it_comes_from(entry: dict[str, Any], top: int = 4) -> str:
    """One line naming the largest breakdown deltas of a variant, e.g. 'optimizer step +0.210 s'."""
    deltas = sorted(entry["delta_breakdown_s"].items(), key=lambda kv: -abs(kv[1]))
    parts = [f"{k} {v * 1e3:+.1f} ms" for k, v in deltas[:top] if abs(v) >= 5e-5]
    return ", ".join(parts) if parts else "no measurable difference"


def render(data: dict[str, Any], reports: list[Any]) -> Any:
    """A rich renderable: one column per variant."""
    from rich.console import Group
    from rich.table import Table

    variants = data["variants"]
    t = Table(title=f"muonsim compare ({reports[0].engine} engine), baseline: {data['baseline']}")
    t.add_column("")
    for v in variants:
        t.add_column(v["label"], justify="right")

    def row(name: str, cells: list[str]) -> None:
        t.add_row(name, *cells)

    row("step time", [f"{v['step_time_s']:.4f} s" for v in variants])
    row("Δ vs baseline", ["-" if i == 0 else f"{v['delta_step_time_s'] * 1e3:+.1f} ms ({v['delta_step_time_pct']:+.2f} %)"
                          for i, v in enumerate(variants)])
    row("tokens/s/GPU", [f"{r.tokens_per_s_per_gpu:,.0f}" for r in reports])
    row("MFU", [f"{r.mfu * 100:.1f} %" for r in reports])
    keys = list(dict.fromkeys(k for v in variants for k in v["delta_breakdown_s"]))
    rows = [_breakdown(r) for r in reports]
    t.add_section()
    for k in keys:
        if all(abs(r.get(k, 0.0)) < 1e-9 for r in rows):
            continue
        cells = []
        for i, r in enumerate(rows):
            d = variants[i]["delta_breakdown_s"].get(k, 0.0)
            cells.append(f"{r.get(k, 0.0) * 1e3:.1f} ms" + ("" if i == 0 or abs(d) < 5e-5 else f" ({d * 1e3:+.1f})"))
        row(k, cells)
    t.add_section()
    opt = [r.optimizer for r in reports]
    row("optimizer", [f"{o.kind} {o.distribution}" + (f" {o.layout}" if o.layout else "") if o else "-" for o in opt])
    row("tp mode / balance", [f"{o.tp_mode or '-'} / {o.load_balance or '-'}" if o else "-" for o in opt])
    row("NS TFLOP/GPU (max)", [f"{o.newton_schulz_flops.get('per_rank_max', 0.0) / 1e12:,.1f}" if o else "-" for o in opt])
    row("optimizer/GPU max", [f"{o.per_rank_compute_s.max * 1e3:.1f} ms" if o else "-" for o in opt])
    row("imbalance (lost)", [f"{o.imbalance:.3f} ({o.imbalance_lost_s * 1e3:.1f} ms)" if o else "-" for o in opt])
    row("opt. exposed / hidden", [f"{o.exposed_s * 1e3:.1f} / {o.hidden_s * 1e3:.1f} ms" if o else "-" for o in opt])
    row("opt. kernels (crit. GPU)", [f"{o.kernels.launches:,.0f}" if o and o.kernels else "-" for o in opt])
    row("  per Muon tensor", [f"{o.kernels.launches_per_muon_tensor:.0f} x {o.kernels.muon_tensors}"
                              if o and o.kernels and o.kernels.launches_per_muon_tensor else "-" for o in opt])
    row("  GPU / host issue", [f"{o.kernels.gpu_s * 1e3:.1f} / {o.kernels.issue_s * 1e3:.1f} ms" if o and o.kernels
                               else "-" for o in opt])
    row("padding overhead", [f"{o.padding_overhead_pct:.1f} %" if o and o.padding_overhead_pct is not None else "-"
                             for o in opt])
    t.add_section()
    row("memory/GPU", [_memory_cell(r) for r in reports])
    lines = [f"[bold]{v['label']}[/bold] vs baseline: {v['delta_step_time_pct']:+.2f} %; {where_it_comes_from(v)}"
             for v in variants[1:]]
    warnings = sorted({w for r in reports for w in r.warnings})
    notes = labelled_notes([v["label"] for v in variants], reports)
    parts: list[Any] = [t, *lines]
    parts += [f"[dim]note:[/dim] {n}" for n in notes]
    parts += [f"[yellow]warning:[/yellow] {w}" for w in warnings]
    return Group(*parts)


def labelled_notes(labels: list[str], reports: list[Any]) -> list[str]:
    """The optimizer notes of all variants; a note that not every variant has names its variants."""
    per = [set(r.optimizer.notes) if r.optimizer else set() for r in reports]
    out = []
    for note in sorted(set().union(*per)):
        having = [label for label, notes in zip(labels, per, strict=True) if note in notes]
        out.append(note if len(having) == len(per) else f"({', '.join(having)}) {note}")
    return out


def _memory_cell(report: Any) -> str:
    mem = report.memory
    if mem is None:
        return "-" if not report.memory_per_gpu_bytes else f"{report.memory_per_gpu_bytes / 1e9:,.1f} GB"
    return f"{mem.total_bytes / 1e9:,.1f} GB" + ("" if mem.fits else " (does NOT fit)")


@user_errors
@with_scenario_flags
def compare(
    scenario_file: ScenarioFileArg = None,
    engine: EngineOpt = "analytic",
    json_out: JsonOpt = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write a plotly figure of per-GPU optimizer load")] = None,
    calibration: CalibrationOpt = None,
    release: ReleaseOpt = None,
    *, scenario_flags: dict[str, str],
) -> None:
    """Compare scenario variants side by side (any scenario flag may hold comma-separated values)."""
    from cli.common import load_calibration, write_text_atomically
    from topologies.inputs import UserInputError

    check_engine(engine)
    check_output_paths(html)
    variants = expand_variants(scenario_flags)
    check_release(None, release, "")
    scenarios = []
    for label, flags in variants:
        try:
            scenarios.append(resolve_release_scenario(scenario_file, flags, release)[0])
        except UserInputError as err:
            raise UserInputError(f"variant {label}: {err}") from None
    profile = load_calibration(calibration)
    from costmodel.engine import predict

    labels = [label for label, _ in variants]
    reports = [predict(sc, engine, profile, release) for sc in scenarios]  # type: ignore[arg-type]
    data = comparison_data(labels, reports)
    if html is not None:
        from costmodel.optimizer.figures import optimizer_load_html
        from costmodel.optimizer.plan import build_optimizer_plan

        applied = [profile.apply(sc) if profile is not None else sc for sc in scenarios]
        write_text_atomically(html, optimizer_load_html([(lb, build_optimizer_plan(sc)) for lb, sc in zip(labels, applied, strict=True)]))
    if json_out:
        print_json(data)
        return
    from rich.console import Console

    console = Console(width=max(120, 28 + 30 * len(reports)))
    console.print(render(data, reports))
    if html is not None:
        console.print(f"wrote {html}")

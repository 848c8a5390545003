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
    WideOpt,
    check_engine,
    check_output_paths,
    check_release,
    print_json,
    resolve_release_scenario,
    user_errors,
    with_release_note,
    with_scenario_flags,
)
from cli.compare_render import breakdown_delta
from cli.memory_advice import with_memory_advice

MAX_VARIANTS = 24
_FLAG_OF = {key: "--" + flag.replace("_", "-") for flag, (key, _, _) in SCENARIO_FLAGS.items()}


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command."""
    app.command("compare")(compare)


def expand_variants(flags: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """(label, flags) of every variant: the cartesian product of comma-separated flag values."""
    from topologies.inputs import first_repeat

    options: dict[str, list[str]] = {}
    for key, raw in flags.items():
        values = [v.strip() for v in str(raw).split(",")]
        if any(not v for v in values):
            raise CliError(f"{_FLAG_OF.get(key, key)} has an empty value in '{raw}'")
        repeated = first_repeat([str(int(v)) if v.isdigit() else v for v in values])  # 2 and 02 are one value
        if repeated is not None:  # two identical variants compare nothing
            raise CliError(f"{_FLAG_OF.get(key, key)} gives '{repeated}' twice in '{raw}'; give each value once")
        options[key] = values
    varying = [k for k, vs in options.items() if len(vs) > 1]
    if not varying:
        raise CliError("compare needs at least one scenario flag with comma-separated values, "
                       "e.g. --optimizer adamw,muon or --tp-mode duplicated,distributed,blockwise")
    count = 1
    for k in varying:
        count *= len(options[k])
    if count > MAX_VARIANTS:
        product = " × ".join(f"{_FLAG_OF.get(k, k)} {len(options[k])}" for k in varying)
        raise CliError(f"{count} variants requested ({product} values); compare runs at most {MAX_VARIANTS}: "
                       "give fewer values, or write the grid for muonsim sweep")
    fixed = {k: vs[0] for k, vs in options.items() if len(vs) == 1}
    out = []
    for combo in itertools.product(*(options[k] for k in varying)):
        chosen = dict(zip(varying, combo, strict=True))
        label = " ".join(f"{_FLAG_OF.get(k, k).lstrip('-')}={v}" for k, v in chosen.items())
        out.append((label, fixed | chosen))
    return out


def comparison_data(labels: list[str], reports: list[Any]) -> dict[str, Any]:
    """The ``--json`` document: every variant's report and its deltas to the first."""
    base = reports[0]
    base_parts = base.breakdown_s.model_dump()
    variants = []
    for label, rep in zip(labels, reports, strict=True):
        delta = breakdown_delta(rep.breakdown_s.model_dump(), base_parts)
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


@user_errors
@with_scenario_flags
def compare(
    scenario_file: ScenarioFileArg = None,
    engine: EngineOpt = "analytic",
    json_out: JsonOpt = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write plotly figures: each variant's step-time breakdown and per-GPU optimizer load")] = None,
    calibration: CalibrationOpt = None,
    release: ReleaseOpt = None,
    wide: WideOpt = False,
    *, scenario_flags: dict[str, str],
) -> None:
    """Compare scenario variants side by side (any scenario flag may hold comma-separated values)."""
    from cli.common import load_calibration, write_text_atomically
    from topologies.inputs import UserInputError

    check_engine(engine)
    check_output_paths(html)
    variants = expand_variants(scenario_flags)
    check_release(None, release, "")
    scenarios, layouts, choices = [], [], []
    for label, flags in variants:
        try:
            sc, layered, chosen = resolve_release_scenario(scenario_file, flags, release)
        except UserInputError as err:
            raise UserInputError(f"variant {label}: {err}") from None
        scenarios.append(sc)
        choices.append(chosen)
        layouts.append(layered.summary())
    profile = load_calibration(calibration)
    from costmodel.engine import predict

    labels = [label for label, _ in variants]
    reports = [with_memory_advice(with_release_note(predict(sc, engine, profile, release),  # type: ignore[arg-type]
                                                    release, chosen, sc))
               for sc, chosen in zip(scenarios, choices, strict=True)]
    data = comparison_data(labels, reports)
    for entry, layout, chosen in zip(data["variants"], layouts, choices, strict=True):
        entry["layout"] = layout
        entry["recipe_settings"] = chosen.to_json_dict() if chosen is not None else None
    if html is not None:
        from costmodel.optimizer.plan import build_optimizer_plan
        from costmodel.report_figures import compare_html

        applied = [profile.apply(sc) if profile is not None else sc for sc in scenarios]
        plans = [build_optimizer_plan(sc) for sc in applied]
        write_text_atomically(html, compare_html(labels, reports, plans, title=_title(data, reports)))
    if json_out:
        print_json(data)
        return
    from cli.compare_render import render_narrow, render_wide
    from cli.terminal import console as make_console

    console = make_console(wide=wide)
    if wide:
        console.width = max(console.width, 28 + 30 * len(reports))
    console.print(render_wide(data, reports) if wide else render_narrow(data, reports, console.width))
    for layout in dict.fromkeys(layouts):
        console.print(f"[dim]{layout}[/dim]", highlight=False)
    for source in dict.fromkeys(c.choice.source for c in choices if c is not None):  # what --release applied
        console.print(f"recipe settings: {source} (--json: the settings applied per variant)",
                      markup=False, highlight=False)
    if html is not None:
        console.print(f"wrote {html}")


def _title(data: dict[str, Any], reports: list[Any]) -> str:
    from workloads.models import model_label

    sc = reports[0].scenario
    return (f"muonsim compare: {model_label(sc.get('model'))} on {sc.get('gpus')} × {sc.get('system')} ({reports[0].engine} engine, "
            f"calibration {reports[0].calibration}); baseline {data['baseline']}")

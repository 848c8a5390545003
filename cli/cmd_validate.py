"""``muonsim validate`` and ``muonsim calibrate``: the model against measured runs.

``validate`` predicts every supported run (CSV/JSON of the measured-run schema, Megatron training
logs, reference-backend JSON, or a shipped dataset) and reports the errors; ``calibrate`` fits the
named efficiency factors and writes a profile, reporting held-out error (each configuration predicted without its runs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import (
    CliError,
    JsonOpt,
    WideOpt,
    check_engine,
    check_output_paths,
    print_json,
    user_errors,
    with_scenario_flags,
    write_text_atomically,
)
from cli.terminal import no_negative_zero

RunsArg = Annotated[list[Path] | None, typer.Argument(
    metavar="FILE", help="runs files: CSV/JSON of the measured-run schema, Megatron training logs (.log/.txt/.out), "
         "reference-backend JSON", show_default=False)]
DatasetOpt = Annotated[list[str] | None, typer.Option(
    "--dataset", metavar="NAME", help="a shipped dataset (megatron-bridge, megatron-ci, megatron-ci-all); repeatable")]
WarmupOpt = Annotated[int, typer.Option("--warmup", min=0, metavar="INT", help="Megatron logs: warm-up iterations to skip")]


def register(app: typer.Typer) -> None:
    """Add the ``validate`` and ``calibrate`` commands."""
    app.command("validate")(validate)
    app.command("calibrate")(calibrate)


def _gather_runs(paths: list[Path] | None, datasets: list[str] | None, flags: dict[str, str],
                 warmup: int) -> tuple[list[Any], str, list[Any]]:
    """All runs from files and datasets (one-line errors), a description of where they came from,
    and the dataset rows that are not runs (with their reasons)."""
    from workloads.datasets import load_dataset_rows
    from workloads.loaders import LOG_SUFFIXES, load_many
    from workloads.megatron_ci import is_megatron_ci_csv, load_megatron_ci

    paths = list(paths or [])
    datasets = list(datasets or [])
    if not paths and not datasets:
        from workloads.datasets import dataset_names

        raise CliError("give runs files (CSV, JSON, Megatron logs) or --dataset NAME "
                       f"(shipped: {', '.join(dataset_names())})")
    if flags and not any(p.suffix.lower() in LOG_SUFFIXES for p in paths):
        raise CliError(f"scenario flags ({', '.join(sorted(flags))}) describe training logs; "
                       "no log file was given (CSV and JSON runs carry their own scenario)")
    loaded = {f"dataset '{d}'": load_dataset_rows(d) for d in datasets}
    # a Megatron CI runs CSV (e.g. a newer harvest than the shipped copy) goes through its own loader
    ci_files = [p for p in paths if is_megatron_ci_csv(p)]
    loaded |= {f"file '{p}'": load_megatron_ci(p) for p in ci_files}
    runs = load_many([p for p in paths if p not in ci_files], flags, warmup, preloaded={name: rows[0] for name, rows in loaded.items()})
    where = ", ".join([f"dataset {d}" for d in datasets] + [p.name for p in paths])
    return runs, where, [s for rows in loaded.values() for s in rows[1]]


def _calibration(path: Path | None, datasheet: bool) -> Any:
    from cli.common import load_calibration

    if path is not None and datasheet:
        raise CliError("--calibration and --datasheet exclude each other")
    if datasheet:
        return None
    return load_calibration(path)  # like predict/compare/plan: 'none' = datasheet defaults


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None or value != value else no_negative_zero(format(value, spec))


@user_errors
@with_scenario_flags
def validate(
    runs_files: RunsArg = None,
    dataset: DatasetOpt = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", metavar="FILE", help="calibration profile YAML (default: the built-in profile); 'none': datasheet defaults")] = None,
    datasheet: Annotated[bool, typer.Option("--datasheet", help="no calibration: datasheet factors")] = False,
    engine: Annotated[str, typer.Option("--engine", metavar="analytic|des", help="step engine")] = "analytic",
    json_out: JsonOpt = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write a plotly scatter + histogram page")] = None,
    warmup: WarmupOpt = 10,
    wide: WideOpt = False,
    *, scenario_flags: dict[str, str],
) -> None:
    """How wrong is the model on measured runs? Predicted vs measured, MAPE, bias, worst case, Kendall τ."""
    from costmodel.calibrate.validation import validate_runs
    from topologies.inputs import plural

    check_engine(engine)
    runs, where, skipped = _gather_runs(runs_files, dataset, scenario_flags, warmup)
    profile = _calibration(calibration, datasheet)
    reference_runs = [r for r in runs if r.phase_times_s or r.collectives]
    step_runs = [r for r in runs if not (r.phase_times_s or r.collectives)]
    report = validate_runs(step_runs, profile, engine, skipped) if step_runs or skipped else None
    reference = _reference_checks(reference_runs, profile) if reference_runs else []
    if html is not None:
        if report is None or not report.rows:
            raise CliError("--html needs at least one supported step-time run")
        from costmodel.calibrate.validation_figures import validation_html

        m = report.metrics
        summary = (f"{plural(m.n, 'run')} from {where}; calibration {report.calibration}; MAPE {m.mape_pct:.1f} %, "
                   f"bias {m.bias_pct:+.1f} %, worst {m.max_ape_pct:.1f} %")
        write_text_atomically(html, validation_html(report.rows, summary))
    if json_out:
        data: dict[str, Any] = report.to_json_dict() if report else {"n": 0, "rows": [], "unsupported": []}
        if reference:
            data["reference"] = [c.to_json_dict() for c in reference]
        print_json(data)
        return
    if report is not None:
        _print_validation(report, where, wide)
    for check in reference:
        _print_reference(check)
    if html is not None:
        typer.echo(f"wrote {html}")


def _reference_checks(runs: list[Any], profile: Any) -> list[Any]:
    from costmodel.calibrate.reference_check import check_reference_run

    if profile is None or profile.local is None:
        raise CliError("reference runs (with phase_times_s) need --calibration with a local profile "
                       "from 'muonsim calibrate --microbench --out local.yaml'")
    return [check_reference_run(r, profile.local, _reference_model(r)) for r in runs]


def _reference_model(run: Any) -> Any:
    """The ModelSpec of a reference run's shapes (presets live in the reference package)."""
    from costmodel.calibrate.reference_check import run_config

    shapes = str(run_config(run).get("shapes", "tiny"))
    try:
        from reference.workload import load_shapes
    except ImportError as err:  # torch missing: only model files and catalogue names work
        from workloads.models import load_model

        if shapes.endswith((".yaml", ".yml")) or "/" in shapes:
            return load_model(shapes)
        raise CliError(f"reference run '{run.run_id}' uses shapes '{shapes}', which needs the reference "
                       f"package ({err})") from None
    return load_shapes(shapes)


def short_run_ids(rows: list[Any]) -> dict[str, str]:
    """Run ids without what the table shows elsewhere: the system (rows are grouped by it) and the
    prefix every id shares (``mb-``), e.g. 'mb-26.08-qwen3-30b-a3b-gb200-nvl72-mxfp8-8g-gbs512' ->
    '26.08-qwen3-30b-a3b-mxfp8-8g-gbs512'."""
    ids = [r.run_id for r in rows]
    prefix = os.path.commonprefix(ids) if len(ids) > 1 else ""
    prefix = prefix[: prefix.rfind("-") + 1] if "-" in prefix else ""
    return {r.run_id: r.run_id[len(prefix):].replace(f"-{r.system}", "") or r.run_id for r in rows}


def _print_validation(report: Any, where: str, wide: bool = False) -> None:
    from rich import box
    from rich.table import Table

    from cli.terminal import console as make_console
    from topologies.inputs import plural

    console = make_console(wide=wide)
    console.print(f"[bold]predicted vs measured step time, s[/bold] ({where}; calibration: {report.calibration}, "
                  f"engine {report.engine})", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("run (by system)", overflow="fold")
    for col in ("measured", "predicted", "error %"):
        table.add_column(col, justify="right", no_wrap=True)
    rows = sorted(report.rows, key=lambda r: (r.system, r.model, r.run_id))
    short = {r.run_id: r.run_id for r in rows} if wide else short_run_ids(rows)
    system = None
    for r in rows:
        if r.system != system:
            if system is not None:
                table.add_section()
            system = r.system
            table.add_row(f"[bold]{system}[/bold]", "", "", "")
        mark = " *" if r.in_training_set else ""
        table.add_row(short[r.run_id] + mark, f"{r.measured_step_time_s:.3f}", f"{r.predicted_step_time_s:.3f}",
                      no_negative_zero(f"{r.error_pct:+.1f}"))
    console.print(table if rows else f"no run could be predicted ({plural(len(report.unsupported), 'unsupported run')}, below)", highlight=False)
    if report.n_in_training_set:
        in_set = report.n_in_training_set
        console.print(f"* {plural(in_set, 'run')} {'is' if in_set == 1 else 'are'} in the profile's training set: their error is "
                      "training error (see 'muonsim calibrate' for held-out error)")
    if report.unsupported:
        console.print(f"unsupported runs ({len(report.unsupported)}), not predicted:")
        _print_unsupported(console, report.unsupported)
    summary = Table(title="errors by system", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("system", "n", "MAPE %", "median %", "bias %", "worst %", "Kendall τ"):
        summary.add_column(col, justify="left" if col == "system" else "right", no_wrap=True)
    for name, m in [*report.by_system.items(), ("overall", report.metrics)]:
        summary.add_row(name, str(m.n), _fmt(m.mape_pct), _fmt(m.median_ape_pct), _fmt(m.bias_pct, "+.1f"),
                        _fmt(m.max_ape_pct), _fmt(m.kendall_tau, ".2f"))
    console.print(summary)


def _print_reference(check: Any) -> None:
    typer.echo(f"reference run {check.run_id}:")
    for line in check.summary_lines():
        typer.echo(f"  {line}")


@user_errors
@with_scenario_flags
def calibrate(
    runs_files: RunsArg = None,
    dataset: DatasetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="profile YAML to write")] = None,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME", help="profile name (default: the output file's stem)")] = None,
    factors: Annotated[str | None, typer.Option(
        "--factors", metavar="LIST", help="comma-separated EfficiencyFactors to fit per system")] = None,
    release_factors: Annotated[str | None, typer.Option(
        "--release-factors", metavar="LIST", help="factors refined per release ('' = none)")] = None,
    min_release_runs: Annotated[int, typer.Option(
        "--min-release-runs", min=2, metavar="INT", help="runs a release family needs for its own multipliers")] = 3,
    folds: Annotated[int, typer.Option("--folds", min=0, metavar="INT", help="held-out folds by configuration; 0 = leave one configuration out")] = 0,
    holdout: Annotated[str, typer.Option("--holdout", metavar="configuration|model",
                                         help="what is held out together: a configuration, or a whole model")] = "configuration",
    no_cv: Annotated[bool, typer.Option("--no-cv", help="skip the held-out evaluation")] = False,
    skip_reconstructed: Annotated[bool, typer.Option(
        "--skip-reconstructed", help="predict and score, but do not fit on, runs whose recipe settings are a "
                                     "reconstruction (the settings file's match_status)")] = False,
    host_prior_sigma: Annotated[float | None, typer.Option(
        "--host-prior-sigma", min=0.01, metavar="SIGMA", help="prior width (sigma of log) of the host factors centred on the host "
                                             "CPU's measured value (default: 1.0)")] = None,
    fit_excluded: Annotated[bool, typer.Option(
        "--fit-excluded", help="fit on the runs the dataset declares excluded too (its fit_exclusion "
                               "reasons), to report held-out error on every run")] = False,
    release_residuals: Annotated[bool, typer.Option(
        "--release-residuals", help="diagnostic: the held-out bias each release family leaves (not fitted)")] = False,
    loss: Annotated[str, typer.Option("--loss", metavar="soft_l1|huber|linear", help="robust loss of the fit")] = "soft_l1",
    microbench: Annotated[bool, typer.Option(
        "--microbench", help="measure this machine (GEMM, eager dispatch, gloo α-β) instead of fitting runs")] = False,
    json_out: JsonOpt = False,
    warmup: WarmupOpt = 10,
    wide: WideOpt = False,
    *, scenario_flags: dict[str, str],
) -> None:
    """Fit the named efficiency factors to measured runs; report held-out error; write a profile."""
    from topologies.inputs import plural
    if out is None:
        raise CliError("--out PROFILE.yaml is required")
    check_output_paths(out)  # a missing directory or a directory given as the file: before the fit
    if microbench:
        if runs_files or dataset:
            raise CliError("--microbench measures this machine; do not give runs with it")
        fit_flags = {"--factors": factors, "--release-factors": release_factors, "--host-prior-sigma": host_prior_sigma,
                     "--no-cv": no_cv or None, "--fit-excluded": fit_excluded or None,
                     "--skip-reconstructed": skip_reconstructed or None, "--release-residuals": release_residuals or None}
        given = [flag for flag, value in fit_flags.items() if value is not None]
        given += [f"scenario flags ({', '.join(sorted(scenario_flags))})"] if scenario_flags else []
        if given:  # they shape a fit of runs; the microbenchmarks would ignore them
            raise CliError(f"--microbench measures this machine and fits no runs; drop {', '.join(given)}")
        _microbench(out, name, json_out)
        return
    from costmodel.calibrate.fit import DEFAULT_FACTORS, DEFAULT_RELEASE_FACTORS, FitSettings
    from costmodel.calibrate.fit_runs import calibrate as run_calibration

    runs, where, skipped = _gather_runs(runs_files, dataset, scenario_flags, warmup)
    fitted = _factor_list("--factors", factors, DEFAULT_FACTORS)
    per_release = _factor_list("--release-factors", release_factors, DEFAULT_RELEASE_FACTORS)
    if not fitted:  # the fit would fit nothing and write the datasheet as a "calibrated" profile
        raise CliError(f"--factors: must name at least one factor (got {factors!r})")
    _check_fit_choices(loss, holdout, folds)
    if release_factors is not None:  # the defaults not fitted are dropped; the ones you name must be fitted
        for name_ in per_release:
            if name_ not in fitted:
                raise CliError(f"--release-factors: '{name_}' is not a fitted factor; a release factor refines one of "
                               f"--factors ({', '.join(fitted)})")
    try:
        settings = FitSettings(factors=fitted, release_factors=tuple(f for f in per_release if f in fitted),
                               loss=loss, folds=folds, holdout=holdout, fit_reconstructed=not skip_reconstructed,
                               fit_excluded=fit_excluded, min_release_runs=min_release_runs,
                               host_prior_sigma_log=host_prior_sigma)
    except ValueError as err:
        raise CliError(str(err)) from None

    def progress(msg: str) -> None:
        if not json_out:
            print(msg, file=sys.stderr, flush=True)

    report = run_calibration(runs, settings, name=name or out.stem, fitted_on=f"{where} ({plural(len(runs), 'run')})",
                             cross_validate=not no_cv, progress=progress, skipped=skipped)
    if not report.result.fits.systems:
        raise CliError("no supported run to fit (all runs are unsupported; see 'muonsim validate')")
    write_text_atomically(out, report.profile.to_yaml())
    warnings = underdetermined_warnings(report.profile) + bound_warnings(report.profile)
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    if json_out:
        print_json(report.to_json_dict() | {"warnings": warnings})
        return
    _print_calibration(report, wide)
    if release_residuals:
        _print_release_residuals(report)
    typer.echo(f"wrote {out}")


def bound_warnings(profile: Any) -> list[str]:
    """One line per fitted factor (of a system or a release) that ended on a bound of its physical
    range (``costmodel.calibrate.priors.bound_hit``): a defect of the model on those runs, not a result."""
    from costmodel.calibrate.priors import FACTOR_BOUNDS, bound_hit

    out = []
    for system, cal in profile.systems.items():
        sets = [(system, cal)] + [(f"{system} release {tag}", rel) for tag, rel in cal.releases.items()]
        for scope, fitted in sets:
            for name, value in sorted(fitted.factors.items()):
                side = bound_hit(name, value)
                if side is not None:
                    bound = FACTOR_BOUNDS[name][0 if side == "lower" else 1]
                    out.append(f"{scope}: {name} = {value:.4g} is on its {side} bound ({bound:g}): the runs ask "
                               "for a value outside its physical range, so the model misses a mechanism on "
                               "them (a defect, not a fitted value)")
    return out


def underdetermined_warnings(profile: Any) -> list[str]:
    """One line per system (or release) whose fit has more factors than runs to determine them."""
    from topologies.inputs import plural
    out = []
    for system, cal in profile.systems.items():
        sets = [(system, cal)] + [(f"{system} release {tag}", rel) for tag, rel in cal.releases.items()]
        for scope, fitted in sets:
            n, k = fitted.n_runs or 0, len(fitted.factors)
            if k > n:
                out.append(f"{scope}: {plural(k, 'factor')} fitted from {plural(n, 'run')}; the runs cannot "
                           "determine them (the values lean on their priors); give more runs or fewer --factors")
    return out


def _factor_list(flag: str, text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """The factor names of ``flag``'s comma-separated ``text`` (``default`` when not given); CliError for a
    name given twice or, for ``--factors``, one that is not a fittable factor (with a did-you-mean)."""
    from costmodel.calibrate.priors import FACTOR_BOUNDS
    from topologies.inputs import did_you_mean, first_repeat

    if text is None:
        return default
    names = tuple(f.strip() for f in text.split(",") if f.strip())
    for name in names:
        if name not in FACTOR_BOUNDS and flag == "--factors":  # --release-factors: checked against --factors
            guess = did_you_mean(name, FACTOR_BOUNDS)
            hint = f"did you mean '{guess}'?" if guess else f"fittable: {', '.join(FACTOR_BOUNDS)}"
            raise CliError(f"{flag}: '{name}' is not a fittable factor; {hint}")
    repeated = first_repeat(names)
    if repeated is not None:
        raise CliError(f"{flag} gives '{repeated}' twice in '{text}'; give each value once")
    return names


def _check_fit_choices(loss: str, holdout: str, folds: int) -> None:
    """CliError in the flags' words for a robust loss, held-out grouping or fold count the fit does not have."""
    for flag, value, valid in (("--loss", loss, ("soft_l1", "huber", "linear")),
                               ("--holdout", holdout, ("configuration", "model"))):
        if value not in valid:
            raise CliError(f"{flag}: must be one of {', '.join(valid)} (got {value!r})")
    if folds == 1:
        raise CliError("--folds: must be 0 (leave one configuration out) or at least 2 (got 1)")


def _print_calibration(report: Any, wide: bool = False) -> None:
    from rich import box
    from rich.table import Table

    from cli.terminal import console as make_console

    console = make_console(wide=wide)
    fac = Table(title="fitted factors per system (± 1 σ)", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    fac.add_column("system", no_wrap=True)
    fac.add_column("runs", justify="right")
    fac.add_column("factor", no_wrap=True)
    fac.add_column("value ± σ", justify="right", no_wrap=True)
    refined = []
    for system, cal in report.profile.systems.items():
        items = list(cal.factors.items()) or [("(none identifiable)", None)]
        for k, (name, value) in enumerate(items):
            cell = "-" if value is None else f"{value:.3g} ± {cal.uncertainty.get(name, float('nan')):.2g}"
            fac.add_row(system if k == 0 else "", str(cal.n_runs) if k == 0 else "", name, cell)
        fac.add_section()
        refined.append(f"{system}: {', '.join(cal.releases) or '-'}")
    console.print(fac)
    console.print("releases refined: " + "; ".join(refined), highlight=False)
    heldout = (f"held-out ({report.result.settings.heldout_scheme})" if any(
        kinds.get("heldout") for kinds in report.metrics_table().values()) else "held-out (not evaluated: --no-cv)")
    table = Table(title=f"step-time error, %: {heldout} MAPE, bias, median and worst APE, Kendall τ; training and "
                        "datasheet MAPE",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    headers = ("scope", "n", "held-out", "bias", "median", "worst", "τ", "train", "datasheet")
    for col in headers:
        table.add_column(col, justify="left" if col == "scope" else "right", no_wrap=col == "scope")
    for scope, kinds in report.metrics_table().items():
        h, t, d = kinds.get("heldout"), kinds.get("train"), kinds.get("datasheet")
        table.add_row(scope, str((h or t).n), _fmt(h.mape_pct if h else None), _fmt(h.bias_pct if h else None, "+.1f"),
                      _fmt(h.median_ape_pct if h else None), _fmt(h.max_ape_pct if h else None),
                      _fmt(h.kendall_tau if h else None, ".2f"), _fmt(t.mape_pct if t else None),
                      _fmt(d.mape_pct if d else None))
    console.print(table)
    if report.unsupported:
        console.print(f"{len(report.unsupported)} unsupported runs were not used:")
        _print_unsupported(console, report.unsupported)


UNSUPPORTED_LISTED = 30  # longer lists are summarised by reason (every run is in --json)


def _print_unsupported(console: Any, unsupported: list[Any]) -> None:
    """Each unsupported run with its reason, or, for long lists, how many runs share each reason."""
    if len(unsupported) <= UNSUPPORTED_LISTED:
        for u in unsupported:
            console.print(f"  {u.run_id}: {u.reason}", markup=False)
        return
    import re
    from collections import Counter

    counts = Counter(re.sub(r"\s*\([^)]*\)", "", u.reason) for u in unsupported)  # details in brackets vary
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        console.print(f"  {n:4d} x {reason}", markup=False)
    console.print("  (every run with its reason: --json)")


def _print_release_residuals(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="diagnostic: held-out error per release family (what a release multiplier would absorb)")
    for col in ("release", "n", "MAPE %", "bias %", "worst %"):
        table.add_column(col, justify="left" if col == "release" else "right")
    for family, m in report.release_residuals().items():
        table.add_row(family or "-", str(m.n), _fmt(m.mape_pct), _fmt(m.bias_pct, "+.1f"), _fmt(m.max_ape_pct))
    Console(width=max(Console().width, 100)).print(table)


def _microbench(out: Path, name: str | None, json_out: bool) -> None:
    from cli.reference_host import measure_reference_host
    from costmodel.calibrate.microbench import measure_local
    from costmodel.calibrate.profile import CalibrationProfile
    from reference.allocator import keep_freed_memory

    # measured with the reference ranks' default allocator setting (keep freed memory, no page faults)
    local = measure_local(progress=None if json_out else (lambda m: print(m, file=sys.stderr, flush=True)),
                          rank_setup=keep_freed_memory)
    local = measure_reference_host(local)  # the reference's Python per Muon tensor (reference/host_probe.py)
    profile = CalibrationProfile(name=name or out.stem, fitted_on=f"microbenchmarks on {local.machine}", local=local)
    write_text_atomically(out, profile.to_yaml())
    if json_out:
        print_json(profile.model_dump(mode="json"))
        return
    typer.echo("GEMM: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in local.gemm_flops_per_s.items()))
    if local.dispatch_s is not None and local.memory_Bps is not None:
        typer.echo(f"eager PyTorch dispatch {local.dispatch_s * 1e6:.2f} us per operator; element-wise "
                   f"{local.memory_Bps / 1e9:.1f} GB/s")
    for dtype, ns in local.newton_schulz.items():
        typer.echo(f"Newton-Schulz ({dtype} matmuls): GEMM efficiency {ns.efficiency:.2f}, {ns.gemm_setup_s * 1e6:.1f} us "
                   f"setup per GEMM over a matmul's, {ns.call_overhead_s * 1e6:.0f} us per call, "
                   f"{ns.shape_change_s * 1e6:.0f} us per change of shape")
    if local.muon_update_host_s is not None and local.muon_orthogonalize_host_s is not None:
        typer.echo(f"reference host layers: {local.muon_update_host_s * 1e6:.0f} us per Muon tensor, "
                   f"{local.muon_orthogonalize_host_s * 1e6:.0f} us per orthogonaliser call")
    for op, fit in local.collectives.items():
        typer.echo(f"gloo {op} ({local.world_size} ranks): alpha {fit.alpha_s * 1e6:.0f} us, "
                   f"beta {fit.beta_Bps / 1e9:.2f} GB/s")
    typer.echo(f"wrote {out}")

"""``muonsim plan``: which parallel layout and optimizer choices are fastest and still fit in memory?

Searched settings (tp, pp, vpp, cp, ep, etp, mbs, recompute, optimizer, distribution, layout,
tp-mode, load-balance, hide-param-gather) given as flags are *pins*: comma lists restrict the
search (``--pp 4,8``), ``--min-X`` / ``--max-X`` bound the numeric ones (``--max-tp 8``). The other
scenario flags (model, system, gpus, gbs, seq, precision, ...) and the optional scenario file set
the base scenario; the base with the single-valued pins applied is the *reference* scenario,
ranked among the plans. See :mod:`costmodel.planner` for the search.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.cluster import SchedulerOpt
from cli.common import (
    CalibrationOpt,
    CliError,
    JsonOpt,
    ScenarioFileArg,
    check_output_paths,
    print_json,
    user_errors,
    with_scenario_flags,
    write_text_atomically,
)

BOUND_FLAGS = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs")
EXIT_INTERRUPTED = 130


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the app."""
    app.command("plan")(plan)


def with_bound_flags(func: Any) -> Any:
    """Add ``--min-X`` / ``--max-X`` for every numeric searched setting; passes ``bounds``."""
    sig = inspect.signature(func, eval_str=True)
    params = [p for p in sig.parameters.values() if p.name != "bounds"]
    names = [f"{side}_{flag}" for flag in BOUND_FLAGS for side in ("min", "max")]
    for name in names:
        side, flag = name.split("_", 1)
        option = typer.Option(None, f"--{side}-{flag}", metavar="INT", help=f"{side}imum {flag} searched",
                              rich_help_panel="Search bounds")
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=int | None))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bounds = {name: kwargs.pop(name, None) for name in names}
        return func(*args, bounds=bounds, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


def _progress() -> tuple[Any, Any]:
    """A rich progress display on stderr and the callback the planner reports to.

    When stderr is not a terminal (a pipe, a log file, a test), each stage is announced by one
    line ``plan: STAGE`` instead of a progress bar: a script knows the search is under way.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=not console.is_terminal)
    tasks: dict[str, Any] = {}

    def report(label: str, done: int, total: int) -> None:
        if label not in tasks:
            for other in tasks.values():
                progress.update(other, visible=False)
            tasks[label] = progress.add_task(label, total=total)
            if not console.is_terminal:
                print(f"plan: {label}", file=sys.stderr, flush=True)
        progress.update(tasks[label], completed=done, total=max(total, done))

    return progress, report


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[list[int]]:
    """SIGTERM behaves like Ctrl-C while the search runs: stop the workers, keep what was found.

    Yields a list that holds the signal number once one arrived (the exit code becomes 128 + it).
    """
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _base_and_reference(scenario_file: Path | None, flags: dict[str, str]) -> tuple[Any, dict[str, str], str | None, Any]:
    """(base scenario, raw pins, why the reference is invalid or None, the base's Layered config).

    The base takes the defaults of its model × system (GPUs, precision, batch, sequence and the
    reference layout) for what neither the file nor a flag sets.
    """
    from cli.common import layered_scenario
    from costmodel.planner.base import plan_base, split_pins

    pins, rest = split_pins(flags)
    layered = layered_scenario(scenario_file, rest)
    base, error = plan_base(layered.config, pins)
    base.check_precision()  # not searched: no candidate could fix it
    return base, pins, error, layered


@user_errors
@with_scenario_flags
@with_bound_flags
def plan(
    scenario_file: ScenarioFileArg = None,
    memory_headroom: Annotated[float, typer.Option("--memory-headroom", metavar="FRACTION", help="fraction of HBM kept free")] = 0.1,
    top_k: Annotated[int, typer.Option("--top-k", metavar="INT", help="best plans re-ranked with the discrete-event engine (0 = none)")] = 5,
    limit: Annotated[int, typer.Option("--limit", metavar="INT", help="plans listed")] = 10,
    jobs: Annotated[int, typer.Option("--jobs", metavar="INT", help="worker processes (0 = every core; ignored with --scheduler)")] = 0,
    explain: Annotated[list[str] | None, typer.Option("--explain", metavar="SETTINGS", help='why not this configuration? e.g. "tp=2,pp=8" (repeatable)')] = None,
    samples: Annotated[int, typer.Option("--samples", metavar="INT", help="calibration-uncertainty draws for the sensitivity (0 = none)")] = 16,
    sensitivity_sigma: Annotated[float | None, typer.Option("--sensitivity-sigma", metavar="REL", help="assumed relative 1-sigma for factors without a fitted uncertainty")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="INT", help="random seed of the sensitivity draws")] = 0,
    exhaustive: Annotated[bool, typer.Option("--exhaustive", help="evaluate every candidate (no pruning)")] = False,
    allow_hypothetical: Annotated[bool, typer.Option("--allow-hypothetical", help="also search layout / load-balance pairs "
                                  "Megatron-Core does not have (legacy with lpt or none, current with ping_pong or none)")] = False,
    calibration: CalibrationOpt = None,
    json_out: JsonOpt = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write plotly figures (all plans, Pareto front, breakdowns)")] = None,
    scheduler: SchedulerOpt = None,
    *, scenario_flags: dict[str, str], bounds: dict[str, int | None],
) -> None:
    """Search parallel layouts and optimizer choices: the fastest plans that fit in memory.

    A searched setting given as a flag pins the search: a comma list restricts it (--pp 4,8), one value fixes
    it; --min-X / --max-X bound the numeric ones. Searched: tp, pp, vpp, cp, ep, etp, mbs, recompute,
    optimizer, distribution, layout, tp-mode, load-balance, hide-param-gather.
    """
    from cli.common import load_calibration
    from costmodel.planner.explain import parse_query
    from costmodel.planner.pins import parse_pins
    from costmodel.planner.plan import PlanOptions, memory_budget_bytes, run_plan

    for name, value, low in (("--top-k", top_k, 0), ("--limit", limit, 1), ("--jobs", jobs, 0), ("--samples", samples, 0)):
        if value < low:
            raise CliError(f"{name}: must be at least {low} (got {value})")
    if sensitivity_sigma is not None and not 0 < sensitivity_sigma < 1:
        raise CliError(f"--sensitivity-sigma: must be in (0, 1) (got {sensitivity_sigma})")
    check_output_paths(html)
    queries = tuple(explain or ())
    for q in queries:
        parse_query(q)
    base, raw_pins, reference_error, layered = _base_and_reference(scenario_file, scenario_flags)
    pins = parse_pins(raw_pins, bounds, allow_hypothetical)
    memory_budget_bytes(base, memory_headroom)
    profile = load_calibration(calibration)
    label = "datasheet defaults"
    if profile is not None:
        base = profile.apply(base)
        label = profile.label(base.system.name)
    options = PlanOptions(pins=pins, headroom=memory_headroom, top_k=top_k, limit=limit, jobs=jobs, samples=samples,
                          assumed_sigma=sensitivity_sigma, seed=seed, explain=queries, exhaustive=exhaustive,
                          scheduler=scheduler)
    progress, report = _progress()
    with _terminate_as_interrupt() as terminated, progress:
        outcome = run_plan(base, options, reference_error=reference_error, profile=profile,
                           calibration_label=label, progress=report)
    result = outcome.result = outcome.result.model_copy(update={"scenario_source": layered.summary()})
    if html is not None:
        from costmodel.planner.figures import plan_html

        write_text_atomically(html, plan_html(outcome))
    if json_out:
        print_json(result.model_dump(mode="json"))
    else:
        from cli.terminal import console as make_console
        from costmodel.planner.render import render

        console = make_console()
        console.print(render(result, outcome.best_report))
        if html is not None:
            console.print(f"wrote {html}")
    if result.interrupted:
        raise typer.Exit(128 + terminated[0] if terminated else EXIT_INTERRUPTED)

"""``muonsim sweep GRID.yaml``: many predict and plan points, on local processes or a Dask cluster.

The grid file (see :mod:`costmodel.sweep.grid`) lists values per scenario setting; every
combination is a point. Results go to ``--out DIR`` (default ``<grid>-sweep/`` beside the grid):
``journal.jsonl`` (every finished point, appended as it finishes), ``results.parquet`` (with the
``cluster`` extra) and ``results.csv`` (one row per point), ``summary.html`` (plotly). Rerunning
the same command skips the finished points; Ctrl-C keeps them and exits with code 130.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.cluster import SchedulerOpt
from cli.common import CalibrationOpt, CliError, JsonOpt, print_json, user_errors

EXIT_INTERRUPTED = 130
EXIT_ABORTED = 1


def register(app: typer.Typer) -> None:
    """Add ``sweep`` to the app."""
    app.command("sweep")(sweep)


def _progress(reused: int) -> tuple[Any, Any]:
    """A rich progress bar on stderr and the callback ``run_sweep`` reports to."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from topologies.inputs import plural

    console = Console(stderr=True)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal)
    label = "sweep" + (f" ({plural(reused, 'point')} done earlier)" if reused else "")
    task = progress.add_task(label, total=None)

    def report(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, report


def _grid_calibration(grid_path: Path, flag: Path | None, from_grid: str | None) -> Path | None:
    """``--calibration`` wins over the grid's ``calibration`` (a path relative to the grid file)."""
    if flag is not None or from_grid is None:
        return flag
    path = Path(from_grid)
    if from_grid.lower() != "none" and not path.is_absolute() and not path.is_file():
        path = grid_path.parent / path
    return path


def _out_dir(grid_path: Path, out: Path | None) -> Path:
    from costmodel.sweep.outputs import default_out_dir

    out_dir = Path(out) if out is not None else default_out_dir(grid_path)
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"--out '{out_dir}' is a file; give a directory")
    if not out_dir.resolve().parent.is_dir():
        raise CliError(f"--out: directory '{out_dir.parent}' does not exist")
    return out_dir


def _check_search_keys(grid_path: Path, search: dict[str, Any], aliases: dict[str, str]) -> None:
    """Raise CliError for a ``plan.search`` key plan does not search (the pins would silently drop it)."""
    from costmodel.planner.pins import CATEGORICAL_FLAGS, NUMERIC_KEYS, SEARCH_KEYS

    valid = [*NUMERIC_KEYS.values(), *CATEGORICAL_FLAGS.values()]
    for raw in search:
        name = raw.replace("-", "_")
        if aliases.get(name, name) not in SEARCH_KEYS:
            raise CliError(f"grid file '{grid_path}': plan.search.{raw}: not a searched setting; "
                           f"valid: {', '.join(valid)}")


def _check_writable(out_dir: Path, journal_path: Path, created: bool) -> None:
    """Raise CliError when ``out_dir`` cannot be created or its journal cannot be written (before any
    point runs); leaves nothing behind that was not there."""
    existed = journal_path.exists()
    try:
        out_dir.mkdir(exist_ok=True)
    except OSError as err:
        raise CliError(f"--out: cannot create directory '{out_dir}': {err.strerror or err}") from None
    try:
        with open(journal_path, "a", encoding="utf-8"):
            pass
    except OSError as err:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise CliError(f"--out: cannot write in directory '{out_dir}': {err.strerror or err}") from None
    if not existed:
        journal_path.unlink()
        if created:
            out_dir.rmdir()


@user_errors
def sweep(
    grid_file: Annotated[Path, typer.Argument(metavar="GRID.yaml", help="grid file: lists of scenario settings; every combination is a point")],
    out: Annotated[Path | None, typer.Option("--out", metavar="DIR", help="output directory (default: <grid>-sweep beside the grid file); a rerun resumes from it")] = None,
    jobs: Annotated[int, typer.Option("--jobs", metavar="INT", help="local worker processes (0 = every core; ignored with --scheduler)")] = 0,
    scheduler: SchedulerOpt = None,
    calibration: CalibrationOpt = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="forget the points finished by earlier runs and compute every point")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run a grid of predict and plan points; write Parquet/CSV rows and an HTML summary (resumable)."""
    try:
        _sweep(grid_file, out, jobs, scheduler, calibration, fresh, json_out)
    except KeyboardInterrupt:  # outside the points' loop (which keeps what is done itself)
        typer.echo("interrupted (Ctrl-C)", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _sweep(grid_file: Path, out: Path | None, jobs: int, scheduler: str | None, calibration: Path | None,
           fresh: bool, json_out: bool) -> None:
    from cli.common import SCENARIO_FLAGS, check_release, load_calibration
    from costmodel.planner.cluster import dask_client_class
    from costmodel.sweep.grid import read_grid_file
    from costmodel.sweep.journal import Journal
    from costmodel.sweep.outputs import JOURNAL
    from costmodel.sweep.points import expand_grid
    from costmodel.sweep.run import SweepAborted, run_sweep

    if jobs < 0:
        raise CliError(f"--jobs: must be at least 0 (got {jobs})")
    if scheduler is not None:
        dask_client_class()  # the extra is installed (one-line error otherwise), before anything is written
    grid_path = Path(grid_file)
    spec = read_grid_file(grid_path)
    profile = load_calibration(_grid_calibration(grid_path, calibration, spec.calibration))
    aliases = {flag: key for flag, (key, _, _) in SCENARIO_FLAGS.items()}
    _check_search_keys(grid_path, spec.plan.search, aliases)
    grid = expand_grid(grid_path, aliases, profile, spec.release, grid_file=spec)
    for system in sorted({p.scenario.system.name for p in grid.points if p.scenario is not None}):
        check_release(profile, spec.release, system)
    out_dir = _out_dir(grid_path, out)
    created = not out_dir.exists()
    journal_path = out_dir / JOURNAL
    _check_writable(out_dir, journal_path, created)
    if fresh and journal_path.exists():
        old = Journal(journal_path)
        old.open()  # fails while another sweep holds it
        old.close()
        journal_path.unlink()
    done_before = _finished_keys(journal_path)
    reused = sum(1 for p in grid.points if p.runnable and p.key in done_before)
    progress, report = _progress(reused)
    start = time.perf_counter()
    try:
        with progress:
            outcome = run_sweep(grid, journal_path, jobs=jobs, scheduler=scheduler, progress=report)
    except Exception as err:
        if created and journal_path.exists() and journal_path.stat().st_size == 0:  # nothing written half-way
            journal_path.unlink()
            if not any(out_dir.iterdir()):
                out_dir.rmdir()
        if isinstance(err, SweepAborted):
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(EXIT_ABORTED) from None
        raise
    wall_s = time.perf_counter() - start
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not tear the files
    try:
        from costmodel.sweep.outputs import write_outputs

        written = write_outputs(outcome, grid, out_dir)
    finally:
        signal.signal(signal.SIGINT, previous)
    _print_summary(grid_path, outcome, written, wall_s, json_out)
    if outcome.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


def _finished_keys(journal_path: Path) -> set[str]:
    if not journal_path.is_file():
        return set()
    from costmodel.sweep.journal import Journal

    return {str(e.get("key")) for e in Journal(journal_path).entries() if isinstance(e, dict)}


def _print_summary(grid_path: Path, outcome: Any, written: list[Path], wall_s: float, json_out: bool) -> None:
    from costmodel.sweep.tables import PARQUET_HINT, parquet_available
    from topologies.inputs import plural

    rate = outcome.computed / wall_s if wall_s > 0 and outcome.computed else 0.0
    if json_out:  # 'workers', not 'jobs': --jobs 0 means every core, and 0 workers here means none ran
        print_json({"grid": str(grid_path), "points": outcome.total, "invalid": outcome.invalid,
                    "reused": outcome.reused, "computed": outcome.computed, "pending": outcome.pending,
                    "statuses": outcome.statuses, "interrupted": outcome.interrupted, "workers": outcome.jobs,
                    "wall_s": wall_s, "points_per_s": rate if outcome.computed else None,
                    "files": [str(p) for p in written]})
        return
    from rich.console import Console

    console = Console()
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(outcome.statuses.items()))
    console.print(f"sweep {grid_path}: {plural(outcome.total, 'point')} ({statuses or 'none finished'})")
    workers = f" on {plural(outcome.jobs, 'worker')}" if outcome.jobs else ""
    ran = f"{workers} in {wall_s:.1f} s ({rate:.1f} points/s)" if outcome.computed else ""
    console.print(f"  computed now: {outcome.computed}{ran}; finished by earlier runs: {outcome.reused}")
    if not parquet_available():
        console.print(f"  no Parquet file: it needs pyarrow ({PARQUET_HINT}); the CSV has the same rows")
    console.print("  wrote " + ", ".join(str(p) for p in written))
    if outcome.interrupted:
        console.print(f"interrupted (Ctrl-C): {plural(outcome.pending, 'point')} not finished; "
                      "rerun the same command to resume")

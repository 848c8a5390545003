"""``run_sweep``: run a grid's unfinished points on a pool and record each as it finishes.

1. The journal (:mod:`costmodel.sweep.journal`) gives the points finished by earlier runs; they
   are skipped. Points sharing a key (the same inputs) run once.
2. The others run as tasks (:func:`costmodel.sweep.task.task_point`) on ``jobs`` local processes
   or on the workers of a Dask scheduler: the same pool as ``muonsim plan``
   (:func:`costmodel.planner.cluster.open_pool`). Each result is appended to the journal as soon
   as it arrives, so Ctrl-C (or a crash) keeps every finished point; rerunning resumes.
3. The rows are assembled in grid order, whatever order the points finished in: ``point`` (index
   in the grid), ``point_id`` (key), ``mode``, ``engine``, the scenario columns
   (:func:`scenario_columns`), then the result columns (:mod:`costmodel.sweep.task`). Invalid
   points get their row without running.
"""

from __future__ import annotations

import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.planner.cluster import open_pool
from costmodel.planner.pool import default_jobs, relaxed_gc, set_evaluators
from costmodel.sweep.journal import Journal
from costmodel.sweep.points import Grid, SweepPoint
from costmodel.sweep.tables import full_rows
from costmodel.sweep.task import CONTEXT, cell, task_point
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from workloads.scenario import ScenarioConfig

Progress = Callable[[int, int], None]  # (points done in this run, points this run has to do)
PointHook = Callable[[str, int], None]  # (key, points done in this run) after each is journalled


class SweepAborted(RuntimeError):
    """The pool failed (e.g. a cluster lost its workers); finished points are kept. One line."""


@dataclass
class SweepOutcome:
    rows: list[dict[str, Any]]  # finished (and invalid) points, grid order, every row with every column
    total: int  # points in the grid
    invalid: int  # points not run: the scenario breaks a rule
    reused: int  # runnable points finished by an earlier run
    computed: int  # points computed by this run (unique keys)
    pending: int  # runnable points not finished (interrupted)
    interrupted: bool = False
    run_id: str = ""
    jobs: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


def scenario_columns(config: ScenarioConfig | None) -> dict[str, Any]:
    """The scenario as flat columns: top-level fields (``model`` as :func:`workloads.models.model_label` names
    it, also for an inline model), then each section's fields by name (``optimizer`` is the optimizer kind;
    tuples are comma-joined), then the derived ``dp``."""
    if config is None:
        return {}
    from workloads.models import model_label

    out: dict[str, Any] = {}
    for key, value in config.model_dump(mode="json").items():
        if key == "model":  # a catalogue name or path, or an inline model's name: one column either way
            out[key] = model_label(value)
            continue
        if not isinstance(value, dict):
            out[key] = cell(value)
            continue
        for name, inner in value.items():
            column = key if (key, name) == ("optimizer", "kind") else name
            out[column if column not in out else f"{key}.{name}"] = cell(inner)
    p = config.parallelism
    model_parallel = p.tp * p.pp * p.cp
    out["dp"] = config.gpus // model_parallel if config.gpus % model_parallel == 0 else None
    return out


def point_row(point: SweepPoint, result: dict[str, Any]) -> dict[str, Any]:
    """One output row: the point, its scenario and its result columns."""
    row: dict[str, Any] = {"point": point.index, "point_id": point.key, "mode": point.mode, "engine": point.engine}
    row |= scenario_columns(point.config)
    row |= result
    return row


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A Ctrl-C inside the block is raised when the block ends (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def run_sweep(grid: Grid, journal_path: Path, jobs: int = 0, scheduler: str | None = None,
              progress: Progress | None = None, on_point: PointHook | None = None) -> SweepOutcome:
    """Run the unfinished points of ``grid``, journalling each; Ctrl-C stops and keeps what is done.

    ``jobs`` local processes (0 = every core) unless ``scheduler`` names a Dask scheduler. Raises
    :class:`SweepAborted` when the pool itself fails.
    """
    journal = Journal(journal_path)
    done = journal.open()
    run_id = secrets.token_hex(6)
    computed = 0
    interrupted = False
    pool_jobs = 0
    todo: dict[str, SweepPoint] = {}
    for p in grid.points:
        if p.runnable and p.key not in done:
            todo.setdefault(p.key, p)
    try:
        if progress:
            progress(0, len(todo))
        if todo:
            set_evaluators(**{CONTEXT: grid.context})
            if scheduler is None:  # forked children inherit the engines instead of each importing them
                import costmodel.analytic  # noqa: F401
                import costmodel.des  # noqa: F401
                import costmodel.planner.plan  # noqa: F401
            try:
                # the planner's GC thresholds: each point leaves thousands of small cached objects that
                # the default thresholds walk again and again (local workers fork inside and inherit them)
                with relaxed_gc(), open_pool(min(jobs or default_jobs(), len(todo)), scheduler) as pool:
                    pool_jobs = pool.jobs
                    for key, result in pool.map(task_point, list(todo.values())):
                        with _sigint_deferred():  # journal and counts agree, whenever Ctrl-C comes
                            journal.append(key, result, run_id)
                            done[key] = result
                            computed += 1
                        if progress:
                            progress(computed, len(todo))
                        if on_point:
                            on_point(key, computed)
            except KeyboardInterrupt:
                interrupted = True
            except UserInputError:
                raise
            except Exception as err:
                message = " ".join(f"{type(err).__name__}: {err}".split())
                raise SweepAborted(f"the workers failed ({message}); the {computed} points finished in this run "
                                   f"are kept in '{journal_path}': rerun to resume") from None
    finally:
        journal.close()
    rows = []
    statuses: dict[str, int] = {}
    invalid = pending = reused = 0
    for p in grid.points:
        if not p.runnable:
            result = {"status": "invalid", "message": p.error}
            invalid += 1
        elif p.key in done:
            result = done[p.key]
            reused += p.key not in todo
        else:
            pending += 1
            continue
        rows.append(point_row(p, result))
        statuses[str(result.get("status"))] = statuses.get(str(result.get("status")), 0) + 1
    return SweepOutcome(rows=full_rows(rows), total=len(grid.points), invalid=invalid, reused=reused, computed=computed,
                        pending=pending, interrupted=interrupted, run_id=run_id, jobs=pool_jobs, statuses=statuses)

"""Running planner tasks on all cores: a fork-started process pool, or in-process for ``jobs=1``.

The evaluators (with their engines, caches and base scenario) are module globals set *before*
the pool forks, so children inherit them without pickling; only candidates and compact
:class:`~costmodel.planner.evaluate.Evaluation` results cross process boundaries. Children
ignore SIGINT: Ctrl-C (and SIGTERM, which ``muonsim plan`` turns into the same interruption) reaches
the parent only, which terminates the pool and keeps what it has; workers die with their parent.
:func:`costmodel.planner.cluster.open_pool` gives this pool, or the same interface on a Dask
cluster (``--scheduler``), which ships the installed evaluators to its workers.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

_EVALUATORS: dict[str, Any] = {}


def set_evaluators(**evaluators: Any) -> None:
    """Install (add or replace, by name) the evaluators tasks use (call before the pool opens).

    Names not given stay installed: a sweep's context survives the plans its tasks run in-process.
    """
    _EVALUATORS.update(evaluators)


def installed_evaluators() -> dict[str, Any]:
    """A copy of the installed evaluators (what a Dask pool ships to its workers)."""
    return dict(_EVALUATORS)


def evaluator(name: str) -> Any:
    """An installed evaluator (in the parent or in a forked child)."""
    return _EVALUATORS[name]


def default_jobs() -> int:
    """Number of cores this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - non-Linux
        return max(os.cpu_count() or 1, 1)


SEARCH_GC_THRESHOLD = (20_000, 50, 100)
"""Python's cyclic-GC thresholds during a search (default (700, 10, 10)): a search allocates
hundreds of thousands of small objects that live on in its caches (optimizer plans hold one
RankWork per GPU class), and with the default thresholds the collector walked them again and again
(a quarter of the CPU time of building 2,048-GPU plans). Cycles are still collected, less often."""


@contextmanager
def relaxed_gc() -> Iterator[None]:
    """Run the body (and the workers forked in it, which inherit the setting) with
    :data:`SEARCH_GC_THRESHOLD`; the previous thresholds are restored afterwards."""
    previous = gc.get_threshold()
    gc.set_threshold(*SEARCH_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _worker_init() -> None:
    """A worker ignores Ctrl-C (the parent handles it), dies quietly on SIGTERM, and dies with the
    parent (Linux parent-death signal) instead of writing results into a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler raises KeyboardInterrupt
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


TERMINATE_WAIT_S = 10.0
"""Seconds an interrupted search waits for ``multiprocessing.Pool.terminate`` before killing the
workers itself (:func:`terminate_pool`)."""


def terminate_pool(pool: Any, wait_s: float = TERMINATE_WAIT_S) -> bool:
    """Terminate and join ``pool`` (a ``multiprocessing.Pool``) within ``wait_s`` seconds; True if it
    did. CPython's ``Pool.terminate`` can block for good: its task-handler thread may be stuck
    writing a task into the workers' pipe once ``_help_stuff_finish`` has stopped draining it, and
    terminate then joins that thread. So it runs in a daemon thread; past ``wait_s`` the workers are
    killed here and the pool's threads abandoned (daemon threads end with the process; the pool's
    exit finalizer has already run, so interpreter exit does not wait on it again)."""
    done = threading.Thread(target=lambda: (pool.terminate(), pool.join()), name="pool-terminate", daemon=True)
    done.start()
    done.join(wait_s)
    if not done.is_alive():
        return True
    for worker in list(getattr(pool, "_pool", ())):  # the worker processes (a private attribute)
        if worker.exitcode is None:
            worker.kill()
    return False


class TaskPool:
    """``map`` over tasks with ``jobs`` forked workers (results in completion order)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = max(int(jobs), 1)
        self._pool = None
        if self.jobs > 1:
            self._pool = mp.get_context("fork").Pool(self.jobs, initializer=_worker_init)

    def map(self, func: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Yield ``func(task)`` for every task, as they complete."""
        if self._pool is None:
            for task in tasks:
                yield func(task)
            return
        yield from self._pool.imap_unordered(func, tasks)

    def start_map(self, func: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """:meth:`map`, with the tasks handed to the workers now rather than when the results are
        first asked for (the caller does other work meanwhile). In-process (``jobs=1``) they run then."""
        if self._pool is None:
            return self.map(func, tasks)
        return iter(self._pool.imap_unordered(func, tasks))

    def close(self, terminate: bool = False) -> None:
        """Stop the workers (``terminate`` after an interrupt: do not wait for running tasks; at most
        :data:`TERMINATE_WAIT_S`, see :func:`terminate_pool`)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        if terminate:
            terminate_pool(pool)
            return
        pool.close()
        pool.join()

    def __enter__(self) -> TaskPool:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(terminate=exc_type is not None)

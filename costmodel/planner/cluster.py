"""Planner and sweep tasks on local processes or on a Dask distributed cluster: one ``map``.

:func:`open_pool` returns the local fork pool (:class:`~costmodel.planner.pool.TaskPool`) or, given
a scheduler address (``--scheduler tcp://host:8786``), a :class:`DaskTaskPool` with the same
interface (``map`` in completion order, ``close``, ``jobs``, context manager). ``plan`` and
``sweep`` both open their pool here, so the tasks, their inputs and their results are the same
either way; only where they run differs.

The evaluators installed with :func:`~costmodel.planner.pool.set_evaluators` before the pool opens
are pickled once and the bytes scattered to every worker; each worker process unpickles them once,
and each task installs that copy before it runs (its caches persist between the tasks of that
process, as in a forked child). Tasks in one worker process run one at a time (a lock: they are CPU-bound Python
and the evaluators' caches are not thread-safe), so a cluster's parallelism is its number of
worker processes: start workers with ``--nthreads 1`` and one process per core (``--nworkers``).
``jobs`` is that number of worker processes.

Dask (``distributed``) is an optional extra (``pip install 'muonsim[cluster]'``): asking for a
scheduler without it, or for one that cannot be reached, is a one-line :class:`UserInputError`.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from costmodel.planner.pool import TaskPool, installed_evaluators, set_evaluators
from topologies.inputs import UserInputError

CONNECT_TIMEOUT_S = 15.0  # reaching the scheduler
WORKER_WAIT_S = 60.0  # for a first worker to join a scheduler that has none
CLUSTER_EXTRA_HINT = "pip install 'muonsim[cluster]'"
QUIET_ON_CLOSE = ("distributed", "tornado.application")  # loggers muted while the client disconnects

_TASK_LOCK = threading.Lock()  # one task at a time per worker process


@dataclass(frozen=True)
class EvaluatorBundle:
    """The evaluators a pool's tasks use, pickled once: immutable bytes that workers may copy from
    one another while tasks fill the caches of their own unpickled copy."""

    token: str
    payload: bytes


_UNPICKLED: dict[str, dict[str, Any]] = {}  # token -> this worker process's copy of the evaluators


def _run_task(task: Any, run: Callable[[Any], Any], bundle: EvaluatorBundle) -> Any:
    """Worker side: install the bundle's evaluators (unpickled once per process), then ``run(task)``
    (one task at a time)."""
    with _TASK_LOCK:
        evaluators = _UNPICKLED.get(bundle.token)
        if evaluators is None:
            import cloudpickle

            _UNPICKLED.clear()  # only the latest pool's evaluators are kept
            evaluators = _UNPICKLED[bundle.token] = cloudpickle.loads(bundle.payload)
        set_evaluators(**evaluators)
        return run(task)


def dask_client_class() -> Any:
    """``distributed.Client``, or a one-line UserInputError naming the extra to install."""
    try:
        from distributed import Client
    except ImportError:
        raise UserInputError(f"--scheduler needs Dask distributed, which is not installed: {CLUSTER_EXTRA_HINT}") from None
    return Client


class DaskTaskPool(TaskPool):
    """``map`` over tasks on the workers of a Dask scheduler (results in completion order)."""

    def __init__(self, address: str, connect_timeout_s: float | None = None, worker_wait_s: float | None = None) -> None:
        client_class = dask_client_class()
        self.address = address
        self._pool = None
        self._pending: set[Any] = set()
        self._client: Any = None
        try:
            self._client = client_class(address, timeout=connect_timeout_s or CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, ValueError, TypeError) as err:
            raise UserInputError(f"--scheduler: cannot reach a Dask scheduler at '{address}' ({err})") from None
        worker_wait_s = worker_wait_s or WORKER_WAIT_S
        try:
            self._client.wait_for_workers(1, timeout=worker_wait_s)
        except (OSError, TimeoutError):
            self._client.close()
            raise UserInputError(f"--scheduler: no worker joined the Dask scheduler at '{address}' within "
                                 f"{worker_wait_s:.0f} s; start some with: dask worker {address} --nthreads 1") from None
        self.jobs = max(len(self._client.nthreads()), 1)
        import cloudpickle

        bundle = EvaluatorBundle(secrets.token_hex(8), cloudpickle.dumps(installed_evaluators()))
        self._bundle = self._client.scatter(bundle, broadcast=True, hash=False)

    def map(self, func: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """Yield ``func(task)`` for every task, as they complete on the cluster.

        Leaving the loop early (an exception, Ctrl-C) cancels the tasks not yet done.
        """
        items = list(tasks)
        if not items:
            return
        yield from self._results(self._submit(func, items))

    def start_map(self, func: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        """:meth:`map` with the tasks submitted to the cluster now."""
        items = list(tasks)
        return self._results(self._submit(func, items)) if items else iter(())

    def _submit(self, func: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        futures = self._client.map(_run_task, items, run=func, bundle=self._bundle, pure=False)
        self._pending |= set(futures)
        return futures

    def _results(self, futures: list[Any]) -> Iterator[Any]:
        from distributed import as_completed

        mine = set(futures)
        try:  # results are gathered on the client's loop: Ctrl-C lands in a plain wait, not inside a sync call
            for future, result in as_completed(futures, loop=self._client.loop, with_results=True):
                self._pending.discard(future)
                mine.discard(future)
                future.release()
                yield result
        finally:  # this stream's tasks not yet done (left early) are cancelled
            if mine and self._client is not None:
                self._client.cancel(list(mine))
                self._pending -= mine

    def _cancel(self) -> None:
        if self._pending:
            self._client.cancel(list(self._pending))
            self._pending = set()

    def close(self, terminate: bool = False) -> None:
        """Cancel what is still queued and disconnect (the cluster itself keeps running).

        Dask logs the result gathers that closing the connection cuts short (after Ctrl-C) as
        errors with tracebacks: its loggers are quiet while the client closes.
        """
        if self._client is None:
            return
        loggers = [logging.getLogger(name) for name in QUIET_ON_CLOSE]
        levels = [log.level for log in loggers]
        for log in loggers:
            log.setLevel(logging.CRITICAL)
        try:
            self._cancel()
            self._client.close()
        finally:
            self._client = None
            for log, level in zip(loggers, levels, strict=True):
                log.setLevel(level)


def open_pool(jobs: int, scheduler: str | None = None) -> TaskPool:
    """The pool tasks run on: ``jobs`` local forked processes, or the workers of ``scheduler``.

    Install the evaluators (``set_evaluators``) first: forked children inherit them, Dask workers
    receive a copy.
    """
    if scheduler is None:
        return TaskPool(jobs)
    return DaskTaskPool(scheduler)

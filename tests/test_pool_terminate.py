"""An interrupted search stops its workers in bounded time, even when ``Pool.terminate`` blocks."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from costmodel.planner.pool import TaskPool, terminate_pool


def test_terminate_pool_returns_and_stops_the_workers():
    pool = mp.get_context("fork").Pool(2)
    workers = list(pool._pool)
    assert terminate_pool(pool, wait_s=30.0)
    assert all(w.exitcode is not None for w in workers)


def test_a_blocking_terminate_is_abandoned_and_the_workers_killed():
    """CPython's ``Pool.terminate`` can hang joining its task-handler thread (a rare race after an
    interrupt). Made to hang exactly there, the bound holds, the workers are gone and, once the
    join is released, the pool finishes tidying up on its own."""
    pool = mp.get_context("fork").Pool(2)
    workers = list(pool._pool)
    handler = pool._task_handler
    real_join, release = handler.join, threading.Event()

    def stuck_join(timeout: float | None = None) -> None:
        release.wait()
        real_join(timeout)

    handler.join = stuck_join
    start = time.monotonic()
    assert terminate_pool(pool, wait_s=0.5) is False
    assert time.monotonic() - start < 5.0
    for w in workers:
        w.join(5.0)
    assert all(w.exitcode is not None for w in workers)
    release.set()
    deadline = time.monotonic() + 10.0
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mp.active_children()


def test_taskpool_close_after_an_interrupt_runs_no_more_tasks():
    with TaskPool(2) as pool:
        assert sorted(pool.map(abs, [-3, -1, 2])) == [1, 2, 3]
        pool.close(terminate=True)
        assert pool._pool is None
        assert list(pool.map(abs, [-4])) == [4]  # closed: runs in-process

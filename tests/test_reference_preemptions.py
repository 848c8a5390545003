"""The phase clock counts the preemptions of a phase (involuntary context switches of the rank's thread)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from reference.instrument import PhaseClock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RUSAGE_THREAD and affinity are Linux's")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_phase_sharing_its_core_with_a_busy_process_is_preempted():
    """This thread and a forked busy child pinned to one core: the scheduler must take the core from
    this thread at least once in 0.3 s of spinning (CFS slices are a few ms), and each such switch
    is involuntary; the phase clock counts it."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    child = os.fork()
    if child == 0:  # the competitor
        os.sched_setaffinity(0, {core})
        _spin(1.0)
        os._exit(0)
    try:
        os.sched_setaffinity(0, {core})
        clock = PhaseClock()
        clock.new_step()
        with clock.phase("busy"):
            _spin(0.3)
        assert clock.preempt_steps[-1]["busy"] >= 1
        assert clock.cpu_steps[-1]["busy"] < 0.3  # the child held the core part of the time
    finally:
        os.sched_setaffinity(0, before)
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_reference_runs_report_preemptions_per_phase():
    pytest.importorskip("torch")
    from reference.api import run_reference

    extra = run_reference({"world_size": 2, "shapes": "tiny", "steps": 2, "check": False}).to_measured_run().extra
    by_rank = extra["phase_preemptions_by_rank"]
    assert {int(r) for r in by_rank} == {0, 1}
    for phases in by_rank.values():
        assert {"backward", "grad_reduce", "optimizer", "newton_schulz"} <= set(phases)
        assert all(v >= 0 for v in phases.values())

"""The reference ranks keep freed memory (reference/allocator.py): no page faults in a steady optimizer step.

Counts, not timings: minor page faults of rank 0's Muon step on the ``small`` preset (2 MiB fp32
temporaries) with glibc's default trimming and with the ranks' setting, each in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
torch.set_num_threads(1)
from reference.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
from reference.config import make_config
from reference.op_count import optimizer_for_rank
opt = optimizer_for_rank(make_config(world_size=2, shapes="small", check=False), 0)
for step in (1, 2, 3, 4):  # the heap reaches its steady size (with 2 steps: up to 86 faults/step)
    opt.step(step)
counts = []
for step in (5, 6, 7):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    opt.step(step)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(counts)[1])  # the median step: a one-off (a lazily started thread, ~260 pages) hits one step
"""


def _faults_per_step(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_kept_memory_removes_the_page_faults_of_the_optimizer_step() -> None:
    """glibc's default gives the heap top back and re-faults it (about 3,500-4,800 faults per step,
    measured); with the ranks' setting a steady (median) step faults no page (a few at most)."""
    default, kept = _faults_per_step("default"), _faults_per_step("keep")
    assert default > 1000
    assert kept < 0.01 * default


def test_phase_clock_records_page_faults() -> None:
    """PhaseClock.fault_steps counts the faults of a block that touches fresh memory (16 MiB: 4,096 pages)."""
    import mmap

    from reference.instrument import PhaseClock

    clock = PhaseClock()
    clock.new_step()
    with clock.phase("touch"):
        region = mmap.mmap(-1, 16 * 2 ** 20)
        for offset in range(0, len(region), 4096):
            region[offset] = 1
        region.close()
    assert clock.fault_steps[-1]["touch"] >= 4096

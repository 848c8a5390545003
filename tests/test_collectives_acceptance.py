"""Predicted nccl-tests figures against the measured ones of reference §5.5 (issue 3 acceptance).

Every figure cites its source. Defaults are NCCL's constants and §5.5's saturation points; nothing
here is fitted. Figures the model misses by more than 10 % are marked ``xfail(strict=True)`` with
the measured and predicted values, so a model change that fixes (or breaks) them is noticed.

Derivation of the 20-rack flat ring (GB200, 1,440 GPUs, NCCL Simple, reference §5.3 [S27]):
MNNVL makes each rack one NCCL node, so n = 1,440 ranks on D = 20 nodes of g = 72.

- latency: 2(n−1) = 2,878 steps, 2(D−1) = 38 across IB: 8.4 µs + 2,840 × 3.4 µs + 38 × 14 µs
  = 10.20 ms, × 1.4 (multi-node ring "plateau") = 14.28 ms;
- bandwidth: min(NVLink 900 × 0.80 = 720 GB/s, g × NIC = 72 × 48.5 GB/s) = 720 GB/s, times the size
  efficiency of the per-rank chunk S/n: 8 GB → 5.56 MB → 5.56 / (5.56 + 2) = 0.735 → 529 GB/s;
- transfer: 2·1,439/1,440 × 8 GB / 529 GB/s = 30.2 ms; total 44.5 ms → algbw 180, busbw 359.5 GB/s
  (measured 381: −5.7 %). At 16 GB the chunk is 11.1 MB (0.847): 52.4 + 14.3 ms → busbw 480 (+18 %).

The tuner does not pick that ring: NVLS inside each rack plus a ring of S/72 per rail across racks
moves far less data over the slow hops (~716 GB/s at 8 GB, 763 at 16 GB), which is what this fabric
allows; the measured NCCL 2.26 run reached about half of it.
"""

from __future__ import annotations

import pytest

from topologies.collectives import collective_cost
from topologies.hardware import load_system
from topologies.placement import place_job

GB = 1e9


def busbw_GBps(system: str, gpus: int, size: float, op: str = "all_reduce", algorithm: str | None = None,
               gpus_per_domain: int | None = None) -> float:
    sys_spec = load_system(system)
    shape = place_job(sys_spec, gpus, gpus_per_domain=gpus_per_domain).shape("world")
    return collective_cost(op, size, shape, sys_spec, algorithm).busbw_Bps / GB


def time_us(system: str, gpus: int, size: float, algorithm: str | None = None, gpus_per_domain: int | None = None) -> float:
    sys_spec = load_system(system)
    shape = place_job(sys_spec, gpus, gpus_per_domain=gpus_per_domain).shape("world")
    return collective_cost("all_reduce", size, shape, sys_spec, algorithm).time_s * 1e6


def within(predicted: float, measured: float, tol: float = 0.10) -> bool:
    return abs(predicted - measured) <= tol * measured


# --- passing acceptance figures -------------------------------------------------------------


@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 479.0), (1 * GB, 466.0)])
def test_h100_8gpu_nvls_all_reduce(size, measured):
    """[S10] Azure ND H100 v5, NCCL 2.18.5 NVLS: 1 GB → 466, 8 GB → 479 GB/s busbw."""
    predicted = busbw_GBps("dgx-h100", 8, size, algorithm="nvls")
    assert within(predicted, measured), predicted
    assert busbw_GBps("dgx-h100", 8, size) == pytest.approx(predicted)  # the tuner picks NVLS too


@pytest.mark.parametrize("size", [1 * GB, 4 * GB, 8 * GB])
def test_h100_8gpu_ring_all_gather(size):
    """[S64] [S28]: 8 x H100 all_gather saturates at ≈ 360 GB/s busbw ('exactly what we'd expect')."""
    predicted = busbw_GBps("dgx-h100", 8, size, op="all_gather")
    assert within(predicted, 360.0), predicted


@pytest.mark.parametrize(("gpus", "per_domain", "measured"), [(12, 4, 197.0), (24, 8, 394.0)])
def test_gb200_ib_only_partitions_ring(gpus, per_domain, measured):
    """[S54]: 3 x NVL4 / 3 x NVL8 GB200 partitions over CX-7, ring, 16 GB → 197 / 394 GB/s busbw."""
    predicted = busbw_GBps("gb200-nvl72", gpus, 16 * GB, algorithm="ring", gpus_per_domain=per_domain)
    assert within(predicted, measured), predicted


def test_gb200_4gpu_ring_large_message():
    """[S10] GB200 1 tray, ring, NCCL 2.25.1: 8 GB → 680 GB/s busbw."""
    assert within(busbw_GBps("gb200-nvl72", 4, 8 * GB, algorithm="ring"), 680.0)


@pytest.mark.parametrize(("system", "gpus", "algorithm", "measured_us"), [
    ("gb200-nvl72", 4, "ring", 15.4),  # [S10] GB200 1 tray ring, 1 KB → 15.4 µs
    ("dgx-h100", 8, "nvls", 25.6),  # [S10] H100 NVLS, 1 KB → 25.6 µs
    ("dgx-h100", 8, None, 25.6),
    ("gb200-nvl72", 72, None, 25.6),
])
def test_small_messages_sit_within_the_measured_floors(system, gpus, algorithm, measured_us):
    """§5.5: the small-message floor is ~15-26 µs on one node (1 KB all-reduce)."""
    t = time_us(system, gpus, 1e3, algorithm)
    assert 15.0 <= t <= 30.0, t


# --- figures outside 10 % (kept visible, reported in the issue note) -------------------------

NVLS72 = ("NVLS at 72 ranks: the S(1+1/n) traffic model with NCCL's nvlsEfficiency 0.74 x NVLink 0.80 "
          "predicts ~980-1,010 GB/s; measured busbw stays ~840 at 72 ranks as at 8 (B200 830+, predicted 825)")


@pytest.mark.xfail(strict=True, reason=NVLS72)
@pytest.mark.parametrize(("size", "measured"), [(4 * GB, 839.0), (8 * GB, 835.0)])
def test_gb200_one_rack_nvls_all_reduce(size, measured):
    """[S29] CoreWeave GB200 NVL72, 1 rack, NCCL 2.26.2: 4 GB → 839, 8 GB → 835 GB/s busbw."""
    assert within(busbw_GBps("gb200-nvl72", 72, size), measured)


def test_gb200_one_rack_is_nvls_and_within_25_percent():
    """The rack figure's current error, pinned so that it cannot silently grow."""
    for size, measured in ((4 * GB, 839.0), (8 * GB, 835.0)):
        assert within(busbw_GBps("gb200-nvl72", 72, size), measured, tol=0.25)


@pytest.mark.xfail(strict=True, reason=NVLS72 + "; the hierarchical (NVLS + ring) two-rack figure inherits it")
@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 793.0), (16 * GB, 810.0)])
def test_gb200_two_racks_all_reduce(size, measured):
    """[S29] GB200 NVL72, 2 racks (IB between), NCCL 2.26.2: 8 GB → 793, 16 GB → 810 GB/s busbw."""
    assert within(busbw_GBps("gb200-nvl72", 144, size), measured)


def test_gb200_two_racks_within_15_percent():
    for size, measured in ((8 * GB, 793.0), (16 * GB, 810.0)):
        assert within(busbw_GBps("gb200-nvl72", 144, size), measured, tol=0.15)


@pytest.mark.xfail(strict=True, reason=(
    "20 racks: measured 406 GB/s at 16 GB (381 at 8 GB) is half of what a hierarchical NVLS + ring "
    "algorithm can do on this fabric (predicted ~760); a flat ring predicts 360 at 8 GB and 480 at "
    "16 GB; NCCL 2.26's multi-rack algorithm is not modelled"))
@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 381.0), (16 * GB, 406.0)])
def test_gb200_twenty_racks_all_reduce(size, measured):
    """[S29] GB200 NVL72, 20 racks (1,440 GPUs), NCCL 2.26.2: 8 GB → 381, 16 GB → 406 GB/s busbw."""
    assert within(busbw_GBps("gb200-nvl72", 1440, size), measured)


def test_gb200_twenty_racks_flat_ring_from_nccl_latency_structure():
    """The flat ring across 20 domains (2,878 steps, 38 across IB, x1.4 plateau) at 8 GB: 381 [S29]."""
    assert within(busbw_GBps("gb200-nvl72", 1440, 8 * GB, algorithm="ring"), 381.0)

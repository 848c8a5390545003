"""Predicted nccl-tests figures against the measured ones of reference §5.5 (issue 3 acceptance).

Every figure cites its source. Defaults are NCCL's constants and §5.5's saturation points. One
factor comes from a measurement, and from one only: ``nvls_all_reduce_efficiency`` = H100 8-GPU
NVLS busbw 479 GB/s [S10] / NCCL's own NVLS estimate 2 × 370.8 × 0.85 GB/s (pinned below). The
Blackwell NVLS figures (GB200 72 GPUs [S29], B200 and GB200 8 GPUs [S32] [S53]) are **held out**:
NCCL's model makes NVLS all-reduce busbw independent of n, so the Hopper-derived factor predicts
them without looking at them. Figures the model misses by more than 10 % are marked
``xfail(strict=True)`` with the measured and predicted values and the reason, so a model change
that fixes (or breaks) them is noticed.

Across NVL72 racks (MNNVL: one rack = one NCCL node) the tuner chooses among ring, tree and NVLSTree,
as NCCL 2.26 does. NVLSTree (GB200: 32 heads per rack at 48.5 GB/s each, the head count NCCL 2.26.2's
own search returns, benchmarks/nccl_probe; NCCL caps 96/80 GB/s per channel) is bound by the in-rack
NVLS stage at 2 racks (≈ 808 at 16 GB vs 810 measured) and at 20 racks too (2·S/32 per head through
the tree keeps up: ≈ 810 vs 406 measured).

The 20-rack measurement [S29] (512 MB → 151, 2 GB → 287, 8 GB → 381, 16 GB → 406 GB/s) fits
t = 4.4 ms + 2(n−1)/n·S / 429 GB/s within 3 % at all four sizes: a fixed cost of a 2,878-step ring
(NVLSTree's is ~0.2 ms) and a bandwidth of about 9 NICs of 48.5 GB/s per rack. Neither NCCL's ring
model (latency 8.4 µs + 2,840 × 3.4 µs + 38 × 14 µs, × 1.4 = 14.3 ms; bandwidth min(NVLink 722,
72 NICs) = 722 GB/s → 360 at 8 GB, 480 at 16 GB) nor its NVLSTree reproduces both terms.
"""

from __future__ import annotations

import pytest

from topologies.algorithms import saturation
from topologies.collectives import collective_cost
from topologies.hardware import EfficiencyFactors, load_system
from topologies.placement import place_job

GB = 1e9


def cost(system: str, gpus: int, size: float, op: str = "all_reduce", algorithm: str | None = None,
         gpus_per_domain: int | None = None):
    sys_spec = load_system(system)
    shape = place_job(sys_spec, gpus, gpus_per_domain=gpus_per_domain).shape("world")
    return collective_cost(op, size, shape, sys_spec, algorithm)


def busbw_GBps(system: str, gpus: int, size: float, op: str = "all_reduce", algorithm: str | None = None,
               gpus_per_domain: int | None = None) -> float:
    return cost(system, gpus, size, op, algorithm, gpus_per_domain).busbw_Bps / GB


def time_us(system: str, gpus: int, size: float, algorithm: str | None = None) -> float:
    return cost(system, gpus, size, algorithm=algorithm).time_s * 1e6


def within(predicted: float, measured: float, tol: float = 0.10) -> bool:
    return abs(predicted - measured) <= tol * measured


# --- the one measured factor, and where it comes from --------------------------------------


def test_nvls_all_reduce_efficiency_is_derived_from_the_h100_figure_alone():
    """479 GB/s at 8 GB on 8 x H100 [S10] over NCCL's estimate 2 x 18 x 20.6 GB/s x 0.85 [S27],
    at the size efficiency of the 1 GB per-rank chunk: the default, to three digits."""
    h100, e = load_system("dgx-h100"), EfficiencyFactors()
    nccl_estimate_GBps = 2 * h100.nvlink.gpu_bandwidth_Bps * h100.efficiency.nvlink_bandwidth * h100.efficiency.nvls_bandwidth / GB
    assert nccl_estimate_GBps == pytest.approx(2 * 18 * 20.6 * 0.85)
    size_eff = saturation(8 * GB / 8, e.nvls_half_saturation_bytes, e.min_size_efficiency)
    assert e.nvls_all_reduce_efficiency == pytest.approx(479.0 / (nccl_estimate_GBps * size_eff), abs=5e-4)


# --- single NVLink domain ------------------------------------------------------------------


@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 479.0), (1 * GB, 466.0)])
def test_h100_8gpu_nvls_all_reduce(size, measured):
    """[S10] Azure ND H100 v5, NCCL 2.18.5 NVLS: 1 GB → 466, 8 GB → 479 GB/s busbw (8 GB is the source
    of nvls_all_reduce_efficiency; 1 GB checks the size curve)."""
    predicted = busbw_GBps("dgx-h100", 8, size, algorithm="nvls")
    assert within(predicted, measured), predicted
    assert busbw_GBps("dgx-h100", 8, size) == pytest.approx(predicted)  # the tuner picks NVLS too


@pytest.mark.parametrize(("size", "measured"), [(4 * GB, 839.0), (8 * GB, 835.0)])
def test_gb200_one_rack_nvls_all_reduce_held_out(size, measured):
    """Held out. [S29] CoreWeave GB200 NVL72, 1 rack, NCCL 2.26.2: 4 GB → 839, 8 GB → 835 GB/s busbw
    (predicted 770 and 792: 2 x 721.8 x 0.74 x 0.762 = 814 at the plateau)."""
    c = cost("gb200-nvl72", 72, size)
    assert c.algorithm == "nvls"
    assert within(c.busbw_Bps / GB, measured), c.busbw_Bps / GB


@pytest.mark.parametrize(("system", "measured"), [("dgx-b200", 830.0), ("gb200-nvl72", 811.0)])
def test_blackwell_8gpu_nvls_all_reduce_held_out(system, measured):
    """Held out. B200 HGX default '830+' [S32]; GB200 2 trays over MNNVL ~811 [S53] (8 GB)."""
    assert within(busbw_GBps(system, 8, 8 * GB), measured)


@pytest.mark.parametrize("size", [1 * GB, 4 * GB, 8 * GB])
def test_h100_8gpu_ring_all_gather(size):
    """[S64] [S28]: 8 x H100 all_gather saturates at ≈ 360 GB/s busbw ('exactly what we'd expect')."""
    predicted = busbw_GBps("dgx-h100", 8, size, op="all_gather")
    assert within(predicted, 360.0), predicted


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


# --- across NVLink domains -----------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "per_domain", "algorithm", "measured"), [
    (12, 4, "ring", 197.0), (24, 8, "ring", 394.0), (12, 4, "tree", 234.0), (24, 8, "tree", 486.0)])
def test_gb200_ib_only_partitions(gpus, per_domain, algorithm, measured):
    """[S54]: 3 x NVL4 / 3 x NVL8 GB200 partitions over CX-7, NCCL 2.27.3, 16 GB busbw: ring 197 / 394,
    tree 234 / 486 (tree has no per-channel cap here: 486 > 16 channels x NCCL's 24 GB/s)."""
    predicted = busbw_GBps("gb200-nvl72", gpus, 16 * GB, algorithm=algorithm, gpus_per_domain=per_domain)
    assert within(predicted, measured), predicted


@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 793.0), (16 * GB, 810.0)])
def test_gb200_two_racks_all_reduce(size, measured):
    """[S29] GB200 NVL72, 2 racks (IB between), NCCL 2.26.2: 8 GB → 793, 16 GB → 810 GB/s busbw.
    NVLSTree, bound by the in-rack NVLS stage (predicted 796 and 808)."""
    c = cost("gb200-nvl72", 144, size)
    assert c.algorithm == "nvls_tree"
    assert within(c.busbw_Bps / GB, measured), c.busbw_Bps / GB


def test_b200_two_nodes_all_reduce():
    """[S55] B200 HGX, 2 nodes (16 GPUs), default algorithm: 8 GB → 690 GB/s busbw (predicted 722:
    NVLSTree bound by 8 heads x 48.5 GB/s per node)."""
    assert within(busbw_GBps("dgx-b200", 16, 8 * GB), 690.0)


@pytest.mark.xfail(strict=True, reason=(
    "H100 2 nodes: measured 441 GB/s [S55], predicted 512 (+16 %): NVLSTree bound by the in-node "
    "NVLS stage (algbw 274 GB/s, the 479 GB/s busbw of 8 ranks), read as busbw over 16 ranks; the "
    "measured run sits between this pipelined bound and the phase sum (NVLS then 8 NICs: 301); "
    "NCCL's Hopper NVLSTree caps are not in the reference"))
def test_h100_two_nodes_all_reduce():
    assert within(busbw_GBps("dgx-h100", 16, 8 * GB), 441.0)


TWENTY_RACKS = (
    "20 racks: measured 381 / 406 GB/s at 8 / 16 GB [S29]; the tuner's NVLSTree predicts 795 / 810 "
    "(32 NVLS heads per rack, each on its own 48.5 GB/s NIC: the in-rack NVLS stage bounds it, as at 2 racks); "
    "the flat ring predicts 360 / 480. The measured sizes fit 4.4 ms + S/429 GB/s busbw: a ring-like "
    "fixed cost with ~9 NICs' worth of bandwidth per rack, which no sourced NCCL constant gives "
    "(8 heads instead of 16 would, but nothing but this figure says 8). NCCL 2.26.2's own search and "
    "tuner, run from its binary on a GB200 NVL72 topology (benchmarks/nccl_probe), pick NVLSTree with "
    "32 heads at 1,056 GB/s for 2 and 20 racks alike: the loss is outside NCCL's own model")


@pytest.mark.xfail(strict=True, reason=TWENTY_RACKS)
@pytest.mark.parametrize(("size", "measured"), [(8 * GB, 381.0), (16 * GB, 406.0)])
def test_gb200_twenty_racks_all_reduce(size, measured):
    """[S29] GB200 NVL72, 20 racks (1,440 GPUs), NCCL 2.26.2: 8 GB → 381, 16 GB → 406 GB/s busbw."""
    assert within(busbw_GBps("gb200-nvl72", 1440, size), measured)


def test_gb200_twenty_racks_is_nvls_tree_and_within_a_factor_two_point_two():
    """The 20-rack miss (+99 to +109 %, as NCCL's own model: +177 %), pinned so that it cannot silently grow."""
    for size, measured in ((8 * GB, 381.0), (16 * GB, 406.0)):
        c = cost("gb200-nvl72", 1440, size)
        assert c.algorithm == "nvls_tree" and measured < c.busbw_Bps / GB < 2.2 * measured


def test_gb200_twenty_racks_flat_ring_from_nccl_latency_structure():
    """The flat ring across 20 domains (2,878 steps, 38 across IB, x1.4 plateau) at 8 GB: 381 [S29]
    (at 16 GB it predicts 480, +18 %: the ring's 14.3 ms latency is too high and its 722 GB/s too fast)."""
    assert within(busbw_GBps("gb200-nvl72", 1440, 8 * GB, algorithm="ring"), 381.0)

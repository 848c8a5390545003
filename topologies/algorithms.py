"""NCCL-style cost formulas per (collective, algorithm): pure arithmetic on a GroupShape.

Structure follows NCCL's own tuner (``src/graph/tuning.cc``, 2.30.7, reference §5.3 [S27]):
``time = latency + bytes_on_the_bottleneck / bandwidth``, where

- **latency** = base + per-step latency by link class. Ring all-reduce takes 2(n−1) steps, of
  which 2(D−1) cross the network (D domains); ring AG/RS take n−1 (D−1 network); tree all-reduce
  takes 2·((g−1) NVLink + log2(D) network) steps; NVLS a flat 25 µs. Multi-domain ring latency is
  multiplied by NCCL's 1.4 "plateau" factor. Simple-protocol constants (the defaults of the
  communication fields of :class:`~topologies.hardware.EfficiencyFactors`).
- **bandwidth** per GPU and direction on the bottleneck link class: NVLink at the NCCL effective
  rate (80 % of the link rate on Blackwell, 82 % on Hopper), NVLS additionally × nvlsEfficiency
  (0.74 Blackwell, 0.85 Hopper), tree × 0.92, NIC at 97 % of line rate. A multi-domain ring runs
  one channel per NIC, so its bandwidth is min(NVLink, g × NIC) for g ranks per domain [S51] (this
  reproduces the IB-only GB200 NVL4 → 197 and NVL8 → 394 GB/s of [S54]).
- **size-dependent efficiency**: bandwidth rises with message size because NCCL splits each
  rank's chunk over channels and pipeline slots and switches protocol; modelled as the smooth
  curve x / (x + x_half) of the per-rank chunk x = S/n, with a named x_half per algorithm class
  (SimAI's measured ratio tables give x_half ≈ 1.5-2.5 MB consistently from 16 to 1,024 GPUs
  [S51]; the GB200-72 and H100-8 NVLS saturation points give ≈ 3 MB [S29] [S10]).

Bytes per GPU per direction (what the bottleneck link carries), S in nccl-tests convention:

- ring all-reduce 2(n−1)/n·S; ring AG/RS (n−1)/n·S; broadcast S;
- NVLS all-reduce S(1+1/n): the switch reads every GPU's share (multimem.ld_reduce, S out) and
  multicasts each reduced share (multimem.st, S in), each GPU also receiving/sending its own 1/n;
  NVLS AG or RS move S on one direction;
- tree all-reduce: a chain inside a domain carries S up and S down (2S per GPU); across domains
  the busiest node of a double binary tree sends and receives (tree degree)·S/2 (S for D = 2,
  1.5·S for D = 3, up to 2S), spread over its g NICs;
- hierarchical: reduce-scatter inside the domain, all-reduce of S/g per GPU across domains (g
  parallel rails), all-gather inside the domain; the phases add (NCCL synchronises them per chunk,
  the sum is the conservative bound);
- all-to-all: (g−1)/n·S over NVLink and (n−g)/n·S over the NIC, concurrently; a GPU cannot borrow
  other GPUs' NICs for all-to-all [S39].
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import log2

from topologies.groups import GroupShape
from topologies.hardware import EfficiencyFactors, SystemSpec


@dataclass(frozen=True)
class Links:
    """Effective per-GPU rates (bytes/s per direction) and latencies of one system."""

    nvlink_Bps: float  # NCCL effective NVLink per GPU (links × rate × nvlink_bandwidth)
    nvls_Bps: float  # NVLS effective per GPU (× nvls_bandwidth)
    alltoall_nvlink_Bps: float  # NVLink rate achieved by all-to-all dispatch/combine
    nic_Bps: float  # achieved NIC rate per GPU (all NICs of the GPU)
    nvls: bool
    oversubscription: float
    eff: EfficiencyFactors

    def network_Bps(self, shape: GroupShape) -> float:
        """Per-GPU network rate for a group whose traffic climbs ``shape.fabric_tiers`` tiers.

        Every GPU of a job runs its collective at once, so an oversubscribed leaf tier divides
        what each GPU gets above the leaf.
        """
        return self.nic_Bps / self.oversubscription if shape.fabric_tiers >= 2 else self.nic_Bps


@lru_cache(maxsize=256)
def links_for(system: SystemSpec) -> Links:
    """The effective link rates of ``system`` (cached per system)."""
    e, nv, so = system.efficiency, system.nvlink, system.scale_out
    raw_nvl = nv.gpu_bandwidth_Bps
    return Links(
        nvlink_Bps=raw_nvl * e.nvlink_bandwidth,
        nvls_Bps=raw_nvl * e.nvlink_bandwidth * e.nvls_bandwidth,
        alltoall_nvlink_Bps=raw_nvl * e.alltoall_bandwidth,
        nic_Bps=so.nic_bandwidth_Bps * so.nics_per_gpu * e.network_bandwidth,
        nvls=nv.nvls and nv.switch_chips > 0,
        oversubscription=so.oversubscription,
        eff=e,
    )


@dataclass(frozen=True)
class Estimate:
    """One algorithm's cost: latency + transfer, bytes per GPU per link class, and the fraction of
    each class's nominal rate it achieves at this size (what the flow view needs to replay it)."""

    algorithm: str
    latency_s: float
    transfer_s: float
    nvlink_bytes: float  # per GPU, per direction
    network_bytes: float  # per GPU, per direction
    nvlink_eff: float = 1.0  # achieved / nominal NVLink rate
    network_eff: float = 1.0  # achieved / nominal NIC rate
    parts: tuple[Estimate, ...] = ()  # hierarchical: the phases, in execution order

    @property
    def time_s(self) -> float:
        """Total predicted seconds."""
        return self.latency_s + self.transfer_s


def saturation(chunk_bytes: float, half_bytes: float, floor: float = 0.5) -> float:
    """Size-dependent efficiency max(x / (x + x_half), floor) of a per-rank chunk x (0..1].

    The floor keeps small messages latency-bound: NCCL shrinks chunks for them, so the pipeline
    fill never costs more than the transfer (``EfficiencyFactors.min_size_efficiency``).
    """
    if half_bytes <= 0:
        return 1.0
    return max(chunk_bytes / (chunk_bytes + half_bytes), floor)


def _sat(chunk_bytes: float, e: EfficiencyFactors, kind: str = "ring") -> float:
    half = {"ring": e.ring_half_saturation_bytes, "nvls": e.nvls_half_saturation_bytes,
            "alltoall": e.alltoall_half_saturation_bytes}[kind]
    return saturation(chunk_bytes, half, e.min_size_efficiency)


def _ring_bw_Bps(shape: GroupShape, lk: Links) -> float:
    """Ring bandwidth per GPU: NVLink inside a domain, min(NVLink, g × NIC) across domains."""
    if shape.domains == 1:
        return lk.nvlink_Bps
    return min(lk.nvlink_Bps, shape.ranks_per_domain * lk.network_Bps(shape))


def _ring_latency_s(steps: int, inter_steps: int, multi_domain: bool, e: EfficiencyFactors) -> float:
    lat = (steps - inter_steps) * e.nvlink_step_latency_s + inter_steps * e.network_step_latency_s
    if multi_domain:
        lat *= e.ring_plateau_latency_factor
    return e.collective_base_latency_s + lat


def _split_bytes(traffic: float, shape: GroupShape) -> tuple[float, float]:
    """(NVLink, network) bytes per GPU for ring traffic: D of the n ring hops cross domains."""
    n, d = shape.size, shape.domains
    if d == 1:
        return traffic, 0.0
    if shape.ranks_per_domain == 1:
        return 0.0, traffic
    return traffic * (n - d) / n, traffic * d / n


def _ring(name: str, traffic: float, steps: int, inter_steps: int, size_bytes: float, shape: GroupShape,
          lk: Links) -> Estimate:
    """A ring-family estimate: ``traffic`` bytes per GPU over ``steps`` ring steps."""
    e = lk.eff
    sat = _sat(size_bytes / shape.size, e)
    lat = _ring_latency_s(steps, inter_steps, shape.domains > 1, e)
    nvl, net = _split_bytes(traffic, shape)
    return Estimate(name, lat, traffic / (_ring_bw_Bps(shape, lk) * sat), nvl, net,
                    e.nvlink_bandwidth * sat, e.network_bandwidth * sat)


def _nvls(traffic: float, size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """An NVLS estimate: ``traffic`` bytes per GPU on its busier NVLink direction, flat latency."""
    e = lk.eff
    sat = _sat(size_bytes / shape.size, e, "nvls")
    return Estimate("nvls", e.nvls_latency_s, traffic / (lk.nvls_Bps * sat), traffic, 0.0,
                    e.nvlink_bandwidth * e.nvls_bandwidth * sat, e.network_bandwidth * sat)


# --------------------------------------------------------------------------- all-reduce


def ring_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Ring all-reduce: 2(n−1) steps, 2(n−1)/n·S per GPU at the ring bandwidth."""
    n, d = shape.size, shape.domains
    return _ring("ring", 2 * (n - 1) / n * size_bytes, 2 * (n - 1), 2 * (d - 1), size_bytes, shape, lk)


@lru_cache(maxsize=2048)
def double_binary_tree(domains: int) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """The two (parent, child) edge lists of a double binary tree over ``domains`` nodes.

    Tree 1 is the heap tree (parent of i is (i−1)//2); tree 2 mirrors it (i ↔ D−1−i), so leaves of
    one tree are inner nodes of the other, as in NCCL's double binary tree; each carries half the data.
    """
    t1 = tuple(((i - 1) // 2, i) for i in range(1, domains))
    t2 = tuple((domains - 1 - p, domains - 1 - c) for p, c in t1)
    return t1, t2


@lru_cache(maxsize=2048)
def tree_network_factor(domains: int) -> float:
    """Bytes the busiest node sends per direction, in units of S: (its tree degree) × S/2.

    1 for 2 domains, 1.5 for 3, up to 2 for large trees (SimAI's tree/ring ratios ×2 and ×4/3 [S51]).
    """
    if domains < 2:
        return 0.0
    degree = [0] * domains
    for tree in double_binary_tree(domains):
        for p, c in tree:
            degree[p] += 1
            degree[c] += 1
    return max(degree) / 2


def tree_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Double binary tree across domains with a chain inside each (NCCL Tree, ×0.92 de-rate)."""
    n, g, d, e = shape.size, shape.ranks_per_domain, shape.domains, lk.eff
    lat = e.collective_base_latency_s + 2 * ((g - 1) * e.nvlink_tree_step_latency_s
                                             + log2(d) * e.network_tree_step_latency_s)
    rates = []
    if g > 1:
        rates.append(lk.nvlink_Bps / 2)  # chain: S up and S down on each GPU's NVLink
    net_factor = tree_network_factor(d)
    if d > 1:
        rates.append(g * lk.network_Bps(shape) / net_factor)
    eff = e.tree_bandwidth * _sat(size_bytes / n, e)
    nvl = 2 * size_bytes if g > 1 else 0.0
    net = net_factor * size_bytes / g if d > 1 else 0.0
    return Estimate("tree", lat, size_bytes / (min(rates) * eff), nvl, net,
                    e.nvlink_bandwidth * eff, e.network_bandwidth * eff)


def nvls_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """NVLink SHARP inside one domain: S(1+1/n) per direction at the NVLS rate, flat latency."""
    return _nvls(size_bytes * (1 + 1 / shape.size), size_bytes, shape, lk)


def inter_shape(shape: GroupShape) -> GroupShape:
    """The per-rail group across domains of a hierarchical collective (one rank per domain)."""
    return GroupShape(size=shape.domains, ranks_per_domain=1, domains=shape.domains, tiers=shape.tiers)


def _best(estimates: list[Estimate]) -> Estimate:
    return min(estimates, key=lambda est: est.time_s)


def hierarchical_parts(op: str, size_bytes: float, shape: GroupShape, lk: Links) -> tuple[Estimate, Estimate]:
    """(phase inside each domain on S, phase across domains on S/g per rail), in execution order.

    All-reduce: NVLS or ring all-reduce inside (= reduce-scatter + all-gather on the domain's
    links) then ring or tree across; reduce-scatter: inside first; all-gather: across first.
    """
    g = shape.ranks_per_domain
    inner, across = GroupShape.single_domain(g), inter_shape(shape)
    if op == "all_reduce":
        intra = _best([ring_all_reduce(size_bytes, inner, lk)] + ([nvls_all_reduce(size_bytes, inner, lk)] if lk.nvls else []))
        inter = _best([ring_all_reduce(size_bytes / g, across, lk), tree_all_reduce(size_bytes / g, across, lk)])
        return intra, inter
    intra = _best([ring_gather(size_bytes, inner, lk)] + ([nvls_gather(size_bytes, inner, lk)] if lk.nvls else []))
    inter = ring_gather(size_bytes / g, across, lk)
    return (inter, intra) if op == "all_gather" else (intra, inter)


def _hierarchical(op: str, size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    first, second = hierarchical_parts(op, size_bytes, shape, lk)
    intra, inter = (second, first) if op == "all_gather" else (first, second)
    return Estimate(f"hierarchical({intra.algorithm}+{inter.algorithm})", first.latency_s + second.latency_s,
                    first.transfer_s + second.transfer_s, intra.nvlink_bytes, inter.network_bytes,
                    parts=(first, second))


def hierarchical_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """RS + AG inside each domain (NVLS or ring, as one all-reduce) + ring/tree AR of S/g across."""
    return _hierarchical("all_reduce", size_bytes, shape, lk)


# --------------------------------------------------------------- reduce-scatter / all-gather


def ring_gather(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Ring reduce-scatter or all-gather: n−1 steps, (n−1)/n·S per GPU."""
    n, d = shape.size, shape.domains
    return _ring("ring", (n - 1) / n * size_bytes, n - 1, d - 1, size_bytes, shape, lk)


def nvls_gather(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """NVLS reduce-scatter (ld_reduce) or all-gather (multicast store): S on one direction."""
    return _nvls(size_bytes, size_bytes, shape, lk)


def pat_gather(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """NCCL PAT (one rank per domain): log2(n) network steps, ring traffic at pat_bandwidth of the NIC."""
    n, e = shape.size, lk.eff
    lat = e.collective_base_latency_s + log2(n) * e.network_step_latency_s
    traffic = (n - 1) / n * size_bytes
    eff = e.pat_bandwidth * _sat(size_bytes / n, e)
    return Estimate("pat", lat, traffic / (lk.network_Bps(shape) * eff), 0.0, traffic,
                    e.nvlink_bandwidth * eff, e.network_bandwidth * eff)


def hierarchical_reduce_scatter(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Reduce-scatter inside each domain (NVLS or ring) then ring reduce-scatter of S/g across."""
    return _hierarchical("reduce_scatter", size_bytes, shape, lk)


def hierarchical_all_gather(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Ring all-gather of S/g across domains then all-gather inside each (NVLS or ring)."""
    return _hierarchical("all_gather", size_bytes, shape, lk)


def direct_gather_v(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Variable-size all-gather as grouped send/recv: every GPU receives each peer's share directly.

    Latency is the ring all-gather's times ``all_gather_v_latency_factor`` (no pipelining across
    peers); off-domain shares arrive through the GPU's own NIC (no rail aggregation).
    """
    n, g, e = shape.size, shape.ranks_per_domain, lk.eff
    ring_lat = _ring_latency_s(n - 1, shape.domains - 1, shape.domains > 1, e)
    lat = e.collective_base_latency_s + (ring_lat - e.collective_base_latency_s) * e.all_gather_v_latency_factor
    nvl = size_bytes * (g - 1) / n
    net = size_bytes * (n - g) / n
    sat = _sat(size_bytes / n, e)
    t = max(nvl / lk.nvlink_Bps, net / lk.network_Bps(shape) if net else 0.0) / sat
    return Estimate("direct", lat, t, nvl, net, e.nvlink_bandwidth * sat, e.network_bandwidth * sat)


# ---------------------------------------------------------- broadcast, all-to-all, p2p


def ring_broadcast(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Pipelined chain broadcast: n−1 steps, S through every GPU."""
    n, d = shape.size, shape.domains
    return _ring("ring", size_bytes, n - 1, d - 1, size_bytes, shape, lk)


def nvls_broadcast(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Multicast broadcast inside one domain: the root sends S once, the switch replicates."""
    return _nvls(size_bytes, size_bytes, shape, lk)


def direct_all_to_all(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """All-to-all: (g−1)/n·S over NVLink and (n−g)/n·S over the GPU's NIC, concurrently."""
    n, g, e = shape.size, shape.ranks_per_domain, lk.eff
    nvl = size_bytes * (g - 1) / n
    net = size_bytes * (n - g) / n if shape.domains > 1 else 0.0
    step = e.network_step_latency_s if shape.domains > 1 else e.nvlink_step_latency_s
    sat = _sat(size_bytes / n, e, "alltoall")
    t = max(nvl / lk.alltoall_nvlink_Bps, net / lk.network_Bps(shape) if net else 0.0) / sat
    return Estimate("direct", e.collective_base_latency_s + step, t, nvl, net,
                    e.alltoall_bandwidth * sat, e.network_bandwidth * sat)


def direct_send_recv(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Point-to-point: NVLink inside a domain, the NIC across domains (the slower pair bounds)."""
    e = lk.eff
    across = shape.domains > 1
    bw = lk.network_Bps(shape) if across else lk.nvlink_Bps
    step = e.network_step_latency_s if across else e.nvlink_step_latency_s
    sat = _sat(size_bytes, e)
    return Estimate("direct", e.collective_base_latency_s + step, size_bytes / (bw * sat),
                    0.0 if across else size_bytes, size_bytes if across else 0.0,
                    e.nvlink_bandwidth * sat, e.network_bandwidth * sat)

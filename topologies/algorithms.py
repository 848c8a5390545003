"""NCCL-style cost formulas per (collective, algorithm): pure arithmetic on a GroupShape.

Structure follows NCCL's own tuner (``src/graph/tuning.cc``, 2.30.7, reference §5.3 [S27]):
``time = latency + bytes_on_the_bottleneck / bandwidth``, where

- **latency** = base + per-step latency by link class. Ring all-reduce takes 2(n−1) steps, of
  which 2(D−1) cross the network (D domains); ring AG/RS take n−1 (D−1 network); tree all-reduce
  takes 2·((g−1) NVLink + log2(D) network) steps; NVLS a flat 25 µs; NVLSTree 25 µs + 2·log2(D)
  network tree levels of 20.9 µs. Multi-domain ring latency is multiplied by NCCL's 1.4 "plateau"
  factor, and its NVLink steps cost at least NCCL's host "net overhead". Simple-protocol constants
  (the defaults of the communication fields of :class:`~topologies.hardware.EfficiencyFactors`).
- **bandwidth** per GPU and direction on the bottleneck link class: NVLink at the NCCL effective
  rate (40.1 of 50 GB/s per link on Blackwell, 20.6 of 25 on Hopper), tree × 0.92, NIC at 97 % of
  line rate. A multi-domain ring runs one channel per NIC, so its bandwidth is min(NVLink, g × NIC)
  for g ranks per domain [S51] (this reproduces the IB-only GB200 NVL4 → 197 and NVL8 → 394 GB/s
  of [S54]).
- **NVLS all-reduce** follows NCCL's model, which rates the **busbw**, not the wire: busbw =
  2 × (effective NVLink per GPU) × nvlsEfficiency (0.74 Blackwell, 0.85 Hopper) × the named
  ``nvls_all_reduce_efficiency`` (achieved / NCCL estimate, derived from the H100 8-GPU figure
  only), the same at every n (measured: H100-8 479, B200-8 830+, GB200-8 811, GB200-72 839 GB/s
  [S10] [S32] [S53] [S29]); algbw = busbw·n/(2(n−1)). The wire, S(1+1/n) per GPU per direction,
  bounds it from below for small n. NVLS AG/RS/broadcast keep NCCL's estimate (no measurement).
- **NVLSTree** (NVLS inside each domain, a double binary tree of domains across; NCCL's multi-node
  NVLS all-reduce): the in-domain NVLS stage and the tree stage are pipelined chunk by chunk, so the
  slower one bounds. The tree runs on ``nvls_tree_channels`` heads per domain (one channel per head,
  each head on its own NIC); the busiest head moves (tree degree)·S/2 per channel share; NCCL's
  per-channel busbw caps (Blackwell 96 GB/s for 2 domains, 80 for more) bound the total.
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
- NVLSTree: S(1+1/g) on NVLink per GPU; (tree degree)·S/(2h) on each of the h heads' NICs;
- hierarchical (forced only, :mod:`topologies.hierarchical`): RS inside the domain, AR of S/g
  per GPU across domains on g parallel rails, AG inside; the phases add;
- all-to-all: (g−1)/n·S over NVLink and (n−g)/n·S over the NIC, concurrently; a GPU cannot borrow
  other GPUs' NICs for all-to-all [S39].
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import log2

from topologies.groups import GroupShape
from topologies.hardware import EfficiencyFactors, SystemSpec
from topologies.identity_memo import IdentityMemo


@dataclass(frozen=True)
class Links:
    """Effective per-GPU rates (bytes/s per direction) and latencies of one system."""

    nvlink_raw_Bps: float  # nominal NVLink per GPU (links × rate)
    nvlink_Bps: float  # NCCL effective NVLink per GPU (links × rate × nvlink_bandwidth)
    nvls_Bps: float  # NCCL's NVLS rate per GPU (× nvls_bandwidth): AG/RS/broadcast
    nvls_all_reduce_busbw_Bps: float  # NVLS all-reduce busbw plateau, independent of n
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


_LINKS: IdentityMemo[Links] = IdentityMemo(256)  # keyed by the system's identity (hashing it costs more than a hit)


def links_for(system: SystemSpec) -> Links:
    """The effective link rates of ``system`` (cached per system object)."""
    hit = _LINKS.get((), system)
    return hit if hit is not None else _LINKS.put(_links(system), (), system)


def clear_links_cache() -> None:
    """Forget the memoised link rates."""
    _LINKS.clear()


def _links(system: SystemSpec) -> Links:
    e, nv, so = system.efficiency, system.nvlink, system.scale_out
    raw_nvl = nv.gpu_bandwidth_Bps
    return Links(
        nvlink_raw_Bps=raw_nvl,
        nvlink_Bps=raw_nvl * e.nvlink_bandwidth,
        nvls_Bps=raw_nvl * e.nvlink_bandwidth * e.nvls_bandwidth,
        nvls_all_reduce_busbw_Bps=2 * raw_nvl * e.nvlink_bandwidth * e.nvls_bandwidth * e.nvls_all_reduce_efficiency,
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
    """NCCL ring latency (s): base + intra steps × NVLink step + inter steps × network step.

    Across domains an NVLink step costs at least the host net overhead, and the step sum is
    multiplied by the plateau factor (tuning.cc [S27]).
    """
    intra = max(e.nvlink_step_latency_s, e.network_host_overhead_s) if multi_domain else e.nvlink_step_latency_s
    lat = (steps - inter_steps) * intra + inter_steps * e.network_step_latency_s
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


def _achieved(nbytes: float, seconds: float, nominal_Bps: float, fallback: float) -> float:
    """Achieved fraction nbytes / (seconds × nominal) of a link class (``fallback`` when idle)."""
    return nbytes / (seconds * nominal_Bps) if seconds > 0 and nbytes > 0 else fallback


def nvls_all_reduce_transfer_s(size_bytes: float, ranks: int, lk: Links) -> float:
    """Seconds to move an NVLS all-reduce of ``size_bytes`` over ``ranks`` GPUs of one domain.

    NCCL's model: busbw = ``lk.nvls_all_reduce_busbw_Bps`` whatever n, so the time is
    2(n−1)/n·S / busbw (× the size efficiency of the per-rank chunk S/n); never faster than the
    wire, S(1+1/n) per GPU per direction at the effective NVLink rate.
    """
    sat = _sat(size_bytes / ranks, lk.eff, "nvls")
    model = 2 * (ranks - 1) / ranks * size_bytes / (lk.nvls_all_reduce_busbw_Bps * sat)
    wire = size_bytes * (1 + 1 / ranks) / (lk.nvlink_Bps * sat)
    return max(model, wire)


def nvls_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """NVLink SHARP inside one domain: n-independent busbw (NCCL's model), flat latency."""
    e, n = lk.eff, shape.size
    t = nvls_all_reduce_transfer_s(size_bytes, n, lk)
    wire = size_bytes * (1 + 1 / n)
    sat = _sat(size_bytes / n, e, "nvls")
    return Estimate("nvls", e.nvls_latency_s, t, wire, 0.0,
                    _achieved(wire, t, lk.nvlink_raw_Bps, e.nvlink_bandwidth * sat), e.network_bandwidth * sat)


def nvls_tree_heads(ranks_per_domain: int, e: EfficiencyFactors) -> int:
    """NVLSTree heads (= channels) per domain: ``nvls_tree_channels``, at most one per rank."""
    return max(1, min(e.nvls_tree_channels, ranks_per_domain))


def nvls_tree_head_slots(ranks_per_domain: int, heads: int) -> tuple[int, ...]:
    """Which of a domain's ranks (by position) are heads: spread evenly over the domain."""
    return tuple(sorted({(k * ranks_per_domain) // heads for k in range(heads)}))


def nvls_tree_all_reduce(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """NCCL NVLSTree: NVLS inside each domain pipelined with a double binary tree across domains.

    Stages (the slowest bounds, NCCL pipelines chunks through them):

    - inside: an NVLS all-reduce of S over the domain's g ranks (n-independent busbw);
    - across: h = ``nvls_tree_heads`` heads per domain, each carrying S/h through a double binary
      tree of the D domains on its own NIC: (tree degree)·S/(2h) per direction, size efficiency
      of its per-rank chunk S/(h·D);
    - NCCL's per-channel cap: busbw ≤ h × cap (96 GB/s per channel for 2 domains, 80 for more).

    Latency: NVLS's flat 25 µs + 2·log2(D) network tree levels (NCCL's NVLSTree latency; its
    base latency is 0 as for NVLS, and the fabric's own latencyInter is not modelled).
    """
    n, g, d, e = shape.size, shape.ranks_per_domain, shape.domains, lk.eff
    h = nvls_tree_heads(g, e)
    t_intra = nvls_all_reduce_transfer_s(size_bytes, g, lk)
    head_bytes = tree_network_factor(d) * size_bytes / h
    sat_net = _sat(size_bytes / (h * d), e)
    t_inter = head_bytes / (lk.network_Bps(shape) * sat_net)
    cap = e.nvls_tree_channel_cap_2_domains_Bps if d == 2 else e.nvls_tree_channel_cap_Bps
    t_cap = 2 * (n - 1) / n * size_bytes / (h * cap)
    t = max(t_intra, t_inter, t_cap)
    lat = e.nvls_latency_s + 2 * log2(d) * e.nvls_tree_network_step_latency_s
    wire = size_bytes * (1 + 1 / g)
    return Estimate("nvls_tree", lat, t, wire, head_bytes,
                    _achieved(wire, max(t_intra, t_cap), lk.nvlink_raw_Bps, e.nvlink_bandwidth),
                    e.network_bandwidth * sat_net)


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

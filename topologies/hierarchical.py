"""The idealised hierarchical collectives: NVLS or ring inside each NVLink domain, ring or tree
across domains on every rail (each of the g ranks of a domain drives its own NIC).

NCCL 2.26 has no such all-reduce (nor RS/AG without CollNet): its multi-node choices are ring, tree
and NVLSTree (:func:`topologies.algorithms.nvls_tree_all_reduce`). These formulas are what the
fabric allows, so :mod:`topologies.collectives` runs them only when forced (``--algorithm
hierarchical``); the default tuner never picks them. Phases, bytes and latencies follow
:mod:`topologies.algorithms`:

- all-reduce: reduce-scatter + all-gather inside the domain (one NVLS or ring all-reduce of S),
  then a ring or tree all-reduce of S/g across domains per rail; reduce-scatter: inside first,
  then ring RS of S/g across; all-gather: ring AG of S/g across first, then inside;
- the phases add (NCCL would synchronise them per chunk; the sum is the conservative bound).
"""

from __future__ import annotations

from topologies.algorithms import (
    Estimate,
    Links,
    nvls_all_reduce,
    nvls_gather,
    ring_all_reduce,
    ring_gather,
    tree_all_reduce,
)
from topologies.groups import GroupShape


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


def hierarchical_reduce_scatter(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Reduce-scatter inside each domain (NVLS or ring) then ring reduce-scatter of S/g across."""
    return _hierarchical("reduce_scatter", size_bytes, shape, lk)


def hierarchical_all_gather(size_bytes: float, shape: GroupShape, lk: Links) -> Estimate:
    """Ring all-gather of S/g across domains then all-gather inside each (NVLS or ring)."""
    return _hierarchical("all_gather", size_bytes, shape, lk)

"""Collective costs on a GroupShape, with NCCL-style algorithm selection (the fast path).

``size_bytes`` follows nccl-tests (and :mod:`workloads.comm`): the buffer for all-reduce and
broadcast, the full gathered array for all-gather / reduce-scatter / all_gather_v, the per-rank send
buffer for all-to-all, the message for send_recv.

Public API (stable; the step engines call it):

- :func:`collective_time_s` ``(op, size_bytes, shape, system, algorithm=None) -> float``: seconds,
  pure arithmetic and cached (no graph). The analytic engine calls it ~100 times per scenario.
- :func:`collective_cost`: the same with details (:class:`CollectiveCost`: algorithm chosen,
  algbw/busbw as nccl-tests reports them, bytes per GPU per link class, every candidate's time).
- :func:`eligible_algorithms` (the tuner's candidates), :func:`forceable_algorithms`,
  :func:`algorithm_estimate`, :func:`bus_factor`, :data:`OPS`, :data:`ALGORITHMS`.

Algorithms: ``ring``, ``tree`` (all-reduce), ``nvls`` (one NVLink domain with NVLink SHARP),
``nvls_tree`` (all-reduce across domains: NVLS inside, tree across, NCCL's NVLSTree), ``pat``
(AG/RS with one rank per domain), ``direct`` (all-to-all, send_recv, all_gather_v), and
``hierarchical`` (NVLS or ring inside domains + ring/tree across on every rail).

The tuner considers what NCCL 2.26 (reference §5.2 [S27]) would: with MNNVL each NVLink domain is
one NCCL node, NVLS runs only inside one node (it is disabled for nNodes > 1 without CollNet), so
an all-reduce across domains chooses among ring, tree and NVLSTree; AG/RS across domains among ring
and PAT (one rank per node). Without ``algorithm`` the tuner picks the one with the smallest
predicted time. ``hierarchical`` is an idealised algorithm NCCL does not have: it runs only when
forced (:func:`forceable_algorithms`). A forced algorithm that cannot run is a one-line
UserInputError. Formulas and sources: :mod:`topologies.algorithms`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from topologies import algorithms as alg
from topologies import hierarchical as hier
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from topologies.inputs import UserInputError, guess_hint

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_gather_v", "broadcast", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical", "pat", "direct")

Formula = Callable[[float, GroupShape, alg.Links], alg.Estimate]


@dataclass(frozen=True)
class CollectiveCost:
    """Predicted cost of one collective on one group (all GPUs of the group run it together)."""

    op: str
    size_bytes: float
    group_size: int
    algorithm: str  # the family (ring, tree, nvls, nvls_tree, hierarchical, pat, direct, none)
    detail: str  # e.g. "hierarchical(nvls+ring)"
    time_s: float
    latency_s: float
    transfer_s: float
    nvlink_bytes_per_gpu: float  # per direction
    network_bytes_per_gpu: float  # per direction
    candidates: tuple[tuple[str, float], ...] = ()  # (algorithm, time_s) of every eligible one

    @property
    def algbw_Bps(self) -> float:
        """nccl-tests algorithm bandwidth: size / time (bytes/s)."""
        return self.size_bytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def busbw_Bps(self) -> float:
        """nccl-tests bus bandwidth: algbw × the op's bus factor (bytes/s)."""
        return self.algbw_Bps * bus_factor(self.op, self.group_size)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (SI units in the keys)."""
        data = asdict(self)
        data["candidates"] = dict(self.candidates)
        data["algbw_Bps"] = self.algbw_Bps
        data["busbw_Bps"] = self.busbw_Bps
        return data


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw/algbw factor: 2(n−1)/n all-reduce, (n−1)/n AG/RS/all-to-all, 1 otherwise."""
    if n <= 1:
        return 0.0 if op not in ("broadcast", "send_recv") else 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    return (n - 1) / n


def _candidates(op: str, shape: GroupShape, lk: alg.Links) -> dict[str, Formula]:
    """The algorithms NCCL's tuner would consider for ``op`` on this shape (see the module doc)."""
    n, g, d = shape.size, shape.ranks_per_domain, shape.domains
    nvls_ok = lk.nvls and d == 1 and n > 1
    if op == "all_reduce":
        c: dict[str, Formula] = {"ring": alg.ring_all_reduce, "tree": alg.tree_all_reduce}
        if nvls_ok:
            c["nvls"] = alg.nvls_all_reduce
        if lk.nvls and d > 1 and g > 1:
            c["nvls_tree"] = alg.nvls_tree_all_reduce
        return c
    if op in ("reduce_scatter", "all_gather"):
        c = {"ring": alg.ring_gather}
        if nvls_ok:
            c["nvls"] = alg.nvls_gather
        if d > 1 and g == 1:
            c["pat"] = alg.pat_gather
        return c
    if op == "all_gather_v":
        return {"direct": alg.direct_gather_v}
    if op == "broadcast":
        c = {"ring": alg.ring_broadcast}
        if nvls_ok:
            c["nvls"] = alg.nvls_broadcast
        return c
    if op == "all_to_all":
        return {"direct": alg.direct_all_to_all}
    if op == "send_recv":
        return {"direct": alg.direct_send_recv}
    raise UserInputError(f"unknown collective '{op}'; valid: {', '.join(OPS)}")


_HIERARCHICAL: dict[str, Formula] = {"all_reduce": hier.hierarchical_all_reduce,
                                     "reduce_scatter": hier.hierarchical_reduce_scatter,
                                     "all_gather": hier.hierarchical_all_gather}


def _forceable(op: str, shape: GroupShape, lk: alg.Links) -> dict[str, Formula]:
    """The tuner's candidates plus the idealised ``hierarchical`` where it can run (forced only)."""
    c = dict(_candidates(op, shape, lk))
    if op in _HIERARCHICAL and shape.domains > 1 and shape.ranks_per_domain > 1:
        c["hierarchical"] = _HIERARCHICAL[op]
    return c


def eligible_algorithms(op: str, shape: GroupShape, system: SystemSpec) -> list[str]:
    """Algorithms the tuner considers for ``op`` on a group of this shape on this system."""
    return list(_candidates(op, shape, alg.links_for(system)))


def forceable_algorithms(op: str, shape: GroupShape, system: SystemSpec) -> list[str]:
    """Algorithms ``--algorithm`` may force: the tuner's plus the idealised ``hierarchical``."""
    return list(_forceable(op, shape, alg.links_for(system)))


def _check(op: str, size_bytes: float, algorithm: str | None) -> None:
    if op not in OPS:
        raise UserInputError(f"unknown collective '{op}'; valid: {', '.join(OPS)}")
    if size_bytes < 0 or size_bytes != size_bytes:
        raise UserInputError(f"collective size must be a non-negative number of bytes, got {size_bytes}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise UserInputError(f"unknown algorithm '{algorithm}'{guess_hint(algorithm, ALGORITHMS)}; "
                             f"valid: {', '.join(ALGORITHMS)}")


_COSTS: IdentityMemo[CollectiveCost] = IdentityMemo(65536)  # the system keyed by identity (hashing it costs more than a hit)


def clear_cost_cache() -> None:
    """Forget every memoised collective cost and link rate (benchmarks time cold queries)."""
    _COSTS.clear()
    alg.clear_links_cache()


def collective_cost(op: str, size_bytes: float, shape: GroupShape, system: SystemSpec,
                    algorithm: str | None = None) -> CollectiveCost:
    """Cost of ``op`` on ``size_bytes`` over a group of ``shape``: time (s), algorithm, bytes.

    The tuner evaluates every eligible algorithm and keeps the fastest unless ``algorithm`` forces
    one (``candidates`` then also lists the forced one). Groups of one rank and empty messages cost
    nothing (algorithm ``none``). Memoised per (op, size, shape, algorithm) and system identity.
    """
    key = (op, size_bytes, shape, algorithm)
    hit = _COSTS.get(key, system)
    if hit is None:
        hit = _COSTS.put(_collective_cost(op, size_bytes, shape, system, algorithm), key, system)
    return hit


def _collective_cost(op: str, size_bytes: float, shape: GroupShape, system: SystemSpec,
                     algorithm: str | None) -> CollectiveCost:
    """:func:`collective_cost` computed afresh."""
    _check(op, size_bytes, algorithm)
    n = shape.size
    if n <= 1 or size_bytes == 0:
        return CollectiveCost(op, float(size_bytes), n, "none", "none", 0.0, 0.0, 0.0, 0.0, 0.0)
    lk = alg.links_for(system)
    formulas = _candidates(op, shape, lk)
    if algorithm is not None and algorithm not in formulas:
        forceable = _forceable(op, shape, lk)
        if algorithm not in forceable:
            raise UserInputError(
                f"algorithm '{algorithm}' cannot run {op} on a group of {n} ranks over {shape.domains} "
                f"NVLink domain(s) of {system.name}; eligible: {', '.join(forceable)}")
        formulas = {**formulas, algorithm: forceable[algorithm]}
    ests = {name: f(float(size_bytes), shape, lk) for name, f in formulas.items()}
    name = algorithm if algorithm is not None else min(ests, key=lambda k: ests[k].time_s)
    est = ests[name]
    return CollectiveCost(
        op=op, size_bytes=float(size_bytes), group_size=n, algorithm=name, detail=est.algorithm,
        time_s=est.time_s, latency_s=est.latency_s, transfer_s=est.transfer_s,
        nvlink_bytes_per_gpu=est.nvlink_bytes, network_bytes_per_gpu=est.network_bytes,
        candidates=tuple((k, v.time_s) for k, v in ests.items()),
    )


def algorithm_estimate(op: str, size_bytes: float, shape: GroupShape, system: SystemSpec,
                       algorithm: str) -> alg.Estimate:
    """The :class:`~topologies.algorithms.Estimate` of one eligible algorithm (phases, efficiencies)."""
    _check(op, size_bytes, algorithm)
    formulas = _forceable(op, shape, alg.links_for(system))
    if algorithm not in formulas:
        raise UserInputError(f"algorithm '{algorithm}' cannot run {op} on this group; eligible: {', '.join(formulas)}")
    return formulas[algorithm](float(size_bytes), shape, alg.links_for(system))


def collective_time_s(op: str, size_bytes: float, shape: GroupShape, system: SystemSpec,
                      algorithm: str | None = None) -> float:
    """Seconds for one collective ``op`` of ``size_bytes`` over a group of ``shape`` (cached)."""
    return collective_cost(op, size_bytes, shape, system, algorithm).time_s

"""Placement of Megatron's process groups onto GPUs, NVLink domains and fabric tiers.

Rank order (Megatron-Core ``RankGenerator``, order "tp-cp-ep-dp-pp" [S47]): tp fastest, then cp,
then dp, then pp (with ``--use-tp-pp-dp-mapping``, order "tp-cp-ep-pp-dp": pp stride tp·cp, dp
stride tp·pp, expert-dp stride etp·ep·pp; :func:`place_job`); expert layers re-view the same ranks as etp fastest, then ep, then expert-dp,
then pp. A group kind is therefore a set of ranks ``base + k * stride`` (k = 0..size-1):

=========== ============================ =========================
kind        size                         stride (in ranks)
=========== ============================ =========================
tp          tp                           1
cp          cp                           tp
dp          dp × cp (gradient group)     tp
etp         etp                          1
ep          ep                           etp
etp_ep      etp · ep                     1
expert_dp   gpus / (etp · ep · pp)       etp · ep
dp_instance dp × cp / k                  tp
dp_across   k                            tp · dp × cp / k
pp          pp                           gpus / pp
embd        2 (1 when pp = 1)            (pp − 1) · gpus / pp   (tp-pp-dp: (pp − 1) · tp·cp)
world       gpus                         1
=========== ============================ =========================

``embd`` is Megatron's embedding group (``default_embedding_ranks(pp_ranks)`` = ``[pp_ranks[0],
pp_ranks[-1]]``, one per pipeline group): the first and the last pipeline stage's rank at the same
position, over which a word embedding duplicated on the last stage (tied output layer, or the MTP
layers' copy) has its gradient all-reduced. There are gpus / pp such groups and, for pp > 2, they do
not tile the ranks (middle stages are in none), so they are described by their first members
instead: ``b = j · period + t`` (t < width, j < gpus / (pp · width)) paired with ``b + stride``.
Default order: width gpus / pp (the whole first stage, one block). tp-pp-dp order: width tp·cp (a
dp replica's first stage), period tp·cp·pp (one dp replica), stride (pp − 1) · tp·cp — both ends in
the same replica's block of adjacent ranks (:meth:`JobPlacement.embd_pattern`).

With ``k = instances`` distributed-optimizer instances (Megatron ``--num-distributed-optimizer-instances``)
the data-parallel group splits into ``k`` instance groups of consecutive dp ranks (``dp_instance``,
``expert_dp_instance``) that shard the optimizer, and the groups across them (``dp_across``,
``expert_dp_across``) that all-reduce the reduced shards (Megatron-Core's intra / inter distributed-
optimizer-instance groups).

Ranks fill ``gpus_per_domain`` slots of each NVLink domain in order (:mod:`topologies.layout`).

**Policy for jobs that do not fill domains** (stated, overridable): a job uses the largest divisor
of its GPU count that does not exceed the domain size and is a multiple of the model-parallel block
(tp·cp, and etp·ep when that fits a domain) so that those groups never straddle domains; without
such a divisor, the largest divisor. 256 GPUs on NVL72 → 64 per rack on four racks (NVIDIA's Kimi
K2 run [S47]); 1,440 → 72; 100,000 with tp=8 → 40 (50 would split tp groups across racks).
``Placement.gpus_per_domain`` in the scenario (``--gpus-per-domain``) overrides it.

Shapes are computed arithmetically, never by listing 100,000 GPUs: :meth:`JobPlacement.shape` is
O(1) for regular groups and O(size) numpy for the rare irregular ones; member lists are built only
on request (:meth:`JobPlacement.group_gpus`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from topologies.inputs import UserInputError, guess_hint
from topologies.layout import FabricLayout, fabric_layout

GROUP_KINDS = ("tp", "cp", "dp", "etp", "ep", "etp_ep", "expert_dp", "pp", "embd", "world", "dp_instance",
               "dp_across", "expert_dp_instance", "expert_dp_across")


def default_gpus_per_domain(system: SystemSpec, gpus: int, block: int = 1) -> int:
    """The default policy: GPUs a job uses per NVLink domain.

    The largest divisor of ``gpus`` not exceeding the domain size, preferring multiples of
    ``block`` (the model-parallel block that should not straddle domains, e.g. tp·cp) when one exists.
    """
    size = system.nvlink.domain_size
    if gpus <= size:
        return gpus
    divisors = [d for d in range(1, size + 1) if gpus % d == 0]
    aligned = [d for d in divisors if d % block == 0]
    return max(aligned or divisors)


def _policy_block(domain_size: int, tp: int, cp: int, ep: int, etp: int) -> int:
    """Block that rack boundaries should respect: tp·cp, and the expert block etp·ep when it fits."""
    from math import lcm

    block = tp * cp if tp * cp <= domain_size else 1
    expert = etp * ep
    if expert <= domain_size and lcm(block, expert) <= domain_size:
        block = lcm(block, expert)
    return block


@dataclass(frozen=True)
class JobPlacement:
    """Strides and sizes of every process group of a job, on domains of ``gpus_per_domain``."""

    gpus: int
    gpus_per_domain: int
    tp: int
    cp: int
    ep: int
    etp: int
    pp: int
    layout: FabricLayout | None = None
    tp_pp_dp: bool = False  # Megatron --use-tp-pp-dp-mapping: order tp-cp-ep-pp-dp (pp inside dp)
    instances: int = 1  # distributed-optimizer instances (1: the optimizer shards over the whole dp group)

    @property
    def dp(self) -> int:
        """Dense data-parallel size (without cp)."""
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size."""
        return self.gpus // (self.etp * self.ep * self.pp)

    @property
    def domains(self) -> int:
        """NVLink domains the job occupies."""
        return self.gpus // self.gpus_per_domain

    def size_and_stride(self, kind: str) -> tuple[int, int]:
        """(size, stride in rank order) of a group kind."""
        table = self._group_table
        if kind not in table:
            raise UserInputError(f"unknown group '{kind}'{guess_hint(kind, table)}; valid: {', '.join(table)}")
        return table[kind]

    @cached_property
    def _group_table(self) -> dict[str, tuple[int, int]]:
        """(size, stride) of every group kind (built once per placement)."""
        table = {
            "tp": (self.tp, 1),
            "cp": (self.cp, self.tp),
            "dp": (self.dp * self.cp, self.tp),  # gradients reduce over the combined dp×cp group
            "etp": (self.etp, 1),
            "ep": (self.ep, self.etp),
            "etp_ep": (self.etp * self.ep, 1),  # the allgather MoE dispatcher's group (Megatron tp_ep)
            "expert_dp": (self.expert_dp, self.etp * self.ep),
            "pp": (self.pp, self.gpus // self.pp),
            "embd": (2, self.embd_pattern()[2]) if self.pp > 1 else (1, 1),  # first and last stage
            "world": (self.gpus, 1),
        }
        if self.tp_pp_dp:  # pipeline stages adjacent (stride tp·cp), data-parallel replicas outermost
            table |= {"pp": (self.pp, self.tp * self.cp), "dp": (self.dp, self.tp * self.pp),
                      "expert_dp": (self.expert_dp, self.etp * self.ep * self.pp)}
        for group in ("dp", "expert_dp"):  # k instances of consecutive dp ranks, and the groups across them
            size, stride = table[group]
            table[f"{group}_instance"] = (size // self.instances, stride)
            table[f"{group}_across"] = (self.instances, stride * (size // self.instances))
        return table

    def embd_pattern(self) -> tuple[int, int, int]:
        """(width, period, stride) in ranks of the embedding groups {b, b + stride}: their first
        members are ``b = j * period + t`` (t < width), one per rank of the first pipeline stage.

        The first stage's ranks are the pipeline groups' first members: ranks [0, gpus/pp) in the
        default order (pp outermost), and the first tp·cp ranks of every dp replica's block of
        tp·cp·pp in the tp-pp-dp order; the last stage is pp − 1 pipeline strides further."""
        if self.tp_pp_dp:
            stage_stride = self.tp * self.cp
            return stage_stride, stage_stride * self.pp, (self.pp - 1) * stage_stride
        stage_stride = self.gpus // self.pp
        return stage_stride, self.gpus, (self.pp - 1) * stage_stride

    def group_count(self, kind: str) -> int:
        """How many disjoint groups of this kind the job has."""
        size, _ = self.size_and_stride(kind)
        if kind == "embd":
            return self.gpus // self.pp  # one per position of a stage (middle stages are in none)
        return self.gpus // size

    def group_ranks(self, kind: str, index: int = 0) -> list[int]:
        """Ranks of the ``index``-th group of ``kind`` (groups ordered by their lowest rank)."""
        size, stride = self.size_and_stride(kind)
        count = self.group_count(kind)
        if not 0 <= index < count:
            raise UserInputError(f"group index {index} out of range: {count} '{kind}' groups")
        if kind == "embd":  # not a tiling for pp > 2: index the first stage's ranks
            width, period, _ = self.embd_pattern()
            base = (index // width) * period + index % width
            return [base + k * stride for k in range(size)]
        block = size * stride  # ranks covered by one tile of groups
        base = (index // stride) * block + index % stride
        return [base + k * stride for k in range(size)]

    def group_gpus(self, kind: str, index: int = 0) -> list[int]:
        """Physical GPU ids of the ``index``-th group of ``kind``."""
        g, d = self.gpus_per_domain, self._domain_size
        return [(r // g) * d + r % g for r in self.group_ranks(kind, index)]

    def all_groups(self, kind: str) -> list[list[int]]:
        """Every group of ``kind`` as GPU-id lists (O(gpus); for small jobs and tests)."""
        return [self.group_gpus(kind, i) for i in range(self.group_count(kind))]

    @property
    def _domain_size(self) -> int:
        return self.layout.domain_size if self.layout is not None else self.gpus_per_domain

    def shape(self, kind: str) -> GroupShape:
        """How group ``kind`` spans NVLink domains and fabric tiers (cheap, cached)."""
        if "shapes" in self.__dict__ and kind in self.shapes:
            return self.shapes[kind]
        known = self._kind_shapes
        if kind not in known:
            known[kind] = self._shape_of(kind)
        return known[kind]

    @cached_property
    def _kind_shapes(self) -> dict[str, GroupShape]:
        """The shapes asked for so far (:meth:`shape`; placements are shared, see :func:`placement_for`)."""
        return {}

    def _shape_of(self, kind: str) -> GroupShape:
        size, stride = self.size_and_stride(kind)
        if kind == "embd" and size > 1:
            width, period, _ = self.embd_pattern()
            return _embd_shape(stride, width, period, self.gpus // self.pp // width, self.gpus_per_domain, self.layout)
        return _shape(size, stride, self.gpus_per_domain, self.layout)

    @cached_property
    def shapes(self) -> dict[str, GroupShape]:
        """Every group kind's shape."""
        return {k: self.shape(k) for k in GROUP_KINDS}


@lru_cache(maxsize=8192)
def _shape(size: int, stride: int, g: int, layout: FabricLayout | None) -> GroupShape:
    """Shape of the groups ``base + k*stride`` (k < size) on domains holding ``g`` consecutive ranks.

    Regular cases are closed-form: a tile of groups (``size * stride`` ranks) inside a domain, a
    stride that is a multiple of ``g`` (one rank per domain), or a stride dividing ``g`` with
    tiles of whole domains. Otherwise (e.g. tp=16 on 72-GPU racks) groups straddle domains
    unevenly; every distinct offset of a group against the domain boundaries is evaluated (numpy,
    at most ``g`` offsets) and the worst group is returned: most domains spanned, then fewest
    ranks in its least-populated domain.
    """
    if size == 1:
        return GroupShape.single_domain(1)
    block = size * stride
    if g % block == 0:
        return GroupShape.single_domain(size)
    if stride % g == 0:
        span, rpd = size, 1
        extent_domains = (stride * (size - 1)) // g + 1
        return GroupShape(size=size, ranks_per_domain=1, domains=span,
                          tiers=layout.tier_for_span(extent_domains) if layout else None)
    if g % stride == 0 and block % g == 0:
        rpd = g // stride
        span = size // rpd
        return GroupShape(size=size, ranks_per_domain=rpd, domains=span,
                          tiers=layout.tier_for_span(span) if layout else None)
    return _irregular_shape(size, stride, g, layout)


@lru_cache(maxsize=1024)
def _embd_shape(stride: int, width: int, period: int, blocks: int, g: int, layout: FabricLayout | None) -> GroupShape:
    """Shape of the embedding groups {b, b + stride}, b = j*period + t (t < width, j < blocks), on
    domains of ``g`` ranks: the worst group. Whether a pair straddles domains, and how far, depends
    only on b mod g, so t < g and j < g (j*period mod g repeats with a period dividing g) suffice."""
    import numpy as np

    firsts = (np.arange(min(blocks, g), dtype=np.int64)[:, None] * period
              + np.arange(min(width, g), dtype=np.int64)[None, :]) % g  # residues of the first members
    extent = int(((firsts + stride) // g).max()) + 1  # domains from a first member's (0) to its partner's
    if extent == 1:
        return GroupShape.single_domain(2)
    return GroupShape(size=2, ranks_per_domain=1, domains=2, tiers=layout.tier_for_span(extent) if layout else None)


def _irregular_shape(size: int, stride: int, g: int, layout: FabricLayout | None) -> GroupShape:
    import numpy as np

    # group bases are tile*block + offset (offset < stride); only their residues mod g matter
    offsets = np.arange(min(stride, g * 4), dtype=np.int64)
    tiles = np.arange(min(g, 4096), dtype=np.int64) * (size * stride)
    residues = np.unique((tiles[:, None] + offsets[None, :]) % g)
    members = np.arange(size, dtype=np.int64) * stride
    worst: tuple[int, int, int, bool] | None = None  # (span, -rpd, extent, uniform)
    for r in residues:
        doms, counts = np.unique((members + int(r)) // g, return_counts=True)
        cand = (int(doms.size), -int(counts.min()), int(doms[-1] - doms[0] + 1), bool(counts.min() == counts.max()))
        if worst is None or cand[:2] > worst[:2]:
            worst = cand
    assert worst is not None
    span, neg_rpd, extent, uniform = worst
    if span == 1:
        return GroupShape.single_domain(size)
    uniform = uniform and size == -neg_rpd * span
    return GroupShape(size=size, ranks_per_domain=-neg_rpd, domains=span,
                      tiers=layout.tier_for_span(extent) if layout else None, uniform=uniform)


def _check_divisible(gpus: int, tp: int, cp: int, ep: int, etp: int, pp: int) -> None:
    for name, value in (("tp", tp), ("cp", cp), ("ep", ep), ("etp", etp), ("pp", pp)):
        if value < 1:
            raise UserInputError(f"{name} must be >= 1, got {value}")
    if gpus % (tp * cp * pp):
        raise UserInputError(f"gpus {gpus} is not divisible by tp*cp*pp = {tp * cp * pp}")
    if gpus % (etp * ep * pp):
        raise UserInputError(f"gpus {gpus} is not divisible by etp*ep*pp = {etp * ep * pp}")


def check_tp_pp_dp_mapping(tp: int, cp: int, ep: int, etp: int) -> None:
    """Raise UserInputError unless ``--use-tp-pp-dp-mapping`` can place these sizes (see :func:`place_job`)."""
    if cp > 1:
        raise UserInputError("use_tp_pp_dp_mapping with cp > 1 is not modelled (the dp×cp group is not strided)")
    if ep * etp > 1 and ep * etp != tp * cp:
        raise UserInputError(f"use_tp_pp_dp_mapping needs etp·ep = tp·cp (got {etp * ep} and {tp * cp}) so that "
                             "dense and expert ranks share pipeline stages")


def place_job(system: SystemSpec, gpus: int, tp: int = 1, cp: int = 1, ep: int = 1, etp: int = 1, pp: int = 1,
              gpus_per_domain: int | None = None, tp_pp_dp: bool = False) -> JobPlacement:
    """Place a job on ``system``; raise UserInputError (one line) when the placement is impossible.

    ``tp_pp_dp``: Megatron's ``--use-tp-pp-dp-mapping`` (rank order tp-cp-ep-pp-dp); it needs cp 1
    (the combined dp×cp gradient group is then not a strided group) and, with experts, etp·ep =
    tp·cp so that a rank's pipeline stage is the same in the dense and the expert view (our reading
    of Megatron's RankGenerator)."""
    if gpus < 1:
        raise UserInputError(f"gpus must be >= 1, got {gpus}")
    if gpus > system.max_gpus:
        raise UserInputError(f"gpus {gpus} exceeds the {system.name} limit of {system.max_gpus}")
    _check_divisible(gpus, tp, cp, ep, etp, pp)
    block = _policy_block(system.nvlink.domain_size, tp, cp, ep, etp)
    g = default_gpus_per_domain(system, gpus, block) if gpus_per_domain is None else gpus_per_domain
    if g < 1:  # 0 is a value given, not 'not given'
        raise UserInputError(f"gpus_per_domain {g} must be between 1 and the NVLink domain size "
                             f"{system.nvlink.domain_size}")
    if g > system.nvlink.domain_size:
        raise UserInputError(f"gpus_per_domain {g} exceeds the NVLink domain size {system.nvlink.domain_size}")
    if gpus % g:
        raise UserInputError(f"gpus {gpus} is not a multiple of gpus_per_domain {g}")
    if tp_pp_dp:
        check_tp_pp_dp_mapping(tp, cp, ep, etp)
    layout = fabric_layout(system, gpus, g)
    return JobPlacement(gpus=gpus, gpus_per_domain=g, tp=tp, cp=cp, ep=ep, etp=etp, pp=pp, layout=layout,
                        tp_pp_dp=tp_pp_dp)


_PLACEMENTS: IdentityMemo[JobPlacement] = IdentityMemo(20_000)  # the system keyed by identity


def placement_for(scenario) -> JobPlacement:  # noqa: ANN001 - avoids importing workloads here
    """Placement of a resolved scenario (workloads.scenario.Scenario).

    Memoised on what it depends on (the system by identity): the placement is immutable, and sharing it keeps its group shapes computed once (the
    planner asks for the placement of tens of thousands of layouts, several times each)."""
    p, cfg = scenario.par, scenario.config.placement
    instances = scenario.optimizer.num_distributed_optimizer_instances
    system = scenario.system
    key = (scenario.gpus, p.tp, p.cp, p.ep, p.expert_tp, p.pp, cfg.gpus_per_domain, cfg.use_tp_pp_dp_mapping, instances)
    hit = _PLACEMENTS.get(key, system)
    if hit is not None:
        return hit
    job = place_job(system, scenario.gpus, tp=p.tp, cp=p.cp, ep=p.ep, etp=p.expert_tp, pp=p.pp,
                    gpus_per_domain=cfg.gpus_per_domain, tp_pp_dp=cfg.use_tp_pp_dp_mapping)
    return _PLACEMENTS.put(job if instances == 1 else replace(job, instances=instances), key, system)

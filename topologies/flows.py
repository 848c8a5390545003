"""The flows of a collective on concrete GPUs: (path edges, bytes) per flow plus edge capacities.

This is what the discrete-event engine needs to share links between concurrent collectives. The
flows live on an **aggregated route view** of the fabric (no networkx needed, cheap to build):

- ``("gpu", g)`` ↔ ``("nvsw", d)``: a GPU's NVLink to its domain's switch chips as one edge
  (NVLink traffic is striped over all chips, so the chips act as one switch of summed rate);
- ``("gpu", g)`` ↔ ``("nic", g)``: the GPU's NIC(s) (PCIe / C2C);
- ``("nic", g)`` ↔ ``("leaf", rail, i)``: NIC ports of all planes into the leaf of its rail;
- ``("leaf", rail, i)`` ↔ ``("spines", pod)``: a leaf's up-links to its pod's spines;
- ``("spines", pod)`` ↔ ``("cores",)``: a pod's spine up-links to the core tier.

Capacities are nominal (bytes/s per direction). Each :class:`Phase` states the efficiency that
applies per link class (``nvlink``, ``network``) so that ``load / (capacity × efficiency)`` on the
busiest edge reproduces the analytic transfer time of :mod:`topologies.collectives`;
:meth:`FlowSet.time_s` does exactly that. Off-domain traffic is routed rail-aligned the way NCCL's
PXN does: over NVLink to the GPU on the destination's rail, then through that GPU's NIC.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from topologies import algorithms as alg
from topologies.collectives import CollectiveCost, algorithm_estimate, collective_cost
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.inputs import UserInputError
from topologies.layout import FabricLayout

Node = tuple
Edge = tuple[Node, Node]
PAIRWISE_LIMIT = 128  # all-to-all groups above this are aggregated per destination domain


@dataclass(frozen=True)
class Flow:
    """``bytes`` from ``src`` to ``dst`` along ``path`` (a tuple of directed edges)."""

    src: Node
    dst: Node
    bytes: float
    path: tuple[Edge, ...]


@dataclass(frozen=True)
class Phase:
    """Flows that run together; phases of a collective run one after another."""

    name: str
    flows: tuple[Flow, ...]
    latency_s: float
    efficiency: dict[str, float]  # per link class: nvlink, network

    def edge_bytes(self) -> dict[Edge, float]:
        """Bytes carried per directed edge."""
        load: dict[Edge, float] = defaultdict(float)
        for f in self.flows:
            for e in f.path:
                load[e] += f.bytes
        return dict(load)


@dataclass(frozen=True)
class FlowSet:
    """A collective on concrete GPUs: its phases of flows and the capacities of the edges used."""

    op: str
    size_bytes: float
    gpus: tuple[int, ...]
    cost: CollectiveCost
    phases: tuple[Phase, ...]
    capacities_Bps: dict[Edge, float] = field(repr=False)
    link_class: dict[Edge, str] = field(repr=False)

    @property
    def flows(self) -> tuple[Flow, ...]:
        """Every flow of every phase."""
        return tuple(f for p in self.phases for f in p.flows)

    def effective_capacity_Bps(self, edge: Edge, phase: Phase) -> float:
        """Capacity of ``edge`` × the phase's efficiency for its link class (bytes/s)."""
        return self.capacities_Bps[edge] * phase.efficiency.get(self.link_class[edge], 1.0)

    def phase_transfer_s(self, phase: Phase, extra_load: dict[Edge, float] | None = None) -> tuple[float, Edge | None]:
        """(seconds, bottleneck edge) of one phase's transfer on its busiest edge."""
        load = phase.edge_bytes()
        if extra_load:
            for e, b in extra_load.items():
                if e in load:
                    load[e] += b
        best, where = 0.0, None
        for e, b in load.items():
            t = b / self.effective_capacity_Bps(e, phase)
            if t > best:
                best, where = t, e
        return best, where

    def time_s(self) -> float:
        """Seconds of the collective replayed on its flows alone (latency + busiest edge per phase)."""
        return sum(p.latency_s + self.phase_transfer_s(p)[0] for p in self.phases)


# ------------------------------------------------------------------------------ route view


class RouteView:
    """Aggregated routes and edge capacities of a job's fabric (see the module docstring)."""

    def __init__(self, layout: FabricLayout, system: SystemSpec) -> None:
        self.layout, self.system = layout, system
        self.capacities: dict[Edge, float] = {}
        self.link_class: dict[Edge, str] = {}

    def _edge(self, u: Node, v: Node, bps: float, cls: str) -> Edge:
        e = (u, v)
        if e not in self.capacities:
            self.capacities[e] = bps
            self.link_class[e] = cls
        return e

    def nvlink_hop(self, a: int, b: int) -> tuple[Edge, Edge]:
        """GPU a → its domain's switch → GPU b (same domain)."""
        lay = self.layout
        d = a // lay.domain_size
        bw = lay.nvlink_gpu_Bps
        return (self._edge(("gpu", a), ("nvsw", d), bw, "nvlink"), self._edge(("nvsw", d), ("gpu", b), bw, "nvlink"))

    def to_switch(self, a: int) -> Edge:
        """GPU → its NVLink switch (NVLS traffic)."""
        return self._edge(("gpu", a), ("nvsw", a // self.layout.domain_size), self.layout.nvlink_gpu_Bps, "nvlink")

    def from_switch(self, a: int) -> Edge:
        """NVLink switch → GPU (NVLS traffic)."""
        return self._edge(("nvsw", a // self.layout.domain_size), ("gpu", a), self.layout.nvlink_gpu_Bps, "nvlink")

    def route(self, a: int, b: int) -> tuple[Edge, ...]:
        """Edges from GPU a to GPU b: NVLink inside a domain; PXN + rail + fat tree across."""
        lay = self.layout
        da, sa = divmod(a, lay.domain_size)
        db, sb = divmod(b, lay.domain_size)
        if da == db:
            return self.nvlink_hop(a, b)
        path: list[Edge] = []
        proxy = lay.gpu_id(da, sb)  # the GPU of a's domain on b's rail
        if proxy != a:
            path.extend(self.nvlink_hop(a, proxy))
        nic_Bps = lay.nic_Bps * lay.nics_per_gpu
        port_Bps = lay.port_Bps * lay.planes * lay.nics_per_gpu
        rail, la = lay.leaf_of(da, sb)
        _, lb = lay.leaf_of(db, sb)
        leaf_a, leaf_b = ("leaf", rail, la), ("leaf", rail, lb)
        path.append(self._edge(("gpu", proxy), ("nic", proxy), nic_Bps, "network"))
        path.append(self._edge(("nic", proxy), leaf_a, port_Bps, "network"))
        if leaf_a != leaf_b:
            up_Bps = lay.leaf_up_ports * lay.port_Bps * lay.planes
            pa, pb = lay.pod_of(da), lay.pod_of(db)
            path.append(self._edge(leaf_a, ("spines", pa), up_Bps, "network"))
            if pa != pb:
                pod_up = (lay.spines_per_plane // max(1, -(-lay.domains // lay.domains_per_pod))) * (lay.radix // 2) * lay.port_Bps * lay.planes
                path.append(self._edge(("spines", pa), ("cores",), pod_up, "network"))
                path.append(self._edge(("cores",), ("spines", pb), pod_up, "network"))
            path.append(self._edge(("spines", pb), leaf_b, up_Bps, "network"))
        path.append(self._edge(leaf_b, ("nic", b), port_Bps, "network"))
        path.append(self._edge(("nic", b), ("gpu", b), nic_Bps, "network"))
        return tuple(path)

    def flow(self, a: int, b: int, nbytes: float) -> Flow:
        """A GPU-to-GPU flow along its route."""
        return Flow(("gpu", a), ("gpu", b), nbytes, self.route(a, b))


# ------------------------------------------------------------------------- flow patterns


def _by_domain(gpus: list[int], domain_size: int) -> list[list[int]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for gpu in sorted(gpus):
        groups[gpu // domain_size].append(gpu)
    return [groups[d] for d in sorted(groups)]


def ring_flows(view: RouteView, gpus: list[int], traffic: float) -> list[Flow]:
    """Ring flows carrying ``traffic`` bytes per GPU.

    Across domains with g ranks each, g rotated rings (channels) share the traffic: channel c
    enters every domain at its c-th member, so each GPU's NIC carries traffic/g and every
    intra-domain hop the rest, as NCCL's multi-channel rings do.
    """
    doms = _by_domain(gpus, view.layout.domain_size)
    if len(doms) == 1 or len({len(d) for d in doms}) != 1 or len(doms[0]) == 1:
        order = [g for d in doms for g in d]
        return [view.flow(order[i], order[(i + 1) % len(order)], traffic) for i in range(len(order))]
    g = len(doms[0])
    flows = []
    for di, members in enumerate(doms):
        nxt = doms[(di + 1) % len(doms)]
        for j in range(g):
            flows.append(view.flow(members[j], members[(j + 1) % g], traffic * (g - 1) / g))
            flows.append(view.flow(members[j], nxt[(j + 1) % g], traffic / g))
    return flows


def nvls_flows(view: RouteView, gpus: list[int], out_bytes: float, in_bytes: float) -> list[Flow]:
    """NVLS: every GPU sends ``out_bytes`` to and receives ``in_bytes`` from its NVLink switch."""
    flows = []
    for gpu in gpus:
        up, down = view.to_switch(gpu), view.from_switch(gpu)
        flows.append(Flow(up[0], up[1], out_bytes, (up,)))
        flows.append(Flow(down[0], down[1], in_bytes, (down,)))
    return flows


def tree_flows(view: RouteView, gpus: list[int], size_bytes: float) -> list[Flow]:
    """Chain inside each domain (S up and S down) plus a double binary tree of domains per slot.

    Each of the two trees carries half the data: S/(2g) each way on every tree edge for each of
    the g rank slots (the slots' trees run in parallel on their own rails).
    """
    doms = _by_domain(gpus, view.layout.domain_size)
    flows = []
    for members in doms:
        for a, b in zip(members, members[1:], strict=False):
            flows += [view.flow(a, b, size_bytes), view.flow(b, a, size_bytes)]
    if len(doms) > 1:
        g = min(len(d) for d in doms)
        share = size_bytes / g / 2
        for tree in alg.double_binary_tree(len(doms)):
            for parent, child in tree:
                for j in range(g):
                    a, b = doms[child][j], doms[parent][j]
                    flows += [view.flow(a, b, share), view.flow(b, a, share)]
    return flows


def nvls_tree_flows(view: RouteView, gpus: list[int], size_bytes: float) -> list[Flow]:
    """NVLSTree: NVLS flows inside each domain plus a double binary tree of domains on the heads.

    The heads (``algorithms.nvls_tree_head_slots``) each carry S/h, half through each tree, on
    their own rail; both stages run at once (one phase), as NCCL pipelines them.
    """
    doms = _by_domain(gpus, view.layout.domain_size)
    flows = [f for members in doms for f in nvls_flows(view, members, *(size_bytes * (1 + 1 / len(members)),) * 2)]
    g = min(len(d) for d in doms)
    h = alg.nvls_tree_heads(g, view.system.efficiency)
    share = size_bytes / h / 2
    for tree in alg.double_binary_tree(len(doms)):
        for parent, child in tree:
            for j in alg.nvls_tree_head_slots(g, h):
                a, b = doms[child][j], doms[parent][j]
                flows += [view.flow(a, b, share), view.flow(b, a, share)]
    return flows


def pairwise_flows(view: RouteView, gpus: list[int], per_pair: float) -> list[Flow]:
    """Every GPU sends ``per_pair`` bytes to every other (all-to-all, grouped send/recv)."""
    if len(gpus) <= PAIRWISE_LIMIT:
        return [view.flow(a, b, per_pair) for a in gpus for b in gpus if a != b]
    doms = _by_domain(gpus, view.layout.domain_size)
    flows = []
    for da in doms:
        for a in da:
            for db in doms:
                if db is da:
                    flows += [view.flow(a, b, per_pair) for b in da if b != a]
                else:  # aggregated: everything for domain db through the same-slot GPU there
                    target = db[da.index(a) % len(db)]
                    flows.append(view.flow(a, target, per_pair * len(db)))
    return flows


# ------------------------------------------------------------------------------- entry point


def shape_of_gpus(gpus: list[int], layout: FabricLayout) -> GroupShape:
    """The GroupShape of an explicit GPU list (domains, fewest ranks in a domain, tiers)."""
    doms = _by_domain(gpus, layout.domain_size)
    n = len(gpus)
    if len(doms) == 1:
        return GroupShape.single_domain(n)
    ids = [d[0] // layout.domain_size for d in doms]
    tiers = max(layout.tier_between_domains(min(ids), max(ids) - min(ids) + 1), 1)
    rpd = min(len(d) for d in doms)
    return GroupShape(size=n, ranks_per_domain=rpd, domains=len(doms), tiers=tiers,
                      uniform=rpd * len(doms) == n)


def _pattern(op: str, name: str, S: float, gpus: list[int], view: RouteView) -> list[Flow]:
    """Flows of one flat (non-hierarchical) algorithm on ``gpus``."""
    n = len(gpus)
    if op == "send_recv":
        return [view.flow(a, b, S) for a, b in zip(gpus, gpus[1:], strict=False)]
    if op in ("all_to_all", "all_gather_v"):
        return pairwise_flows(view, gpus, S / n)
    if name == "nvls":
        out_in = {"all_reduce": (S * (1 + 1 / n),) * 2, "reduce_scatter": (S, S / n),
                  "all_gather": (S / n, S), "broadcast": (S, S)}[op]
        return nvls_flows(view, gpus, *out_in)
    if name == "tree":
        return tree_flows(view, gpus, S)
    if name == "nvls_tree":
        return nvls_tree_flows(view, gpus, S)
    traffic = {"all_reduce": 2 * (n - 1) / n * S, "broadcast": S}.get(op, (n - 1) / n * S)
    return ring_flows(view, gpus, traffic)  # ring and pat


def _phase(est: alg.Estimate, flows: list[Flow]) -> Phase:
    return Phase(est.algorithm, tuple(flows), est.latency_s, {"nvlink": est.nvlink_eff, "network": est.network_eff})


def collective_flows(op: str, size_bytes: float, gpus: list[int], layout: FabricLayout, system: SystemSpec,
                     algorithm: str | None = None, shape: GroupShape | None = None) -> FlowSet:
    """The flows of ``op`` on the GPUs ``gpus`` (physical ids, in rank order) of a job's fabric.

    The algorithm is the one :func:`collective_cost` picks for the group's shape (or ``algorithm``);
    its :class:`~topologies.algorithms.Estimate` gives each phase's latency and link efficiencies.
    Returns a :class:`FlowSet`; ``FlowSet.capacities_Bps`` are the edges the flows use.
    """
    gpus = list(gpus)
    if len(set(gpus)) != len(gpus) or any(not 0 <= g < layout.physical_gpus for g in gpus):
        raise UserInputError(f"GPU ids must be distinct and in 0..{layout.physical_gpus - 1}")
    shape = shape or shape_of_gpus(gpus, layout)
    cost = collective_cost(op, size_bytes, shape, system, algorithm)
    view = RouteView(layout, system)
    S = float(size_bytes)
    phases: list[Phase] = []
    if cost.algorithm != "none":
        est = algorithm_estimate(op, S, shape, system, cost.algorithm)
        if est.parts:
            phases = _hierarchical_phases(op, S, gpus, shape, est, view)
        else:
            phases = [_phase(est, _pattern(op, cost.algorithm, S, gpus, view))]
    return FlowSet(op=op, size_bytes=S, gpus=tuple(gpus), cost=cost, phases=tuple(phases),
                   capacities_Bps=view.capacities, link_class=view.link_class)


def _hierarchical_phases(op: str, S: float, gpus: list[int], shape: GroupShape, est: alg.Estimate,
                         view: RouteView) -> list[Phase]:
    """The intra-domain phase (on S, per domain) and the per-rail phase across domains (on S/g)."""
    doms = _by_domain(gpus, view.layout.domain_size)
    g, d = shape.ranks_per_domain, shape.domains
    first, second = est.parts
    intra, inter = (second, first) if op == "all_gather" else (first, second)
    intra_flows = [f for members in doms for f in _pattern(op, intra.algorithm, S, members, view)]
    inter_flows: list[Flow] = []
    for j in range(g):
        column = [members[j] for members in doms]
        if inter.algorithm == "tree":
            inter_flows += tree_flows(view, column, S / g)
        else:
            inter_flows += ring_flows(view, column, (2 if op == "all_reduce" else 1) * (d - 1) / d * S / g)
    phases = {id(intra): _phase(intra, intra_flows), id(inter): _phase(inter, inter_flows)}
    return [phases[id(first)], phases[id(second)]]

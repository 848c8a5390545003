"""Contention between collectives that run at the same time on shared links.

When every group of a kind runs its collective at once (all dp groups of a pipeline stage, all ep
groups of a layer), links that several groups use are shared: leaf up-links of an oversubscribed
fabric, spine/core links, NVLink ports when groups overlap. Two views:

- :func:`contention` — the simple per-link load ratio: add every group's bytes per edge and phase,
  divide by the edge's effective capacity; the busiest edge is the **bottleneck link** and the
  ratio of that time to the slowest group alone is the **slowdown** (≥ 1).
- :func:`max_min_fair_rates` — max-min fair rates of a set of flows (progressive filling), for the
  DES and for tests: every flow gets the largest rate such that no link is over capacity and no
  flow can grow without shrinking a slower one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from topologies.flows import Edge, Flow, FlowSet, collective_flows
from topologies.hardware import SystemSpec


@dataclass(frozen=True)
class ContentionReport:
    """Result of running several collectives at once."""

    groups: int
    time_alone_s: float  # slowest group on its own
    time_s: float  # all groups together (per-link load ratio)
    bottleneck: Edge | None  # busiest edge (of the slowest phase)
    bottleneck_class: str
    bottleneck_load_bytes: float
    bottleneck_capacity_Bps: float  # effective (capacity × efficiency)

    @property
    def slowdown(self) -> float:
        """time_s / time_alone_s (1.0 = no contention)."""
        return self.time_s / self.time_alone_s if self.time_alone_s > 0 else 1.0


def contention(flowsets: Sequence[FlowSet]) -> ContentionReport:
    """Per-link load ratio of concurrent collectives (same op and phase structure per group)."""
    if not flowsets:
        return ContentionReport(0, 0.0, 0.0, None, "", 0.0, 0.0)
    alone = max(fs.time_s() for fs in flowsets)
    nphases = max(len(fs.phases) for fs in flowsets)
    total = 0.0
    worst: tuple[float, Edge | None, str, float, float] = (0.0, None, "", 0.0, 0.0)
    for i in range(nphases):
        load: dict[Edge, float] = defaultdict(float)
        cap: dict[Edge, float] = {}
        cls: dict[Edge, str] = {}
        latency = 0.0
        for fs in flowsets:
            if i >= len(fs.phases):
                continue
            ph = fs.phases[i]
            latency = max(latency, ph.latency_s)
            for e, b in ph.edge_bytes().items():
                load[e] += b
                eff = fs.effective_capacity_Bps(e, ph)
                cap[e] = min(cap.get(e, eff), eff)
                cls[e] = fs.link_class[e]
        t, where = 0.0, None
        for e, b in load.items():
            if b / cap[e] > t:
                t, where = b / cap[e], e
        total += latency + t
        if where is not None and t > worst[0]:
            worst = (t, where, cls[where], load[where], cap[where])
    return ContentionReport(len(flowsets), alone, total, worst[1], worst[2], worst[3], worst[4])


def max_min_fair_rates(flows: Sequence[Flow], capacities_Bps: dict[Edge, float]) -> list[float]:
    """Max-min fair rate (bytes/s) of every flow over the edges' capacities (progressive filling)."""
    rates = [0.0] * len(flows)
    active = {i for i, f in enumerate(flows) if f.path}
    remaining = dict(capacities_Bps)
    users: dict[Edge, set[int]] = defaultdict(set)
    for i in active:
        for e in flows[i].path:
            users[e].add(i)
    while active:
        share, tight = min(((remaining[e] / len(u & active), e) for e, u in users.items() if u & active),
                           key=lambda x: x[0])
        frozen = users[tight] & active
        for i in frozen:
            rates[i] = share
            for e in flows[i].path:
                remaining[e] -= share
        for e in remaining:
            remaining[e] = max(remaining[e], 0.0)
        active -= frozen
    return rates


def group_flowsets(placement, kind: str, op: str, size_bytes: float, system: SystemSpec,  # noqa: ANN001
                   algorithm: str | None = None, max_groups: int | None = None) -> list[FlowSet]:
    """FlowSets of ``op`` on every group of ``kind`` of a placement (or the first ``max_groups``)."""
    count = placement.group_count(kind)
    if max_groups is not None:
        count = min(count, max_groups)
    shape = placement.shape(kind)
    return [collective_flows(op, size_bytes, placement.group_gpus(kind, i), placement.layout, system,
                             algorithm=algorithm, shape=shape) for i in range(count)]

"""A fluid flow model of shared links: max-min fair bandwidth sharing, re-planned on every change.

A flow has a volume (in link-seconds: the seconds it would take alone on its links) and the set
of resources (link directions) it crosses; every resource has a capacity (1.0 = one link's rate).
While flows are active, rates are the max-min fair allocation (progressive filling: repeatedly
find the resource whose remaining capacity split over its unfrozen flows is smallest, freeze
those flows at that share). Whenever a flow starts or ends, the scheduler (a wake-up event whose
callback re-arms it, :meth:`FluidNetwork._arm`) advances every flow's progress, recomputes the
rates of the flows sharing links with the change and re-plans the next completion event.

``contention=False`` gives every flow its full bottleneck capacity (no sharing): the mode in
which the discrete-event engine must match the analytic engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import simpy

DONE_EPS_S = 1e-12  # a flow with less than this many link-seconds left is complete


@dataclass(eq=False, slots=True)
class Flow:
    """An active transfer: volume and remaining work in link-seconds, rate in link-seconds/s."""

    volume: float
    resources: tuple[str, ...]
    done: simpy.Event
    remaining: float = 0.0
    rate: float = 0.0
    start_s: float = 0.0
    tags: dict[str, Any] = field(default_factory=dict)
    done_below: float = 0.0  # complete once ``remaining`` is at most this (DONE_EPS_S x max(1, volume))


def max_min_rates(flows: Iterable[Flow], capacity: dict[str, float]) -> dict[Flow, float]:
    """Max-min fair rates (link-seconds per second) of ``flows`` on resources of ``capacity``."""
    active = list(flows)
    users: dict[str, set[Flow]] = {}
    for f in active:
        for r in f.resources:
            users.setdefault(r, set()).add(f)
    rates: dict[Flow, float] = {}
    shared = []
    for f in active:  # fast path: a flow alone on all its resources runs at its bottleneck capacity
        if all(len(users[r]) == 1 for r in f.resources):
            rates[f] = min((capacity.get(r, 1.0) for r in f.resources), default=1.0)
        else:
            shared.append(f)
    if not shared:
        return rates
    left = {r: capacity.get(r, 1.0) for f in shared for r in f.resources}
    users = {r: {f for f in users[r] if f in set(shared)} for r in left}
    unfrozen = set(shared)
    while unfrozen:
        best_r, best_share = None, float("inf")
        for r, us in users.items():
            if us:
                share = left[r] / len(us)
                if share < best_share:
                    best_r, best_share = r, share
        if best_r is None:
            for f in unfrozen:
                rates[f] = 1.0
            break
        for f in list(users[best_r]):
            rates[f] = best_share
            unfrozen.discard(f)
            for r in f.resources:
                left[r] -= best_share
                users[r].discard(f)
    return rates


class FluidNetwork:
    """Links shared by concurrent flows; ``transfer`` returns an event that fires on completion."""

    def __init__(self, env: simpy.Environment, capacity: dict[str, float] | None = None,
                 contention: bool = True) -> None:
        self.env = env
        self.capacity = capacity or {}
        self.contention = contention
        self.flows: list[Flow] = []
        self.users: dict[str, set[Flow]] = {}
        self._last_s = 0.0
        self._version = 0
        self._wake: simpy.Event = env.event()
        self._arm()

    def transfer(self, volume_s: float, resources: tuple[str, ...], latency_s: float = 0.0,
                 **tags: Any) -> simpy.Event:
        """Start a flow of ``volume_s`` link-seconds after ``latency_s``; the event fires when done."""
        done = self.env.event()
        if latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _: self._add(volume_s, resources, done, tags))
        else:
            self._add(volume_s, resources, done, tags)
        return done

    def _add(self, volume_s: float, resources: tuple[str, ...], done: simpy.Event, tags: dict[str, Any]) -> None:
        if volume_s <= DONE_EPS_S:
            done.succeed()
            return
        self._advance()
        flow = Flow(volume_s, resources, done, remaining=volume_s, start_s=self.env.now, tags=tags,
                    done_below=DONE_EPS_S * max(1.0, volume_s))
        self.flows.append(flow)
        alone = True
        users = self.users
        for r in resources:
            us = users.get(r)
            if us is None:
                users[r] = {flow}
            else:
                alone = alone and not us
                us.add(flow)
        if alone:  # no other flow on its links: the component is this flow, at its bottleneck capacity
            flow.rate = self._alone_rate(resources)
        else:
            self._allocate(resources)
        if not self._wake.triggered:
            self._wake.succeed()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last_s
        if dt > 0:
            for f in self.flows:
                f.remaining -= f.rate * dt
        self._last_s = now

    def _component(self, resources: Iterable[str]) -> set[Flow]:
        """Every active flow connected (through shared resources) to ``resources``."""
        seen_r: set[str] = set()
        todo = list(resources)
        flows: set[Flow] = set()
        while todo:
            r = todo.pop()
            if r in seen_r:
                continue
            seen_r.add(r)
            for f in self.users.get(r, ()):
                if f not in flows:
                    flows.add(f)
                    todo.extend(f.resources)
        return flows

    def _allocate(self, touched: Iterable[str]) -> None:
        """Re-plan the rates of the flows affected by a change on ``touched`` resources (max-min
        allocations decompose over connected components, so the others keep their rates)."""
        comp = self._component(touched)
        if len(comp) == 1:  # a flow alone on its links (max_min_rates' first case)
            for f in comp:
                f.rate = self._alone_rate(f.resources)
            return
        if not self.contention:
            for f in comp:
                f.rate = min((self.capacity.get(r, 1.0) for r in f.resources), default=1.0)
            return
        for f, rate in max_min_rates(comp, self.capacity).items():
            f.rate = rate

    def _alone_rate(self, resources: tuple[str, ...]) -> float:
        """The rate of a flow no other flow shares a link with: its bottleneck capacity (link-s/s)."""
        capacity = self.capacity
        if not capacity:  # every link at 1.0 (the simulation's links)
            return 1.0
        return min((capacity.get(r, 1.0) for r in resources), default=1.0)

    def _ring(self, version: int) -> None:
        """Timer callback: wake the scheduler if no change re-planned since the timer was set."""
        if version == self._version and not self._wake.triggered:
            self._wake.succeed()

    def _ring_callback(self, version: int) -> Callable[[simpy.Event], None]:
        """The timer's callback for the plan numbered ``version`` (a SimPy event callback)."""
        return lambda _event: self._ring(version)

    def _arm(self) -> None:
        """Wait for the next wake-up: a fresh wake event, and a timer at the next completion (if any
        flow is active). The scheduler is this callback loop rather than a SimPy process: the same
        events enter the queue in the same order, without a generator resumed at every wake-up."""
        env, flows = self.env, self.flows
        self._wake = wake = env.event()
        wake.callbacks.append(self._on_wake)  # type: ignore[union-attr]
        if flows:
            dt = min([f.remaining / f.rate for f in flows])
            self._version += 1
            env.timeout(max(dt, 0.0)).callbacks.append(self._ring_callback(self._version))  # type: ignore[union-attr]

    def _on_wake(self, _event: simpy.Event) -> None:
        """At a completion (or when a flow arrived): finish flows, re-plan the rates, re-arm."""
        self._advance()
        finished = [f for f in self.flows if f.remaining <= f.done_below]
        if finished:
            done = set(finished)
            self.flows = [f for f in self.flows if f not in done]
            touched = set()
            for f in finished:
                for r in f.resources:
                    self.users[r].discard(f)
                    touched.add(r)
            if any(self.users[r] for r in touched):  # otherwise no flow is left on their component
                self._allocate(touched)
            for f in finished:
                f.done.succeed()
        self._arm()

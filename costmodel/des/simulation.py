"""The discrete-event simulation of consecutive training steps (SimPy).

One representative GPU per pipeline stage (data-, tensor- and expert-parallel replicas are
identical by symmetry). Each rank has a compute stream (a SimPy process running the Megatron
schedule order of :mod:`costmodel.pipeline`) and a DP stream (a process serving a FIFO of
gradient reduce-scatters and parameter all-gathers). Layer collectives (TP/CP/EP), PP sends and
DP collectives are flows in a :class:`FluidNetwork` over per-rank link directions
(``nvl_tx{s}``, ``nvl_rx{s}``, ``net_tx{s}``, ``net_rx{s}``), so concurrent flows on one link
share it max-min fairly. A collective's flow volume is its uncontended time minus its latency
(link-seconds); the latency is a pure delay.

Dependencies: a forward pass of virtual stage ``v`` waits for the activation sent by ``v-1``; a
backward for the gradient from ``v+1``. The last backward of each chunk is sliced at the bucket
boundaries, each slice releasing its bucket's reduce-scatter to the DP stream (when
``overlap_grad_reduce``). After its schedule a rank waits for its gradients, meets every other
rank (gradient-norm synchronisation), runs the optimizer step, then gathers parameters
synchronously or, with ``hide_param_gather``, queues every bucket's all-gather in forward order
(``align_param_gather``: right away; otherwise each chunk's when the next step's first forward of
that chunk starts) and lets that forward wait at each bucket for its parameters.
Passes run as one compute block followed by their collectives, or layer by layer while DP traffic
is in flight on the rank (so overlapping flows and compute interleave as in the real step).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NamedTuple

import simpy

from costmodel.des.fluid import FluidNetwork
from costmodel.pipeline import schedule_order
from costmodel.step_structure import BucketCost, PassCost, StepStructure

Ev = Generator[simpy.Event, Any, None]
SliceFlows = tuple[list[tuple[float, tuple[str, ...]]],
                   list[tuple[tuple[str, ...], float, float, float, list[tuple[str, float, float, float]]]]]
LINK_PREFIX = {"nvlink": "nvl", "network": "net", "host": "host"}  # host: the GPU's link to host memory (offloading)


class RawEvent(NamedTuple):
    """A recorded timeline interval (seconds) of one rank's stream (a named tuple: a Kimi K2 pp8 vpp7
    step records ~43,000 of them, and the engine sends them on as plain tuples)."""

    rank: int
    stream: str
    name: str
    start_s: float
    duration_s: float
    category: str
    step: int
    bytes: float = 0.0  # bytes moved per GPU (0: not recorded)


# Waits that delay a rank's messages and so reach the ranks downstream of it: an activation that is
# late because its sender waited for these is booked under the same kind, not as a pipeline bubble
# (the analytic engine books the parameter gather's delay of the first forwards as dp_param too).
# The 1/dp gradient pre-scaling in the last backwards is carried the same way, as dp_grad
# (:meth:`StepSimulation._releaser`).
PROPAGATED_KINDS = ("dp_param",)


@dataclass
class DesResult:
    """What a simulation produced: step end times (s), per-rank attribution (s), the timeline."""

    step_ends_s: list[float]  # per step: when the last rank finished it
    rank_ends_s: list[list[float]]  # [step][rank]
    attribution: list[list[dict[str, float]]]  # [step][rank] seconds by kind
    events: list[RawEvent]


class StepSimulation:
    """Simulate ``steps`` consecutive steps of a :class:`StepStructure`."""

    def __init__(self, st: StepStructure, steps: int = 2, contention: bool = True, record: bool = True) -> None:
        self.st = st
        self.steps = steps
        self.record = record
        self.env = simpy.Environment()
        self.net = FluidNetwork(self.env, contention=contention)
        self.pp, self.vpp = st.pp, st.vpp
        self.orders = [schedule_order(st.pp, st.vpp, st.microbatches, s) for s in range(st.pp)]
        self.msgs: dict[tuple, simpy.Event] = {}
        self.sent_at: dict[tuple, float] = {}
        self.queues = [simpy.Store(self.env) for _ in range(st.pp)]
        self.dp_busy = [0] * st.pp
        self.grad_done = [[self.env.event() for _ in range(st.pp)] for _ in range(steps)]
        self.embd_stages = [s for s, stage in enumerate(st.stages) if stage.embedding_grad_s > 0]
        self.embd_done = [self.env.event() for _ in range(steps)]  # shared-embedding all-reduce finished
        self.reduce_left = [[len(s.buckets) for s in st.stages] for _ in range(steps)]
        self.params: dict[tuple[int, int, int], simpy.Event] = {}
        self.rank_end = [[0.0] * st.pp for _ in range(steps)]
        self.bwd_end = [[0.0] * st.pp for _ in range(steps)]
        self.acc: list[list[dict[str, float]]] = [[defaultdict(float) for _ in range(st.pp)] for _ in range(steps)]
        # [step][rank] seconds of PROPAGATED_KINDS waits (and dp_grad pre-scaling) on the rank's path so far
        # (own or inherited)
        self.delay: list[list[dict[str, float]]] = [[defaultdict(float) for _ in range(st.pp)] for _ in range(steps)]
        self.carried: dict[tuple, dict[str, float]] = {}  # message key -> its sender's delays when sent
        self.events: list[RawEvent] = []
        self._slice_memo: dict[tuple[int, float, int], SliceFlows] = {}

    # ------------------------------------------------------------------ helpers
    def _res(self, link: str, s: int, dst: int | None = None) -> tuple[str, ...]:
        p = LINK_PREFIX[link]
        return (f"{p}_tx{s}", f"{p}_rx{s if dst is None else dst}")

    def _log(self, s: int, stream: str, name: str, start: float, category: str, step: int,
             size_bytes: float = 0.0) -> None:
        if self.record:
            self.events.append(RawEvent(s, stream, name, start, self.env.now - start, category, step, size_bytes))

    def _msg(self, key: tuple) -> simpy.Event:
        ev = self.msgs.get(key)
        if ev is None:
            ev = self.msgs[key] = self.env.event()
        return ev

    def _send(self, s: int, dst: int, key: tuple, step: int) -> None:
        st = self.st
        self.sent_at[key] = self.env.now
        self.carried[key] = dict(self.delay[step][s])
        done = self.net.transfer(st.p2p_s - st.p2p_latency_s, self._res(st.p2p_link, s, dst), st.p2p_latency_s)
        start = self.env.now
        target = self._msg(key)

        def arrived(_: simpy.Event) -> None:
            self._log(s, "pp", f"send {key[0]} mb{key[2]} v{key[3]}", start, "pp", step, st.p2p_bytes)
            target.succeed()

        done.callbacks.append(arrived)

    def _wait_msg(self, s: int, key: tuple, step: int) -> Ev:
        ev = self._msg(key)
        t0 = self.env.now
        yield ev
        wait = self.env.now - t0
        if wait > 0:
            transfer = self.env.now - max(t0, self.sent_at.get(key, t0))
            acc, mine = self.acc[step][s], self.delay[step][s]
            acc["pp"] += transfer
            idle = wait - transfer
            for kind, theirs in self.carried.get(key, {}).items():  # the sender's delays explain the lateness first
                inherited = min(idle, max(theirs - mine[kind], 0.0))
                acc[kind] += inherited
                mine[kind] += inherited
                idle -= inherited
            acc["pipeline_bubble"] += idle

    def _wait(self, s: int, ev: simpy.Event, kind: str, step: int) -> Ev:
        t0 = self.env.now
        yield ev
        self.acc[step][s][kind] += self.env.now - t0
        if kind in PROPAGATED_KINDS:
            self.delay[step][s][kind] += self.env.now - t0

    # ------------------------------------------------------------------ passes
    def _slice_flows(self, s: int, cost: PassCost, frac: float) -> SliceFlows:
        """(hidden flows, exposed flows) of ``frac`` of a pass on rank ``s``: the hidden shares as
        (link-seconds, resources); the exposed shares per link as (resources, link-seconds, latency s,
        link-seconds + latency s, parts (kind, link-seconds, latency s, bytes)). Memoised: every
        micro-batch repeats them."""
        key = (id(cost), frac, s)
        flows = self._slice_memo.get(key)
        if flows is not None:
            return flows
        hidden_flows: list[tuple[float, tuple[str, ...]]] = []
        exposed: dict[str, list[tuple[str, float, float, float]]] = {}
        for blk in cost.comm:
            vol = max(blk.time_s - blk.latency_s, 0.0) * frac
            hidden = 1.0 - blk.exposed_fraction
            if hidden > 0:  # the hidden share runs under this slice's compute (it starts with it)
                hidden_flows.append((vol * hidden, self._res(blk.link, s)))
            if blk.exposed_fraction > 0:
                exposed.setdefault(blk.link, []).append(
                    (blk.kind, vol * blk.exposed_fraction, blk.latency_s * frac * blk.exposed_fraction, blk.bytes * frac))
        exposed_flows = [(self._res(link, s), sum(p[1] for p in parts), sum(p[2] for p in parts),
                          sum(p[1] + p[2] for p in parts), parts) for link, parts in exposed.items()]
        flows = self._slice_memo[key] = (hidden_flows, exposed_flows)
        return flows

    def _slice(self, s: int, cost: PassCost, frac: float, name: str, step: int) -> Ev:
        """``frac`` of a pass: its collectives' hidden shares start with its compute; the exposed shares follow it."""
        env, acc = self.env, self.acc[step][s]
        if frac <= 0:
            return
        hidden_flows, exposed_flows = self._slice_flows(s, cost, frac)
        for vol, res in hidden_flows:
            self.net.transfer(vol, res, 0.0)
        if cost.compute_s > 0:
            t0 = env.now
            dur = cost.compute_s * frac
            slow = dur * self.st.compute_slowdown if self.dp_busy[s] else 0.0
            yield env.timeout(dur + slow)
            acc["compute"] += dur
            acc["other"] += slow
            self._log(s, "compute", name, t0, "compute", step)
        for res, volume, latency, alone, parts in exposed_flows:  # back-to-back collectives on one link: one flow
            t0 = env.now
            yield self.net.transfer(volume, res, latency)
            took = env.now - t0
            t = t0
            for kind, v, lat, size in parts:  # split the measured time by each collective's share
                share = took * (v + lat) / alone if alone > 0 else 0.0
                acc[kind] += share
                if self.record:
                    self.events.append(RawEvent(s, kind, f"{kind} {name} (exposed part)", t, share, kind, step, size))
                t += share

    def _run_pass(self, s: int, cost: PassCost, name: str, step: int, layers: int,
                  cuts: list[tuple[float, str, Any]] | None = None) -> Ev:
        """Run a pass layer by layer (compute, then its collectives); ``cuts`` = (fraction, "before" |
        "after", action): a "before" action is a generator run (waited for) when the pass reaches the
        fraction, an "after" action a plain call made there."""
        per_layer = bool(cuts) or self.dp_busy[s] > 0  # layer granularity only where DP traffic can overlap
        if not per_layer:  # one slice: the whole pass (what the loop below does with the points {1.0})
            yield from self._slice(s, cost, 1.0, name, step)
            return
        points = sorted({j / layers for j in range(1, layers)}
                        | {c[0] for c in cuts or ()} | {1.0})
        pending = sorted(cuts or (), key=lambda c: c[0])
        done = 0.0
        for point in points:
            while pending and pending[0][0] <= done + 1e-12:
                frac, mode, action = pending.pop(0)
                if mode == "before":
                    yield from action()
                else:
                    action()
            if point > done:
                yield from self._slice(s, cost, point - done, name, step)
                done = point
        for _, mode, action in pending:
            if mode == "before":
                yield from action()
            else:
                action()

    # ------------------------------------------------------------------ DP stream
    def _dp_stream(self, s: int) -> Ev:
        q = self.queues[s]
        while True:
            kind, step, bucket, done = yield q.get()
            t0 = self.env.now
            total = bucket.reduce_s if kind == "reduce" else bucket.gather_s
            lat = bucket.reduce_latency_s if kind == "reduce" else bucket.gather_latency_s
            if total > 0:
                self.dp_busy[s] += 1
                yield self.net.transfer(max(total - lat, 0.0), self._res(bucket.link, s), lat)
                self.dp_busy[s] -= 1
            size = bucket.reduce_bytes if kind == "reduce" else bucket.gather_bytes
            self._log(s, "dp", f"{'RS grad' if kind == 'reduce' else 'AG param'} c{bucket.chunk} {bucket.group}", t0, "dp",
                      step, size)
            if done is not None:
                done.succeed()
            if kind == "reduce":
                self.reduce_left[step][s] -= 1
                if self.reduce_left[step][s] == 0:
                    self.grad_done[step][s].succeed()

    def _reduce(self, s: int, step: int, bucket: BucketCost) -> None:
        self.queues[s].put(("reduce", step, bucket, None))

    def _gather(self, s: int, step: int, k: int) -> simpy.Event:
        """The all-gather of bucket ``k`` (forward order) for ``step`` (issued once)."""
        key = (step, s, k)
        if key not in self.params:
            ev = self.params[key] = self.env.event()
            self.queues[s].put(("gather", step, self.st.stages[s].forward_buckets[k], ev))
        return self.params[key]

    # ------------------------------------------------------------------ a rank
    def _rank(self, s: int) -> Ev:
        st, env, pp = self.st, self.env, self.pp
        stage = st.stages[s]
        order = self.orders[s]
        nv = pp * self.vpp
        last_b = {p.chunk: i for i, p in enumerate(order) if p.kind == "B"}
        first_f: dict[int, int] = {}
        for i, p in enumerate(order):
            if p.kind == "F":
                first_f.setdefault(p.chunk, i)
        fwd_buckets = stage.forward_buckets
        for step in range(self.steps):
            if stage.buckets == ():
                self.grad_done[step][s].succeed()
            hide = st.hide_param_gather and step > 0
            for i, p in enumerate(order):
                v = p.chunk * pp + s
                chunk = stage.chunks[p.chunk]
                label = f"{p.kind} mb{p.microbatch} c{p.chunk}"
                if p.kind == "F":
                    if v > 0:
                        yield from self._wait_msg(s, ("F", step, p.microbatch, v), step)
                    cuts = None
                    if hide and first_f[p.chunk] == i and not st.align_param_gather:
                        for k, b in enumerate(fwd_buckets):  # not aligned: the chunk's gathers start now
                            if b.chunk == p.chunk:
                                self._gather(s, step, k)
                    if hide and first_f[p.chunk] == i:
                        cuts = [(b.fwd_need_fraction, "before", self._param_waiter(s, step, k))
                                for k, b in enumerate(fwd_buckets) if b.chunk == p.chunk]
                    yield from self._run_pass(s, chunk.fwd, label, step, max(chunk.layers, 1), cuts)
                    if v < nv - 1:
                        self._send(s, (v + 1) % pp, ("F", step, p.microbatch, v + 1), step)
                else:
                    if v < nv - 1:
                        yield from self._wait_msg(s, ("B", step, p.microbatch, v), step)
                    cuts = None
                    if st.overlap_grad_reduce and last_b[p.chunk] == i:
                        cuts = [(b.bwd_ready_fraction, "before" if b.prescale_s > 0 else "after",
                                 self._releaser(s, step, b)) for b in stage.buckets if b.chunk == p.chunk]
                    yield from self._run_pass(s, chunk.bwd, label, step, max(chunk.layers, 1), cuts)
                    self.bwd_end[step][s] = env.now
                    if v > 0:
                        self._send(s, (v - 1) % pp, ("B", step, p.microbatch, v - 1), step)
            if stage.grad_prescale_s > 0 and not st.overlap_grad_reduce:  # every bucket's 1/dp scaling, now
                t0 = env.now  # (finish_grad_sync: gradient synchronisation after the backward, booked dp_grad)
                yield env.timeout(stage.grad_prescale_s)
                self.acc[step][s]["dp_grad"] += env.now - t0
                self._log(s, "compute", "scale grads 1/dp", t0, "dp", step)
            if not st.overlap_grad_reduce:
                for b in stage.backward_buckets:
                    self._reduce(s, step, b)
            yield from self._wait(s, self.grad_done[step][s], "dp_grad", step)
            if s in self.embd_stages:  # both ends reduced their DP grads: all-reduce the shared embedding's
                yield from self._wait(s, env.all_of([self.grad_done[step][j] for j in self.embd_stages]), "dp_grad", step)
                t0 = env.now
                yield self.net.transfer(max(stage.embedding_grad_s - stage.embedding_grad_latency_s, 0.0),
                                        self._res(stage.embedding_grad_link, s), stage.embedding_grad_latency_s)
                self.acc[step][s]["dp_grad"] += env.now - t0
                self._log(s, "dp", "AR embedding grad (embd)", t0, "dp", step)
                if not self.embd_done[step].triggered:
                    self.embd_done[step].succeed()
            t0 = env.now
            yield env.all_of(self.grad_done[step] + ([self.embd_done[step]] if self.embd_stages else []))
            drain = min(max(max(self.bwd_end[step]) - t0, 0.0), env.now - t0)  # others still in backward
            last = max(range(pp), key=lambda j: self.bwd_end[step][j])  # their lateness from 1/dp scaling: dp_grad
            scaling = min(drain, max(self.delay[step][last]["dp_grad"] - self.delay[step][s]["dp_grad"], 0.0))
            self.acc[step][s]["pipeline_bubble"] += drain - scaling
            self.acc[step][s]["dp_grad"] += env.now - t0 - drain + scaling
            t0 = env.now
            yield env.timeout(stage.optimizer_compute_s)
            self.acc[step][s]["optimizer"] += env.now - t0
            self._log(s, "optimizer", "optimizer step", t0, "optimizer", step)
            if stage.optimizer_tp_s > 0:
                t0 = env.now
                yield self.net.transfer(stage.optimizer_tp_s, self._res("nvlink", s))
                self.acc[step][s]["optimizer_tp"] += env.now - t0
                self._log(s, "tp", "optimizer TP collectives", t0, "optimizer", step)
            if not st.hide_param_gather:
                for k in range(len(fwd_buckets)):
                    yield from self._wait(s, self._gather(s, step, k), "dp_param", step)
            elif step + 1 < self.steps and st.align_param_gather:
                for k in range(len(fwd_buckets)):  # aligned: prefetch every bucket, in forward order
                    self._gather(s, step + 1, k)
            self.rank_end[step][s] = env.now

    def _param_waiter(self, s: int, step: int, k: int):  # noqa: ANN202
        def wait() -> Ev:
            yield from self._wait(s, self._gather(s, step, k), "dp_param", step)
        return wait

    def _releaser(self, s: int, step: int, bucket: BucketCost):  # noqa: ANN202
        """Release ``bucket``'s reduction; with a 1/dp pre-scaling (``prescale_s``) a generator that
        first runs it on the compute stream (MCore ``start_grad_sync`` from the backward hook).

        The scaling is gradient synchronisation: booked as ``dp_grad`` here, and carried with this
        rank's later messages (``delay``) so that the ranks it holds up book their waits as
        ``dp_grad`` too, not as pipeline bubble (as the analytic engine does)."""
        if bucket.prescale_s <= 0:
            return lambda: self._reduce(s, step, bucket)

        def scale_then_reduce() -> Ev:
            t0 = self.env.now
            yield self.env.timeout(bucket.prescale_s)
            self.acc[step][s]["dp_grad"] += self.env.now - t0
            self.delay[step][s]["dp_grad"] += self.env.now - t0
            self._log(s, "compute", f"scale grads 1/dp c{bucket.chunk}", t0, "dp", step)
            self._reduce(s, step, bucket)
        return scale_then_reduce

    def run(self) -> DesResult:
        """Run the simulation to the end and collect per-step times and attributions."""
        for s in range(self.pp):
            self.env.process(self._dp_stream(s))
            self.env.process(self._rank(s))
        self.env.run()
        ends = [max(r) for r in self.rank_end]
        return DesResult(step_ends_s=ends, rank_ends_s=self.rank_end,
                         attribution=[[dict(a) for a in row] for row in self.acc], events=self.events)

"""Instrumented collectives and phase clocks.

Every collective the reference issues goes through :class:`Comm`, which performs it on the right
process group and records a :class:`workloads.comm.CollectiveCall` (op, group kind, group size,
dtype, bytes in the nccl-tests size convention, phase) with the step it belongs to and its wall
time. Groups of size one are skipped (nothing moves; Megatron skips them too) and not recorded.

Transport notes (gloo): the variable-size all-gather (``all_gather_v``) is done by padding every
rank's part to the largest and calling ``all_gather_single``; it is recorded as the logical
operation with the total gathered bytes, which is what NCCL would move.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from workloads.comm import CollectiveCall

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# torch >= 2.13 names; older releases only have the *_tensor spellings
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class Group:
    """A process group as seen by one rank (``pg`` None for a single-rank group)."""

    kind: str  # 'dp', 'expert_dp', 'tp', 'etp'
    size: int
    rank: int
    pg: object | None


@dataclass
class CommRecord:
    """One issued collective: the call (count 1), its step, wall time and time the caller blocked."""

    step: int
    call: CollectiveCall
    wall_s: float = 0.0
    blocked_s: float = 0.0


class Pending:
    """An in-flight collective; :meth:`wait` blocks, finishes it and records the timing."""

    def __init__(self, record: CommRecord, work: object | None, t0: float, finish: Callable[[], None] | None,
                 sync: Callable[[], None]) -> None:
        self._record, self._work, self._t0, self._finish, self._sync = record, work, t0, finish, sync
        self.done = False

    @property
    def blocked_s(self) -> float:
        """Seconds the caller has spent blocked on this collective so far."""
        return self._record.blocked_s

    def wait(self) -> float:
        """Block until complete; returns the seconds spent blocked here."""
        if self.done:
            return 0.0
        t = time.perf_counter()
        if self._work is not None:
            self._work.wait()  # type: ignore[attr-defined]
        self._sync()
        if self._finish is not None:
            self._finish()
        end = time.perf_counter()
        self._record.blocked_s += end - t
        self._record.wall_s = end - self._t0
        self.done = True
        return end - t


class Comm:
    """Issues and records collectives for one rank; ``step`` tags the records."""

    def __init__(self, groups: dict[str, Group], sync: Callable[[], None] = lambda: None) -> None:
        self.groups = groups
        self.sync = sync
        self.step = 0
        self.records: list[CommRecord] = []

    # ----- helpers -----
    def _record(self, op: str, kind: str, dtype: torch.dtype, nbytes: int, phase: str) -> CommRecord:
        g = self.groups[kind]
        call = CollectiveCall(op=op, group=kind, group_size=g.size, dtype=DTYPE_NAMES[dtype],  # type: ignore[arg-type]
                              bytes=int(nbytes), count=1, phase=phase)
        rec = CommRecord(self.step, call)
        self.records.append(rec)
        return rec

    def _issue(self, rec: CommRecord, launch: Callable[[bool], object], async_op: bool,
               finish: Callable[[], None] | None = None) -> Pending:
        t0 = time.perf_counter()
        work = launch(async_op)
        pending = Pending(rec, work if async_op else None, t0, finish, self.sync)
        rec.blocked_s = time.perf_counter() - t0
        if not async_op:
            pending.wait()
        return pending

    @staticmethod
    def _done() -> Pending:
        p = Pending(CommRecord(-1, CollectiveCall("all_reduce", "world", 1, "fp32", 0)), None, 0.0, None, lambda: None)
        p.done = True
        return p

    # ----- collectives -----
    def all_reduce(self, t: torch.Tensor, kind: str, phase: str, async_op: bool = False) -> Pending:
        """In-place SUM all-reduce; bytes = the buffer."""
        g = self.groups[kind]
        if g.size == 1:
            return self._done()
        rec = self._record("all_reduce", kind, t.dtype, t.numel() * t.element_size(), phase)
        return self._issue(rec, lambda a: dist.all_reduce(t, group=g.pg, async_op=a), async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, kind: str, phase: str,
                       async_op: bool = False) -> Pending:
        """SUM reduce-scatter of ``inp`` (size × out) into ``out``; bytes = the whole input."""
        g = self.groups[kind]
        if g.size == 1:
            out.copy_(inp)
            return self._done()
        rec = self._record("reduce_scatter", kind, inp.dtype, inp.numel() * inp.element_size(), phase)
        return self._issue(rec, lambda a: _REDUCE_SCATTER(out, inp, group=g.pg, async_op=a), async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, kind: str, phase: str,
                   async_op: bool = False) -> Pending:
        """Equal all-gather of ``inp`` into ``out`` (rank order); bytes = the whole output."""
        g = self.groups[kind]
        if g.size == 1:
            out.copy_(inp)
            return self._done()
        rec = self._record("all_gather", kind, out.dtype, out.numel() * out.element_size(), phase)
        return self._issue(rec, lambda a: _ALL_GATHER(out, inp, group=g.pg, async_op=a), async_op)

    def all_gather_v(self, inp: torch.Tensor, sizes: list[int], kind: str, phase: str,
                     on_done: Callable[[list[torch.Tensor]], None], async_op: bool = False) -> Pending:
        """Variable-size all-gather of 1-D ``inp`` (this rank's ``sizes[rank]`` elements).

        ``on_done`` receives every rank's part. bytes = Σ sizes × element size.
        """
        g = self.groups[kind]
        if g.size == 1:
            on_done([inp])
            return self._done()
        width = max(max(sizes), 1)
        send = torch.zeros(width, dtype=inp.dtype, device=inp.device)
        send[: inp.numel()] = inp
        recv = torch.empty(width * g.size, dtype=inp.dtype, device=inp.device)
        rec = self._record("all_gather_v", kind, inp.dtype, sum(sizes) * inp.element_size(), phase)

        def finish() -> None:
            on_done([recv[r * width: r * width + n] for r, n in enumerate(sizes)])

        return self._issue(rec, lambda a: _ALL_GATHER(recv, send, group=g.pg, async_op=a),
                           async_op, finish)


_RUSAGE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def thread_counters() -> tuple[int, int]:
    """(minor page faults, involuntary context switches) of this thread so far (of the process where
    threads are not counted apart), one ``getrusage``."""
    usage = resource.getrusage(_RUSAGE)
    return usage.ru_minflt, usage.ru_nivcsw


class PhaseClock:
    """Per-step wall time per phase for one rank (seconds, accumulated within a step).

    Timed blocks also record this thread's CPU time (``cpu_steps``): on a shared CPU machine a
    block's wall time includes the time other processes held the core, its CPU time does not; and
    its minor page faults (``fault_steps``: pages the allocator had given back to the OS and the block
    touched again, see :mod:`reference.allocator`) and its preemptions (``preempt_steps``: involuntary
    context switches; each hands the core to another process, whose data evicts this thread's caches,
    and the refill counts in its CPU time: a run with many is not a quiet run).
    """

    def __init__(self, sync: Callable[[], None] = lambda: None) -> None:
        self.sync = sync
        self.steps: list[dict[str, float]] = []
        self.cpu_steps: list[dict[str, float]] = []
        self.fault_steps: list[dict[str, float]] = []
        self.preempt_steps: list[dict[str, float]] = []

    def new_step(self) -> None:
        """Start accumulating a new step."""
        self.steps.append(defaultdict(float))
        self.cpu_steps.append(defaultdict(float))
        self.fault_steps.append(defaultdict(float))
        self.preempt_steps.append(defaultdict(float))

    def add(self, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase`` of the current step."""
        self.steps[-1][phase] += seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block (synchronising the device first and last) into ``name``."""
        self.sync()
        t, cpu, (faults, preempts) = time.perf_counter(), time.thread_time(), thread_counters()
        try:
            yield
        finally:
            self.sync()
            self.add(name, time.perf_counter() - t)
            self.cpu_steps[-1][name] += time.thread_time() - cpu
            faults_now, preempts_now = thread_counters()
            self.fault_steps[-1][name] += faults_now - faults
            self.preempt_steps[-1][name] += preempts_now - preempts


@dataclass
class NsCounter:
    """Newton–Schulz FLOPs and seconds of one rank, per step."""

    flops: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def new_step(self) -> None:
        """Start counting a new step."""
        self.flops.append(0.0)
        self.seconds.append(0.0)

    def add(self, flops: float, seconds: float) -> None:
        """Add one Newton-Schulz call: FLOPs and wall seconds."""
        self.flops[-1] += flops
        self.seconds[-1] += seconds

"""Evaluating one candidate: validate, check memory, predict the step time.

The engine and the memory function are injected (:class:`Evaluator`), so the planner's logic is
tested with stub functions and runs with the real models otherwise: screening uses
:class:`costmodel.planner.fast_analytic.FastAnalytic` (the analytic engine with shared optimizer
plans), the memory function is ``workloads.memory.memory_breakdown(scenario).total_bytes``.
Memory is cached per ``Candidate.memory_key`` (load balancing and hiding cannot change it). A
compact :class:`Evaluation` (not a whole StepReport) is what crosses process boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from costmodel.planner.space import Candidate, build_scenario
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from costmodel.report import Breakdown, StepReport
    from workloads.scenario import Scenario

Terms = tuple[tuple[str, float], ...]
MemoryFn = Callable[["Scenario"], "MemoryEstimate"]
Status = Literal["ok", "oom", "invalid", "unsupported", "error"]


class StepEngine(Protocol):
    """What screening needs from an engine (seconds)."""

    def step(self, scenario: Scenario) -> tuple[float, Terms]:
        """(step time, breakdown terms: compute, pipeline_bubble, comm:<kind>, optimizer, other)."""
        ...

    def pipeline_bound_s(self, scenario: Scenario) -> float:
        """A lower bound on the step time of every optimizer choice of this layout."""
        ...


MEMORY_LIMIT_FRACTION = 0.95  # a plan using >= 95 % of the memory budget is 'memory'-limited


@dataclass(frozen=True)
class Evaluation:
    """The outcome of one candidate. Times in seconds, memory in bytes per GPU (most loaded GPU)."""

    candidate: Candidate
    status: Status
    message: str = ""
    step_time_s: float = math.nan
    tokens_per_s_per_gpu: float = math.nan
    memory_bytes: float = math.nan
    budget_bytes: float = math.nan
    terms_s: tuple[tuple[str, float], ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.status == "ok"

    @property
    def timed(self) -> bool:
        return not math.isnan(self.step_time_s)

    @property
    def terms(self) -> dict[str, float]:
        """Breakdown terms in seconds: compute, pipeline_bubble, comm:<kind>, optimizer, other."""
        return dict(self.terms_s)

    @property
    def memory_fraction(self) -> float:
        """Memory per GPU / memory budget (dimensionless)."""
        return self.memory_bytes / self.budget_bytes if self.budget_bytes else math.nan

    def limiter(self) -> str:
        """What limits the plan: 'memory' when near the budget, else the largest breakdown term,
        followed by the largest overhead term (e.g. ``compute 71% · comm:ep 12%``)."""
        if not self.timed or not self.terms_s:
            return self.status
        total = sum(v for _, v in self.terms_s) or 1.0
        ranked = sorted(self.terms_s, key=lambda kv: -kv[1])
        parts = []
        if self.memory_fraction >= MEMORY_LIMIT_FRACTION:
            parts.append(f"memory {self.memory_fraction:.0%}")
        top = ranked[0]
        parts.append(f"{top[0]} {top[1] / total:.0%}")
        overhead = [kv for kv in ranked if kv[0] not in ("compute", top[0]) and kv[1] > 0]
        if overhead:
            parts.append(f"{overhead[0][0]} {overhead[0][1] / total:.0%}")
        return " · ".join(parts)


def report_terms(report: StepReport) -> Terms:
    """Flatten a StepReport breakdown into named terms (seconds)."""
    return breakdown_terms(report.breakdown_s)


def breakdown_terms(b: Breakdown) -> Terms:
    """Flatten a breakdown (a report's, a plan row's) into named terms (seconds): compute,
    pipeline_bubble, comm:<kind>, optimizer, other."""
    terms = [("compute", b.compute), ("pipeline_bubble", b.pipeline_bubble)]
    terms += [(f"comm:{k}", v) for k, v in sorted(b.exposed_comm.items())]
    terms += [("optimizer", b.optimizer), ("other", b.other)]
    return tuple((k, float(v)) for k, v in terms)


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per GPU in bytes: the most loaded GPU's total, and the part no optimizer choice changes
    (weights + gradients + activations of the most loaded stage: a floor for every optimizer choice)."""

    total_bytes: float
    floor_bytes: float


class InventoryMemory:
    """``workloads.memory`` per stage with the tensor inventory cached between candidates.

    :func:`workloads.memory.memory_by_stage` with the inventory cached, hence the same totals as
    ``memory_breakdown(scenario)`` (the most loaded stage): the stages' activations computed at once,
    and stages holding the same layers priced once (the memo ``stage_memory`` keys on them); the
    inventory depends only on the model, tp, pp, vpp, ep, etp, the QKV split and the pipeline split,
    and is shared with the optimizer plans (:func:`costmodel.optimizer.plan.cached_inventory`).
    """

    def _inventory(self, scenario: Scenario) -> Any:
        from costmodel.optimizer.plan import cached_inventory

        return cached_inventory(scenario)

    def __call__(self, scenario: Scenario) -> MemoryEstimate:
        from workloads.activation_memory import activation_bytes_by_stage
        from workloads.memory import stage_memory

        inv = self._inventory(scenario)
        memo: dict[tuple[Any, ...], Any] = {}  # this scenario's stages by their layers (memory_by_stage's)
        activations = activation_bytes_by_stage(scenario)
        stages = [stage_memory(scenario, s, inv, memo, activations) for s in range(scenario.par.pp)]
        total = max(m.total_bytes for m in stages)
        floor = max(m.weights_bytes + m.gradients_bytes + m.activations_bytes for m in stages)
        return MemoryEstimate(total_bytes=float(total), floor_bytes=float(floor))


def default_memory_fn() -> MemoryFn:
    """Memory per GPU from the accounting model (``workloads.memory``)."""
    return InventoryMemory()


class Evaluator:
    """Evaluates candidates against one base scenario (holds the per-process caches)."""

    def __init__(self, base: Scenario, engine: StepEngine, memory_fn: MemoryFn, budget_bytes: float) -> None:
        self.base = base
        self.engine = engine
        self.memory_fn = memory_fn
        self.budget_bytes = budget_bytes
        self._memory: dict[tuple[Any, ...], float] = {}
        self._floor: dict[tuple[Any, ...], float] = {}  # per layout + recompute
        self.calls = 0  # step-time calls made by this evaluator

    def with_base(self, base: Scenario) -> Evaluator:
        """Same functions and budget over another base (e.g. perturbed efficiency factors)."""
        ev = Evaluator(base, self.engine, self.memory_fn, self.budget_bytes)
        ev._memory, ev._floor = self._memory, self._floor  # memory does not depend on efficiency factors
        return ev

    def memory_of(self, cand: Candidate, scenario: Scenario) -> float:
        """Bytes per GPU of ``cand`` (cached per memory key)."""
        key = cand.memory_key
        if key not in self._memory:
            est = self.memory_fn(scenario)
            self._memory[key] = est.total_bytes
            self._floor[cand.structure] = max(self._floor.get(cand.structure, 0.0), est.floor_bytes)
        return self._memory[key]

    def floor_exceeds_budget(self, cand: Candidate) -> bool:
        """Whether the memory no optimizer choice changes already exceeds the budget (for every
        candidate of ``cand``'s layout and recompute mode; False while unknown)."""
        return self._floor.get(cand.structure, 0.0) > self.budget_bytes

    def evaluate(self, cand: Candidate, time_if_oom: bool = False, memory_only: bool = False) -> Evaluation:
        """Validate, check memory and (if it fits, or ``time_if_oom``) predict ``cand``.

        ``memory_only`` stops after the memory check (status ok/oom, no step time).
        """
        try:
            scenario = build_scenario(self.base, cand)
        except UserInputError as err:
            return Evaluation(cand, "invalid", str(err))
        try:
            mem = self.memory_of(cand, scenario)
            fits = mem <= self.budget_bytes
            status: Status = "ok" if fits else "oom"
            message = "" if fits else f"needs {mem / 1e9:.1f} GB of a {self.budget_bytes / 1e9:.1f} GB budget"
            if memory_only or (not fits and not time_if_oom):
                return Evaluation(cand, status, message, memory_bytes=mem, budget_bytes=self.budget_bytes)
            self.calls += 1
            step_s, terms = self.engine.step(scenario)
        except UserInputError as err:
            return Evaluation(cand, "invalid", str(err))
        except Exception as err:  # noqa: BLE001 - one bad candidate must not end a long search
            kind: Status = "unsupported" if type(err).__name__ == "UnsupportedScenario" else "error"
            return Evaluation(cand, kind, f"{type(err).__name__}: {err}")
        return Evaluation(cand, status, message, step_time_s=step_s,
                          tokens_per_s_per_gpu=scenario.tokens_per_step / (step_s * scenario.gpus),
                          memory_bytes=mem, budget_bytes=self.budget_bytes, terms_s=terms)

    def bound(self, cand: Candidate) -> tuple[float, Evaluation | None]:
        """(lower bound on the step time of ``cand``'s layout, or inf + the failure)."""
        try:
            scenario = build_scenario(self.base, cand)
            return float(self.engine.pipeline_bound_s(scenario)), None
        except UserInputError as err:
            return math.inf, Evaluation(cand, "invalid", str(err))
        except Exception as err:  # noqa: BLE001 - reported, not raised: one layout must not end the search
            kind: Status = "unsupported" if type(err).__name__ == "UnsupportedScenario" else "error"
            return math.inf, Evaluation(cand, kind, f"{type(err).__name__}: {err}")

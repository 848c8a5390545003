"""What ``muonsim plan`` returns: the ranking, Pareto front, reference, sensitivity (pydantic, ``--json``).

Times in seconds, memory in bytes per GPU (the most loaded GPU), throughput in tokens/s per GPU.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from costmodel.planner.evaluate import Evaluation
from costmodel.report import Breakdown


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanRow(_Out):
    rank: int | None = Field(None, description="1 = best; None when only a range is known")
    rank_range: tuple[int, int] | None = Field(None, description="(best case, worst case) when not exact")
    label: str
    settings: dict[str, Any]
    step_time_s: float = Field(description="analytic engine")
    des_step_time_s: float | None = Field(None, description="discrete-event engine (top-k only)")
    tokens_per_s_per_gpu: float
    memory_per_gpu_bytes: float
    memory_fraction_of_budget: float
    limiter: str = Field(description="memory when near the budget, else the largest breakdown terms")
    breakdown_s: Breakdown = Field(description="the analytic step time's additive terms, as predict --json nests them")
    reference: bool = False
    pareto: bool = False
    hypothetical: bool = Field(False, description="a layout / load-balance pair Megatron-Core does not have")

    @property
    def best_time_s(self) -> float:
        """The DES time when there is one, else the analytic time."""
        return self.des_step_time_s if self.des_step_time_s is not None else self.step_time_s


class ReferenceOut(_Out):
    label: str | None = None
    status: str = Field(description="ok, oom, invalid, unsupported, error or absent")
    message: str = ""
    rank: int | None = None
    rank_range: tuple[int, int] | None = None
    rank_estimate: int | None = Field(None, description="sampled estimate when only a range is known")
    row: PlanRow | None = None


class SpaceStats(_Out):
    raw_combinations: int = Field(description="product of the allowed values before any rule")
    valid_layouts: int = Field(description="tp/pp/vpp/cp/ep/etp/mbs rows passing Megatron's divisibility rules")
    layouts_over_memory_by_weights: int = Field(description="rows whose weights + gradients alone exceed the budget")
    layouts_screened: int = Field(description="layout x recompute units given to the screen")
    groups: int = Field(description="layout x recompute x optimizer kind")
    candidates: int = Field(description="every optimizer choice of every group")
    bounds_computed: int
    groups_expanded: int
    groups_infeasible: int
    candidates_evaluated: int = Field(description="full analytic evaluations (memory + step time)")
    candidates_pruned: int = Field(description="never evaluated: provably slower than the listed plans")
    candidates_unexamined: int = Field(0, description="neither evaluated nor pruned: the search was interrupted first")
    bound_violations: int = Field(description="times a real step time fell below its bound (should be 0)")
    threshold_s: float | None = None
    jobs: int
    screening_wall_s: float
    engine_calls_per_s: float = Field(description="(bounds + full evaluations) / screening wall time")
    candidates_per_s: float = Field(description="candidates covered (evaluated or pruned) / screening wall time")
    des_wall_s: float = 0.0
    sensitivity_wall_s: float = 0.0
    total_wall_s: float = 0.0


class PlanResult(_Out):
    scenario: dict[str, Any]
    scenario_source: str = Field("", description="where the base scenario's layout came from (one line)")
    calibration: str
    pins: str
    memory_headroom_fraction: float = Field(description="fraction of HBM kept free")
    memory_budget_bytes: float
    ranking: list[PlanRow]
    reference: ReferenceOut
    pareto_front: list[PlanRow]
    best: PlanRow | None = None
    best_report: dict[str, Any] | None = None
    sensitivity: dict[str, Any] | None = None
    explain: list[dict[str, Any]] = Field(default_factory=list)
    stats: SpaceStats
    interrupted: bool = False
    notes: list[str] = Field(default_factory=list)


def plan_row(e: Evaluation, rank: int | None = None, des_step_time_s: float | None = None,
             reference: bool = False, pareto: bool = False, rank_range: tuple[int, int] | None = None) -> PlanRow:
    """A row of the ranking from an evaluation."""
    return PlanRow(
        rank=rank, rank_range=rank_range, label=e.candidate.label(),
        settings={k: v for k, v in e.candidate.settings().items() if v is not None},
        step_time_s=e.step_time_s, des_step_time_s=des_step_time_s, tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
        memory_per_gpu_bytes=e.memory_bytes, memory_fraction_of_budget=e.memory_fraction, limiter=e.limiter(),
        breakdown_s=terms_breakdown(e.terms), reference=reference, pareto=pareto, hypothetical=e.candidate.hypothetical,
    )


def terms_breakdown(terms_s: dict[str, float]) -> Breakdown:
    """The :class:`Breakdown` (seconds) of an evaluation's flat terms (``comm:<kind>`` nested under
    ``exposed_comm``), so a plan row's ``breakdown_s`` has the shape and names of a StepReport's."""
    exposed = {k.removeprefix("comm:"): v for k, v in terms_s.items() if k.startswith("comm:")}
    return Breakdown(compute=terms_s.get("compute", 0.0), pipeline_bubble=terms_s.get("pipeline_bubble", 0.0),
                     exposed_comm=exposed, optimizer=terms_s.get("optimizer", 0.0), other=terms_s.get("other", 0.0))

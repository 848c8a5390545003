"""StepReport: what both engines return (one contract), and its JSON form.

All times in seconds, memory in bytes, throughput per GPU. ``breakdown_s`` splits the step time
into additive parts: ``compute`` (the busy compute time of the critical rank), ``pipeline_bubble``,
``exposed_comm`` by kind (what is not hidden behind compute), ``optimizer`` (the optimizer step's
exposed compute), and ``other``. Exporters (rich table, Perfetto trace, plotly HTML) live in
:mod:`costmodel.exporters`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EngineName = Literal["analytic", "des"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Breakdown(_Out):
    """Additive decomposition of the step time (seconds)."""

    compute: float = 0.0
    pipeline_bubble: float = 0.0
    exposed_comm: dict[str, float] = Field(default_factory=dict, description="by kind: tp, cp, ep, dp_fsdp (Megatron-FSDP per-layer gathers and reduce-scatters), offload (activation copies to and from host memory), pp, dp_grad, dp_param, optimizer_tp")
    optimizer: float = 0.0
    other: float = 0.0

    @property
    def total_s(self) -> float:
        """Sum of the terms: the step time they account for, in seconds."""
        return self.compute + self.pipeline_bubble + sum(self.exposed_comm.values()) + self.optimizer + self.other


def breakdown_label(key: str, kind: str | None = None) -> str:
    """The display label of a ``breakdown_s`` term (``kind``: the collective kind of an ``exposed_comm`` term)."""
    if kind is not None:
        return f"exposed comm: {kind}"
    return {"pipeline_bubble": "pipeline bubble", "optimizer": "optimizer step"}.get(key, key)


def breakdown_rows(report: StepReport) -> list[tuple[str, float]]:
    """(label, seconds) rows of a report's additive breakdown, in display order."""
    return breakdown_term_rows(report.breakdown_s)


def breakdown_term_rows(b: Breakdown) -> list[tuple[str, float]]:
    """(label, seconds) rows of an additive breakdown (a report's, a plan row's), in display order."""
    rows = [(breakdown_label("compute"), b.compute), (breakdown_label("pipeline_bubble"), b.pipeline_bubble)]
    rows += [(breakdown_label("exposed_comm", k), v) for k, v in b.exposed_comm.items()]
    rows += [(breakdown_label("optimizer"), b.optimizer), (breakdown_label("other"), b.other)]
    return rows


class Stats(_Out):
    """Minimum, mean and maximum of a per-rank quantity."""

    min: float
    mean: float
    max: float


class CollectiveOut(_Out):
    """One collective kind per step per GPU: op, group, exact bytes (nccl-tests size), count, time in s."""

    op: str
    group: str
    group_size: int
    dtype: str
    bytes: int
    count: int
    phase: str = ""
    time_s: float | None = None


class OptimizerKernelsOut(_Out):
    """The kernels of the optimizer step on the critical GPU (launches, seconds)."""

    launches: int = Field(description="kernel launches of the step on the critical GPU")
    by_part: dict[str, int] = Field(default_factory=dict, description="launches by part: newton_schulz_gemm, "
                                      "muon_elementwise, adam_multi_tensor, adam_param_copy, grad_norm, gather_copy")
    muon_tensors: int = Field(0, description="Muon tensors (expert copies counted) the critical GPU steps")
    launches_per_muon_tensor: float | None = Field(None, description="mean Newton-Schulz and element-wise launches per Muon tensor")
    gpu_s: float = Field(description="GPU-busy seconds (kernels and blocking TP collectives)")
    issue_s: float = Field(description="host seconds to issue the launches (kernel_issue_s each)")
    host_idle_s: float = Field(description="seconds the GPU waits for the host (launch-bound share of the step)")
    grad_prescale_launches: int = Field(0, description="grad_data *= 1/dp kernels before the bucket reductions (one per "
                                        "bucket, in the backward pass, not in the step)")


class OptimizerReport(_Out):
    """The optimizer section of a StepReport (seconds, FLOPs, bytes)."""

    kind: str
    distribution: str
    layout: str | None = None
    tp_mode: str | None = None
    load_balance: str | None = None
    hypothetical: bool = Field(False, description="a layout / load-balance pair Megatron-Core does not have (a what-if; "
                               "the reason is in notes)")
    per_rank_compute_s: Stats
    imbalance_ratio: float = Field(description="max / mean per-rank optimizer compute")
    imbalance_lost_s: float = Field(0.0, description="(max - mean) per-rank optimizer compute")
    exposed_s: float = Field(description="optimizer-related time on the critical path (compute + unhidden comm)")
    hidden_s: float = Field(description="optimizer-related communication hidden behind compute")
    newton_schulz_flops: dict[str, float] = Field(default_factory=dict, description="total, per_rank_max, per_rank_mean")
    padding_overhead_pct: float | None = None
    kernels: OptimizerKernelsOut | None = None
    collectives: list[CollectiveOut] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class MemoryReport(_Out):
    """Memory per GPU on the most loaded stage, in bytes, by component."""

    total_bytes: float
    components_bytes: dict[str, float]
    capacity_bytes: float
    fits: bool


class TimelineEvent(_Out):
    """One interval of the simulated timeline (seconds from the start of the first step)."""

    rank: str = Field(description="representative rank label, e.g. 'pp0'")
    stream: str = Field(description="compute, tp, ep, cp, pp, dp, optimizer")
    name: str
    start_s: float
    duration_s: float
    category: str = ""
    step: int = 0
    bytes: float | None = Field(None, description="bytes the operation moves per GPU (communication; None: not recorded)")


class StepReport(_Out):
    """What both engines return for one scenario (seconds, bytes, per-GPU throughput)."""

    engine: EngineName
    scenario: dict[str, Any]
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu_fraction: float = Field(description="model TFLOP/s per GPU / dense peak at the training precision")
    breakdown_s: Breakdown
    memory_per_gpu_bytes: float
    memory: MemoryReport | None = None
    optimizer: OptimizerReport | None = None
    events: list[TimelineEvent] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    calibration: str = "datasheet defaults"

    def to_json_dict(self, include_events: bool = False) -> dict[str, Any]:
        """The ``--json`` form (events only when asked: they can be large)."""
        data = self.model_dump(mode="json")
        if not include_events:
            data.pop("events", None)
        return data

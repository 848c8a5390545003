"""Assembling a :class:`StepReport` from an engine's timing (shared by both engines).

Throughput follows Megatron-Bridge: ``model_tflops_per_gpu = model_flops_per_token(model, seq, tp)
× tokens per step / step time / GPUs``; MFU divides it by the dense peak at the training
precision. Memory comes from ``workloads.memory.memory_breakdown`` when that module exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.report import Breakdown, MemoryReport, OptimizerReport, StepReport, TimelineEvent
from topologies.identity_memo import IdentityMemo
from workloads.flops import model_flops_per_token

if TYPE_CHECKING:
    from costmodel.optimizer.plan_types import OptimizerPlan
    from workloads.scenario import Scenario


_MEMORY_CACHE: IdentityMemo[tuple[MemoryReport | None, list[str]]] = IdentityMemo(4096)  # model, system by identity


def memory_report(scenario: Scenario) -> tuple[MemoryReport | None, list[str]]:
    """The per-GPU memory of ``scenario`` (memoised per scenario: the planner asks many times)."""
    out = _MEMORY_CACHE.get(scenario.config, scenario.model, scenario.system)
    if out is None:
        out = _MEMORY_CACHE.put(_memory_report(scenario), scenario.config, scenario.model, scenario.system)
    return out[0], list(out[1])


def _memory_report(scenario: Scenario) -> tuple[MemoryReport | None, list[str]]:
    try:
        from workloads.memory import MemoryBreakdown, memory_breakdown
    except ImportError:
        return None, ["memory model not available yet: memory_per_gpu_bytes is 0"]
    mb: Any = memory_breakdown(scenario)
    if isinstance(mb, MemoryReport):
        return mb, []
    if isinstance(mb, MemoryBreakdown):  # the memory model's own type: read its fields (what the generic path finds)
        total = float(mb.total_bytes)
        capacity = float(mb.capacity_bytes)
        return MemoryReport(total_bytes=total, components_bytes={k: float(v) for k, v in mb.components_bytes.items()},
                            capacity_bytes=capacity, fits=total <= capacity), []
    if isinstance(mb, dict):
        mb_dict = mb
    elif hasattr(mb, "model_dump"):
        mb_dict = mb.model_dump()
    else:
        mb_dict = {k: getattr(mb, k) for k in dir(mb) if not k.startswith("_") and not callable(getattr(mb, k))}
    total = float(mb_dict.get("total_bytes", 0.0))
    comps = mb_dict.get("components_bytes") or mb_dict.get("components") or {}
    capacity = float(mb_dict.get("capacity_bytes", scenario.system.gpu.hbm_bytes))
    fits = bool(mb_dict.get("fits", total <= capacity))
    return MemoryReport(total_bytes=total, components_bytes={k: float(v) for k, v in comps.items()},
                        capacity_bytes=capacity, fits=fits), []


def optimizer_section(plan: OptimizerPlan, exposed_s: float, hidden_s: float) -> OptimizerReport:
    """The optimizer report of the optimizer models (``exposed_s`` / ``hidden_s`` in seconds)."""
    from costmodel.optimizer.plan import optimizer_report

    return optimizer_report(plan, exposed_s, hidden_s)


_FLOPS_PER_TOKEN: IdentityMemo[float] = IdentityMemo(4096)  # the model keyed by identity


def _flops_per_token(scenario: Scenario) -> float:
    """:func:`model_flops_per_token` of the scenario's model, sequence and tp (memoised: it reads only these)."""
    key = (scenario.par.seq_length, scenario.par.tp)
    hit = _FLOPS_PER_TOKEN.get(key, scenario.model)
    if hit is None:
        hit = _FLOPS_PER_TOKEN.put(model_flops_per_token(scenario.model, *key), key, scenario.model)
    return hit


MFU_FLOOR = 0.05  # below: the step is almost all waiting (published runs reach 20-50 %)
PADDING_CEILING_PCT = 100.0  # above: the optimizer's collectives move more padding than parameters
PADDING_MEMORY_FLOOR_BYTES = 1e9  # at or above: the layer-wise padding's uncounted buffer memory is warned about


def layer_wise_padding_bytes(plan: OptimizerPlan, params_in_grad_buffer: bool = False) -> tuple[int, float]:
    """(stage, bytes) of the largest per-GPU padding in a plan's layer-wise buckets: Megatron-Core's
    ``_ParamAndGradBuffer`` allocates the gradient buffer, and with the distributed optimizer the parameter
    buffer, at the padded bucket size (``dp × padded shard``), so the padding takes
    ``(numel - used numel) × (gradient + parameter bytes per element)`` on every GPU of the stage
    (gradient bytes only when MXFP8 parameters share the gradient buffer: ``params_in_grad_buffer``)."""
    worst = (0, 0.0)
    for st in plan.stages:
        pad = sum((b.numel - b.used_numel) * (b.grad_bytes + (0.0 if params_in_grad_buffer else b.param_bytes)) / b.numel
                  for b in st.buckets if b.kind == "layer_wise" and b.numel > 0)
        if pad > worst[1]:
            worst = (st.stage, pad)
    return worst


def sanity_warnings(report: StepReport, padding_bytes: tuple[int, float] = (0, 0.0)) -> list[str]:
    """Warnings for results no real training run would accept (MFU under 5 %, the layer-wise
    optimizer's buckets padded by more than their parameters), naming the likely cause;
    ``padding_bytes``: :func:`layer_wise_padding_bytes` of the report's plan."""
    out = []
    if report.step_time_s > 0 and report.mfu_fraction < MFU_FLOOR:
        parts = [("compute", report.breakdown_s.compute), ("pipeline bubble", report.breakdown_s.pipeline_bubble),
                 *((f"exposed {k}", v) for k, v in report.breakdown_s.exposed_comm.items()),
                 ("optimizer step", report.breakdown_s.optimizer)]
        name, worst = max(parts, key=lambda kv: kv[1])
        out.append(f"MFU {report.mfu_fraction * 100:.1f} % is under {MFU_FLOOR * 100:.0f} %: {name} takes {worst:.3g} s of the "
                   f"{report.step_time_s:.3g} s step; check the layout (too little work per data-parallel rank?)")
    opt = report.optimizer
    if opt is not None and opt.padding_overhead_pct is not None and opt.padding_overhead_pct > PADDING_CEILING_PCT:
        out.append(f"{opt.kind} {opt.distribution} padding {opt.padding_overhead_pct:.0f} %: its reduce-scatter and "
                   "all-gather move more padding than parameters (fewer matrices per bucket than data-parallel "
                   "ranks); the legacy layout or fewer data-parallel ranks avoid it")
    stage, pad = padding_bytes
    if pad >= PADDING_MEMORY_FLOOR_BYTES:
        out.append(f"the layer-wise buckets' padding takes {pad / 1e9:,.1f} GB more per GPU on stage {stage} (Megatron "
                   "allocates the gradient and parameter buffers at the padded size), which the memory figure does not "
                   "count yet")
    return out


def schedule_warnings(pp: int, vpp: int, microbatches: int) -> list[str]:
    """A warning when the interleaved schedule's last group of micro-batches is partial (``0 < m mod pp``):
    Megatron-Core 0.16 refuses it with the default group size (``forward_backward_pipelining_with_interleaving``:
    "The remainder of M ... should be 0, or larger than or equal to the pipeline-parallel size"); the engines
    price the order as built (or, when it cannot run, the analytic closed form; the DES refuses)."""
    if vpp <= 1 or microbatches % pp == 0:
        return []
    return [f"{microbatches} micro-batches on pp {pp} with interleaving leave a partial last group of "
            f"{microbatches % pp}: Megatron-Core 0.16 refuses it (with its default group of pp micro-batches); a global "
            "batch size giving a multiple of pp micro-batches per pipeline avoids it"]


def build_report(scenario: Scenario, engine: str, step_time_s: float, breakdown: Breakdown,
                 plan: OptimizerPlan, optimizer_exposed_s: float, optimizer_hidden_s: float,
                 events: list[TimelineEvent] | None = None, warnings: list[str] | None = None) -> StepReport:
    """A complete StepReport (throughput, MFU, memory, optimizer section) for one engine's result."""
    gpus = scenario.gpus
    tokens = scenario.tokens_per_step
    fpt = _flops_per_token(scenario)
    tflops = fpt * tokens / step_time_s / gpus / 1e12
    peak = scenario.system.peak_flops_per_s(scenario.precision)
    mem, mem_warn = memory_report(scenario)
    context = scenario.model.context_warning(scenario.par.seq_length)
    mem_warn = [context, *mem_warn] if context else mem_warn
    if scenario.precision.tensor_core_class == "fp4" and scenario.system.gpu.peak_flops_per_s.fp4 is None:
        mem_warn = [f"{scenario.system.name} has no FP4 tensor cores: {scenario.precision.value} GEMMs are "
                    "modelled at the FP8 peak", *mem_warn]
    report = StepReport(
        engine=engine,
        scenario=scenario.config.model_dump(mode="json"),
        step_time_s=step_time_s,
        tokens_per_s_per_gpu=tokens / step_time_s / gpus,
        model_tflops_per_gpu=tflops,
        mfu_fraction=tflops * 1e12 / peak,
        breakdown_s=breakdown,
        memory_per_gpu_bytes=mem.total_bytes if mem else 0.0,
        memory=mem,
        optimizer=optimizer_section(plan, optimizer_exposed_s, optimizer_hidden_s),
        events=events or [],
        warnings=list(warnings or []) + mem_warn,
    )
    extra = sanity_warnings(report, layer_wise_padding_bytes(plan, scenario.optimizer.reuse_grad_buf_for_mxfp8_param_ag))
    extra += schedule_warnings(scenario.par.pp, scenario.par.vpp, scenario.num_microbatches)
    return report.model_copy(update={"warnings": report.warnings + extra}) if extra else report

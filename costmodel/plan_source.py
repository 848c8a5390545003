"""Where the step engines get the optimizer plan from.

The optimizer models (``costmodel.optimizer.plan.build_optimizer_plan``) own the real plan. Until
that module is importable, a tiny private fallback describes the element-wise distributed
optimizer with one bucket per (stage, chunk, DP group) and an even split of the optimizer work;
it is labelled as approximate in the report's warnings and is removed once the real plan lands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.compute import gemm_time_s, memory_time_s
from costmodel.optimizer.plan_types import Bucket, OptimizerPlan, RankWork, StageOptimizerPlan
from workloads.flops import newton_schulz_flops

if TYPE_CHECKING:
    from workloads.scenario import Scenario

ADAMW_BYTES_PER_PARAM = 30  # grad fp32 r, master fp32 r/w, m and v fp32 r/w, bf16 param w
MUON_ELEMENTWISE_BYTES_PER_PARAM = 22  # grad r, momentum r/w, master r/w, bf16 param w


def optimizer_plan_for(scenario: Scenario) -> tuple[OptimizerPlan, list[str]]:
    """The optimizer plan of ``scenario`` and warnings (non-empty when the fallback was used)."""
    try:
        from costmodel.optimizer.plan import build_optimizer_plan
    except ImportError:
        return _fallback_plan(scenario), ["optimizer plan module not available: approximate optimizer model used"]
    return build_optimizer_plan(scenario), []


def _fallback_plan(scenario: Scenario) -> OptimizerPlan:
    from workloads.inventory import inventory_for

    inv = inventory_for(scenario)
    opt, system = scenario.optimizer, scenario.system
    sizes = {"dp": scenario.dp * scenario.par.cp, "expert_dp": scenario.expert_dp}
    stages = []
    for s in range(scenario.par.pp):
        numel: dict[tuple[int, str], int] = {}
        muon_s = 0.0
        muon_numel = 0
        for t in inv.stage_tensors(s):
            key = (t.chunk, t.dp_group)
            numel[key] = numel.get(key, 0) + t.rank_numel
            if opt.kind == "muon" and t.optimizer == "muon":
                muon_numel += t.rank_numel // sizes[t.dp_group]
                for rows, cols in t.local_muon_components:
                    f = newton_schulz_flops(rows, cols, opt.ns_steps, opt.use_syrk)
                    muon_s += gemm_time_s(f, system, "bf16") * t.experts_per_rank / sizes[t.dp_group]
        buckets = []
        order = 0
        for chunk in reversed(range(scenario.par.vpp)):
            for group in ("expert_dp", "dp"):
                n = numel.get((chunk, group), 0)
                if n == 0:
                    continue
                g = sizes[group]
                padded = -(-n // g) * g
                buckets.append(Bucket(stage=s, chunk=chunk, dp_group=group, group_size=g, numel=padded,  # type: ignore[arg-type]
                                      grad_bytes=padded * opt.grad_bytes, param_bytes=padded * 2,
                                      reduce_op="reduce_scatter", gather_op="all_gather", order=order))
                order += 1
        owned = sum(b.numel // b.group_size for b in buckets)
        adam_numel = owned - muon_numel
        elem = memory_time_s(adam_numel * ADAMW_BYTES_PER_PARAM + muon_numel * MUON_ELEMENTWISE_BYTES_PER_PARAM, system)
        rank = RankWork(rank=0, owned_numel=owned, newton_schulz_flops=0.0, newton_schulz_s=muon_s,
                        elementwise_s=elem, tp_comm_s=0.0)
        stages.append(StageOptimizerPlan(stage=s, buckets=tuple(buckets), ranks=(rank,), collectives=()))
    return OptimizerPlan(kind=opt.kind, distribution=opt.resolved_distribution, layout=None, tp_mode=None,
                         load_balance=None, stages=tuple(stages), notes=("fallback plan (engine-side approximation)",))

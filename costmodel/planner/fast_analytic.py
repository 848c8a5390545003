"""The analytic engine for screening: same numbers as ``run_analytic``, optimizer plans shared.

``run_analytic(scenario)`` builds the step structure (per-chunk costs, cached per layer kind by
the engine), the optimizer plan (cached under a key of the *whole* scenario) and a full StepReport
(memory model, optimizer section). Screening needs only the step time and its breakdown, for
thousands of candidates that differ in settings the optimizer plan does not depend on
(micro-batch size, recompute, context parallelism at fixed dp×cp, hiding). :class:`FastAnalytic`
keys plans by exactly what :func:`costmodel.optimizer.plan.build_optimizer_plan` reads (model,
system but its :data:`PLAN_INDEPENDENT_FACTORS`, sizes tp/pp/vpp/ep/etp, dp×cp and expert-dp, the
placement shapes of the groups the plan times, the optimizer settings except hiding, which only
the engines read) and passes the shared plan to ``build_step_structure(scenario, plan=...)``; the
timing is the engine's own ``analytic_timing``. A test holds it equal to ``run_analytic`` on sampled candidates.

:meth:`FastAnalytic.pipeline_bound_s` is the step time without any optimizer work (an empty
plan): the engine's forward/backward phase. The analytic step is that phase plus non-negative
terms (gradient reduction past the backward, optimizer step, parameter gather, overlap
slowdown), so it is a lower bound on the step time of every optimizer choice, and it grows with
recompute (recompute only adds work to the backward passes).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from costmodel.optimizer.plan_types import EMPTY_PLAN, OptimizerPlan

if TYPE_CHECKING:
    from workloads.scenario import Scenario

PLAN_GROUPS = ("dp", "expert_dp", "tp", "etp", "ep", "embd")  # groups whose collectives the optimizer plan times

PLAN_INDEPENDENT_FACTORS = ("attention", "gemm_bf16", "gemm_fp8", "gemm_fp4", "grouped_gemm", "layer_host_s",
                            "moe_host_s", "alltoall_bandwidth")
"""Efficiency factors the optimizer plan never reads (neither to build it nor to time its kernels and
collectives): the model GEMMs' and attention's compute factors (the plan's matmuls are Newton-Schulz
GEMMs at ``newton_schulz_gemm``, its other kernels memory-bound), the per-layer host overheads of
the forward/backward passes, and the all-to-all rate (the plan times no all-to-all). Plans are shared
between systems that differ only in these: the sensitivity's draws perturb such factors (the
calibration's fitted uncertainties of the GEMM, attention, host and all-to-all factors) and rebuilt
the same plans for every draw (two thirds of a draw's time). A test perturbs each of them and holds
the plans equal; a draw perturbing a factor the plan reads still gets plans of its own."""


class FastAnalytic:
    """Analytic step times with optimizer plans shared between candidates (per process)."""

    def __init__(self, max_plans: int = 2048) -> None:
        from costmodel.step_structure import build_step_structure

        self.max_plans = max_plans
        self.shares_plans = "plan" in inspect.signature(build_step_structure).parameters
        self._plans: OrderedDict[tuple[Any, ...], OptimizerPlan] = OrderedDict()
        self.plan_builds = 0
        self.fast_bound = True
        self._plan_systems: dict[int, tuple[Any, Any]] = {}  # id(system) -> (system, its plan_system)

    def plan_system(self, system: Any) -> Any:
        """``system`` with the :data:`PLAN_INDEPENDENT_FACTORS` blanked: what the optimizer plan
        reads of it (a key only, never priced; memoised per system object)."""
        hit = self._plan_systems.get(id(system))
        if hit is not None and hit[0] is system:
            return hit[1]
        eff = system.efficiency.model_copy(update=dict.fromkeys(PLAN_INDEPENDENT_FACTORS, 0.0))
        keyed = system.model_copy(update={"efficiency": eff})
        if len(self._plan_systems) >= 64:
            self._plan_systems.clear()
        self._plan_systems[id(system)] = (system, keyed)
        return keyed

    def plan_key(self, scenario: Scenario) -> tuple[Any, ...]:
        """Everything the optimizer plan of ``scenario`` depends on."""
        from costmodel.optimizer.layouts import default_bucket_size
        from topologies.placement import placement_for

        c, p = scenario.config, scenario.par
        placement = placement_for(scenario)
        shapes = tuple(placement.shape(k) for k in PLAN_GROUPS)
        spec = c.optimizer
        if not (spec.resolved_distribution == "layer_wise" and spec.layer_wise_layout == "legacy"):
            # the legacy layout's gathers depend on it (one per dp group, or per bucket when hidden)
            spec = spec.model_copy(update={"hide_param_gather": False})
        # cp enters the plan only through the default DDP bucket size, sized on dp without cp
        # (StageBuilder.bucket_size): key on that size, so layouts of equal dp·cp whose buckets are
        # equal (dp <= 40 without cp) share their plan
        bucket = spec.bucket_size_elements or default_bucket_size(scenario.dp)
        return (scenario.model, self.plan_system(scenario.system), c.gpus, c.precision, c.placement, p.tp, p.pp, p.vpp, p.ep, p.expert_tp,
                scenario.dp * p.cp, bucket, scenario.expert_dp, p.stage_split, spec, shapes)

    def plan(self, scenario: Scenario) -> OptimizerPlan:
        """The optimizer plan of ``scenario`` (shared with every candidate of the same key)."""
        from costmodel.optimizer.plan import build_optimizer_plan

        key = self.plan_key(scenario)
        plan = self._plans.get(key)
        if plan is None:
            plan = build_optimizer_plan(scenario, critical_only=True)  # the step time reads the slowest GPU only
            self.plan_builds += 1
            self._plans[key] = plan
            if len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def _timing(self, scenario: Scenario, plan: OptimizerPlan | None) -> Any:
        from costmodel.analytic import analytic_timing
        from costmodel.step_structure import build_step_structure

        if not self.shares_plans:  # the engine cannot take a plan: let it build its own
            return analytic_timing(build_step_structure(scenario))
        return analytic_timing(build_step_structure(scenario, plan=plan))

    def step(self, scenario: Scenario) -> tuple[float, tuple[tuple[str, float], ...]]:
        """(step time in seconds, breakdown terms in seconds) as ``run_analytic`` gives them."""
        timing = self._timing(scenario, self.plan(scenario) if self.shares_plans else None)
        from costmodel.planner.evaluate import breakdown_terms

        return float(timing.step_time_s), breakdown_terms(timing.breakdown)

    def report(self, scenario: Scenario) -> Any:
        """The full analytic StepReport (``costmodel.engine.predict``) of one scenario."""
        from costmodel.engine import predict

        return predict(scenario, "analytic")

    def pipeline_bound_s(self, scenario: Scenario) -> float:
        """A lower bound (seconds) on the forward/backward phase alone, hence on every optimizer choice.

        Computed by :func:`costmodel.planner.bound.fast_pipeline_bound_s`; should the engine's
        helpers it relies on change, by the engine itself with an empty optimizer plan.
        """
        if self.fast_bound:
            from costmodel.planner.bound import fast_pipeline_bound_s

            try:
                return fast_pipeline_bound_s(scenario)
            except (AttributeError, ImportError, TypeError, KeyError, IndexError, ValueError):
                self.fast_bound = False
        return self.engine_pipeline_bound_s(scenario)

    def engine_pipeline_bound_s(self, scenario: Scenario) -> float:
        """A lower bound on the forward/backward phase from ``build_step_structure``
        (:func:`costmodel.analytic.pipeline_lower_bound_of`: the phase itself without interleaving)."""
        from costmodel.analytic import pipeline_lower_bound_of
        from costmodel.step_structure import build_step_structure

        if self.shares_plans:
            return float(pipeline_lower_bound_of(build_step_structure(scenario, plan=EMPTY_PLAN)))
        return float(pipeline_lower_bound_of(build_step_structure(scenario)))

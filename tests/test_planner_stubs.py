"""Stub engine and memory model for the planner tests (and a check that they behave as documented).

The stub step time is a *pipeline part* that depends on the layout only plus an *optimizer part*
that depends on the optimizer choices, exactly the structure the planner's pruning relies on; the
stub reads efficiency factors so calibration sensitivity has something to move. The stub memory
grows with the micro-batch size and shrinks with recompute, tp, pp, ep and etp.
"""

from __future__ import annotations

import math

from costmodel.planner.evaluate import MemoryEstimate
from costmodel.report import Breakdown, StepReport

RECOMPUTE_TIME = {"none": 1.0, "selective": 1.04, "full": 1.33}
RECOMPUTE_MEMORY = {"none": 1.0, "selective": 0.6, "full": 0.15}


class StubEngine:
    """Deterministic analytic stand-in: ``step(scenario) -> (seconds, terms)``."""

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.calls = 0
        self.interrupt_after = interrupt_after

    def _pipeline_terms(self, sc) -> dict[str, float]:  # noqa: ANN001
        p, eff = sc.par, sc.system.efficiency
        m = sc.num_microbatches
        compute = 6.0 * (0.6 / eff.gemm_fp8) * (1 + 0.04 * math.log2(p.tp)) * (1 + 0.03 / p.micro_batch_size)
        compute *= RECOMPUTE_TIME[p.recompute] * (1 + 0.01 * math.log2(p.expert_tp))
        terms = {"compute": compute, "pipeline_bubble": compute * (p.pp - 1) / (p.vpp * m)}
        terms["comm:ep"] = 0.4 * (p.ep / 64) * (0.75 / eff.alltoall_bandwidth)
        terms["comm:tp"] = 0.3 * (p.tp - 1) / p.tp
        terms["comm:cp"] = 0.05 * (p.cp - 1)
        terms["comm:pp"] = 0.002 * p.pp * p.vpp
        return terms

    def _optimizer_terms(self, sc) -> dict[str, float]:  # noqa: ANN001
        o, p = sc.optimizer, sc.par
        if o.kind == "adamw":
            opt = 0.10
        else:
            opt = 0.30 * (1.1 if o.layer_wise_layout == "legacy" else 1.0)
            opt *= {"none": 1.3, "ping_pong": 1.1, "lpt": 1.0}[o.resolved_load_balance]
            if p.tp > 1 or p.expert_tp > 1:
                opt *= {"duplicated": 1.2, "distributed": 1.05, "blockwise": 0.95}[o.tp_mode]
            opt /= sc.system.efficiency.newton_schulz_gemm / 0.65
        return {"optimizer": opt, "comm:dp_grad": 0.04, "comm:dp_param": 0.0 if o.hide_param_gather else 0.06,
                "other": 0.01 if o.hide_param_gather else 0.0}

    def step(self, sc):  # noqa: ANN001, ANN201
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        terms = self._pipeline_terms(sc) | self._optimizer_terms(sc)
        return sum(terms.values()), tuple(terms.items())

    def pipeline_bound_s(self, sc) -> float:  # noqa: ANN001
        return sum(self._pipeline_terms(sc).values())

    def report(self, sc, engine: str = "analytic") -> StepReport:  # noqa: ANN001
        t, terms = self.step(sc)
        if engine == "des":  # the 'DES' differs a little, more for deep pipelines
            t *= 1 + 0.01 * (sc.par.pp - 1) / sc.par.vpp
        d = dict(terms)
        exposed = {k.removeprefix("comm:"): v for k, v in d.items() if k.startswith("comm:")}
        return StepReport(engine=engine, scenario=sc.config.model_dump(mode="json"), step_time_s=t,
                          tokens_per_s_per_gpu=sc.tokens_per_step / t / sc.gpus, model_tflops_per_gpu=0.0, mfu_fraction=0.0,
                          breakdown_s=Breakdown(compute=d["compute"], pipeline_bubble=d["pipeline_bubble"],
                                                exposed_comm=exposed, optimizer=d["optimizer"], other=d["other"]),
                          memory_per_gpu_bytes=0.0)


def stub_des(sc) -> StepReport:  # noqa: ANN001
    return StubEngine().report(sc, "des")


def stub_memory(sc) -> MemoryEstimate:  # noqa: ANN001
    """Bytes per GPU: weights + grads + optimizer state + workspace + activations."""
    p, o = sc.par, sc.optimizer
    params = 1.0e12 / (p.pp * p.ep * p.expert_tp) + 2.0e10 / (p.tp * p.pp)
    weights_grads = 6.0 * params
    state = (8.0 if o.kind == "muon" else 12.0) * params / max(sc.dp * p.cp, 1)
    workspace = 3e9 if o.kind == "muon" and o.tp_mode == "duplicated" and p.tp > 1 else 0.5e9
    acts = 1.2e10 * p.micro_batch_size * RECOMPUTE_MEMORY[p.recompute] / (p.tp * p.cp)
    return MemoryEstimate(total_bytes=weights_grads + state + workspace + acts, floor_bytes=weights_grads + acts)


def test_stub_bound_holds_for_every_optimizer_choice(default_scenario) -> None:
    from costmodel.planner.pins import parse_pins
    from costmodel.planner.space import build_scenario, enumerate_candidates

    cands, _ = enumerate_candidates(default_scenario, parse_pins({"pp": "4", "vpp": "4", "ep": "64", "cp": "1",
                                                                   "micro_batch_size": "2", "recompute": "none"}))
    eng = StubEngine()
    scenarios = [build_scenario(default_scenario, c) for c in cands]
    assert len({c.optimizer for c in cands}) == 2
    for sc in scenarios:
        t, terms = eng.step(sc)
        assert t >= eng.pipeline_bound_s(sc)
        assert abs(t - sum(v for _, v in terms)) < 1e-12
        assert stub_memory(sc).floor_bytes <= stub_memory(sc).total_bytes

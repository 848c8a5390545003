"""The planner with the real engines and memory model (small spaces, to stay fast)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from costmodel.analytic import run_analytic
from costmodel.engine import predict
from costmodel.planner.bound import fast_pipeline_bound_s
from costmodel.planner.evaluate import InventoryMemory
from costmodel.planner.fast_analytic import FastAnalytic
from costmodel.planner.pins import parse_pins
from costmodel.planner.plan import PlanOptions, memory_budget_bytes, run_plan
from costmodel.planner.space import (
    Candidate,
    build_scenario,
    candidate_config,
    enumerate_candidates,
)
from workloads.memory import memory_breakdown, memory_by_stage
from workloads.scenario import ScenarioConfig

HEADROOM = 0.05
SMALL = {"tp": "1,2", "pp": "4", "vpp": "2,4", "cp": "1,2", "ep": "32,64", "etp": "1",
         "micro_batch_size": "1,2", "optimizer": "muon", "layer_wise_layout": "current"}


def _sample(base, n: int, seed: int, pins: dict | None = None) -> list[Candidate]:
    cands, _ = enumerate_candidates(base, parse_pins(pins or {"pp": "2,4", "vpp": "1,2,4", "ep": "32,64"}))
    return random.Random(seed).sample(cands, n)


def test_fast_analytic_equals_run_analytic(default_scenario) -> None:
    engine = FastAnalytic()
    assert engine.shares_plans
    for cand in _sample(default_scenario, 16, seed=4):
        sc = build_scenario(default_scenario, cand)
        step_s, terms = engine.step(sc)
        report = run_analytic(sc)
        assert step_s == pytest.approx(report.step_time_s, rel=1e-12), cand.label()
        assert sum(v for _, v in terms) == pytest.approx(report.breakdown_s.total_s, rel=1e-9)
        assert engine.pipeline_bound_s(sc) <= step_s * (1 + 1e-9)
    # candidates that differ only in recompute and hiding share one optimizer plan
    shared = FastAnalytic()
    cand = Candidate.from_scenario(default_scenario)
    for variant in (cand, dataclasses.replace(cand, recompute="full"), dataclasses.replace(cand, hide=False)):
        sc = build_scenario(default_scenario, variant)
        assert shared.step(sc)[0] == pytest.approx(run_analytic(sc).step_time_s, rel=1e-12)
    assert shared.plan_builds == 1


def test_plans_do_not_read_the_plan_independent_factors(default_scenario) -> None:
    """Each factor the engine's plan cache ignores (``PLAN_INDEPENDENT_FACTORS``), halved (a host
    overhead doubled), leaves the optimizer plan as it was: the same buckets, collectives and their
    seconds, GPU classes and their seconds (Kimi K2, MXFP8: Muon legacy with distributed TP, Muon
    layer-wise, AdamW); a factor the plan does read (``newton_schulz_gemm``) changes it."""
    from costmodel.optimizer.plan import build_optimizer_plan
    from costmodel.planner.fast_analytic import PLAN_INDEPENDENT_FACTORS

    def view(plan):
        return [(s.buckets, s.collectives, tuple(s.collective_times_s), s.ranks, s.max_rank_s) for s in plan.stages]

    cands = [Candidate(2, 4, 2, 1, 32, 1, 1, "none", "muon", "legacy", None, "distributed", "lpt", True),
             Candidate(1, 4, 2, 1, 64, 1, 1, "none", "muon", "layer_wise", "current", None, "lpt", True),
             Candidate(2, 2, 1, 1, 64, 2, 1, "none", "adamw", "element_wise")]
    system = default_scenario.system
    for cand in cands:
        sc = build_scenario(default_scenario, cand)
        nominal = view(build_optimizer_plan(sc, critical_only=True))
        for name in PLAN_INDEPENDENT_FACTORS:
            value = getattr(system.efficiency, name)
            changed = system.with_efficiency(**{name: value * (2.0 if name.endswith("_s") else 0.5)})
            assert view(build_optimizer_plan(dataclasses.replace(sc, system=changed), critical_only=True)) == nominal, \
                (cand.label(), name)
        slower = system.with_efficiency(newton_schulz_gemm=system.efficiency.newton_schulz_gemm * 0.5)
        if cand.optimizer == "muon":
            assert view(build_optimizer_plan(dataclasses.replace(sc, system=slower), critical_only=True)) != nominal


def test_fast_analytic_shares_plans_across_plan_independent_factors(default_scenario) -> None:
    """A system differing only in plan-independent factors reuses the plan and gives the step time
    a fresh engine gives; one differing in a factor the plan reads builds its own."""
    shared = FastAnalytic()
    cand = Candidate.from_scenario(default_scenario)
    sc = build_scenario(default_scenario, cand)
    shared.step(sc)
    eff = sc.system.efficiency
    drawn = sc.system.with_efficiency(gemm_bf16=eff.gemm_bf16 * 0.9, attention=eff.attention * 1.1,
                                      layer_host_s=eff.layer_host_s * 1.5)
    perturbed = dataclasses.replace(sc, system=drawn)
    assert shared.step(perturbed) == FastAnalytic().step(perturbed)
    assert shared.step(perturbed)[0] != shared.step(sc)[0]
    assert shared.plan_builds == 1
    shared.step(dataclasses.replace(sc, system=sc.system.with_efficiency(newton_schulz_gemm=eff.newton_schulz_gemm * 0.9)))
    assert shared.plan_builds == 2


def test_critical_only_plan_keeps_the_slowest_gpu_class(default_scenario) -> None:
    """The planner's plans keep each stage's slowest GPU class alone: the same RankWork (the first
    of equals, as ``max`` picks it), the same buckets and collectives as the full plan's."""
    from costmodel.optimizer.plan import build_optimizer_plan

    classes = 0
    for cand in _sample(default_scenario, 6, seed=7, pins={"tp": "1,2", "pp": "2,4", "ep": "16,64"}):
        sc = build_scenario(default_scenario, cand)
        full, lean = build_optimizer_plan(sc), build_optimizer_plan(sc, critical_only=True)
        for fs, ls in zip(full.stages, lean.stages, strict=True):
            slowest = max(fs.ranks, key=lambda r: r.total_s)
            classes = max(classes, len(fs.ranks))
            assert ls.ranks == (slowest,) and ls.critical_rank == 0
            assert (ls.buckets, ls.collectives, ls.collective_times_s) == (fs.buckets, fs.collectives,
                                                                          fs.collective_times_s)
    assert classes > 1  # the sample has stages of several GPU classes


def test_fast_pipeline_bound_equals_the_engine(default_scenario) -> None:
    engine = FastAnalytic()
    pins = {"tp": "1,2,4", "pp": "1,2,4,8", "cp": "1,2", "micro_batch_size": "1,2", "ep": "16,64"}
    for cand in _sample(default_scenario, 40, seed=5, pins=pins):
        sc = build_scenario(default_scenario, cand)
        assert fast_pipeline_bound_s(sc) == pytest.approx(engine.engine_pipeline_bound_s(sc), rel=1e-12)


def test_fast_bound_shares_layers_without_experts_across_expert_layouts(default_scenario) -> None:
    """Dense, embedding and output layers are priced once for layouts that differ only in ep and etp
    (their operations and collectives do not involve the experts); each layout's bound is still
    exactly the engine's, whichever layout priced the shared layers first."""
    from costmodel.planner import bound

    engine = FastAnalytic()
    bound._NON_MOE_COSTS.clear()
    for ep, etp in ((64, 1), (16, 1), (32, 2), (8, 1)):
        cand = Candidate(1, 4, 2, 1, ep, etp, 1, "none", "muon", "layer_wise", "current", None, "lpt", True)
        sc = build_scenario(default_scenario, cand)
        assert fast_pipeline_bound_s(sc) == pytest.approx(engine.engine_pipeline_bound_s(sc), rel=1e-12), cand.label()
    kinds = {key[1] for key in (k[0] for k in bound._NON_MOE_COSTS._entries)}
    assert kinds == {"dense", "embedding", "output"}  # Kimi K2: one dense layer, then MoE layers
    assert len(bound._NON_MOE_COSTS) == 3  # priced for the first layout, shared by the other three


def test_inventory_memory_equals_memory_breakdown(default_scenario) -> None:
    """The planner's memory (inventory cached between candidates) is the memory model's to the bit:
    the most loaded stage's total, and the largest weights + gradients + activations of a stage."""
    memory = InventoryMemory()
    pins = {"pp": "1,2,4,8", "vpp": "1,2,3", "ep": "32,64", "recompute": "none,full"}
    for cand in _sample(default_scenario, 12, seed=6, pins=pins):
        sc = build_scenario(default_scenario, cand)
        est = memory(sc)
        stages = memory_by_stage(sc)
        assert est.total_bytes == memory_breakdown(sc).total_bytes == max(m.total_bytes for m in stages)
        assert est.floor_bytes == max(m.weights_bytes + m.gradients_bytes + m.activations_bytes for m in stages)
        assert est.floor_bytes <= est.total_bytes


@pytest.fixture(scope="module")
def small_plan(default_scenario):
    # the default layout needs 91 % of HBM (TE's MXFP8 weight caches included): 5 % headroom keeps it in
    options = PlanOptions(pins=parse_pins(SMALL), jobs=1, top_k=2, limit=6, samples=0, headroom=HEADROOM)
    return run_plan(default_scenario, options)


def test_listed_plans_are_valid_and_fit(default_scenario, small_plan) -> None:
    res = small_plan.result
    budget = memory_budget_bytes(default_scenario, HEADROOM)
    listed = [*res.ranking, *res.pareto_front, res.reference.row]
    assert res.ranking and res.stats.bound_violations == 0
    for row in listed:
        s = row.settings
        cand = Candidate(s["tp"], s["pp"], s["vpp"], s["cp"], s["ep"], s["etp"], s["micro_batch_size"],
                         s["recompute"], s["optimizer"], s["distribution"], s.get("layer_wise_layout"),
                         s.get("tp_mode"), s.get("load_balance"), s.get("hide_param_gather"))
        sc = ScenarioConfig.model_validate(candidate_config(default_scenario.config, cand).model_dump()).resolve()
        assert memory_breakdown(sc).total_bytes <= budget
        assert predict(sc, "analytic").step_time_s == pytest.approx(row.step_time_s, rel=1e-12)


def test_reference_ranked_and_best_des_not_worse(small_plan) -> None:
    res = small_plan.result
    ref = res.reference
    assert ref.status == "ok" and ref.rank is not None and ref.row.des_step_time_s is not None
    assert res.best.des_step_time_s <= ref.row.des_step_time_s
    assert small_plan.best_report is not None and small_plan.best_report.engine == "des"


def test_cli_plan_json_html_and_errors(run_cli, tmp_path) -> None:
    html = tmp_path / "plan.html"
    args = ["plan", "--tp", "1", "--pp", "4", "--vpp", "4", "--cp", "1", "--ep", "32,64", "--mbs", "1,2",
            "--optimizer", "muon", "--layout", "current", "--load-balance", "lpt", "--recompute", "none,selective",
            "--top-k", "1", "--jobs", "1", "--samples", "0", "--explain", "ep=32", "--memory-headroom", str(HEADROOM)]
    result = run_cli(*args, "--json", "--html", html)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ranking"] and data["reference"]["rank"] >= 1
    assert data["explain"][0]["verdict"] == "ranked"
    assert all(r["settings"]["ep"] in (32, 64) and r["settings"]["tp"] == 1 for r in data["ranking"])
    assert html.read_text().count("plotly") > 2
    table = run_cli(*args)
    assert table.exit_code == 0 and "reference" in table.stdout and "searched" in table.stdout
    missing = tmp_path / "nope" / "x.html"
    for bad, fragment in ((["--tp", "x"], "--tp: 'x' is not an integer"),
                          (["--memory-headroom", "1.5"], "--memory-headroom"),
                          (["--explain", "bogus"], "--explain"),
                          (["--max-tp", "0"], "--max-tp"),
                          (["--html", str(missing)], "does not exist")):
        r = run_cli("plan", "--pp", "4", *bad)
        assert r.exit_code == 2, (bad, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], (bad, r.stderr)
    assert not missing.parent.exists()


def test_plan_with_megatron_fsdp_keeps_fsdp_layouts(run_cli) -> None:
    """fsdp shards weights and gradients: the memory screen must not drop every layout (it did: 423 GB)."""
    r = run_cli("plan", "--model", "llama3-70b", "--system", "gb300-nvl72", "--gpus", "64", "--precision", "fp8-cs",
                "--tp", "1", "--pp", "1", "--vpp", "1", "--ep", "1", "--cp", "1", "--fsdp", "64", "--mbs", "2",
                "--gbs", "256", "--seq", "8192", "--optimizer", "adamw", "--jobs", "1", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ranking"] and data["reference"]["status"] in ("ok", "oom")  # rc none: 357 GB > 279 GB
    assert all("dp_fsdp" in row["breakdown_s"]["exposed_comm"] for row in data["ranking"])

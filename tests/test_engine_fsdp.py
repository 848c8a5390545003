"""Megatron-FSDP (fsdp = dp·cp) in the step engines: per-layer collectives, exposure, engines, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from costmodel.analytic import run_analytic
from costmodel.des import run_des
from costmodel.engine import UnsupportedScenario
from costmodel.fsdp import FSDP_KIND, fsdp_layer_blocks, fsdp_units
from costmodel.layer_costs import layer_ops, ops_time, rank_shape
from costmodel.optimizer.plan import build_optimizer_plan, cached_inventory
from costmodel.step_structure import build_step_structure
from topologies.inputs import UserInputError
from topologies.placement import placement_for
from workloads.scenario import DEFAULT_SCENARIO, Scenario, build_config

LLAMA8B_H100 = {"model": "llama3-8b", "system": "dgx-h100", "gpus": 8, "precision": "fp8-cs", "tp": 1, "pp": 1,
                "vpp": 1, "cp": 1, "ep": 1, "fsdp": 8, "micro_batch_size": 1, "global_batch_size": 128,
                "seq_length": 8192, "optimizer": "adamw"}
LLAMA70B_GB300 = {"model": "llama3-70b", "system": "gb300-nvl72", "gpus": 64, "precision": "fp8-cs", "tp": 1,
                  "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "fsdp": 64, "micro_batch_size": 2, "global_batch_size": 256,
                  "seq_length": 8192, "optimizer": "adamw"}
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def scenario(base: dict, **changes: object) -> Scenario:
    return build_config(DEFAULT_SCENARIO.model_dump(), {**base, **changes}).resolve()


def _scaled_bandwidth(sc: Scenario, factor: float) -> Scenario:
    s = sc.system
    system = s.model_copy(update={
        "nvlink": s.nvlink.model_copy(update={"link_bandwidth_Bps": s.nvlink.link_bandwidth_Bps * factor}),
        "scale_out": s.scale_out.model_copy(update={"nic_bandwidth_Bps": s.scale_out.nic_bandwidth_Bps * factor}),
    })
    return dataclasses.replace(sc, system=system)


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize(("tp", "grad", "grad_bytes", "grad_dtype"), [(1, "fp32", 4, "fp32"), (2, "bf16", 2, "bf16")])
def test_per_layer_gathers_and_reduce_scatters_move_the_layers_parameters(tp, grad, grad_bytes, grad_dtype) -> None:
    sc = scenario(LLAMA8B_H100, tp=tp, fsdp=8 // tp, grad_reduce_dtype=grad)
    h, f, heads, kv, d = 4096, 14336, 32, 8, 128  # Llama 3 8B
    params = ((heads + 2 * kv) * d * h + h * heads * d + 3 * f * h) // tp + 2 * h  # GEMM weights / tp + 2 norms
    unit = fsdp_units(cached_inventory(sc))["dense"]
    assert (unit.dense_numel, unit.expert_numel) == (params, 0)
    dp = 8 // tp
    fwd, bwd = unit.calls(dp, 1, sc.optimizer.grad_bytes)
    assert [(c.op, c.group, c.group_size, c.dtype, c.bytes) for c in fwd] == [("all_gather", "dp", dp, "bf16", 2 * params)]
    assert sorted((c.op, c.dtype, c.bytes) for c in bwd) == [
        ("all_gather", "bf16", 2 * params), ("reduce_scatter", grad_dtype, grad_bytes * params)]


def test_moe_layer_gathers_experts_over_the_expert_data_parallel_group() -> None:
    sc = scenario(LLAMA8B_H100, model="qwen3-30b-a3b", ep=4, seq_length=4096)
    units = fsdp_units(cached_inventory(sc))
    assert set(units) == {"embedding", "moe", "output"}  # no dense layers, no MTP
    moe = units["moe"]
    assert moe.expert_numel == 128 // 4 * 3 * 768 * 2048  # 32 local experts of fc1 (2·768×2048) + fc2 (2048×768)
    fwd, bwd = moe.calls(8, sc.expert_dp, 4)
    assert sc.expert_dp == 2
    assert {(c.group, c.group_size, c.bytes) for c in fwd} == {("dp", 8, 2 * moe.dense_numel),
                                                               ("expert_dp", 2, 2 * moe.expert_numel)}
    assert len(bwd) == 4


def test_fsdp_plan_has_no_dp_buckets_but_steps_adamw_on_the_shard() -> None:
    sc = scenario(LLAMA8B_H100)
    plan = build_optimizer_plan(sc)
    assert all(not s.buckets and not s.collectives for s in plan.stages)
    ranks = plan.stages[0].ranks
    params = cached_inventory(sc).rank_numel(0)
    assert sum(r.owned_numel * r.multiplicity for r in ranks) == pytest.approx(params, rel=1e-4)
    assert all(r.elementwise_s > 0 for r in ranks)
    assert any("Megatron-FSDP" in n for n in plan.notes)
    no_fsdp = build_optimizer_plan(scenario(LLAMA8B_H100, fsdp=0))
    assert no_fsdp.stages[0].buckets  # the plain distributed optimizer keeps its buckets
    assert no_fsdp.stages[0].max_rank_s == pytest.approx(plan.stages[0].max_rank_s, rel=0.01)


# ----------------------------------------------------------------------------- exposure
def _dense_blocks(sc: Scenario, overlap: bool = True):  # noqa: ANN202
    shape = rank_shape(sc)
    f, b, _, _ = ops_time(layer_ops(sc.model, shape, "dense", sc.par.recompute, tuple(sc.par.recompute_modules)),
                           sc.system)
    placement = placement_for(sc)
    shapes = {g: placement.shape(g) for g in ("dp", "expert_dp")}
    return fsdp_layer_blocks(sc, fsdp_units(cached_inventory(sc)), "dense", shapes, (f, b), overlap), (f, b)


def test_layer_gathers_are_hidden_when_compute_dominates_and_exposed_when_bandwidth_is_cut() -> None:
    sc = scenario(LLAMA70B_GB300)
    ((fwd,), (bwd,)), (f, b) = _dense_blocks(sc)
    assert fwd.kind == bwd.kind == FSDP_KIND
    assert fwd.time_s < f and bwd.time_s < b and fwd.exposed_s == 0 and bwd.exposed_s == 0
    ((fwd_off,), (bwd_off,)), _ = _dense_blocks(sc, overlap=False)
    assert fwd_off.exposed_s == fwd_off.time_s and bwd_off.exposed_s == bwd_off.time_s
    slow = _scaled_bandwidth(sc, 0.01)
    ((sfwd,), (sbwd,)), _ = _dense_blocks(slow)
    assert sfwd.exposed_s == pytest.approx(sfwd.time_s - f) and sfwd.exposed_s > 0
    assert sbwd.exposed_s == pytest.approx(sbwd.time_s - b) and sbwd.exposed_s > 0
    fast_step, slow_step = run_analytic(sc), run_analytic(slow)
    assert slow_step.breakdown_s.exposed_comm[FSDP_KIND] > 50 * fast_step.breakdown_s.exposed_comm[FSDP_KIND]
    assert fast_step.breakdown_s.exposed_comm[FSDP_KIND] < 0.01 * fast_step.step_time_s
    assert fast_step.breakdown_s.exposed_comm["dp_grad"] == 0 and fast_step.breakdown_s.exposed_comm["dp_param"] == 0


def test_hybrid_sharding_is_unsupported_with_both_numbers() -> None:
    sc = scenario(LLAMA8B_H100, fsdp=4)
    with pytest.raises(UnsupportedScenario, match=r"fsdp 4 != dp·cp 8"):
        build_step_structure(sc)


# ----------------------------------------------------------------------------- engines
@st.composite
def fsdp_scenarios(draw: st.DrawFn) -> Scenario:
    model = draw(st.sampled_from(["llama3-8b", "qwen3-30b-a3b"]))
    tp, cp, dp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 4, 8]))
    pp = draw(st.sampled_from([1, 2]))
    m = draw(st.sampled_from([1, 2])) * pp
    overrides = {
        "model": model, "system": draw(st.sampled_from(["gb300-nvl72", "dgx-h100"])), "gpus": tp * cp * dp * pp,
        "tp": tp, "cp": cp, "pp": pp, "vpp": 1, "ep": draw(st.sampled_from([1, 2])) if model != "llama3-8b" else 1,
        "fsdp": dp * cp, "micro_batch_size": 1, "global_batch_size": dp * m, "seq_length": 4096,
        "precision": draw(st.sampled_from(["bf16", "fp8-cs"])), "optimizer": "adamw",
        "recompute": draw(st.sampled_from(["none", "full"])),
    }
    try:
        return build_config(DEFAULT_SCENARIO.model_dump(), overrides).resolve()
    except UserInputError:
        assume(False)
        raise


@given(sc=fsdp_scenarios())
@SETTINGS
def test_fsdp_engines_agree_without_overlap_and_overlap_never_slows(sc: Scenario) -> None:
    off = run_analytic(sc, overlap=False)
    assert off.breakdown_s.exposed_comm[FSDP_KIND] > 0
    assert run_des(sc, contention=False, overlap=False, record=False).step_time_s == pytest.approx(off.step_time_s, rel=0.05)
    on = run_analytic(sc)
    assert on.step_time_s <= off.step_time_s * (1 + 1e-9)
    assert run_des(sc, record=False).step_time_s <= run_des(sc, overlap=False, record=False).step_time_s * (1 + 1e-9)


@given(sc=fsdp_scenarios(), factor=st.sampled_from([2.0, 10.0]))
@SETTINGS
def test_fsdp_more_bandwidth_never_slows_a_step(sc: Scenario, factor: float) -> None:
    faster = _scaled_bandwidth(sc, factor)
    assert run_analytic(faster).step_time_s <= run_analytic(sc).step_time_s * (1 + 1e-9)
    assert run_des(faster, record=False).step_time_s <= run_des(sc, record=False).step_time_s * (1 + 1e-9)


def test_fsdp_breakdowns_add_up_and_name_the_fsdp_comm() -> None:
    sc = scenario(LLAMA70B_GB300)
    a, d = run_analytic(sc), run_des(sc, record=False)
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    for r in (a, d):
        assert r.breakdown_s.total_s == pytest.approx(r.step_time_s, rel=1e-6)
        assert r.breakdown_s.exposed_comm[FSDP_KIND] == pytest.approx(a.breakdown_s.exposed_comm[FSDP_KIND], rel=0.05)
        assert abs(r.breakdown_s.other) < 1e-9


# ----------------------------------------------------------------------------- CLI
def test_cli_predict_fsdp_prints_a_breakdown(run_cli) -> None:
    res = run_cli("predict", "--model", "llama3-70b", "--system", "gb300-nvl72", "--gpus", "64", "--precision",
                  "fp8-cs", "--tp", "1", "--pp", "1", "--vpp", "1", "--ep", "1", "--fsdp", "64", "--mbs", "2",
                  "--gbs", "256", "--seq", "8192", "--optimizer", "adamw")
    assert res.exit_code == 0, res.output
    assert "step time" in res.stdout and "compute" in res.stdout and f"exposed comm: {FSDP_KIND}" in res.stdout


def test_cli_predict_hybrid_fsdp_is_one_line(run_cli) -> None:
    res = run_cli("predict", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--pp", "1", "--vpp", "1",
                  "--ep", "1", "--fsdp", "4", "--gbs", "128", "--seq", "8192", "--optimizer", "adamw", "--json")
    assert res.exit_code == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "fsdp 4 != dp·cp 8" in lines[0] and "Traceback" not in res.output


def test_cli_validate_predicts_the_published_fsdp_runs(run_cli, tmp_path) -> None:
    from workloads.datasets import load_dataset
    from workloads.loaders import write_csv

    runs = [r for r in load_dataset("megatron-bridge") if r.fsdp > 0]
    assert len(runs) == 12
    path = tmp_path / "fsdp.csv"
    write_csv(runs, path)
    res = run_cli("validate", path, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["n"] == 12 and data["unsupported"] == []

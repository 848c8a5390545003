"""Property tests of the two step engines (hypothesis, small budgets)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from costmodel.analytic import run_analytic
from costmodel.des import run_des
from topologies.inputs import UserInputError
from workloads.scenario import DEFAULT_SCENARIO, Scenario, build_config

MODELS = {"llama3-8b": False, "qwen3-30b-a3b": True, "llama3-70b": False}
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    model = draw(st.sampled_from(sorted(MODELS)))
    pp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    ep = draw(st.sampled_from([1, 2, 4, 8])) if MODELS[model] else 1
    mbs = draw(st.sampled_from([1, 2]))
    m = pp * draw(st.sampled_from([1, 2])) if pp > 1 else draw(st.sampled_from([1, 2, 4]))
    overrides = {
        "model": model, "system": draw(st.sampled_from(["gb300-nvl72", "dgx-h100", "gb200-nvl72"])),
        "gpus": tp * pp * dp, "tp": tp, "pp": pp, "vpp": vpp, "ep": ep, "cp": 1, "micro_batch_size": mbs,
        "global_batch_size": mbs * dp * m, "seq_length": draw(st.sampled_from([2048, 4096])),
        "precision": draw(st.sampled_from(["bf16", "fp8-cs", "mxfp8"])),
        "optimizer": draw(st.sampled_from(["adamw", "muon"])),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "tp_comm_overlap": draw(st.booleans()),
        "ep_comm_overlap": draw(st.booleans()) and ep > 1 and (pp == 1 or vpp > 1),
    }
    try:
        return build_config(DEFAULT_SCENARIO.model_dump(), overrides).resolve()
    except UserInputError:
        assume(False)
        raise


def _scaled(sc: Scenario, nvlink: float = 1.0, network: float = 1.0, flops: float = 1.0) -> Scenario:
    sysm = sc.system
    peaks = sysm.gpu.peak_flops_per_s
    new_peaks = peaks.model_copy(update={k: (v * flops if v is not None else None) for k, v in peaks.model_dump().items()})
    system = sysm.model_copy(update={
        "gpu": sysm.gpu.model_copy(update={"peak_flops_per_s": new_peaks}),
        "nvlink": sysm.nvlink.model_copy(update={"link_bandwidth_Bps": sysm.nvlink.link_bandwidth_Bps * nvlink}),
        "scale_out": sysm.scale_out.model_copy(update={"nic_bandwidth_Bps": sysm.scale_out.nic_bandwidth_Bps * network}),
    })
    return dataclasses.replace(sc, system=system)


@given(sc=scenarios())
@SETTINGS
def test_engines_agree_within_5_percent_without_contention_and_overlap(sc: Scenario) -> None:
    a = run_analytic(sc, overlap=False).step_time_s
    d = run_des(sc, contention=False, overlap=False, record=False).step_time_s
    assert d == pytest.approx(a, rel=0.05)


@given(sc=scenarios(), factor=st.sampled_from([1.5, 2.0, 4.0]), which=st.sampled_from(["nvlink", "network", "flops"]))
@SETTINGS
def test_more_bandwidth_or_flops_never_slows_a_step(sc: Scenario, factor: float, which: str) -> None:
    faster = _scaled(sc, **{which: factor})
    assert run_analytic(faster).step_time_s <= run_analytic(sc).step_time_s * (1 + 1e-9)
    assert run_des(faster, record=False).step_time_s <= run_des(sc, record=False).step_time_s * (1 + 1e-9)


@given(sc=scenarios(), setting=st.sampled_from(["hide_param_gather", "overlap_grad_reduce", "tp_comm_overlap",
                                                "ep_comm_overlap"]))
@SETTINGS
def test_an_overlapped_collective_never_costs_more_than_a_synchronous_one(sc: Scenario, setting: str) -> None:
    try:
        on, off = sc.with_updates(**{setting: True}), sc.with_updates(**{setting: False})
    except UserInputError:  # e.g. EP overlap without experts or without an interleaved schedule
        assume(False)
        raise
    assert run_analytic(on).step_time_s <= run_analytic(off).step_time_s * (1 + 1e-9)
    assert run_des(on, record=False).step_time_s <= run_des(off, record=False).step_time_s * (1 + 1e-9)


def test_default_scenario_engines_agree_and_report_the_same_work(default_scenario: Scenario) -> None:
    a = run_analytic(default_scenario)
    d = run_des(default_scenario, record=False)
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.05)
    assert d.breakdown_s.compute == pytest.approx(a.breakdown_s.compute, rel=1e-6)
    for r in (a, d):
        assert r.breakdown_s.total_s == pytest.approx(r.step_time_s, rel=1e-6)
        assert r.breakdown_s.exposed_comm["ep"] > 0  # EP64 all-to-all is on the critical path

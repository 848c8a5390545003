"""``muonsim compare``: variant expansion, one-line errors, end-to-end deltas, --html; hiding never slower."""

from __future__ import annotations

import json

import pytest

SMALL = ("--model", "llama3-8b", "--gpus", "8", "--pp", "1", "--vpp", "1", "--ep", "1", "--gbs", "128", "--seq", "8192")


def test_expand_variants_is_the_cartesian_product_in_order() -> None:
    from cli.cmd_compare import expand_variants

    out = expand_variants({"optimizer": "adamw, muon", "tp": "2", "tp_mode": "duplicated,blockwise"})
    assert [label for label, _ in out] == [
        "optimizer=adamw tp-mode=duplicated", "optimizer=adamw tp-mode=blockwise",
        "optimizer=muon tp-mode=duplicated", "optimizer=muon tp-mode=blockwise"]
    assert out[3][1] == {"tp": "2", "optimizer": "muon", "tp_mode": "blockwise"}


@pytest.mark.parametrize(("args", "needle"), [
    ((), "at least one scenario flag with comma-separated values"),
    (("--optimizer", "adamw,"), "--optimizer has an empty value"),
    (("--tp-mode", "duplicated,sideways"), "variant tp-mode=sideways"),
    (("--optimizer", "adamw,muon", "--engine", "fast"), "--engine"),
    (("--tp", "1,2,3,4,5", "--pp", "1,2,3,4,5,6"), "at most"),
    (("--optimizer", "adamw,muon", "--html", "/no/such/dir/x.html"), "does not exist"),
    (("--optimizer", "adamw,muon", "--tp", "3"), "variant optimizer=adamw"),
])
def test_user_errors_are_one_line_exit_2(run_cli, args: tuple[str, ...], needle: str) -> None:
    res = run_cli("compare", *args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and needle in err and "Traceback" not in res.output


def test_compare_json_end_to_end(run_cli) -> None:
    res = run_cli("compare", *SMALL, "--optimizer", "adamw,muon", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["baseline"] == "optimizer=adamw"
    base, muon = data["variants"]
    assert base["delta_step_time_s"] == 0.0
    assert muon["delta_step_time_s"] == pytest.approx(muon["step_time_s"] - base["step_time_s"])
    # the breakdown deltas explain the step-time delta (the breakdown is additive)
    delta = muon["delta_breakdown_s"]
    total = sum(v for k, v in delta.items() if k != "exposed_comm") + sum(delta["exposed_comm"].values())
    assert total == pytest.approx(muon["delta_step_time_s"], abs=1e-9)
    assert muon["report"]["optimizer"]["kind"] == "muon" and base["report"]["optimizer"]["kind"] == "adamw"
    assert muon["report"]["optimizer"]["newton_schulz_flops"]["total"] > 0
    assert muon["delta_step_time_pct"] > 0  # Muon adds Newton-Schulz work on top of AdamW's step


def test_compare_table_and_html(run_cli, tmp_path) -> None:
    out = tmp_path / "load.html"
    res = run_cli("compare", *SMALL, "--load-balance", "ping_pong,lpt", "--layout", "legacy", "--html", str(out))
    assert res.exit_code == 0, res.output
    assert "load-balance=ping_pong" in res.stdout and "load-balance=lpt" in res.stdout and "vs baseline" in res.stdout
    text = out.read_text()
    assert "plotly" in text.lower() and "Optimizer step time per GPU" in text


def test_notes_that_differ_between_variants_name_their_variants(run_cli) -> None:
    # the critical pipeline stage differs between these two variants: each note must say whose it is
    res = run_cli("compare", "--tp", "2", "--etp", "2", "--gpus", "512", "--tp-mode", "duplicated,blockwise")
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "(tp-mode=duplicated) per-rank statistics" in text
    assert "(tp-mode=blockwise) per-rank statistics" in text


def test_figure_expands_rank_classes_to_every_gpu() -> None:
    from costmodel.optimizer import build_optimizer_plan
    from costmodel.optimizer.figures import per_gpu_loads_s
    from workloads.scenario import DEFAULT_SCENARIO

    plan = build_optimizer_plan(DEFAULT_SCENARIO.resolve().with_updates(tp=2, gpus=512))
    st = plan.critical_stage
    loads = per_gpu_loads_s(st)
    total = sum(loads.values())
    assert len(total) == st.gpus == 128
    assert total.max() == pytest.approx(st.max_rank_s) and total.mean() == pytest.approx(st.mean_rank_s)


HIDING_CASES = {
    "llama3-8b 8 GPUs": dict(model="llama3-8b", gpus=8, pp=1, vpp=1, ep=1, global_batch_size=128, seq_length=8192),
    "qwen3-30b-a3b 8 GPUs": dict(model="qwen3-30b-a3b", gpus=8, pp=1, vpp=1, ep=8, micro_batch_size=8,
                                 global_batch_size=512),
    "kimi-k2 64 GPUs pp1": dict(pp=1, vpp=1, gpus=64, ep=64),
    "kimi-k2 default (pp4 vpp4)": {},
    "kimi-k2 default, adamw": dict(optimizer="adamw"),
    "llama3-70b pp4 tp2": dict(model="llama3-70b", gpus=64, pp=4, vpp=1, ep=1, tp=2, global_batch_size=256),
}


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("case", list(HIDING_CASES))
def test_hiding_never_makes_a_step_slower(engine: str, case: str) -> None:
    from costmodel.engine import predict
    from workloads.scenario import DEFAULT_SCENARIO

    # with the stages' gathers aligned (all dispatched when the step starts); unaligned (Megatron's
    # default) each stage waits for its first gather when its first forward arrives, and with pp > 1
    # those waits add up along the pipeline fill, which can cost more than one synchronous gather
    # (test_dp_settings.py::test_unaligned_parameter_gathers_add_up_along_the_pipeline_fill)
    sc = DEFAULT_SCENARIO.resolve().with_updates(**HIDING_CASES[case], align_param_gather=True)
    off = predict(sc.with_updates(hide_param_gather=False), engine).step_time_s  # type: ignore[arg-type]
    on = predict(sc.with_updates(hide_param_gather=True), engine).step_time_s  # type: ignore[arg-type]
    assert on <= off * (1 + 1e-9)

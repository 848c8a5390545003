"""The planner's search space: pins and bounds, the vectorised validity filter, normalisation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from costmodel.planner.memory_bound import stage_params_max
from costmodel.planner.pins import parse_pins
from costmodel.planner.plan import scenario_from_config
from costmodel.planner.space import (
    STRUCT_KEYS,
    Candidate,
    build_scenario,
    candidate_config,
    default_values,
    enumerate_candidates,
    structure_grid,
    structure_mask,
)
from topologies.inputs import UserInputError
from workloads.inventory import build_inventory
from workloads.scenario import DEFAULT_SCENARIO, ScenarioConfig, build_config


def _base(**flags):
    return scenario_from_config(build_config(DEFAULT_SCENARIO.model_dump(), flags))


def test_pins_parse_lists_bounds_and_reject_bad_values() -> None:
    pins = parse_pins({"tp": "1,2", "pp": "4", "optimizer": "muon", "hide_param_gather": "on,off"},
                      {"max_tp": 8, "min_pp": 2, "max_mbs": None})
    assert pins.values["tp"] == (1, 2) and pins.values["pp"] == (4,)
    assert pins.values["hide_param_gather"] == (True, False)
    assert pins.max == {"tp": 8} and pins.min == {"pp": 2}
    assert pins.allows("tp", 2) and not pins.allows("tp", 4) and not pins.allows("pp", 1)
    for raw, bounds, fragment in (({"tp": "x"}, {}, "--tp: 'x' is not an integer"),
                                  ({"tp": "0"}, {}, "--tp: must be greater than 0 (got 0)"),
                                  ({"tp": "2,,4"}, {}, "empty value"),
                                  ({"tp_mode": "fast"}, {}, "--tp-mode: 'fast' is not one of"),
                                  ({"hide_param_gather": "maybe"}, {}, "not on/off"),
                                  ({}, {"min_tp": 4, "max_tp": 2}, "--min-tp 4 exceeds --max-tp 2"),
                                  ({"tp": "16"}, {"max_tp": 8}, "outside")):
        with pytest.raises(UserInputError) as err:
            parse_pins(raw, bounds)
        assert fragment in str(err.value) and "\n" not in str(err.value)


def test_pinning_restricts_the_space(default_scenario) -> None:
    base_pins = {"vpp": "1,2", "cp": "1", "micro_batch_size": "1,2", "recompute": "none"}
    full, _ = enumerate_candidates(default_scenario, parse_pins(base_pins))
    cases = [({"tp": "1"}, {}, lambda c: c.tp == 1),
             ({"pp": "4,8"}, {}, lambda c: c.pp in (4, 8)),
             ({}, {"max_tp": 2}, lambda c: c.tp <= 2),
             ({}, {"min_ep": 32}, lambda c: c.ep >= 32),
             ({"optimizer": "muon"}, {}, lambda c: c.optimizer == "muon"),
             ({"load_balance": "lpt", "hide_param_gather": "on"}, {},
              lambda c: c.hide and (c.optimizer == "adamw" or c.load_balance == "lpt"))]
    for extra, bounds, ok in cases:
        pinned, _ = enumerate_candidates(default_scenario, parse_pins(base_pins | extra, bounds))
        assert pinned and len(pinned) < len(full), extra
        assert all(ok(c) for c in pinned), extra
        assert set(pinned) == {c for c in full if ok(c)}, extra  # pins only remove candidates


def test_default_bounds_tp_etp_cp_vpp_mbs(default_scenario) -> None:
    vals = default_values(default_scenario, parse_pins({}))
    assert max(vals["tp"]) == 8 and max(vals["etp"]) == 8 and max(vals["cp"]) == 8
    assert vals["micro_batch_size"] == [1, 2, 4, 8] and max(vals["vpp"]) == 8
    assert all(384 % ep == 0 for ep in vals["ep"])
    widened = default_values(default_scenario, parse_pins({}, {"max_tp": 16, "max_mbs": 32}))
    assert max(widened["tp"]) == 16 and max(widened["micro_batch_size"]) == 32
    dgx = default_values(_base(system="dgx-b300", gpus=64), parse_pins({}))
    assert max(dgx["tp"]) == 8  # the NVLink domain caps tp by default


@pytest.mark.parametrize("flags", [
    {"model": "llama3-8b", "gpus": 16, "global_batch_size": 64, "seq_length": 8192},
    {"model": "qwen3-30b-a3b", "gpus": 24, "global_batch_size": 96, "seq_length": 4096},
    {"model": "kimi-k2", "gpus": 64, "global_batch_size": 256, "seq_length": 4096},
    {"model": "deepseek-v3-mtp", "gpus": 32, "global_batch_size": 64, "seq_length": 2048},
    {"model": "llama3-8b", "gpus": 16, "global_batch_size": 64, "seq_length": 4098},  # sequence parallel: tp | seq/cp
])
def test_vectorised_filter_equals_the_validator(flags) -> None:
    """Every row the numpy filter keeps passes Scenario.validate, and every row it drops fails it."""
    base = _base(**flags)
    vals = default_values(base, parse_pins({}))
    axes = [np.asarray(vals[k]) for k in STRUCT_KEYS]
    grid = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
    mask = structure_mask(base, grid)
    rng = random.Random(0)
    rows = list(range(len(grid)))
    sample = rows if len(rows) <= 1500 else rng.sample(rows, 1500)
    assert mask.any()
    for i in sample:
        tp, pp, vpp, cp, ep, etp, mbs = (int(x) for x in grid[i])
        cand = Candidate(tp, pp, vpp, cp, ep, etp, mbs, "none", "adamw", "element_wise")
        try:
            build_scenario(base, cand)
            valid = True
        except UserInputError:
            valid = False
        assert valid == bool(mask[i]), (flags, grid[i])


def test_every_candidate_passes_full_validation(default_scenario) -> None:
    cands, raw = enumerate_candidates(default_scenario, parse_pins({"pp": "2,4", "micro_batch_size": "1"}))
    assert raw > len({c.structure for c in cands})
    for c in random.Random(1).sample(cands, 60):  # pydantic field checks + every cross-field rule
        ScenarioConfig.model_validate(candidate_config(default_scenario.config, c).model_dump()).resolve()


def test_candidates_are_normalised_and_unique(default_scenario) -> None:
    cands, _ = enumerate_candidates(default_scenario, parse_pins({"pp": "4", "vpp": "2", "cp": "1",
                                                                  "micro_batch_size": "1", "recompute": "none"}))
    assert len(cands) == len(set(cands))
    for c in cands:
        if c.optimizer == "adamw":
            assert c.layout is None and c.load_balance is None and c.tp_mode is None and c.hide is not None
        if c.optimizer == "muon":
            assert c.layout in ("legacy", "current") and c.load_balance in ("none", "ping_pong", "lpt")
            assert (c.tp_mode is None) == (c.tp == 1 and c.etp == 1)
    ref = Candidate.from_scenario(default_scenario)
    # Megatron's defaults: current layout balanced by LPT, overlap_param_gather off
    assert ref.tp_mode is None and ref.layout == "current" and ref.load_balance == "lpt" and ref.hide is False


def test_weights_bound_is_exact_params_of_the_heaviest_stage(default_scenario) -> None:
    grid, _ = structure_grid(default_scenario, parse_pins({"micro_batch_size": "1", "cp": "1"}))
    for row in random.Random(2).sample(grid.tolist(), 12):
        tp, pp, vpp, _, ep, etp, _ = row
        inv = build_inventory(default_scenario.model, tp, pp, vpp, ep, etp)
        exact = max(inv.rank_numel(s) for s in range(pp))
        assert stage_params_max(default_scenario.model, np.array([row]))[0] == pytest.approx(exact, rel=1e-12)


def test_plan_searches_only_megatron_pairs_unless_hypothetical_allowed(default_scenario) -> None:
    """Megatron-Core has two layer-wise (layout, load balance) pairs: legacy/ping_pong (shard_params) and
    current/lpt (the per-buffer layout). The other four are what-ifs, searched only when allowed and
    labelled "hypothetical" (label and PlanRow)."""
    raw = {"pp": "4", "vpp": "2", "cp": "1", "micro_batch_size": "1", "recompute": "none", "optimizer": "muon"}
    real, _ = enumerate_candidates(default_scenario, parse_pins(raw))
    assert {(c.layout, c.load_balance) for c in real} == {("legacy", "ping_pong"), ("current", "lpt")}
    assert not any(c.hypothetical or "hypothetical" in c.label() for c in real)
    every, _ = enumerate_candidates(default_scenario, parse_pins(raw, allow_hypothetical=True))
    assert {(c.layout, c.load_balance) for c in every} == {(a, b) for a in ("legacy", "current")
                                                           for b in ("none", "ping_pong", "lpt")}
    hyp = [c for c in every if c.hypothetical]
    assert len(hyp) == 2 * len(every) // 3 and all(c.label().endswith("(hypothetical)") for c in hyp)
    with pytest.raises(UserInputError, match="allow-hypothetical") as err:
        parse_pins(raw | {"layer_wise_layout": "legacy", "load_balance": "lpt"})
    assert "\n" not in str(err.value)
    assert parse_pins(raw | {"layer_wise_layout": "legacy", "load_balance": "lpt"}, allow_hypothetical=True)


@pytest.mark.parametrize("pins", [{}, {"optimizer": "adamw,muon", "tp": "1,2", "etp": "1,2", "pp": "2,4"},
                                  {"recompute": "full,none", "distribution": "replicated,layer_wise"}])
def test_first_candidates_are_the_groups_first_candidates(default_scenario, pins) -> None:
    """The candidates the first bound pass is handed to the workers with (before the groups exist) are
    the first candidate of each layout's first group with the first recompute mode."""
    from costmodel.planner.space import (
        default_values,
        enumerate_groups,
        first_candidates,
        structure_grid,
    )

    parsed = parse_pins(pins)
    grid, _ = structure_grid(default_scenario, parsed)
    rc = default_values(default_scenario, parsed)["recompute"][0]
    expected: dict[tuple, object] = {}
    for g in enumerate_groups(default_scenario, parsed, grid):
        if g.recompute == rc:
            expected.setdefault(g.structure, g.candidates()[0])
    assert first_candidates(parsed, grid, rc) == list(expected.values())
    assert len(expected) == len(grid)


@pytest.mark.parametrize("flags", [
    {"model": "kimi-k2", "gpus": 64, "global_batch_size": 256, "seq_length": 4096},
    {"model": "llama3-8b", "gpus": 16, "global_batch_size": 48, "seq_length": 8192, "fsdp": 1},
    {"model": "qwen3-30b-a3b", "gpus": 24, "global_batch_size": 96, "seq_length": 4096, "ep_comm_overlap": True},
])
def test_build_scenario_gives_the_validators_verdict_and_message(flags) -> None:
    """build_scenario memoises the size and settings rules across micro-batch sizes: on candidates
    (valid ones and ones breaking one or several rules, before and after the batch rule) it must
    raise exactly what Scenario.validate raises on the same config, or nothing when that passes."""
    from workloads.scenario import Scenario

    base = _base(**flags)
    rng = random.Random(3)
    outcomes = set()
    for _ in range(1500):
        cand = Candidate(rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 4, 5]), rng.choice([1, 2, 3]),
                         rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 8]), rng.choice([1, 2]), rng.choice([1, 2, 3, 4, 64]),
                         rng.choice(["none", "selective", "full"]), *rng.choice([("muon", "layer_wise"),
                         ("muon", "element_wise"), ("adamw", "element_wise"), ("adamw", "replicated")]))
        direct = Scenario(config=candidate_config(base.config, cand), system=base.system, model=base.model)
        try:
            direct.validate()
            expected = None
        except UserInputError as err:
            expected = str(err)
        try:
            build_scenario(base, cand)
            got = None
        except UserInputError as err:
            got = str(err)
        assert got == expected, cand
        outcomes.add(expected.split()[0] if expected else None)
    assert None in outcomes and len(outcomes) >= 4  # valid ones and several different rules broken

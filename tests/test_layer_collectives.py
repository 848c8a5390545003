"""A layer's collectives (costmodel.layer_comm.LayerCollectives) and their blocks (comm_blocks)."""

from __future__ import annotations

from costmodel.layer_comm import LayerCollectives, comm_blocks
from costmodel.layer_costs import CommAcc, CommBlock, LayerParts
from workloads.scenario import DEFAULT_SCENARIO, build_config


def _acc(*adds: tuple[float, float, str]) -> CommAcc:
    a = CommAcc()
    for t in adds:
        a.add(t, 1, 100.0)
    return a


def test_present_lists_the_kinds_with_collectives_and_their_bottleneck_link() -> None:
    tp = _acc((1.0, 0.1, "nvlink"), (2.0, 0.2, "network"))  # 2 s on the network > 1 s on NVLink
    ep = _acc((3.0, 0.3, "nvlink"))
    coll = LayerCollectives({"tp": tp, "cp": CommAcc(), "ep": ep}, {"tp": CommAcc(), "cp": CommAcc(), "ep": CommAcc()},
                            None)
    assert coll.present == ((("tp", tp, "network"), ("ep", ep, "nvlink")), ())


def test_blocks_without_overlap_are_all_exposed() -> None:
    scenario = build_config(DEFAULT_SCENARIO.model_dump(), {}).resolve()
    coll = LayerCollectives({"tp": _acc((1.0, 0.1, "nvlink")), "cp": CommAcc(), "ep": CommAcc()},
                            {"tp": CommAcc(), "cp": _acc((2.0, 0.5, "network"), (0.5, 0.1, "nvlink")), "ep": CommAcc()},
                            None)
    fwd, bwd = comm_blocks(scenario, coll, (1.0, 1.0), False, LayerParts({}))
    assert fwd == (CommBlock("tp", 1.0, 0.1, "nvlink", 1.0, 100.0),)
    assert bwd == (CommBlock("cp", 2.5, 0.6, "network", 1.0, 200.0),)


def test_cp_block_exposes_the_excess_over_the_attention_core() -> None:
    scenario = build_config(DEFAULT_SCENARIO.model_dump(), {}).resolve()
    coll = LayerCollectives({"tp": CommAcc(), "cp": _acc((2.0, 0.5, "network")), "ep": CommAcc()},
                            {"tp": CommAcc(), "cp": _acc((4.0, 0.5, "network")), "ep": CommAcc()}, None)
    fwd, bwd = comm_blocks(scenario, coll, (1.5, 1.0), True, LayerParts({}))
    assert fwd[0].exposed_fraction == 0.25  # (2 - 1.5) / 2
    assert bwd[0].exposed_fraction == 0.75  # (4 - 1) / 4

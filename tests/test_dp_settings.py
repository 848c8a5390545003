"""Data-parallel recipe settings in the optimizer plan and the step: hand calculations.

Distributed-optimizer instances (collectives and their bytes), the precision-aware optimizer's
step bytes, and the optimizer CPU offload's host time.
"""

from __future__ import annotations

import pytest

from costmodel.analytic import run_analytic
from costmodel.compute import memory_time_s
from costmodel.des import run_des
from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer.plan import build_optimizer_plan
from topologies.inputs import UserInputError
from topologies.placement import placement_for
from workloads.inventory import inventory_for
from workloads.scenario import DEFAULT_SCENARIO, OptimizerSpec, build_config


def _llama(gpus: int = 16, **flags: object):
    base = dict(model="llama3-8b", gpus=gpus, tp=1, pp=1, vpp=1, ep=1, cp=1, micro_batch_size=1,
                global_batch_size=8 * gpus, seq_length=1024, optimizer="adamw", grad_reduce_dtype="bf16",
                precision="bf16", system="gb300-nvl72")
    return build_config(DEFAULT_SCENARIO.model_dump(), base | flags).resolve()


# ------------------------------------------------------------------ distributed-optimizer instances
@pytest.mark.parametrize("k", [2, 4])
def test_instances_reduce_within_all_reduce_across_gather_within(k: int) -> None:
    one, many = build_optimizer_plan(_llama()), build_optimizer_plan(_llama(num_distributed_optimizer_instances=k))
    calls = list(many.stages[0].collectives)
    rs = [c for c in calls if c.op == "reduce_scatter"]
    ar = [c for c in calls if c.op == "all_reduce"]
    ag = [c for c in calls if c.op == "all_gather"]
    assert {(c.group, c.group_size) for c in rs} == {("dp_instance", 16 // k)}
    assert {(c.group, c.group_size) for c in ag} == {("dp_instance", 16 // k)}
    assert {(c.group, c.group_size, c.phase) for c in ar} == {("dp_across", k, "grad_reduce_across")}
    # per bucket: the all-reduce carries one rank's reduced shard of the bucket (bytes / instance size)
    assert sorted(c.bytes * 16 // k for c in ar) == sorted(c.bytes for c in rs)
    assert [c.count for c in sorted(ar, key=lambda c: c.bytes)] == [c.count for c in sorted(rs, key=lambda c: c.bytes)]
    # every rank steps 1/(dp/k) of the parameters instead of 1/dp
    n = inventory_for(_llama()).rank_numel(0)
    assert sum(r.owned_numel * r.multiplicity for r in one.stages[0].ranks) == pytest.approx(n, rel=1e-3)
    assert sum(r.owned_numel * r.multiplicity for r in many.stages[0].ranks) == pytest.approx(k * n, rel=1e-3)


def test_instance_groups_in_megatron_rank_order() -> None:
    pl = placement_for(_llama(64, tp=2, num_distributed_optimizer_instances=4))  # dp 32 -> 4 instances of 8
    assert pl.group_ranks("dp_instance", 0) == [0, 2, 4, 6, 8, 10, 12, 14]  # consecutive dp ranks
    assert pl.group_ranks("dp_across", 0) == [0, 16, 32, 48]  # the same position in every instance


@pytest.mark.parametrize(("flags", "message"), [
    ({"optimizer": "muon"}, "element-wise distributed optimizer"),
    ({"distribution": "replicated"}, "element-wise distributed optimizer"),
    ({"fsdp": 16}, "element-wise distributed optimizer"),
])
def test_instances_need_the_element_wise_optimizer(flags: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        _llama(num_distributed_optimizer_instances=2, **flags)


# ------------------------------------------------------------------ precision-aware optimizer step bytes
def test_adam_step_bytes_by_dtype() -> None:
    plain = ks.AdamBytes.of(OptimizerSpec(kind="adamw", grad_reduce_dtype="bf16"))
    # fused Adam: fp32 grad 4 + master, m, v read+write 24; per piece: main -> model copy 4 + 2, grad cast 2 + 4
    assert (plain.fused, plain.piece_kernels) == (28.0, (6.0, 6.0))
    aware = ks.AdamBytes.of(OptimizerSpec(kind="adamw", grad_reduce_dtype="bf16", use_precision_aware_optimizer=True,
                                          main_grads_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    # bf16 grad 2 + fp32 master r/w 8 + bf16 m, v r/w 8 + bf16 parameter write 2; no copy, no cast
    assert (aware.fused, aware.piece_kernels) == (20.0, ())
    cast = ks.AdamBytes.of(OptimizerSpec(kind="adamw", grad_reduce_dtype="bf16", use_precision_aware_optimizer=True))
    assert (cast.fused, cast.piece_kernels) == (4 + 2 * 12 + 2.0, (6.0,))  # fp32 main grads cast from bf16


def test_precision_aware_step_is_faster_by_the_bytes_it_saves() -> None:
    sc = _llama(8)
    aware = _llama(8, use_precision_aware_optimizer=True, main_grads_dtype="bf16", exp_avg_dtype="bf16",
                   exp_avg_sq_dtype="bf16")
    r0, r1 = build_optimizer_plan(sc).stages[0].ranks[0], build_optimizer_plan(aware).stages[0].ranks[0]
    s_per_byte = memory_time_s(1e9, sc.system) / 1e9
    saved = r0.owned_numel * ((28 + 6 + 6) - 20) * s_per_byte
    assert r0.elementwise_s - r1.elementwise_s == pytest.approx(saved, rel=1e-3)


def test_optimizer_cpu_offload_moves_the_step_to_the_host() -> None:
    sc, off = _llama(8), _llama(8, optimizer_cpu_offload=True)
    r0, r1 = build_optimizer_plan(sc).stages[0].ranks[0], build_optimizer_plan(off).stages[0].ranks[0]
    gpu = sc.system.gpu
    host = r0.owned_numel * ((2 + 2) / gpu.host_link_Bps + 28 / gpu.host_memory_Bps)  # grads down, Adam, params up
    s_per_byte = memory_time_s(1e9, sc.system) / 1e9
    on_gpu = r0.owned_numel * (28 + 6 + 6) * s_per_byte  # fused Adam, copies, casts no longer on the GPU
    assert r1.elementwise_s - r0.elementwise_s == pytest.approx(host - on_gpu, rel=1e-3)
    assert dict(r1.kernel_counts)["adam_multi_tensor"] == 0 < dict(r0.kernel_counts)["adam_multi_tensor"]
    with pytest.raises(UserInputError, match="needs optimizer adamw"):
        _llama(8, optimizer="muon", optimizer_cpu_offload=True)


# ------------------------------------------------------------------ Megatron-FSDP sharding strategies
def _fsdp(strategy: str, **flags: object):
    return _llama(8, fsdp=8, data_parallel_sharding_strategy=strategy, **flags)


def _unit_calls(sc):  # noqa: ANN001, ANN202
    from costmodel.fsdp import fsdp_layer_blocks, fsdp_units
    from costmodel.optimizer.plan import cached_inventory

    unit = fsdp_units(cached_inventory(sc), sc)["dense"]
    strategy = sc.optimizer.data_parallel_sharding_strategy
    calls = unit.calls(8, 1, sc.optimizer.grad_bytes, gather=strategy == "optim_grads_params",
                       reduce=strategy in ("optim_grads", "optim_grads_params"))
    shapes = {g: placement_for(sc).shape(g) for g in ("dp", "expert_dp")}
    blocks = fsdp_layer_blocks(sc, fsdp_units(cached_inventory(sc), sc), "dense", shapes, (1.0, 1.0), True)
    return unit, calls, blocks


LAYER = (32 + 16) * 128 * 4096 + 4096 * 4096 + 2 * 14336 * 4096 + 4096 * 14336  # Llama 3 8B layer GEMM weights
NORMS = 2 * 4096


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads", "optim_grads_params"])
def test_fsdp_strategy_collectives(strategy: str) -> None:
    sc = _fsdp(strategy)
    unit, (fwd, bwd), blocks = _unit_calls(sc)
    assert unit.dense_numel == LAYER + NORMS
    gathers = [c for c in fwd + bwd if c.op == "all_gather"]
    reduces = [c for c in bwd if c.op == "reduce_scatter"]
    assert [c.bytes for c in gathers] == ([2 * (LAYER + NORMS)] * 2 if strategy == "optim_grads_params" else [])
    assert [c.bytes for c in reduces] == ([2 * (LAYER + NORMS)] if strategy in ("optim_grads", "optim_grads_params") else [])
    assert bool(blocks[0] or blocks[1]) == (strategy in ("optim_grads", "optim_grads_params"))
    plan = build_optimizer_plan(sc).stages[0]
    ops = {(c.op, c.phase) for c in plan.collectives}
    expected = {"no_shard": {("all_reduce", "grad_reduce")},
                "optim": {("reduce_scatter", "grad_reduce"), ("all_gather", "param_gather")},
                "optim_grads": {("all_gather", "param_gather")},
                "optim_grads_params": set()}[strategy]
    assert ops == expected
    n = inventory_for(sc).rank_numel(0)
    owned = max(r.owned_numel for r in plan.ranks)
    assert owned == (n if strategy == "no_shard" else pytest.approx(n / 8, rel=1e-3))


@pytest.mark.parametrize(("precision", "system"), [("fp8-cs", "gb300-nvl72"), ("fp8-cs", "dgx-h100"),
                                                   ("mxfp8", "gb300-nvl72")])
def test_fsdp_gathers_fp8_parameters_one_byte_per_element(precision: str, system: str) -> None:
    """Megatron-FSDP keeps FP8 parameters in parameter groups of their own (``dtype="float8"``) whose
    buffers are ``uint8``: the rowwise data (``fp8_get_raw_data``), and for MXFP8 also the columnwise
    data (``transpose_weight_buffer``, gathered in the backward instead). Scales are computed on every
    rank, Hopper's transpose is made after the gather. So one Llama 3 8B layer gathers its GEMM
    weights at 1 B per element (not 2 B as stored with Hopper's transpose, nor 2.06 B as MXFP8's
    rowwise + columnwise + scales) and its two norms at 2 B, as two collectives, in the forward and
    again in the backward."""
    sc = _fsdp("optim_grads_params", precision=precision, fp8_param_gather=True, system=system)
    unit, (fwd, bwd), _ = _unit_calls(sc)
    gathers = [("bf16", 2 * NORMS), ("fp8", LAYER)]
    assert [(c.dtype, c.bytes) for c in fwd] == gathers
    assert [(c.dtype, c.bytes) for c in bwd if c.op == "all_gather"] == gathers
    # full recompute: the recomputed forward's gather serves the backward, except MXFP8's columnwise one
    _, again = unit.calls(8, 1, sc.optimizer.grad_bytes, recomputed=True)
    extra = [("fp8", LAYER)] if precision == "mxfp8" else []
    assert [(c.dtype, c.bytes) for c in again if c.op == "all_gather"] == gathers + extra
    # a layer kept in BF16 (first_last_layers_bf16) gathers everything at 2 B
    _, kept = unit.calls(8, 1, sc.optimizer.grad_bytes, fp8=False)
    assert [(c.dtype, c.bytes) for c in kept if c.op == "all_gather"] == [("bf16", 2 * (LAYER + NORMS))]


def test_fsdp_layer_blocks_know_recompute_and_bf16_layers() -> None:
    """The step's per-layer blocks: MXFP8 with full recompute gathers the rowwise data once more in
    the backward of a recomputed layer (not of a ``:norc`` one); a ``:bf16`` layer gathers 2 B."""
    from costmodel.fsdp import fsdp_layer_blocks, fsdp_units
    from costmodel.optimizer.plan import cached_inventory

    sc = _fsdp("optim_grads_params", precision="mxfp8", fp8_param_gather=True, recompute="full")
    units = fsdp_units(cached_inventory(sc), sc)
    shapes = {g: placement_for(sc).shape(g) for g in ("dp", "expert_dp")}
    rs = 2 * (LAYER + NORMS)  # bf16 gradient reduce-scatter (grad_reduce_dtype bf16)

    def bwd_bytes(kind: str) -> float:
        return fsdp_layer_blocks(sc, units, kind, shapes, (1.0, 1.0), True)[1][0].bytes

    assert bwd_bytes("dense") == 2 * NORMS + 2 * LAYER + rs
    assert bwd_bytes("dense:norc") == 2 * NORMS + LAYER + rs
    assert bwd_bytes("dense:bf16") == 2 * (LAYER + NORMS) + rs


def test_mxfp8_on_megatron_fsdp_gathers_two_uint8_buffers_after_the_step() -> None:
    """``optim``: the FP8 buckets are gathered after the step as the rowwise and the columnwise
    ``uint8`` buffers, one after the other (2 × an all-gather of 1 B per element), and Megatron-FSDP
    holds no BF16 parameter-gather buffer (the distributed optimizer's MXFP8 path does: 2 B)."""
    from costmodel.layer_costs import collective_s
    from costmodel.step_structure import build_step_structure
    from workloads.weight_memory import low_precision_storage

    sc = _fsdp("optim", precision="mxfp8", fp8_param_gather=True)
    plan = build_optimizer_plan(sc).stages[0]
    fp8 = [b for b in plan.buckets if b.param_dtype == "fp8"]
    assert fp8 and all(b.param_gathers == 2 and b.param_bytes == b.numel for b in fp8)
    costs = build_step_structure(sc).stages[0].buckets  # in the plan's bucket order
    shape = placement_for(sc).shape("dp")
    for b, cost in zip(sorted(plan.buckets, key=lambda x: x.order), costs, strict=True):
        if b.param_dtype == "fp8":
            assert cost.gather_bytes == 2 * b.numel
            assert cost.gather_s == pytest.approx(2 * collective_s("all_gather", b.numel, shape, sc.system)[0])
    assert low_precision_storage(sc).gather_buffer_bytes == 0.0
    ddp = _llama(8, precision="mxfp8", fp8_param_gather=True)
    assert low_precision_storage(ddp).gather_buffer_bytes == 2.0


# ------------------------------------------------------------------ first/last layers in BF16
def test_bf16_first_last_layers_run_their_gemms_in_bf16() -> None:
    from costmodel.analytic import run_analytic
    from costmodel.layer_comm import base_kind
    from costmodel.layer_costs import bf16_shape, layer_ops, ops_time, rank_shape

    flags = dict(precision="mxfp8", micro_batch_size=1, global_batch_size=64)
    low = _llama(8, **flags)
    kept = _llama(8, first_last_layers_bf16=True, num_layers_at_start_in_bf16=1, num_layers_at_end_in_bf16=2, **flags)
    shape = rank_shape(low)
    kept_shape = bf16_shape("dense:bf16", shape)
    assert (base_kind("dense:bf16"), kept_shape.precision, bf16_shape("dense", shape)) == ("dense", "bf16", shape)
    fp8_ops, bf16_ops = layer_ops(low.model, shape, "dense", "none", ()), layer_ops(low.model, kept_shape, "dense", "none", ())
    assert {o.tensor_class for o in bf16_ops.forward if o.kind == "gemm"} == {"bf16"}
    assert not [o for o in bf16_ops.forward + bf16_ops.backward if o.kind == "quantize"]  # no casts
    assert [o for o in fp8_ops.forward if o.kind == "quantize"]
    f8, b8, _, _ = ops_time(fp8_ops, low.system)
    f16, b16, _, _ = ops_time(bf16_ops, low.system)
    assert f16 + b16 > f8 + b8  # BF16 GEMMs run at half the FP8 rate
    # three layers (the first, the last two) per micro-batch, 8 micro-batches, one stage
    extra = 3 * low.num_microbatches * ((f16 + b16) - (f8 + b8))
    c0, c1 = run_analytic(low).breakdown_s.compute, run_analytic(kept).breakdown_s.compute
    assert c1 - c0 == pytest.approx(extra, rel=1e-6)


# ------------------------------------------------------------------ activation offloading traffic
def test_cpu_offloading_copies_over_the_host_link() -> None:
    from costmodel.analytic import run_analytic
    from costmodel.layer_comm import layer_kind_costs
    from costmodel.layer_costs import LAYER_GROUP_KINDS, rank_shape
    from workloads.activation_memory import full_layer_bytes

    flags = dict(system="dgx-b200", micro_batch_size=2, global_batch_size=32)
    sc = _llama(8, cpu_offloading=True, cpu_offloading_num_layers=20, **flags)
    pl = placement_for(sc)
    f, b, _, _ = layer_kind_costs(sc, rank_shape(sc), "dense", {k: pl.shape(k) for k in LAYER_GROUP_KINDS}, True)
    t = full_layer_bytes(sc, 0, False) / 64e9  # one layer's saved tensors over PCIe Gen5 x16
    assert t > f  # the copy outlasts the next layer's forward on PCIe ...
    exposed = sc.num_microbatches * 20 * (max(0.0, t - f) + max(0.0, t - b))  # 20 layers out and back
    report = run_analytic(sc)
    assert report.breakdown_s.exposed_comm["offload"] == pytest.approx(exposed, rel=1e-9)
    plain = run_analytic(_llama(8, **flags))
    # the step grows by it, less what of the gradient reduction the longer backward now hides
    assert 0.98 * exposed < report.step_time_s - plain.step_time_s <= exposed
    # ... and hides behind it on NVLink-C2C (225 GB/s per GPU and direction)
    gb = _llama(8, cpu_offloading=True, cpu_offloading_num_layers=20, **(flags | {"system": "gb200-nvl72"}))
    assert run_analytic(gb).breakdown_s.exposed_comm.get("offload", 0.0) < exposed / 3


# ------------------------------------------------------------------ parameter-gather alignment
def test_unaligned_parameter_gathers_add_up_along_the_pipeline_fill() -> None:
    from costmodel.analytic import analytic_timing
    from costmodel.des import run_des
    from costmodel.step_structure import build_step_structure

    flags = dict(gpus=32, pp=2, hide_param_gather=True, micro_batch_size=1, global_batch_size=256)
    aligned, plain = _llama(align_param_gather=True, **flags), _llama(**flags)
    st = build_step_structure(plain)

    def own_delay(stage) -> float:  # noqa: ANN001 - the stage's wait when its gathers start with its first forward
        arrive, worst = 0.0, 0.0
        fwd = stage.chunks[0].fwd.time_s
        for b in stage.forward_buckets:
            arrive += b.gather_s
            worst = max(worst, arrive - b.fwd_need_fraction * fwd)
        return worst

    d0, d1 = own_delay(st.stages[0]), own_delay(st.stages[1])
    fill1 = st.stages[0].chunks[0].fwd.time_s + st.p2p_s
    assert d0 > 0 and d1 > 0
    t_plain = analytic_timing(st).breakdown.exposed_comm["dp_param"]
    t_aligned = analytic_timing(build_step_structure(aligned)).breakdown.exposed_comm["dp_param"]
    assert t_plain == pytest.approx(d0 + d1, rel=1e-9)  # stage 1 starts gathering only when its forward arrives
    assert t_aligned == pytest.approx(max(d0, d1 - fill1), rel=1e-9)  # stage 1 gathers during the fill
    # the same direction in the discrete-event engine
    assert run_des(aligned).step_time_s < run_des(plain).step_time_s
    # overlapping the gather with the optimizer step dispatches the first chunk's right after it: aligned
    early = _llama(overlap_param_gather_with_optimizer_step=True, **flags)
    assert analytic_timing(build_step_structure(early)).breakdown.exposed_comm["dp_param"] == pytest.approx(t_aligned)


# ------------------------------------------------------------------ average_in_collective
def test_gradient_prescaling_unless_averaged_in_the_collective() -> None:
    from costmodel.step_structure import build_step_structure

    sc, avg = _llama(8), _llama(8, average_in_collective=True)
    plan = build_optimizer_plan(sc).stages[0]
    # one read + write pass over every bf16 gradient bucket at the HBM rate
    expected = sum(memory_time_s(2 * 2 * b.numel, sc.system) for b in plan.buckets)
    assert build_step_structure(sc).stages[0].grad_prescale_s == pytest.approx(expected, rel=1e-9)
    assert build_step_structure(avg).stages[0].grad_prescale_s == 0.0
    # without overlap (MCore finish_grad_sync: scale, then reduce, bucket after bucket) the whole scaling
    # is on the critical path, booked as gradient synchronisation in both engines
    ana, ana_avg = run_analytic(sc, overlap=False), run_analytic(avg, overlap=False)
    des, des_avg = (run_des(x, contention=False, overlap=False, record=False) for x in (sc, avg))
    for with_scaling, without in ((ana, ana_avg), (des, des_avg)):
        assert with_scaling.step_time_s - without.step_time_s == pytest.approx(expected, rel=1e-6)
        a, b = with_scaling.breakdown_s, without.breakdown_s
        assert a.exposed_comm["dp_grad"] - b.exposed_comm["dp_grad"] == pytest.approx(expected, rel=1e-6)
        assert (a.compute, a.pipeline_bubble) == pytest.approx((b.compute, b.pipeline_bubble), rel=1e-9, abs=1e-12)


def test_overlapped_gradient_prescaling_delays_the_drain_in_both_engines() -> None:
    """With ``overlap_grad_reduce`` Megatron-Core scales a bucket from the backward hook
    (``register_grad_ready`` → ``start_grad_sync``: ``grad_data *= 1/dp`` on the compute stream) as
    soon as its gradients are complete in the last micro-batch, inside that backward and before the
    input gradient is sent to the previous stage. The last micro-batch's backward runs through the
    stages pp−1 … 0, so (vpp 1) stage s's last backward ends later by Σ_{j ≥ s} P_j, with P_j the
    scaling of stage j's buckets (one read + write pass over each bf16 bucket at the HBM rate)."""
    from costmodel.analytic import analytic_timing
    from costmodel.des.simulation import StepSimulation
    from costmodel.step_structure import build_step_structure

    sc, avg = _llama(32, pp=4, global_batch_size=64), _llama(32, pp=4, global_batch_size=64, average_in_collective=True)
    plan = build_optimizer_plan(sc)
    scaling = [sum(memory_time_s(2 * 2 * b.numel, sc.system) for b in stage.buckets) for stage in plan.stages]
    expected = [sum(scaling[s:]) for s in range(4)]
    ends = []
    for x in (sc, avg):
        sim = StepSimulation(build_step_structure(x), steps=1, contention=False, record=False)
        sim.run()
        ends.append(sim.bwd_end[0])
    assert [a - b for a, b in zip(*ends, strict=True)] == pytest.approx(expected, rel=1e-6)
    ana, ana_avg = (analytic_timing(build_step_structure(x)) for x in (sc, avg))
    assert ana.pipeline_s - ana_avg.pipeline_s == pytest.approx(expected[0], rel=1e-9)
    # what it adds to the step is booked as gradient synchronisation (not compute, not bubble) in both
    # engines (less than Σ P: the reductions of the earlier buckets run meanwhile)
    for engine in (run_analytic, lambda x: run_des(x, contention=False, record=False)):
        r, r_avg = engine(sc), engine(avg)
        a, b = r.breakdown_s, r_avg.breakdown_s
        added = r.step_time_s - r_avg.step_time_s - (a.other - b.other)  # other: overlap slowdown
        assert 0 < added <= expected[0]
        assert a.exposed_comm["dp_grad"] - b.exposed_comm["dp_grad"] == pytest.approx(added, rel=1e-6)
        assert (a.compute, a.pipeline_bubble) == pytest.approx((b.compute, b.pipeline_bubble), rel=1e-6)

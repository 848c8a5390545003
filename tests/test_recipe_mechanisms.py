"""Recipe-setting mechanisms against hand calculations: direction and size of each effect."""

from __future__ import annotations

import pytest

from costmodel.comm_exposure import EpOverlap, dispatch_sm_share, ep_exposed_fraction, overlapped_s
from costmodel.compute import operation_time_s
from costmodel.layer_comm import hybrid_ep_shape
from costmodel.layer_costs import layer_ops, pass_time_s, rank_shape
from costmodel.step_structure import _chunk_items, build_step_structure
from costmodel.tp_overlap import overlapped_exposed_s
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import load_system
from topologies.placement import place_job
from workloads.operations import Operation
from workloads.runtime import RuntimeSettings
from workloads.scenario import build_config

DSV3 = {"model": "deepseek-v3", "system": "gb300-nvl72", "gpus": 256, "precision": "mxfp8", "tp": 1, "pp": 2,
        "vpp": 8, "ep": 32, "micro_batch_size": 1, "global_batch_size": 4096, "seq_length": 4096,
        "optimizer": "adamw", "mtp_layers": 1, "pipeline_model_parallel_layout": "Et*4|(t*4|)*14tmL"}
LLAMA8B = {"model": "llama3-8b", "system": "dgx-h100", "gpus": 8, "precision": "fp8-cs", "tp": 1, "pp": 1, "vpp": 1,
           "ep": 1, "micro_batch_size": 1, "global_batch_size": 128, "seq_length": 8192, "optimizer": "adamw"}


def scenario(base: dict, **flags: object):  # noqa: ANN201
    return build_config({}, {**base, **flags}).resolve()


def moe_ops(sc):  # noqa: ANN001, ANN201
    p = sc.par
    return layer_ops(sc.model, rank_shape(sc), "moe", p.recompute, tuple(p.recompute_modules))


# ---------------------------------------------------------------------------------- recompute
def test_selective_recompute_replays_the_named_modules_forward_flops() -> None:
    base, mla = scenario(DSV3), scenario(DSV3, recompute="selective", recompute_modules="mla_up_proj")
    extra = moe_ops(mla).backward_flops - moe_ops(base).backward_flops
    att = mla.model.attention
    t = 4096  # tokens of one micro-batch (mbs 1, tp 1, cp 1)
    nh, dqk = att.num_heads, att.qk_head_dim + att.qk_pos_emb_head_dim
    hand = 2 * t * att.q_lora_rank * nh * dqk + 2 * t * att.kv_lora_rank * nh * (att.qk_head_dim + att.v_head_dim)
    assert extra == pytest.approx(hand, rel=1e-12)  # the two up-projection GEMMs, once more, nothing else


def test_full_recompute_block_method_recomputes_the_first_layers_of_each_chunk() -> None:
    sc = scenario(LLAMA8B, recompute="full", recompute_method="block", recompute_num_layers=5)
    (items,) = _chunk_items(sc)
    assert items.count("dense") == 5 and items.count("dense:norc") == 27
    full, block = scenario(LLAMA8B, recompute="full"), sc
    none = scenario(LLAMA8B)
    c_full, c_block, c_none = (build_step_structure(x).stages[0].chunks[0].bwd.compute_s for x in (full, block, none))
    # the backward grows by the recomputed forward of 5 of 32 layers (the rest of the chunk is unchanged)
    assert (c_block - c_none) == pytest.approx(5 / 32 * (c_full - c_none), rel=0.02)


# ------------------------------------------------------------------------------ MoE dispatch
def test_overlapped_all_to_all_costs_its_excess_and_the_sms_it_takes() -> None:
    assert overlapped_s(1.0, 0.6, 0.2) == pytest.approx(0.4 + 0.2 * 0.6)
    assert overlapped_s(0.5, 2.0, 0.2) == pytest.approx(0.1)  # fully hidden: only the SM loss remains
    rt = RuntimeSettings(moe_hybridep_num_sms=32)
    assert dispatch_sm_share(rt, 148) == pytest.approx(32 / 148)
    assert dispatch_sm_share(rt.model_copy(update={"moe_token_dispatcher_type": "alltoall"}), 148) == 0.0
    # 2 s of all-to-all per pass: 1 s dispatch beside 0.6 s of the partner's compute, 1 s combine beside 2 s
    o = EpOverlap(paired_s=(0.6, 2.0), sm_share=0.2, ep_overlap=True)
    assert ep_exposed_fraction(2.0, o) == pytest.approx(((0.4 + 0.2 * 0.6) + 0.2 * 1.0) / 2.0)
    # only the paired share overlaps; warm-up/cool-down passes expose it all
    o = EpOverlap(paired_s=(2.0, 2.0), paired_share=0.75, sm_share=0.25, ep_overlap=True)
    assert ep_exposed_fraction(2.0, o) == pytest.approx(0.75 * 0.25 + 0.25)
    # delay_wgrad: the deferred expert wgrad (own) hides the backward dispatch, also without a partner
    o = EpOverlap(paired_s=(2.0, 2.0), own_s=(0.0, 1.0), paired_share=0.75, sm_share=0.25, ep_overlap=True)
    assert ep_exposed_fraction(2.0, o) == pytest.approx((0.75 * 0.5 + 0.25 * (1.0 + 0.25)) / 2.0)


def test_delay_wgrad_and_hybridep_sms_move_the_step_as_expected() -> None:
    overlap = scenario(DSV3, ep_comm_overlap=True, moe_hybridep_num_sms=16)
    delayed = scenario(DSV3, ep_comm_overlap=True, delay_wgrad_compute=True, moe_hybridep_num_sms=16)
    more_sms = scenario(DSV3, ep_comm_overlap=True, moe_hybridep_num_sms=64)
    from costmodel.analytic import run_analytic

    t_overlap, t_delayed, t_sms = (run_analytic(x).step_time_s for x in (overlap, delayed, more_sms))
    assert t_delayed < t_overlap < t_sms


def test_hybridep_domain_from_the_environment() -> None:
    shape = GroupShape(32, 32, 1)
    assert hybrid_ep_shape(shape, None) == shape and hybrid_ep_shape(shape, 72) == shape
    split = hybrid_ep_shape(shape, 8)
    assert (split.size, split.ranks_per_domain, split.domains) == (32, 8, 4)


def test_host_sync_splits_the_issue_window() -> None:
    system = load_system("gb300-nvl72")
    e = system.efficiency
    tiny = Operation("k", "elementwise", "fwd", "moe", 0.0, 1.0, kernels=10)  # launch-bound: 10 tiny kernels
    big = Operation("g", "elementwise", "fwd", "moe", 0.0, 5e9, kernels=1)  # one long GPU kernel
    sync = Operation("permute", "elementwise", "fwd", "moe", 0.0, 1.0, kernels=10, host_sync=True)
    gpu = sum(operation_time_s(o, system) for o in (big, tiny, sync))
    assert pass_time_s((big, tiny, sync.__class__(**{**sync.__dict__, "host_sync": False})), system) == pytest.approx(
        max(gpu, 21 * e.kernel_issue_s))
    # after the sync the host cannot run ahead: the last window costs its own issue time
    split = operation_time_s(big, system) + operation_time_s(tiny, system)
    hand = max(split, 11 * e.kernel_issue_s) + e.host_sync_s + max(operation_time_s(sync, system), 10 * e.kernel_issue_s)
    assert pass_time_s((big, tiny, sync), system) == pytest.approx(hand)


def test_alltoall_and_deepep_sync_hybridep_does_not() -> None:
    def synced(**flags: object) -> bool:
        return any(o.host_sync for o in moe_ops(scenario(DSV3, **flags)).forward)

    assert synced(moe_token_dispatcher_type="alltoall")
    assert synced(moe_flex_dispatcher_backend="deepep")
    assert not synced(moe_flex_dispatcher_backend="hybridep")


def test_router_in_fp32_runs_on_the_fp32_peak() -> None:
    bf16, fp32 = scenario(DSV3), scenario(DSV3, moe_router_dtype="fp32")
    r16 = next(o for o in moe_ops(bf16).forward if o.name == "router")
    r32 = next(o for o in moe_ops(fp32).forward if o.name == "router")
    assert (r16.tensor_class, r32.tensor_class, r16.flops) == ("bf16", "fp32", r32.flops)
    peaks = fp32.system.gpu.peak_flops_per_s
    assert operation_time_s(r32, fp32.system) / operation_time_s(r16, bf16.system) > 0.5 * peaks.bf16 / peaks.fp32
    cast = next(o for o in moe_ops(fp32).forward if o.name == "router.cast")
    assert cast.bytes == 4096 * fp32.model.hidden_size * (2 + 4)  # read bf16, write fp32


def test_fusions_change_launches_not_bytes() -> None:
    fused, unfused = scenario(DSV3), scenario(DSV3, moe_permute_fusion=False, moe_router_fusion=False)

    def by_name(sc):  # noqa: ANN001, ANN202
        return {o.name: o for o in moe_ops(sc).forward}

    f, u = by_name(fused), by_name(unfused)
    for name, (kf, ku) in {"permute": (2, 5), "unpermute": (1, 3), "router_topk": (3, 8)}.items():
        assert (f[name].kernels, u[name].kernels, f[name].bytes) == (kf, ku, u[name].bytes)


def test_no_grouped_gemm_runs_one_dense_gemm_per_expert() -> None:
    grouped, loop = scenario(DSV3), scenario(DSV3, moe_grouped_gemm=False)
    g = next(o for o in moe_ops(grouped).forward if o.name == "experts.linear_fc1")
    d = next(o for o in moe_ops(loop).forward if o.name == "experts.linear_fc1")
    assert (g.kind, d.kind, d.kernels, d.flops) == ("grouped_gemm", "gemm", 8, g.flops)  # 256 experts / ep 32
    eff = loop.system.efficiency
    assert operation_time_s(d, loop.system) == pytest.approx(operation_time_s(g, grouped.system) * eff.grouped_gemm,
                                                             rel=1e-9)


def test_unfused_gradient_accumulation_adds_the_main_grad_update() -> None:
    sc = scenario(LLAMA8B, gradient_accumulation_fusion=False)
    ops = layer_ops(sc.model, rank_shape(sc), "dense", "none", ())
    acc = next(o for o in ops.backward if o.name == "linear_qkv.grad_accumulate")
    h = sc.model.hidden_size
    att = sc.model.attention
    n = (att.num_heads + 2 * att.num_kv_heads) * att.head_dim
    assert acc.bytes == h * n * (2 + 4 + 4)  # read the bf16 wgrad, read and write the fp32 main_grad


def test_fsdp_sharded_gradients_copy_the_wgrad_into_the_bucket() -> None:
    # Megatron-FSDP, optim_grads_params over 8 GPUs, bf16 reduction: main_grad.copy_(grad) into the
    # bf16 bucket (read 2 + write 2 B), then the reduced 1/8 shard added into the local shard
    # (read 2, read 2, write 2 B per shard element): 4 + 6 / 8 = 4.75 B per weight element
    flags = {"gradient_accumulation_fusion": False, "fsdp": 8, "grad_reduce_dtype": "bf16"}
    sc = scenario(LLAMA8B, **flags)
    ops = layer_ops(sc.model, rank_shape(sc), "dense", "none", ())
    fc1 = next(o for o in ops.backward if o.name == "mlp.linear_fc1.grad_accumulate")
    h, f = sc.model.hidden_size, sc.model.ffn_hidden_size
    assert fc1.bytes == pytest.approx(h * 2 * f * 4.75, rel=1e-12)
    # fp32 bucket (grad_reduce_in_fp32): read 2 + write 4, shard add 3 x 4 / 8
    sc32 = scenario(LLAMA8B, **{**flags, "grad_reduce_dtype": "fp32"})
    fc1_32 = next(o for o in layer_ops(sc32.model, rank_shape(sc32), "dense", "none", ()).backward
                  if o.name == "mlp.linear_fc1.grad_accumulate")
    assert fc1_32.bytes == pytest.approx(h * 2 * f * (6 + 1.5), rel=1e-12)
    # optim (gradients unsharded, accumulated across micro-batches): DDP's main_grad.add_ stays
    optim = scenario(LLAMA8B, **{**flags, "data_parallel_sharding_strategy": "optim"})
    acc = next(o for o in layer_ops(optim.model, rank_shape(optim), "dense", "none", ()).backward
               if o.name == "mlp.linear_fc1.grad_accumulate")
    assert acc.bytes == h * 2 * f * 10


# --------------------------------------------------------------------------------- TP overlap
def test_tp_overlap_methods_by_hand() -> None:
    # ring-exchange all-gather, tp 4: 3 exchanges of c/3 under 4 GEMM chunks of g/4
    assert overlapped_exposed_s("ring_exchange", 0.3, 0.8, 4, False, 0, 148) == 0.0
    assert overlapped_exposed_s("ring_exchange", 0.9, 0.8, 4, False, 0, 148) == pytest.approx(3 * (0.3 - 0.2))
    # ring-exchange reduce-scatter: the last exchange follows the last chunk
    assert overlapped_exposed_s("ring_exchange", 0.3, 0.8, 4, True, 0, 148) == pytest.approx(0.1)
    # pipeline reduce-scatter in 4 splits: the last split is exposed
    assert overlapped_exposed_s("pipeline", 0.4, 2.0, 4, True, 0, 148, 4) == pytest.approx(0.1)
    # bulk: the excess over the independent GEMM, plus the SMs it takes meanwhile
    assert overlapped_exposed_s("bulk", 0.5, 0.3, 4, False, 37, 148) == pytest.approx(0.2 + 0.25 * 0.3)
    assert overlapped_exposed_s("bulk", 2.0, 0.0, 4, False, 8, 148) == 2.0  # nothing to hide under


def test_tp_overlap_config_changes_the_exposed_tp_time() -> None:
    from costmodel.analytic import run_analytic

    base = {"model": "llama3.1-405b", "system": "gb300-nvl72", "gpus": 256, "precision": "fp8-cs", "tp": 4, "pp": 8,
            "vpp": 4, "ep": 1, "micro_batch_size": 1, "global_batch_size": 1536, "seq_length": 8192,
            "optimizer": "adamw"}
    off = run_analytic(scenario(base)).breakdown_s.exposed_comm["tp"]
    te = run_analytic(scenario(base, tp_comm_overlap=True)).breakdown_s.exposed_comm.get("tp", 0.0)
    sms = "qkv_dgrad:bulk:64+qkv_wgrad:bulk:64+fc1_dgrad:bulk:64+fc1_wgrad:bulk:64"
    greedy = run_analytic(scenario(base, tp_comm_overlap=True, tp_comm_overlap_cfg=sms)).breakdown_s.exposed_comm["tp"]
    assert te < 0.5 * off and te < greedy < off  # more SMs for the bulk overlaps slow their GEMMs


# ------------------------------------------------------------------- pipeline P2P, NVLS, ranks
def test_blocking_p2p_costs_one_transfer_per_interleaved_pass() -> None:
    over, block = scenario(DSV3), scenario(DSV3, overlap_p2p_comm=False)
    s_over, s_block = build_step_structure(over), build_step_structure(block)
    assert s_over.p2p_s > 0 and s_block.p2p_s == 0.0
    extra = s_block.stages[0].chunks[1].fwd.exposed_by_kind()["pp"]
    assert extra == pytest.approx(s_over.p2p_s)  # every pass waits for one send/receive


def test_nvls_disabled_changes_the_collective_algorithm() -> None:
    system = load_system("gb300-nvl72")
    on = collective_cost("all_gather", 64e6, GroupShape.single_domain(64), system)
    off = collective_cost("all_gather", 64e6, GroupShape.single_domain(64), system.without_nvls())
    assert (on.algorithm, off.algorithm) == ("nvls", "ring") and off.time_s > on.time_s
    assert scenario(DSV3, nccl_nvls_enable=False).system.nvlink.nvls is False


def test_tp_pp_dp_rank_order_places_pipeline_stages_adjacent() -> None:
    system = load_system("dgx-h100")
    default = place_job(system, 16, tp=2, pp=2)
    mapped = place_job(system, 16, tp=2, pp=2, tp_pp_dp=True)
    assert default.group_ranks("pp", 0) == [0, 8] and default.group_ranks("dp", 0) == [0, 2, 4, 6]
    assert mapped.group_ranks("pp", 0) == [0, 2] and mapped.group_ranks("dp", 0) == [0, 4, 8, 12]
    assert mapped.shape("pp").intra_domain and not default.shape("pp").intra_domain

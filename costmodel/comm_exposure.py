"""Which share of a layer's collectives sits on the compute stream's critical path.

Rules per collective kind (``overlap=False`` exposes everything, the mode in which the engines must
agree):

- **tp**: exposed unless the scenario turns on ``tp_comm_overlap`` (Megatron ``--tp-comm-overlap``,
  TE userbuffers); then each collective is overlapped with its GEMM by the method of the recipe's
  ``tp_comm_overlap_cfg`` (:mod:`costmodel.tp_overlap`).
- **cp**: the ring exchange of K/V overlaps the attention core; only the excess over the
  attention compute of the same pass is exposed.
- **ep**: exposed, except what overlaps compute:

  * with ``ep_comm_overlap`` (Megatron ``--overlap-moe-expert-parallel-comm``) the merged
    forward-backward steps of 1F1B run one micro-batch's layer forward beside the other's layer
    backward, each all-to-all under one compute part of the other micro-batch (Megatron-Core
    0.15/0.16 ``TransformerLayerSchedulePlan.run``: comm stream ``combine_bwd | dispatch_fwd ->
    dispatch_bwd | combine_fwd`` beside compute ``attn_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd |
    attn_bwd``, one CUDA event per micro-batch): forward dispatch under the backward MoE MLP,
    forward combine under the backward attention side, backward combine under the forward
    attention side, backward dispatch under the forward MoE MLP. With ``delay_wgrad_compute`` the
    expert weight-gradient GEMMs leave the backward MLP part and run under the backward dispatch.
    Only the paired share of the passes overlaps (warm-up forwards and cool-down backwards run
    alone: :func:`ep_paired_share`), where the delayed wgrad still hides the backward dispatch;
  * with ``moe_shared_expert_overlap`` the shared expert runs on a side stream under the
    dispatch/combine of its own pass.

  Overlapped communication costs ``max(0, c - T) + f·min(c, T)`` for ``c`` seconds of all-to-all
  under ``T`` seconds of compute: the excess, plus the compute's loss of the SMs the dispatch
  kernels occupy while they run, ``f = num_sms / sm_count`` (``moe_hybridep_num_sms`` or
  ``moe_deepep_num_sms`` of the flex dispatcher; NCCL's all-to-all SM use is not modelled, f = 0).
- **dp_fsdp** (Megatron-FSDP's per-layer gathers and reduce-scatters) is built and overlapped in
  :mod:`costmodel.fsdp` (the excess over the layer's own compute is exposed);
- anything else: exposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.pipeline import paired_pass_share

if TYPE_CHECKING:
    from workloads.runtime import RuntimeSettings
    from workloads.scenario import Scenario


def ep_paired_share(scenario: Scenario) -> float:
    """Share of passes that overlap their EP all-to-all with a paired micro-batch (1 without EP overlap)."""
    p = scenario.par
    return paired_pass_share(p.pp, p.vpp, scenario.num_microbatches) if p.ep_comm_overlap else 1.0


def dispatch_sm_share(runtime: RuntimeSettings, sm_count: int) -> float:
    """Fraction (0-1) of the GPU's SMs the EP dispatch/combine kernels occupy while they run."""
    if runtime.moe_token_dispatcher_type != "flex":
        return 0.0
    sms = runtime.moe_hybridep_num_sms if runtime.moe_flex_dispatcher_backend == "hybridep" else runtime.moe_deepep_num_sms
    return min(sms / sm_count, 1.0)


def overlapped_s(comm_s: float, compute_s: float, sm_share: float) -> float:
    """Exposed seconds of ``comm_s`` of communication run under ``compute_s`` of compute that loses
    ``sm_share`` of its SMs meanwhile: ``max(0, c - T) + f·min(c, T)``."""
    return max(0.0, comm_s - compute_s) + sm_share * min(comm_s, compute_s)


@dataclass(frozen=True)
class EpOverlap:
    """What one pass's two all-to-alls (dispatch, combine) can hide under (seconds), and the SM share.

    ``paired_s``: the compute parts of the other micro-batch each all-to-all runs beside, in this
    pass's order (EP overlap); ``own_s``: this pass's own compute that hides its all-to-alls
    without a partner (delayed expert wgrad under the backward dispatch, or the shared expert)."""

    paired_s: tuple[float, float] = (0.0, 0.0)
    own_s: tuple[float, float] = (0.0, 0.0)
    paired_share: float = 1.0
    sm_share: float = 0.0
    ep_overlap: bool = False


def ep_exposed_fraction(comm_s: float, o: EpOverlap) -> float:
    """Exposed share (0-1) of ``comm_s`` seconds of one pass's EP all-to-alls (module docstring):
    half of it is the dispatch, half the combine, each overlapped with its own compute part."""
    if comm_s <= 0:
        return 1.0
    half = comm_s / 2
    alone = sum(overlapped_s(half, own, o.sm_share) if own > 0 else half for own in o.own_s)
    if not o.ep_overlap:
        return alone / comm_s
    paired = sum(overlapped_s(half, t + own, o.sm_share) for t, own in zip(o.paired_s, o.own_s, strict=True))
    return (o.paired_share * paired + (1.0 - o.paired_share) * alone) / comm_s


def cp_exposed_fraction(comm_s: float, attention_s: float) -> float:
    """Exposed share (0-1) of the CP ring exchange: the excess over the attention core of its pass."""
    return max(0.0, comm_s - attention_s) / comm_s if comm_s > 0 else 1.0

"""Per-layer, per-micro-batch operations of one rank: GEMMs, attention, element-wise work, casts.

Each :class:`Operation` carries its FLOPs and HBM bytes; ``costmodel.compute`` turns them into
seconds. Shapes follow Megatron-Core under tp / sp / cp / ep / etp:

- ``tokens`` = micro_batch_size · seq_length / cp: the tokens one rank's GEMMs see (gathered over
  tp under sequence parallelism); element-wise work in sequence-parallel regions (norms, residual
  adds, router) sees ``tokens / tp``.
- Column-parallel GEMMs shard N by tp, row-parallel GEMMs shard K by tp; MLA down-projections are
  replicated over tp (every tp rank computes them on all tokens).
- Routed experts: with balanced (forced) routing one rank receives ``tokens/tp · topk · etp``
  token-expert pairs, spread over ``num_experts / ep`` local experts (a grouped GEMM). The
  all-to-all dispatchers permute the rank's own ``tokens/tp · topk`` copies before sending them;
  the allgather dispatcher selects its pairs from the tokens gathered over etp·ep and scatter-adds
  the outputs into a zeroed buffer of all those tokens.
- Backward = data-gradient GEMM + weight-gradient GEMM (each as many FLOPs as the forward GEMM);
  the flash-attention backward does 2.5x the forward FLOPs (it recomputes QKᵀ: five matmuls vs two).
- Recompute adds forward operations to the backward pass: ``full`` replays the whole layer,
  ``selective`` replays the operations whose module is listed (``core_attn``, ``layernorm``,
  ``mlp``, ``moe``, ``moe_act``, ``mla_up_proj``, ``shared_experts``).
- Building blocks follow the model (:mod:`workloads.models`): a gated activation (SwiGLU) reads gate
  and up (``2F``) and writes ``F``, a non-gated one (GELU, squared ReLU) reads and writes ``F``;
  LayerNorm writes one more fp32 statistic per token (the mean) than RMSNorm and reads it back in
  backward; RoPE is applied only with ``position_embedding: rope`` (MLA always ropes its positional
  part, as Megatron-Core's MLA builds its own rotary embedding); a learned absolute position
  table is read and added in the embedding. Linear biases are added in the GEMM epilogue
  (Transformer Engine fuses them), so they add no kernel and no traffic here.
- Low-precision GEMMs (FP8 current, delayed or blockwise scaling, MXFP8, NVFP4) pay quantisation
  casts as memory traffic (FP16 GEMMs run like BF16 ones, without casts):
  the GEMM input activations (forward), the output gradients (backward) and the weights (once per
  step: TE caches the cast weights across micro-batches, so 1 / micro-batches per micro-batch).
  Attention, the router, the output layer (logits) and the Newton-Schulz matmuls stay BF16.

Kernels: each operation also says how many kernels it launches (``Operation.kernels``, per
micro-batch; ``costmodel.kernels`` prices the launches). The counts follow what Megatron-Core 0.16
and Transformer Engine run; where the count is our reading of code we could not profile it is
marked an assumption:

- GEMM: one cuBLAS call each for forward, dgrad and wgrad (the wgrad accumulates into
  ``main_grad`` in the same call); a grouped expert GEMM (TE ``GroupedLinear``) runs one GEMM per
  local expert (``general_grouped_gemm``).
- Casts (low precision): one quantize kernel per GEMM input (per expert split for grouped GEMMs),
  per output gradient, and per weight once per step (amortised over the micro-batches); FP8
  current scaling adds an amax pass: 2 kernels per cast (``CAST_KERNELS``).
- Norm: 1 forward kernel, 2 backward (TE's dgrad kernel and the weight-gradient finalize).
- RoPE: fused, applied to Q and K separately: 2 forward, 2 backward.
- Attention core: flash attention, 1 forward kernel; 3 backward (FlashAttention-2's dO·O
  preprocessing, the dQ/dK/dV kernel, the dQ conversion).
- Fused element-wise (bias-dropout-add, bias-SwiGLU): 1 forward, 1 backward.
- MoE (unfused paths, Megatron-Core's defaults; assumption from a reading of ``router.py`` and
  ``moe_utils.py``): router top-k with score function, scatter, normalisation and aux-loss
  statistics 8 forward / 4 backward; dispatch preprocessing (tokens per expert, permutation
  indices) 4 forward; permute (int8 transpose, argsort, index_select of tokens and probs) 5 / 2;
  unpermute (scale by probs, scatter-add) 3 / 3.
- Embedding lookup 1 / 3 (dense embedding backward: sort and segment reduction); vocabulary-parallel
  cross-entropy, unfused, 6 / 3 (assumption).

Recipe settings that change the kernels (:class:`KernelOptions`, from the scenario's runtime
settings; each our reading of Megatron-Core / Transformer Engine, marked assumption where not profiled):

- ``moe_router_fusion``: TE's fused top-k with score function and the fused aux-loss scores and
  loss: 3 forward / 3 backward launches instead of 8 / 4 (same bytes);
- ``moe_permute_fusion``: TE ``moe_permute_with_probs`` / ``moe_unpermute``: permute 2 / 1 (row-id
  map, permute) and unpermute 1 / 1 instead of 5 / 2 and 3 / 3 (same bytes);
- ``moe_router_dtype`` fp32 (or fp64): Megatron's ``RouterGatingLinearFunction`` casts the input and
  the router weight to fp32 and calls ``torch.mm``; PyTorch's default float32 matmul precision is
  'highest' (no TF32), so the router GEMM runs on the FP32 (non-tensor) peak, plus the cast of its
  input (read 2 B, write 4 B per element); fp64 is priced as fp32 (optimistic);
- ``moe_grouped_gemm`` off: one dense GEMM per local expert (dense efficiency, no grouped factor),
  and (Megatron's SequentialMLP) one activation per local expert and a concatenation of their outputs;
- ``gradient_accumulation_fusion`` off: each weight-gradient GEMM writes a BF16 gradient and a
  separate kernel adds it into the fp32 ``main_grad`` (read 2 + read 4 + write 4 B per weight element;
  one launch per GEMM, per expert for grouped GEMMs). Under Megatron-FSDP with sharded gradients
  (``KernelOptions.sharded_grad_copy``) the gradient is copied into the reduce-scatter bucket instead
  and the reduced shard added locally (:meth:`_Builder.grad_accumulate_bytes`, :mod:`costmodel.fsdp`);
- linear biases (``add_bias_linear``) are never fused: Megatron DDP's backward hook adds each bias
  gradient into its ``main_grad`` (one kernel per bias per micro-batch, same bytes per element);
  the same add for norm weights, the router and the embedding tables is not counted (a few small
  kernels per layer, kept out so the catalogue's kernel counts stay as pinned);
- unfused attention (``attention_backend`` unfused or local, or Megatron's local layers): 8 / 10
  kernels on the materialised score matrix (``UNFUSED_ATTENTION_*``);
- ``cross_entropy_loss_fusion`` on: TE's fused vocabulary-parallel cross-entropy, 2 forward /
  1 backward launches instead of 6 / 3 (same bytes);
- a dispatcher that needs the token counts on the host (``alltoall``, ``flex`` with DeepEP; Megatron's
  ``cuda_sync_point`` before the all-to-all) marks the permute as a host synchronisation: the host
  cannot run ahead of the GPU across it (:func:`costmodel.layer_costs.pass_time_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from topologies.hardware import TENSOR_CORE_CLASS
from workloads.models import GqaAttention, MlaAttention, ModelSpec

OpKind = Literal["gemm", "grouped_gemm", "attention", "elementwise", "quantize"]
Phase = Literal["fwd", "bwd"]

ACT_BYTES = 2  # BF16 activations
FP32_BYTES = 4
ATTENTION_BWD_FLOPS_RATIO = 2.5  # FlashAttention backward: 5 matmuls (QKᵀ recomputed) vs 2 forward
MAIN_GRAD_ADD_BYTES = 10  # main_grad.add_(grad): read bf16 grad 2 + read fp32 main grad 4 + write 4
# Unfused attention (TE UnfusedDotProductAttention / Megatron local DotProductAttention), forward:
# q, k, v layout copies (3), baddbmm QKᵀ, fused scale-mask-softmax, dropout, bmm PV, output permute
# copy = 8 kernels; backward: the output copy, 2 bmm (dP, dV), dropout and softmax backward, 2 bmm
# (dQ, dK), 3 layout copies = 10 (our reading of the code: an assumption). Bytes per score element
# (bf16): forward baddbmm write 2, softmax read + write 4, dropout read + write + mask 5, bmm read 2
# = 13; backward dP write 2, dropout read + mask + write 5, softmax read probs + grad + write 6,
# dQ/dK bmm reads 4 = 17.
UNFUSED_ATTENTION_KERNELS = (8, 10)
UNFUSED_ATTENTION_BYTES = (13.0, 17.0)
# bytes moved per element cast (read BF16 + write the quantised copies incl. scales):
# fp8-cs: amax pass (read 2) + cast (read 2) + rowwise and transposed FP8 copies (1 + 1);
# mxfp8: read 2 + rowwise and columnwise copies with an E8M0 scale per 32 (2 x (1 + 1/32));
# nvfp4: read 2 + two FP4 copies with an E4M3 scale per 16 (2 x (0.5 + 1/16)).
# fp8-delayed: the scale comes from the amax history, so one fused cast-transpose pass reads 2 and
# writes both FP8 copies (1 + 1), recording the amax on the way (TE's delayed-scaling recipe);
# fp8-blockwise: the block amax is taken in registers, read 2 + two FP8 copies with an fp32 scale
# per 128 elements (2 x (1 + 4/128)); fp16 GEMMs need no cast (assumption: sized as the others).
CAST_BYTES_PER_ELEMENT = {"bf16": 0.0, "fp16": 0.0, "fp8-cs": 6.0, "fp8-delayed": 4.0,
                          "fp8-blockwise": 2 + 2 * (1 + 4 / 128), "mxfp8": 2 + 2 * (1 + 1 / 32),
                          "nvfp4": 2 + 2 * (0.5 + 1 / 16)}
# launches per cast (fp8-cs: amax pass + cast; delayed and blockwise scaling: one fused pass)
CAST_KERNELS = {"bf16": 0, "fp16": 0, "fp8-cs": 2, "fp8-delayed": 1, "fp8-blockwise": 1, "mxfp8": 1, "nvfp4": 1}
TENSOR_CLASS = TENSOR_CORE_CLASS


@dataclass(frozen=True)
class Operation:
    """One operation of one rank for one micro-batch (FLOPs, HBM bytes; GEMM shape M x N x K) and the
    number of kernels it launches (``kernels``; they share the FLOPs and bytes)."""

    name: str
    kind: OpKind
    phase: Phase
    module: str
    flops: float = 0.0
    bytes: float = 0.0
    tensor_class: str = "bf16"  # bf16, fp8 or fp4 for tensor-core work
    m: int = 0
    n: int = 0
    k: int = 0
    groups: int = 1  # grouped GEMM: number of experts sharing the total M
    kernels: float = 1.0  # kernel launches per micro-batch (fractional when amortised over micro-batches)
    host_sync: bool = False  # the host waits for the GPU before issuing this operation (D2H of token counts)
    # a cast including weights cast once per step: (input elements, weight elements, launches per
    # micro-batch before the weights', bytes per element); see :func:`weight_cast_operation`.
    # Not compared: it only records how ``bytes`` and ``kernels`` were derived.
    weight_cast: tuple[int, int, int, float] | None = field(default=None, compare=False, repr=False)


def weight_cast_operation(name: str, module: str, cast: tuple[int, int, int, float], microbatches: int,
                          phase: Phase = "fwd") -> Operation:
    """The quantisation cast of a GEMM's input and weights for one micro-batch: ``cast`` is (input
    elements, weight elements, launches per micro-batch, bytes per element). The weights are cast
    once per step (TE caches them across micro-batches), so each micro-batch moves
    ``(input + weights / micro-batches) x bytes per element`` in ``launches x (1 + 1 / micro-batches)``
    kernels. The one place of the formula: the layer caches re-price only these operations when
    the micro-batch count changes (:mod:`costmodel.layer_template`)."""
    act, weights, casts, bytes_per_element = cast
    per_step = 1 / max(microbatches, 1)
    return Operation(name, "quantize", phase, module, 0.0, (act + weights * per_step) * bytes_per_element,
                     kernels=casts * (1 + per_step), weight_cast=cast)


def recast_operation(op: Operation, microbatches: int) -> Operation:
    """``op`` (a weight cast, :func:`weight_cast_operation`, or its recomputed copy) for a step of
    ``microbatches`` micro-batches; any other operation unchanged."""
    if op.weight_cast is None:
        return op
    return weight_cast_operation(op.name, op.module, op.weight_cast, microbatches, op.phase)


@dataclass(frozen=True)
class KernelOptions:
    """Recipe settings that change a layer's kernels (see the module docstring)."""

    router_fusion: bool = True
    permute_fusion: bool = True
    router_dtype: str = "bf16"  # bf16 (the activation dtype), fp32 or fp64
    grouped_gemm: bool = True
    gradient_accumulation_fusion: bool = True
    cross_entropy_fusion: bool = True
    dispatcher_host_sync: bool = False
    unfused_attention: bool = False  # attention core as separate batched GEMMs, softmax and dropout
    local_spec: bool = False  # Megatron's local transformer spec (--transformer-impl local), not TE's
    # Megatron-FSDP with sharded gradients (optim_grads, optim_grads_params): a gradient that arrives in
    # param.grad is copied into the reduce-scatter bucket and the reduced shard added locally
    sharded_grad_copy: bool = False
    grad_bytes: int = 4  # bytes per element of the gradient bucket (grad_reduce_dtype: 4 fp32, 2 bf16)
    grad_shard: int = 1  # FSDP group size of dense parameters (dp·cp)
    expert_grad_shard: int = 1  # FSDP group size of routed-expert parameters (expert data-parallel)


@dataclass(frozen=True)
class RankShape:
    """What one rank sees of one micro-batch (see the module docstring)."""

    micro_batch_size: int
    seq_length: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    precision: str = "bf16"  # Precision value: bf16, fp16, fp8-cs, fp8-delayed, fp8-blockwise, mxfp8, nvfp4
    microbatches: int = 1  # micro-batches per step (weight casts are amortised over them)
    moe_dispatcher: str = "flex"  # allgather permutes the tokens gathered over etp·ep (costmodel.moe_dispatch)
    options: KernelOptions = KernelOptions()

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch in this rank's CP shard (gathered over tp)."""
        return self.micro_batch_size * self.seq_length // self.cp

    @property
    def sp_tokens(self) -> int:
        """Tokens of the sequence-parallel regions (sharded over tp when sp is on)."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @cached_property
    def without_experts(self) -> RankShape:
        """This shape with ep, etp and the dispatcher reset: what a layer without an MoE block (or the
        parts of a MoE layer outside its routed experts) reads; one object per shape object."""
        return replace(self, ep=1, etp=1, moe_dispatcher="flex")

    @cached_property
    def one_microbatch(self) -> RankShape:
        """This shape in a step of one micro-batch (one object per shape object)."""
        return replace(self, microbatches=1)


@dataclass(frozen=True)
class LayerOps:
    """Forward and backward operations of one transformer layer (or block) for one micro-batch."""

    forward: tuple[Operation, ...]
    backward: tuple[Operation, ...]
    local_spec: bool = False  # built from Megatron's local spec (KernelOptions.local_spec): its framework host time

    def __hash__(self) -> int:
        """The dataclass's hash of (forward, backward), computed once per object: the layer caches
        (``functools.lru_cache`` on the operations) look a layer's operations up several times, and
        hashing ~100 operations each time was a good part of the planner's pipeline bounds."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.forward, self.backward, self.local_spec))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the cached hash (string hashes differ between processes)."""
        return {"forward": self.forward, "backward": self.backward, "local_spec": self.local_spec}

    @property
    def forward_flops(self) -> float:
        """FLOPs of the forward operations."""
        return sum(o.flops for o in self.forward)

    @property
    def backward_flops(self) -> float:
        """FLOPs of the backward operations (including recomputed forward work)."""
        return sum(o.flops for o in self.backward)


class _Builder:
    """Collects forward operations and derives their backward counterparts."""

    def __init__(self, shape: RankShape, hidden: int, layernorm: bool = False, bias: bool = False) -> None:
        self.shape = shape
        self.hidden = hidden
        self.layernorm = layernorm
        self.bias = bias  # linear layers carry biases (their gradients go through the DDP hook)
        self.fwd: list[Operation] = []
        self.bwd: list[Operation] = []
        self.low = TENSOR_CLASS[shape.precision] != "bf16"  # fp16 GEMMs run like bf16 ones
        self.cast = CAST_BYTES_PER_ELEMENT[shape.precision]

    def gemm(self, name: str, module: str, m: int, n: int, k: int, low_precision: bool = True,
             groups: int = 1, tensor_class: str | None = None, bias: bool = True) -> None:
        """A (grouped) GEMM [m x k] @ [k x n]: forward, dgrad and wgrad, plus quantisation casts, the
        weight gradient's accumulation without gradient-accumulation fusion, and the bias gradient's
        (DDP hook)."""
        low = low_precision and self.low
        tclass = (TENSOR_CLASS[self.shape.precision] if low else "bf16") if tensor_class is None else tensor_class
        kind: OpKind = "grouped_gemm" if groups > 1 and self.shape.options.grouped_gemm else "gemm"
        flops = 2.0 * m * n * k
        in_b = 1 if low else ACT_BYTES
        io = (m * k + k * n * groups) * in_b + m * n * ACT_BYTES
        self.fwd.append(Operation(name, kind, "fwd", module, flops, io, tclass, m, n, k, groups, groups))
        self.bwd.append(Operation(name + ".dgrad", kind, "bwd", module, flops, io, tclass, m, k, n, groups, groups))
        self.bwd.append(Operation(name + ".wgrad", kind, "bwd", module, flops, io, tclass, k * groups, n, m, groups,
                                  groups))
        if not self.shape.options.gradient_accumulation_fusion:  # bf16 wgrad, then into main_grad
            self.bwd.append(Operation(name + ".grad_accumulate", "elementwise", "bwd", module, 0.0,
                                      k * n * groups * self.grad_accumulate_bytes(module), kernels=groups))
        if low:
            casts = CAST_KERNELS[self.shape.precision] * groups
            self.fwd.append(weight_cast_operation(name + ".cast", module, (m * k, k * n * groups, casts, self.cast),
                                                  self.shape.microbatches))
            self.bwd.append(Operation(name + ".cast_grad", "quantize", "bwd", module, 0.0, m * n * self.cast,
                                      kernels=casts))
        if bias and self.bias:
            self.grad_add(name + ".bias_grad_add", module, n * groups, groups)

    def grad_accumulate_bytes(self, module: str) -> float:
        """HBM bytes per weight element of one weight gradient's trip into ``main_grad`` without
        gradient-accumulation fusion (module docstring): DDP / unsharded ``main_grad.add_(grad)``
        ``MAIN_GRAD_ADD_BYTES``; Megatron-FSDP with sharded gradients a copy into the bucket (read 2 B,
        write the bucket's dtype) plus the add of the reduced shard into the local shard (3 x the
        bucket's dtype over the FSDP group size)."""
        o = self.shape.options
        if not o.sharded_grad_copy:
            return MAIN_GRAD_ADD_BYTES
        shard = o.expert_grad_shard if module == "moe" else o.grad_shard
        return ACT_BYTES + o.grad_bytes + 3.0 * o.grad_bytes / max(shard, 1)

    def grad_add(self, name: str, module: str, numel: float, kernels: float = 1.0) -> None:
        """Megatron DDP's backward hook for a parameter whose gradient arrives in ``param.grad``:
        ``main_grad.add_(grad)``, one kernel per parameter per micro-batch reading the bf16 gradient
        and the fp32 main gradient and writing it back (``MAIN_GRAD_ADD_BYTES`` per element; under
        Megatron-FSDP with sharded gradients the copy into the bucket, :meth:`grad_accumulate_bytes`)."""
        self.bwd.append(Operation(name, "elementwise", "bwd", module, 0.0, numel * self.grad_accumulate_bytes(module),
                                  kernels=kernels))

    def elementwise(self, name: str, module: str, fwd_bytes: float, bwd_factor: float = 2.0,
                    kernels: tuple[float, float] = (1.0, 1.0)) -> None:
        """Memory-bound work moving ``fwd_bytes`` forward and ``bwd_factor`` times that backward, in
        ``kernels`` (forward, backward) launches."""
        self.fwd.append(Operation(name, "elementwise", "fwd", module, 0.0, fwd_bytes, kernels=kernels[0]))
        self.bwd.append(Operation(name + ".grad", "elementwise", "bwd", module, 0.0, fwd_bytes * bwd_factor,
                                  kernels=kernels[1]))

    def attention(self, name: str, fwd_flops: float, io_bytes: float, scores: float = 0.0) -> None:
        """The attention core (QKᵀ, softmax, PV) in BF16: one fused kernel (flash / cuDNN), or, with
        ``shape.options.unfused_attention``, the unfused path on the ``scores`` (b·heads·s_q·s_k) matrix
        (``UNFUSED_ATTENTION_*``: the full square, twice the causal FLOPs)."""
        if not self.shape.options.unfused_attention:
            self.fwd.append(Operation(name, "attention", "fwd", "core_attn", fwd_flops, io_bytes))
            self.bwd.append(Operation(name + ".grad", "attention", "bwd", "core_attn",
                                      fwd_flops * ATTENTION_BWD_FLOPS_RATIO, 2 * io_bytes, kernels=3))
            return
        f_kernels, b_kernels = UNFUSED_ATTENTION_KERNELS
        self.fwd.append(Operation(name, "attention", "fwd", "core_attn", 2 * fwd_flops,
                                  io_bytes + UNFUSED_ATTENTION_BYTES[0] * scores, kernels=f_kernels))
        self.bwd.append(Operation(name + ".grad", "attention", "bwd", "core_attn", 4 * fwd_flops,
                                  2 * io_bytes + UNFUSED_ATTENTION_BYTES[1] * scores, kernels=b_kernels))

    def norm(self, name: str, tokens: int, width: int) -> None:
        """The model's norm over ``tokens`` x ``width`` BF16 values: read + write, plus LayerNorm's
        fp32 mean per token (RMSNorm keeps only the reciprocal RMS, counted in neither)."""
        stats = tokens * FP32_BYTES if self.layernorm else 0.0
        self.elementwise(name, "layernorm", 2.0 * tokens * width * ACT_BYTES + stats, kernels=(1, 2))

    def extend(self, ops: tuple[tuple[Operation, ...], tuple[Operation, ...]]) -> None:
        """Append (forward, backward) operations built elsewhere (:func:`_part_ops`)."""
        self.fwd.extend(ops[0])
        self.bwd.extend(ops[1])

    def build(self, recompute: str, modules: tuple[str, ...]) -> LayerOps:
        """The layer's operations, with recomputed forward work prepended to the backward."""
        replay: list[Operation] = []
        if recompute == "full":
            replay = list(self.fwd)
        elif recompute == "selective":
            replay = [o for o in self.fwd if o.module in modules]
        extra = tuple(Operation("recompute." + o.name, o.kind, "bwd", o.module, o.flops, o.bytes, o.tensor_class,
                                o.m, o.n, o.k, o.groups, o.kernels, weight_cast=o.weight_cast) for o in replay)
        return LayerOps(forward=tuple(self.fwd), backward=extra + tuple(self.bwd),
                        local_spec=self.shape.options.local_spec)


def _attention_block(b: _Builder, model: ModelSpec) -> None:
    s = b.shape
    t, tsp, tp, h = s.tokens, s.sp_tokens, s.tp, model.hidden_size
    att = model.attention
    b.norm("input_layernorm", tsp, h)
    avg_kv = s.seq_length / 2  # causal, load-balanced over cp: each query sees seq/2 keys on average
    if isinstance(att, GqaAttention):
        nh, nkv, d = att.num_heads // tp, att.num_kv_heads // tp, att.head_dim
        b.gemm("linear_qkv", "attn_proj", t, (nh + 2 * nkv) * d, h)
        if model.position_embedding == "rope":
            b.elementwise("rope", "attn_proj", 2.0 * t * (nh + nkv) * d * ACT_BYTES, kernels=(2, 2))
        core = 2.0 * 2.0 * t * avg_kv * nh * d
        io = t * (2 * nh + 2 * nkv) * d * ACT_BYTES
        b.attention("core_attention", core, io, scores=float(t) * nh * s.seq_length)
        b.gemm("linear_proj", "attn_proj", t, h, nh * d)
    else:
        assert isinstance(att, MlaAttention)
        nh = att.num_heads // tp
        dqk = att.qk_head_dim + att.qk_pos_emb_head_dim
        if att.q_lora_rank:
            b.gemm("linear_q_down_proj", "attn_proj", t, att.q_lora_rank, h)
            if att.latent_norm:
                b.norm("q_layernorm", t, att.q_lora_rank)
            b.gemm("linear_q_up_proj", "mla_up_proj", t, nh * dqk, att.q_lora_rank)
        else:
            b.gemm("linear_q_proj", "attn_proj", t, nh * dqk, h)
        b.gemm("linear_kv_down_proj", "attn_proj", t, att.kv_lora_rank + att.qk_pos_emb_head_dim, h)
        if att.latent_norm:
            b.norm("kv_layernorm", t, att.kv_lora_rank)
        b.gemm("linear_kv_up_proj", "mla_up_proj", t, nh * (att.qk_head_dim + att.v_head_dim), att.kv_lora_rank)
        b.elementwise("rope", "mla_up_proj", 2.0 * t * nh * att.qk_pos_emb_head_dim * 2 * ACT_BYTES, kernels=(2, 2))
        core = 2.0 * t * avg_kv * nh * (dqk + att.v_head_dim)
        io = t * nh * (2 * dqk + 2 * att.v_head_dim) * ACT_BYTES
        b.attention("core_attention", core, io, scores=float(t) * nh * s.seq_length)
        b.gemm("linear_proj", "attn_proj", t, h, nh * att.v_head_dim)
    b.elementwise("residual_add", "attn_proj", 3.0 * tsp * h * ACT_BYTES)


def _activation(b: _Builder, model: ModelSpec, name: str, module: str, tokens: int, width: int,
                calls: int = 1) -> None:
    """The MLP activation on ``width`` output features.

    Gated (SwiGLU): read gate and up (2·width), write width; backward reads dy, gate and up and
    writes both gradients (5·width). Not gated (GELU, squared ReLU): read and write width; backward
    reads dy and x, writes dx (3·width).
    """
    kernels = (float(calls), float(calls))  # one fused kernel per call (SequentialMLP: one per expert)
    if model.gated_mlp:
        b.elementwise(f"{name}.swiglu", module, 3.0 * tokens * width * ACT_BYTES, bwd_factor=5.0 / 3.0, kernels=kernels)
    else:
        b.elementwise(f"{name}.{model.activation}", module, 2.0 * tokens * width * ACT_BYTES, bwd_factor=1.5,
                      kernels=kernels)


def _dense_mlp(b: _Builder, model: ModelSpec, ffn: int, module: str, name: str) -> None:
    s = b.shape
    f = ffn // s.tp
    b.gemm(f"{name}.linear_fc1", module, s.tokens, model.fc1_factor * f, b.hidden)
    _activation(b, model, name, module, s.tokens, f)
    b.gemm(f"{name}.linear_fc2", module, s.tokens, b.hidden, f)


def _builder(model: ModelSpec, shape: RankShape) -> _Builder:
    return _Builder(shape, model.hidden_size, layernorm=model.normalization == "layernorm", bias=model.add_bias_linear)

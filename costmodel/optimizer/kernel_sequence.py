"""The optimizer step as a kernel sequence, per tensor, following the code that runs.

Megatron-Core 0.16.1 with Emerging-Optimizers (EO) 0.3.0 and Transformer Engine. Bytes are HBM
bytes per launch (fp32 master weights, momentum and Adam moments; bf16 model parameters; main
gradients of ``grad_bytes``); :class:`costmodel.kernels.KernelSpec` prices them.

**Muon, per parameter** (:func:`muon_tensor_kernels`; EO ``OrthogonalizedOptimizer.step``, called
by MCore's ``TensorParallelMuon`` inside ``Float16OptimizerWithFloat16Params``):

1. ``_copy_model_grads_to_main_grads``: ``main_grad.float()``, a cast only when the main gradient
   is bf16 (a no-op for fp32 grads);
2. weight decay ``p.add_(p, alpha=-wd·lr)`` (``mixin.py``, decoupled; MCore default wd 0.01);
3. momentum ``momentum_buffer.lerp_(grad, 1 − β)``; Nesterov ``grad.lerp(momentum, β)`` only when
   ``muon_use_nesterov`` (MCore default off: the update then reads the buffer itself);
4. ``TensorParallelMuon.orthogonalize``: a fused QKV is split (one ``reshape`` copy per Q/K/V
   component) and concatenated back (one ``cat``); per component ``scaled_orthogonalize_fn``:
   ``newton_schulz_tp`` → ``newton_schulz`` (``muon_utils.py``):
   * local (tp 1, replicated weights, or ``blockwise``): ``F.normalize`` over the matrix = norm,
     ``clamp_min``, divide (3 kernels); under bf16 matmuls (``fp32_matmul_prec`` 'medium') a cast
     to bf16; per iteration ``A = X @ X.mT``, ``B = addmm(A, A, A)``, ``X = addmm(X, B, X)``
     (3 GEMMs; SYRK replaces the first two where EO ≥ 0.4 has it), each out-of-place ``addmm``
     first copying its ``self`` into the new output (1 copy kernel each,
     :func:`costmodel.optimizer.newton_schulz.addmm_copies`); a cast back to fp32;
   * ``duplicated``: ``all_gather`` into a list (NCCL gathers into a flat buffer, PyTorch copies
     each of the tp shards out), ``torch.cat`` of the shards, then the local path on the full matrix;
   * ``distributed``: ``distributed_normalize_p2`` = ``x*x``, ``sum``, all-reduce, ``sqrt``,
     ``clamp_min``, divide (5 kernels); then per iteration the local Gram, its all-reduce and the
     two ``addmm`` (3 GEMMs, 2 copies); casts as above;
   then ``orth_grad * scale_factor * extra_scale_factor`` (2 kernels);
5. ``p.add_(orth_grad, alpha=-lr)``;
6. ``_copy_main_params_to_model_params``: with bf16 there is no overflow buffer, so
   ``_multi_tensor_copy_this_to_that`` falls back to one ``copy_`` per parameter (fp32 → bf16).

**AdamW** (TE ``FusedAdam`` under MCore's ``DistributedOptimizer``, or under the layer-wise
optimizer for Muon's non-matrix parameters): one ``multi_tensor_apply`` over all local shards (depth
4: grad, param, exp_avg, exp_avg_sq, 28 bytes per element), chunked launches
(:func:`multi_tensor_launches`); plus one ``copy_`` per local shard piece (main → model parameter,
``DistributedOptimizer._copy_main_params_to_model_params``) and, for bf16 main gradients, one cast
per piece (``_copy_model_grads_to_main_grads``).

**Both**: the gradient-norm pass for clipping (``clip_grads.get_grad_norm_fp32``): one
``multi_tensor_l2norm`` over every local main gradient (depth 1), its cleanup kernel, ``norm ** 2``,
the all-reduce and ``.item()`` (a device-to-host copy and a host synchronisation: the optimizer's
kernels are then issued to an idle GPU). Clipping itself (``multi_tensor_scale``) runs only when the
norm exceeds ``clip_grad`` and is not counted. Gradient pre-scaling (``grad_data *= 1/dp`` per
bucket, ``param_and_grad_buffer.start_grad_sync``) runs during the backward pass with the bucket's
reduction: one kernel per bucket (:func:`grad_prescale_kernels`), not in the optimizer step.

The legacy layer-wise layout (MCore 0.16.1 ``LayerWiseDistributedOptimizer.allgather_params``)
flattens the owned parameters (one ``cat``) and, after the gather, copies every parameter it does
not own back into the model (one ``copy_`` each): :func:`gather_copy_kernels`.

The reference backend runs AdamW as plain torch operations per bucket shard
(:func:`eager_adam_kernels`, 8 kernels) and has no gradient-norm pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.kernels import KernelSpec
from costmodel.optimizer.newton_schulz import (
    MATMUL_CLASS,
    NsSettings,
    NsWork,
    addmm_copies,
    full_ns_gemms,
)
from workloads.comm import DTYPE_BYTES
from workloads.inventory import TensorSpec

# apex / TE multi_tensor_apply.cuh: chunk of 2048·32 elements, at most 320 blocks and, per depth
# (tensor lists), 110 / 64 / 48 / 36 / 30 tensors per launch
MT_CHUNK_ELEMENTS = 65536
MT_MAX_BLOCKS = 320
MT_MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
ADAM_BYTES_PER_ELEMENT = 28  # fused Adam: read grad 4, read+write param, exp_avg, exp_avg_sq 24
COPY_BYTES_PER_ELEMENT = 6  # fp32 main -> bf16 model parameter: read 4 + write 2
GRAD_CAST_BYTES_PER_ELEMENT = 6  # bf16 main_grad -> fp32: read 2 + write 4
NORM_BYTES_PER_ELEMENT = 4  # l2 norm reads the fp32 main gradient
EAGER_ADAM = (("weight_decay", 8), ("exp_avg_lerp", 12), ("exp_avg_sq_mul", 8), ("exp_avg_sq_addcmul", 12),
              ("sqrt", 8), ("bias_correction_div", 8), ("eps_add", 8), ("addcdiv", 16))
GRAD_NORM_EXTRA = 3  # l2norm cleanup, norm ** 2, .item() device-to-host copy
SCALAR_BYTES = 8.0


@dataclass(frozen=True)
class AdamBytes:
    """HBM bytes per element of one rank's AdamW step, by kernel, for an ``OptimizerSpec``.

    Megatron's distributed optimizer (default): fused Adam reads the fp32 main gradient and reads
    and writes the fp32 master, ``exp_avg`` and ``exp_avg_sq`` (28 B); per shard piece a main ->
    model copy (read 4 + write 2) and, for non-fp32 gradient buffers, the fp32 cast of the gradient
    shard (read 2 + write 4). Precision-aware optimizer (``use_precision_aware_optimizer``, TE
    ``FusedAdam`` with master weights; our reading of Megatron-Core, an assumption): one kernel reads
    the main gradient and reads and writes the master and both moments in their dtypes
    (``main_params_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype``) and writes the bf16 model
    parameter itself (2 B, no copy kernel); the gradient is cast only when ``main_grads_dtype`` is not
    the gradient buffer's dtype (read the buffer + write the main gradient).
    """

    fused: float  # per element of the fused multi-tensor kernel
    piece_kernels: tuple[float, ...]  # bytes per element of each per-shard-piece kernel (copy, cast)

    @classmethod
    def of(cls, spec) -> AdamBytes:  # noqa: ANN001 - workloads.scenario.OptimizerSpec
        """The bytes of ``spec``'s AdamW step (see the class docstring)."""
        g = spec.grad_bytes
        if not getattr(spec, "use_precision_aware_optimizer", False):
            cast = (float(GRAD_CAST_BYTES_PER_ELEMENT),) if g != 4 else ()
            return cls(float(ADAM_BYTES_PER_ELEMENT), (float(COPY_BYTES_PER_ELEMENT), *cast))
        mg = DTYPE_BYTES[spec.main_grads_dtype]
        state = DTYPE_BYTES[spec.main_params_dtype] + DTYPE_BYTES[spec.exp_avg_dtype] + DTYPE_BYTES[spec.exp_avg_sq_dtype]
        return cls(float(mg + 2 * state + 2), (float(g + mg),) if mg != g else ())

    @property
    def piece_bytes(self) -> float:
        """Bytes per element of all per-piece kernels together."""
        return float(sum(self.piece_kernels))


def multi_tensor_launches(tensors: np.ndarray | float, chunks: np.ndarray | float, depth: int) -> np.ndarray:
    """Launches of one ``multi_tensor_apply`` over ``tensors`` tensors of ``chunks`` chunks in all.

    A launch is issued when the block list (320 chunks) or the tensor list (``MT_MAX_TENSORS``)
    is full: ``max(⌈chunks / 320⌉, ⌈tensors / max tensors⌉)``, a lower bound of the loop that is
    exact when one of the two limits binds. Works elementwise on arrays (one entry per rank).
    """
    t = np.asarray(tensors, dtype=np.float64)
    c = np.asarray(chunks, dtype=np.float64)
    out = np.maximum(np.ceil(c / MT_MAX_BLOCKS), np.ceil(t / MT_MAX_TENSORS[depth]))
    return np.where(t > 0, out, 0.0)


def chunks_of(numel: np.ndarray | float) -> np.ndarray:
    """Multi-tensor chunks of tensors of ``numel`` elements (``⌈numel / 65536⌉`` each)."""
    return np.ceil(np.asarray(numel, dtype=np.float64) / MT_CHUNK_ELEMENTS)


def newton_schulz_call_kernels(rows: int, cols: int, st: NsSettings) -> tuple[KernelSpec, ...]:
    """Every kernel of one local ``newton_schulz`` call on a rows×cols fp32 matrix: normalisation,
    casts and the ``3·steps`` GEMMs (what ``calibrate --microbench`` times on this machine)."""
    gemms = [KernelSpec("ns_gemm", "ns_gemm", c, flops=f, tensor_class=MATMUL_CLASS[st.precision])
             for f, c in full_ns_gemms(rows, cols, st)]
    copies = addmm_copy_kernels(addmm_copies(min(rows, cols), max(rows, cols), st), st)
    return (*_local_ns("", rows, cols, st), *copies, *gemms)


def addmm_copy_kernels(copies: tuple[tuple[int, int], ...], st: NsSettings) -> list[KernelSpec]:
    """The copy kernels of the NS ``addmm`` calls (:func:`~costmodel.optimizer.newton_schulz.addmm_copies`):
    each reads and writes its elements once in the work dtype (bf16 under 'medium', else fp32)."""
    size = DTYPE_BYTES[st.gram_dtype]
    return [KernelSpec("ns_addmm_copy", "memory", count, bytes=2.0 * size * elements) for elements, count in copies]


# kernels of the Muon step outside the orthogonalisation (the reference backend times the rest as
# its ``newton_schulz`` phase)
OUTSIDE_ORTHOGONALIZE = frozenset({"main_grad_cast", "weight_decay", "momentum_lerp", "nesterov_lerp",
                                   "param_update", "main_to_model_copy"})


def orthogonalize_kernels(kernels: tuple[KernelSpec, ...]) -> tuple[KernelSpec, ...]:
    """The kernels of ``TensorParallelMuon.orthogonalize`` among a tensor's Muon kernels."""
    return tuple(k for k in kernels if k.name not in OUTSIDE_ORTHOGONALIZE)


def _ns_casts(prefix: str, numel: int, st: NsSettings) -> list[KernelSpec]:
    """The casts of a ``numel``-element fp32 matrix to the bf16 work dtype and back (none in fp32)."""
    if st.precision != "bf16":
        return []
    return [KernelSpec(f"{prefix}ns_cast_bf16", "memory", 1, bytes=6.0 * numel),
            KernelSpec(f"{prefix}ns_cast_fp32", "memory", 1, bytes=6.0 * numel)]


def _local_ns(prefix: str, rows: int, cols: int, st: NsSettings) -> list[KernelSpec]:
    """``newton_schulz`` on a whole rows×cols fp32 matrix, without its GEMMs: normalise (norm,
    clamp_min, divide) and the casts to and from the bf16 work dtype."""
    m = rows * cols
    out = [KernelSpec(f"{prefix}ns_norm", "memory", 1, bytes=4.0 * m),
           KernelSpec(f"{prefix}ns_clamp_min", "memory", 1, bytes=SCALAR_BYTES),
           KernelSpec(f"{prefix}ns_normalize", "memory", 1, bytes=8.0 * m)]
    return out + _ns_casts(prefix, m, st)


def _distributed_ns(prefix: str, local_numel: int, st: NsSettings) -> list[KernelSpec]:
    """``distributed_normalize_p2`` (x*x, sum, sqrt, clamp_min, divide) and the casts, on the local shard."""
    m = local_numel
    out = [KernelSpec(f"{prefix}ns_square", "memory", 1, bytes=8.0 * m),
           KernelSpec(f"{prefix}ns_sum", "memory", 1, bytes=4.0 * m),
           KernelSpec(f"{prefix}ns_sqrt", "memory", 1, bytes=SCALAR_BYTES),
           KernelSpec(f"{prefix}ns_clamp_min", "memory", 1, bytes=SCALAR_BYTES),
           KernelSpec(f"{prefix}ns_normalize", "memory", 1, bytes=8.0 * m)]
    return out + _ns_casts(prefix, m, st)


def muon_tensor_kernels(tensor: TensorSpec, work: NsWork, st: NsSettings, grad_bytes: int = 4,
                        nesterov: bool = False, weight_decay: bool = True) -> tuple[KernelSpec, ...]:
    """Kernels of one Muon step of one copy of ``tensor`` on one rank (see the module docstring).

    ``work`` is the tensor's :func:`costmodel.optimizer.newton_schulz.tensor_ns_work` (its GEMMs
    become ``ns_gemm`` kernels); ``grad_bytes`` the main-gradient element size.
    """
    n = tensor.local_numel
    k: list[KernelSpec] = []
    if grad_bytes != 4:
        k.append(KernelSpec("main_grad_cast", "memory", 1, bytes=float(GRAD_CAST_BYTES_PER_ELEMENT * n)))
    if weight_decay:
        k.append(KernelSpec("weight_decay", "memory", 1, bytes=8.0 * n))
    k.append(KernelSpec("momentum_lerp", "memory", 1, bytes=12.0 * n))
    if nesterov:
        k.append(KernelSpec("nesterov_lerp", "memory", 1, bytes=12.0 * n))
    comps, locs = tensor.muon_components, tensor.local_muon_components
    split = len(comps) > 1
    sharded = tensor.shard_dim is not None and tensor.shards > 1
    mode = st.tp_mode if sharded else "local"
    for i, ((rows, cols), (lrows, lcols)) in enumerate(zip(comps, locs, strict=True)):
        local = lrows * lcols
        prefix = f"qkv{i}." if split else ""
        if split:
            k.append(KernelSpec(f"{prefix}qkv_split_copy", "memory", 1, bytes=8.0 * local))
        if mode in ("local", "blockwise"):
            k += _local_ns(prefix, lrows, lcols, st)
        elif mode == "duplicated":
            k.append(KernelSpec(f"{prefix}all_gather_copy_out", "memory", tensor.shards, bytes=8.0 * local))
            k.append(KernelSpec(f"{prefix}all_gather_cat", "memory", 1, bytes=8.0 * rows * cols))
            k += _local_ns(prefix, rows, cols, st)
        elif mode == "distributed":
            k += _distributed_ns(prefix, local, st)
        else:
            raise ValueError(f"unknown tp_mode {st.tp_mode!r}")
        k.append(KernelSpec(f"{prefix}scale", "memory", 2, bytes=8.0 * local))
    if split:
        k.append(KernelSpec("qkv_cat", "memory", 1, bytes=8.0 * n))
    k += addmm_copy_kernels(work.addmm_copies, st)
    k += [KernelSpec("ns_gemm", "ns_gemm", c, flops=f, tensor_class=MATMUL_CLASS[st.precision]) for f, c in work.gemms]
    k.append(KernelSpec("param_update", "memory", 1, bytes=12.0 * n))
    k.append(KernelSpec("main_to_model_copy", "memory", 1, bytes=float(COPY_BYTES_PER_ELEMENT * n)))
    return tuple(k)


def kernel_count(kernels: tuple[KernelSpec, ...], kind: str | None = None) -> float:
    """Launches in ``kernels`` (of one ``kind`` only when given)."""
    return sum(x.count for x in kernels if kind is None or x.kind == kind)


def fused_adam_kernels(pieces: float, chunks: float, numel: float, grad_bytes: int = 4) -> tuple[KernelSpec, ...]:
    """TE ``FusedAdam`` over ``pieces`` local shard pieces (``chunks`` multi-tensor chunks, ``numel``
    elements), the main → model copies and, for bf16 main gradients, the gradient casts."""
    if pieces <= 0:
        return ()
    launches = float(multi_tensor_launches(pieces, chunks, 4))
    out = [KernelSpec("fused_adam", "memory", launches, bytes=ADAM_BYTES_PER_ELEMENT * numel / launches),
           KernelSpec("main_to_model_copy", "memory", pieces, bytes=COPY_BYTES_PER_ELEMENT * numel / pieces)]
    if grad_bytes != 4:
        out.append(KernelSpec("main_grad_cast", "memory", pieces, bytes=GRAD_CAST_BYTES_PER_ELEMENT * numel / pieces))
    return tuple(out)


def eager_adam_kernels(pieces: float, numel: float, grad_bytes: int = 4) -> tuple[KernelSpec, ...]:
    """The reference backend's AdamW: 8 torch operations per shard (``reference.muon_math.adamw_step``:
    decay, lerp, mul, addcmul, sqrt, divide, add eps, addcdiv), the bf16 copy and a gradient cast
    for bf16 gradients."""
    if pieces <= 0:
        return ()
    per = numel / pieces
    out = [KernelSpec(name, "memory", pieces, bytes=b * per) for name, b in EAGER_ADAM]
    out.append(KernelSpec("main_to_model_copy", "memory", pieces, bytes=COPY_BYTES_PER_ELEMENT * per))
    if grad_bytes != 4:
        out.append(KernelSpec("main_grad_cast", "memory", pieces, bytes=GRAD_CAST_BYTES_PER_ELEMENT * per))
    return tuple(out)


def grad_norm_kernels(pieces: float, chunks: float, numel: float) -> tuple[KernelSpec, ...]:
    """``get_grad_norm_fp32``: ``multi_tensor_l2norm`` over every local main gradient, then the
    cleanup, ``** 2`` and the ``.item()`` copy."""
    if pieces <= 0:
        return ()
    launches = float(multi_tensor_launches(pieces, chunks, 1))
    return (KernelSpec("l2norm", "memory", launches, bytes=NORM_BYTES_PER_ELEMENT * numel / launches),
            KernelSpec("l2norm_finish", "memory", GRAD_NORM_EXTRA, bytes=SCALAR_BYTES))


def gather_copy_kernels(copies: float, copy_numel: float, owned_numel: float) -> tuple[KernelSpec, ...]:
    """Legacy layer-wise gather: flatten the owned parameters (one cat, bf16 read+write) and copy
    each of the ``copies`` non-owned parameters (``copy_numel`` elements) back into the model."""
    out = [KernelSpec("gather_flatten", "memory", 1, bytes=4.0 * owned_numel)]
    if copies > 0:
        out.append(KernelSpec("gather_copy_back", "memory", copies, bytes=4.0 * copy_numel / copies))
    return tuple(out)


def grad_prescale_kernels(buckets: int, bucket_numel: float, grad_bytes: int = 4) -> tuple[KernelSpec, ...]:
    """``bucket.grad_data *= gradient_scaling_factor`` before each bucket's reduction (one kernel per
    bucket, read + write the whole bucket); runs with the backward pass, not in the optimizer step."""
    if buckets <= 0:
        return ()
    return (KernelSpec("grad_prescale", "memory", buckets, bytes=2.0 * grad_bytes * bucket_numel / buckets),)


def shard_chunks(pieces: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """Multi-tensor chunks of ``pieces`` shard pieces holding ``numel`` elements in all (per rank):
    ``⌈numel / 65536⌉ + pieces − 1``, exact when at most one piece of a shard spans more than a
    chunk boundary (pieces are whole parameters except at the shard's two ends)."""
    return np.where(pieces > 0, np.ceil(np.asarray(numel) / MT_CHUNK_ELEMENTS) + pieces - 1, 0.0)

"""Newton–Schulz work of one Muon matrix on one TP rank, per tensor-parallel mode (spec §2, §5).

A :class:`NsWork` lists the GEMMs one optimizer step runs for one copy of a tensor (each GEMM
size in FLOPs with how many times it runs), the elements the Newton–Schulz input/output casts
touch, and the TP collectives (byte-exact, :class:`workloads.comm.CollectiveCall`). It is
system-independent; :func:`ns_time_s` and :func:`tp_comm_time_s` turn it into seconds.

Per step on the working matrix ``X`` (``m×n``, ``m ≤ n`` after the transpose rule):
``A = X·Xᵀ`` (2m²n, SYRK m²n), ``B = bA + cA·A`` (2m³, SYRK m³, absent when c = 0, i.e. cubic5),
``X ← aX + B·X`` (2m²n). TP modes, with the full matrix oriented ``R×S`` so that S is sharded
(column-parallel ``[out/t, in]`` → R = in; row-parallel ``[out, in/t]`` → R = out):

* ``duplicated``: all-gather the fp32 momentum over tp (nccl size 4·R·S), full NS on every rank;
* ``distributed``: one fp32 scalar all-reduce (norm), then per step a local Gram ``R×R``
  (2R²S/t), an all-reduce of R² elements in the Gram dtype (bf16 under bf16 matmuls, fp32
  otherwise), ``B`` redundantly on every rank (2R³) and ``X_loc ← aX_loc + B·X_loc`` (2R²S/t);
* ``blockwise``: NS on the local shard only, no communication (a different, TP-dependent update).

Tensors replicated over their TP group (router, MLA down-projections) and groups of size 1 run
the full NS locally with no communication. With split QKV every component is its own NS call
with its own collectives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from costmodel.compute import newton_schulz_gemm_time_s
from costmodel.kernels import kernel_floor_s
from topologies.hardware import SystemSpec
from workloads.comm import DTYPE_BYTES, CollectiveCall
from workloads.flops import newton_schulz_flops
from workloads.inventory import TensorSpec

MATMUL_CLASS = {"bf16": "bf16", "tf32": "tf32", "fp32": "fp32"}


@dataclass(frozen=True)
class NsSettings:
    """The Newton–Schulz settings that change cost (hashable; from OptimizerSpec)."""

    steps: int
    cubic: bool  # coefficient schedule with c = 0 (cubic5)
    precision: str  # bf16, tf32, fp32
    syrk: bool  # effective: only under bf16 ('medium'), as EO/MCore gate it
    tp_mode: str
    nesterov: bool = False  # muon_use_nesterov: one more lerp kernel per tensor (kernel_sequence)

    @staticmethod
    def from_spec(spec) -> NsSettings:  # noqa: ANN001 - workloads.scenario.OptimizerSpec
        """Settings of an OptimizerSpec (SYRK is dropped unless matmuls are bf16)."""
        return NsSettings(
            steps=spec.ns_steps, cubic=spec.ns_coefficients == "cubic5", precision=spec.matmul_precision,
            syrk=bool(spec.use_syrk and spec.matmul_precision == "bf16"), tp_mode=spec.tp_mode,
            nesterov=spec.use_nesterov,
        )

    @property
    def gram_dtype(self) -> str:
        """dtype of the distributed-mode Gram all-reduce: X's dtype (bf16 under 'medium')."""
        return "bf16" if self.precision == "bf16" else "fp32"


@dataclass(frozen=True)
class NsWork:
    """Newton–Schulz work of one copy of a tensor on one TP rank for one optimizer step."""

    flops: float
    gemms: tuple[tuple[float, int], ...]  # (FLOPs of one GEMM, times it runs)
    matrix_numel: int  # elements of the matrices NS reads/writes (casts, normalisation)
    calls: tuple[CollectiveCall, ...]
    addmm_copies: tuple[tuple[int, int], ...] = ()  # (elements of one addmm's self -> output copy, times)


def full_ns_gemms(rows: int, cols: int, st: NsSettings) -> tuple[tuple[float, int], ...]:
    """GEMMs of a full NS call on a rows×cols matrix: ((FLOPs, count), ...) per the §2 table."""
    m, n = min(rows, cols), max(rows, cols)
    gram = (1 if st.syrk else 2) * m * m * n
    out = [(float(gram), st.steps), (float(2 * m * m * n), st.steps)]
    if not st.cubic:
        out.append((float((1 if st.syrk else 2) * m ** 3), st.steps))
    return tuple(out)


def addmm_copies(m: int, n: int, st: NsSettings) -> tuple[tuple[int, int], ...]:
    """The copies ATen's out-of-place ``addmm`` makes before its GEMM, per NS call on an ``m×n``
    working matrix (``m ≤ n``; distributed: ``n`` is the local columns): ((elements, count), ...).

    ``torch.addmm(C, A, B, beta=β)`` with β ≠ 0 into a new output first copies ``C`` into it, then
    runs the GEMM accumulating onto it: one extra copy kernel per call. Measured here with
    ``torch.profiler`` (an ``aten::copy_`` nested under every ``aten::addmm`` of the reference's
    NS; a ``TorchDispatchMode`` does not see it); on CUDA, ``addmm_out_cuda_impl``
    (``aten/src/ATen/native/cuda/Blas.cpp``) copies ``self`` into ``result`` likewise when β ≠ 0
    outside the cuBLASLt bias-epilogue path (a 1-D bias), which a 2-D ``self`` never takes. Per
    step: ``B = addmm(A, A, A)`` copies the m×m Gram (absent with SYRK, which computes B itself,
    and with cubic5, which has no B) and ``X = addmm(X, B, X)`` copies X (m×n)."""
    out = [] if st.cubic or st.syrk else [(m * m, st.steps)]
    return (*out, (m * n, st.steps))


def distributed_ns_gemms(r: int, s: int, t: int, st: NsSettings) -> tuple[tuple[float, int], ...]:
    """GEMMs per rank of distributed NS on an R×S matrix sharded t ways along S."""
    s_loc = s // t
    gram = (1 if st.syrk else 2) * r * r * s_loc
    out = [(float(gram), st.steps), (float(2 * r * r * s_loc), st.steps)]
    if not st.cubic:
        out.append((float((1 if st.syrk else 2) * r ** 3), st.steps))
    return tuple(out)


def distributed_ns_flops(r: int, s: int, t: int, st: NsSettings) -> float:
    """FLOPs per rank of distributed NS: steps·(4R²S/t + 2R³); SYRK steps·(3R²S/t + R³)."""
    return sum(f * k for f, k in distributed_ns_gemms(r, s, t, st))


def _oriented(rows: int, cols: int, shard_dim: int) -> tuple[int, int]:
    """(R, S) of a global matrix: S is the sharded dim (rows for column-parallel, shard_dim 0)."""
    return (cols, rows) if shard_dim == 0 else (rows, cols)


@lru_cache(maxsize=4096)
def _tensor_work(comps: tuple[tuple[int, int], ...], local: tuple[tuple[int, int], ...], shard_dim: int | None,
                 shards: int, group: str | None, st: NsSettings) -> NsWork:
    gemms: list[tuple[float, int]] = []
    copies: list[tuple[int, int]] = []
    calls: list[CollectiveCall] = []
    flops = 0.0
    numel = 0
    sharded = shard_dim is not None and shards > 1
    for (rows, cols), (lrows, lcols) in zip(comps, local, strict=True):
        if not sharded or st.tp_mode == "blockwise":
            rr, cc = (rows, cols) if not sharded else (lrows, lcols)
            gemms += full_ns_gemms(rr, cc, st)
            copies += addmm_copies(min(rr, cc), max(rr, cc), st)
            flops += newton_schulz_flops(rr, cc, st.steps, st.syrk, st.cubic)
            numel += rr * cc
        elif st.tp_mode == "duplicated":
            calls.append(CollectiveCall("all_gather", group, shards, "fp32", 4 * rows * cols, 1, "ns_gather"))  # type: ignore[arg-type]
            gemms += full_ns_gemms(rows, cols, st)
            copies += addmm_copies(min(rows, cols), max(rows, cols), st)
            flops += newton_schulz_flops(rows, cols, st.steps, st.syrk, st.cubic)
            numel += rows * cols
        elif st.tp_mode == "distributed":
            r, s = _oriented(rows, cols, shard_dim)  # type: ignore[arg-type]
            calls.append(CollectiveCall("all_reduce", group, shards, "fp32", 4, 1, "ns_norm"))  # type: ignore[arg-type]
            calls.append(CollectiveCall("all_reduce", group, shards, st.gram_dtype,  # type: ignore[arg-type]
                                        r * r * DTYPE_BYTES[st.gram_dtype], st.steps, "ns_gram"))
            gemms += distributed_ns_gemms(r, s, shards, st)
            copies += addmm_copies(r, s // shards, st)
            flops += distributed_ns_flops(r, s, shards, st)
            numel += lrows * lcols
        else:
            raise ValueError(f"unknown tp_mode {st.tp_mode!r}")
    return NsWork(flops=flops, gemms=tuple(gemms), matrix_numel=numel, calls=tuple(calls), addmm_copies=tuple(copies))


def tensor_ns_work(tensor: TensorSpec, st: NsSettings) -> NsWork:
    """NS work of one copy of a Muon ``tensor`` on one rank of its TP (or expert-TP) group."""
    return _tensor_work(tensor.muon_components, tensor.local_muon_components, tensor.shard_dim,
                        tensor.shards, tensor.shard_group, st)


def ns_time_s(work: NsWork, system: SystemSpec, precision: str) -> float:
    """GPU seconds of the NS GEMMs of ``work`` (one kernel each, at the Newton-Schulz GEMM efficiency)."""
    cls = MATMUL_CLASS[precision]
    return sum(kernel_floor_s(newton_schulz_gemm_time_s(f, system, cls), 0.0, system) * k for f, k in work.gemms)


def tp_comm_time_s(work: NsWork, call_time_s: Callable[[CollectiveCall], float]) -> float:
    """Seconds of the TP collectives of ``work`` (``call_time_s`` times one call)."""
    return sum(call_time_s(c) * c.count for c in work.calls)

"""Compute model: operation times from FLOPs and bytes (roofline with named efficiencies).

Times are ``FLOPs / (dense peak × efficiency(size))`` for tensor-core work and ``bytes / (HBM
bandwidth × memory efficiency)`` for memory-bound work. The efficiency of a GEMM grows with its
size: ``eff(F) = eff_max · F / (F + F_half)``, where ``eff_max`` is the per-precision factor
(``gemm_bf16``, ``gemm_fp8``, ``gemm_fp4``) and ``F_half`` is
``EfficiencyFactors.gemm_half_efficiency_flops`` scaled by the precision's peak relative to BF16
(the small-GEMM overhead is a fixed time, so at twice the rate it takes twice the FLOPs to hide).
A GEMM is never faster than streaming its operands (roofline). Grouped expert GEMMs use the
per-expert size and the ``grouped_gemm`` factor; attention runs at ``attention`` × the BF16 peak;
element-wise kernels at ``memory_bandwidth`` and quantisation casts at ``quantize_bandwidth`` ×
the HBM bandwidth. Newton–Schulz matmuls (eager torch calls) follow the same size curve with their
own factors ``newton_schulz_gemm`` and ``newton_schulz_half_efficiency_flops``.

Kernels (:mod:`costmodel.kernels`): an operation stands for ``op.kernels`` launches sharing its
FLOPs and bytes; each launch takes at least ``kernel_min_s`` (:func:`operation_time_s`), and a
:class:`~costmodel.kernels.KernelSpec` is priced the same way (:func:`kernel_gpu_s`). All factors
are named fields of :class:`EfficiencyFactors` and calibratable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kernels import KernelSpec, StreamCost, issued_stream, kernel_floor_s
from topologies.hardware import SystemSpec

if TYPE_CHECKING:
    from collections.abc import Iterable

    from workloads.operations import Operation

MATMUL_CLASS_OF = {"bf16": "bf16", "tf32": "tf32", "fp32": "fp32", "fp8": "fp8", "fp4": "fp4"}


def tensor_peak_flops_per_s(system: SystemSpec, tensor_class: str) -> float:
    """Dense peak FLOP/s for a tensor-core class: bf16, fp8, fp4, tf32 or fp32."""
    return system.gpu.peak_flops_per_s.of_class(tensor_class)


def gemm_efficiency(flops: float, system: SystemSpec, tensor_class: str) -> float:
    """Achieved fraction (dimensionless) of dense peak for one GEMM of ``flops`` FLOPs."""
    eff = system.efficiency
    eff_max = {"fp8": eff.gemm_fp8, "fp4": eff.gemm_fp4}.get(tensor_class, eff.gemm_bf16)
    ratio = tensor_peak_flops_per_s(system, tensor_class) / system.gpu.peak_flops_per_s.bf16
    f_half = eff.gemm_half_efficiency_flops * ratio
    return eff_max * flops / (flops + f_half)


def newton_schulz_gemm_time_s(flops: float, system: SystemSpec, tensor_class: str = "bf16") -> float:
    """Seconds of one Newton–Schulz matmul of ``flops`` FLOPs (no kernel floor):
    ``flops / (peak · newton_schulz_gemm · F / (F + F_half))``, F_half scaled by the class's peak
    ratio to BF16 as for the other GEMMs."""
    if flops <= 0:
        return 0.0
    eff = system.efficiency
    peak = tensor_peak_flops_per_s(system, tensor_class)
    f_half = eff.newton_schulz_half_efficiency_flops * peak / system.gpu.peak_flops_per_s.bf16
    return (flops + f_half) / (peak * eff.newton_schulz_gemm)


def gemm_time_s(flops: float, system: SystemSpec, tensor_class: str = "bf16", scale: float = 1.0) -> float:
    """Seconds for one GEMM of ``flops`` FLOPs; ``scale`` multiplies the efficiency (e.g. grouped GEMM)."""
    if flops <= 0:
        return 0.0
    eff = gemm_efficiency(flops, system, tensor_class) * scale
    return flops / (tensor_peak_flops_per_s(system, tensor_class) * eff)


def memory_time_s(num_bytes: float, system: SystemSpec) -> float:
    """Seconds to stream ``num_bytes`` bytes through HBM at the achieved memory bandwidth."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / (system.gpu.hbm_bandwidth_Bps * system.efficiency.memory_bandwidth)


def quantize_time_s(num_bytes: float, system: SystemSpec) -> float:
    """Seconds for quantisation casts moving ``num_bytes`` bytes (read + write) through HBM."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / (system.gpu.hbm_bandwidth_Bps * system.efficiency.quantize_bandwidth)


def attention_time_s(flops: float, system: SystemSpec) -> float:
    """Seconds for ``flops`` FLOPs of flash attention (BF16 tensor cores at the attention factor)."""
    if flops <= 0:
        return 0.0
    return flops / (system.gpu.peak_flops_per_s.bf16 * system.efficiency.attention)


def operation_time_s(op: Operation, system: SystemSpec) -> float:
    """GPU seconds for one :class:`workloads.operations.Operation` on one GPU of ``system``.

    The operation's FLOPs and bytes are shared by its ``op.kernels`` launches (a grouped GEMM's
    launches are its groups); each launch costs its roofline time, at least ``kernel_min_s``.
    """
    n = max(op.kernels, 1e-9)
    if op.kind == "gemm":
        math_s = gemm_time_s(op.flops / n, system, op.tensor_class)
    elif op.kind == "grouped_gemm":
        math_s = gemm_time_s(op.flops / n, system, op.tensor_class, system.efficiency.grouped_gemm)
    elif op.kind == "attention":
        math_s = attention_time_s(op.flops / n, system)
    else:
        math_s = 0.0
    mem = quantize_time_s if op.kind == "quantize" else memory_time_s
    return n * kernel_floor_s(math_s, mem(op.bytes / n, system), system)


def kernel_gpu_s(k: KernelSpec, system: SystemSpec) -> float:
    """GPU seconds of ONE launch of ``k`` on ``system`` (roofline with the kernel floor)."""
    if k.kind == "ns_gemm":
        math_s = newton_schulz_gemm_time_s(k.flops, system, k.tensor_class)
    elif k.kind == "gemm":
        math_s = gemm_time_s(k.flops, system, k.tensor_class)
    else:
        math_s = 0.0
    return kernel_floor_s(math_s, memory_time_s(k.bytes, system), system)


def stream_cost(kernels: Iterable[KernelSpec], system: SystemSpec, captured: bool = False) -> StreamCost:
    """GPU and host-issue seconds of ``kernels`` issued eagerly (``captured``: replayed from a graph)."""
    gpu = launches = 0.0
    for k in kernels:
        gpu += k.count * kernel_gpu_s(k, system)
        launches += k.count
    return issued_stream(gpu, launches, system, captured)

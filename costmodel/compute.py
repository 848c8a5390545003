"""Compute model: operation times from FLOPs and bytes (roofline with named efficiencies).

Times are ``FLOPs / (dense peak × efficiency(size))`` for tensor-core work and ``bytes / (HBM
bandwidth × memory efficiency)`` for memory-bound work. The efficiency of a GEMM grows with its
size: ``eff(F) = eff_max · F / (F + F_half)`` where ``F_half`` is
``EfficiencyFactors.gemm_half_efficiency_flops``; ``eff_max`` is the per-precision factor
(``gemm_bf16``, ``gemm_fp8``, ``gemm_fp4``). All factors are named and calibratable.
"""

from __future__ import annotations

from topologies.hardware import SystemSpec

MATMUL_CLASS_OF = {"bf16": "bf16", "tf32": "tf32", "fp32": "fp32", "fp8": "fp8", "fp4": "fp4"}


def gemm_efficiency(flops: float, system: SystemSpec, tensor_class: str) -> float:
    """Achieved fraction of dense peak for one GEMM of ``flops`` FLOPs in ``tensor_class``."""
    eff = system.efficiency
    eff_max = {"fp8": eff.gemm_fp8, "fp4": eff.gemm_fp4}.get(tensor_class, eff.gemm_bf16)
    return eff_max * flops / (flops + eff.gemm_half_efficiency_flops)


def tensor_peak_flops_per_s(system: SystemSpec, tensor_class: str) -> float:
    """Dense peak FLOP/s for a tensor-core class: bf16, fp8, fp4, tf32 or fp32."""
    peaks = system.gpu.peak_flops_per_s
    if tensor_class == "fp4":
        return peaks.fp4 if peaks.fp4 is not None else peaks.fp8
    return float(getattr(peaks, tensor_class))


def gemm_time_s(flops: float, system: SystemSpec, tensor_class: str = "bf16", scale: float = 1.0) -> float:
    """Seconds for one GEMM of ``flops`` FLOPs; ``scale`` multiplies the efficiency (e.g. grouped GEMM)."""
    if flops <= 0:
        return 0.0
    eff = gemm_efficiency(flops, system, tensor_class) * scale
    return flops / (tensor_peak_flops_per_s(system, tensor_class) * eff)


def memory_time_s(num_bytes: float, system: SystemSpec) -> float:
    """Seconds to stream ``num_bytes`` through HBM at the achieved memory bandwidth."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / (system.gpu.hbm_bandwidth_Bps * system.efficiency.memory_bandwidth)

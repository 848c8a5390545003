"""Kernel-level cost: the GPU time of kernels and the host time to issue them.

Three quantities, all named factors of :class:`topologies.hardware.EfficiencyFactors`:

* a kernel's **GPU time** is the largest of its math roofline, its memory roofline and
  ``kernel_min_s`` (launch latency, ramp-up and tail of a tiny grid: no kernel is shorter);
* the **host issue time** of a kernel launched eagerly is ``kernel_issue_s`` (Python, the ATen
  dispatcher, ``cudaLaunchKernel``); kernels captured in a CUDA graph cost none (the replay of a
  whole graph is one launch, counted as one issue);
* a **stream** of kernels the host issues eagerly costs ``max(Σ GPU time, Σ issue time)``: the host
  runs ahead of the GPU through the launch queue, and when the kernels are shorter than the time
  the host needs to issue them the GPU idles (the stream is launch-bound).

Sums are taken over a window between host synchronisations: one layer's forward or backward pass
of one micro-batch (:func:`costmodel.layer_costs.ops_time`), or one rank's optimizer step after
the gradient-norm synchronisation (:mod:`costmodel.optimizer.kernel_sequence`).

:class:`KernelSpec` describes one kind of kernel of a sequence (its launches, FLOPs and bytes per
launch); :func:`costmodel.compute.kernel_gpu_s` prices one launch on a GPU system with the
rooflines of :mod:`costmodel.compute` and :func:`kernel_floor_s`. A reference-backend run on CPU
prices the same specs serially with this machine's measured rates
(:meth:`costmodel.calibrate.profile.LocalMeasurements.kernels_time_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from topologies.hardware import SystemSpec

KernelKind = Literal["gemm", "ns_gemm", "memory"]


@dataclass(frozen=True)
class KernelSpec:
    """``count`` launches of one kernel, each doing ``flops`` FLOPs and moving ``bytes`` HBM bytes.

    ``kind``: ``gemm`` (a dense GEMM at the Megatron GEMM efficiency), ``ns_gemm`` (a Newton-Schulz
    matmul, eager torch, at the ``newton_schulz_gemm`` efficiency) or ``memory`` (element-wise,
    reductions, copies and casts: memory-bound). ``tensor_class``: bf16, tf32, fp32 for GEMMs.
    """

    name: str
    kind: KernelKind
    count: float
    flops: float = 0.0
    bytes: float = 0.0
    tensor_class: str = "bf16"


@dataclass(frozen=True)
class StreamCost:
    """Seconds of a stream of kernels on one GPU: GPU busy time, host issue time, launches."""

    gpu_s: float = 0.0
    issue_s: float = 0.0
    kernels: float = 0.0  # launches (captured ones included)
    captured_kernels: float = 0.0  # launches replayed from CUDA graphs (no issue time)

    @property
    def time_s(self) -> float:
        """Seconds of the stream: ``max(Σ GPU time, Σ host issue time)``."""
        return max(self.gpu_s, self.issue_s)

    @property
    def host_idle_s(self) -> float:
        """Seconds the GPU waits for the host to issue kernels (0 when GPU-bound)."""
        return max(0.0, self.issue_s - self.gpu_s)

    def __add__(self, other: StreamCost) -> StreamCost:
        return StreamCost(self.gpu_s + other.gpu_s, self.issue_s + other.issue_s, self.kernels + other.kernels,
                          self.captured_kernels + other.captured_kernels)


def kernel_floor_s(math_s: float, memory_s: float, system: SystemSpec) -> float:
    """GPU seconds of one kernel: ``max(math s, memory s, kernel_min_s)``."""
    return max(math_s, memory_s, system.efficiency.kernel_min_s)


def issued_stream(gpu_s: float, launches: float, system: SystemSpec, captured: bool = False) -> StreamCost:
    """A stream of ``launches`` kernels taking ``gpu_s`` GPU seconds, issued eagerly (or replayed
    from a CUDA graph when ``captured``: no issue time)."""
    issue = 0.0 if captured else launches * system.efficiency.kernel_issue_s
    return StreamCost(gpu_s, issue, launches, launches if captured else 0.0)

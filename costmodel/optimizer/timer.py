"""Seconds of an optimizer plan's kernels and collectives on a system (:class:`Timer`).

Internal to :mod:`costmodel.optimizer.stage_builder`: one Timer per plan memoises the plan's
per-shape rows and layouts; the kernel-sequence seconds and the collective seconds are memoised
across plans on the system (identity), as they depend on nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from costmodel.kernels import KernelSpec
from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer import layouts as lay
from costmodel.optimizer.newton_schulz import NsSettings, NsWork
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from workloads.comm import CollectiveCall
from workloads.inventory import TensorSpec

_MUON_KERNELS: IdentityMemo[tuple[float, float, float, float]] = IdentityMemo(4096)  # the system by identity
_CALL_S: IdentityMemo[float] = IdentityMemo(16384)  # Timer.call_s per (op, bytes, group shape), the system by identity


class Timer:
    """Seconds of NS work and collectives on a system (zero without one); memoised per plan."""

    def __init__(self, system: SystemSpec | None, precision: str,
                 shape_of: Callable[[str], GroupShape] | None) -> None:
        self.system, self.precision, self.shape_of = system, precision, shape_of
        self._calls: dict[tuple[str, str, int, str, int], float] = {}
        self.s_per_byte = self.min_s = self.issue_s = 0.0
        self.muon_rows: dict[tuple, tuple[np.ndarray, tuple[CollectiveCall, ...]]] = {}  # see StageBuilder.muon_item
        self.adam_rows: dict[tuple[int, tuple[float, ...]], np.ndarray] = {}  # see StageBuilder.adam_item
        self.element_wise_spans: dict[tuple, list[tuple[lay.BucketSpan, np.ndarray]]] = {}  # see StageBuilder.element_wise
        self.spans_effects: dict[tuple, tuple[np.ndarray, Any]] = {}  # spans_batch._SpansEffect: StageBuilder.layer_wise_current
        if system is not None:
            from costmodel.compute import memory_time_s

            self.s_per_byte = memory_time_s(1e9, system) / 1e9
            self.min_s, self.issue_s = system.efficiency.kernel_min_s, system.efficiency.kernel_issue_s

    def release(self) -> None:
        """Forget the per-plan memos of the plan's construction (the finished plan keeps this timer
        only for :meth:`call_s`, to time its stages' collectives when first read)."""
        self.muon_rows, self.adam_rows, self.element_wise_spans, self.spans_effects = {}, {}, {}, {}

    def kernels_s(self, kernels: tuple[KernelSpec, ...]) -> tuple[float, float]:
        """(GPU seconds of the Newton-Schulz GEMMs, GPU seconds of the other kernels) of ``kernels``."""
        if self.system is None:
            return 0.0, 0.0
        from costmodel.compute import kernel_gpu_s

        ns = sum(k.count * kernel_gpu_s(k, self.system) for k in kernels if k.kind == "ns_gemm")
        other = sum(k.count * kernel_gpu_s(k, self.system) for k in kernels if k.kind != "ns_gemm")
        return ns, other

    def muon_kernels(self, t: TensorSpec, work: NsWork, st: NsSettings, grad_bytes: int,
                     shape_key: tuple) -> tuple[float, float, float, float]:
        """(NS GEMM GPU s, other GPU s, launches, NS GEMM launches) of one Muon tensor's kernel sequence,
        memoised across plans per (tensor shape and sharding, NS settings, gradient size, system)."""
        key = (shape_key, st, grad_bytes)
        hit = _MUON_KERNELS.get(key, self.system)
        if hit is not None:
            return hit
        kernels = ks.muon_tensor_kernels(t, work, st, grad_bytes, nesterov=st.nesterov)
        out = (*self.kernels_s(kernels), ks.kernel_count(kernels), ks.kernel_count(kernels, "ns_gemm"))
        return _MUON_KERNELS.put(out, key, self.system)

    def floored_s(self, launches: np.ndarray | float, num_bytes: np.ndarray | float) -> np.ndarray:
        """GPU seconds of ``launches`` kernels sharing ``num_bytes`` bytes: max(memory, launches·kernel_min_s)."""
        return np.maximum(np.asarray(num_bytes) * self.s_per_byte, np.asarray(launches) * self.min_s)

    def call_s(self, call: CollectiveCall) -> float:
        """Seconds of one ``call`` (nccl-tests size) over its group's placement shape."""
        if self.system is None or call.group_size <= 1:
            return 0.0
        key = (call.op, call.group, call.group_size, call.dtype, call.bytes)
        hit = self._calls.get(key)
        if hit is None:
            shape = self._shape(call)
            shared = (call.op, call.bytes, shape)  # across plans on the system (identity)
            hit = _CALL_S.get(shared, self.system)
            if hit is None:
                from topologies.collectives import collective_time_s

                hit = _CALL_S.put(collective_time_s(call.op, call.bytes, shape, self.system), shared, self.system)
            self._calls[key] = hit
        return hit

    def _shape(self, call: CollectiveCall) -> GroupShape:
        return self.shape_of(call.group) if self.shape_of else GroupShape.single_domain(call.group_size)

    def group_shape(self, call: CollectiveCall) -> GroupShape | None:
        """The placement shape :meth:`call_s` times ``call`` over (None without a system or for one rank)."""
        return None if self.system is None or call.group_size <= 1 else self._shape(call)

"""Memory traffic of the element-wise optimizer kernels (bytes per element; time via memory_time_s).

These are counts of what the kernels read and write, not tuned constants; the achieved bandwidth
is the calibratable ``memory_bandwidth`` factor applied by :func:`costmodel.compute.memory_time_s`.

AdamW on one fp32-master element (Megatron's fused Adam on the local shard): read the gradient
(``b_g``), read+write the fp32 master (8), m (8) and v (8), write the bf16 parameter copy (2):
``b_g + 26`` bytes.

Muon on one owned element (EO ``OrthogonalizedOptimizer.step``): decoupled weight decay on the fp32
master (r+w 8), momentum lerp (grad ``b_g`` + momentum r+w 8), spectral scale of the update (r+w 8),
``p ← p − lr·O`` (read O 4, master r+w 8), bf16 parameter copy (r 4 + w 2): ``b_g + 42`` bytes.
Plus, per element of the matrix Newton–Schulz runs on (the gathered full matrix in duplicated mode):
Frobenius norm read (4), normalise and cast to the matmul dtype (r 4 + w 2), cast the result back to
fp32 (r 2 + w 4): 16 bytes. The NS iterations themselves are GEMMs (``aX + B·X`` is one addmm).
"""

from __future__ import annotations

ADAM_STATE_BYTES_PER_ELEMENT = 26  # master r/w 8 + m r/w 8 + v r/w 8 + bf16 param write 2
MUON_STATE_BYTES_PER_ELEMENT = 42  # wd 8 + momentum r/w 8 + scale 8 + update 12 + bf16 copy 6
NS_CAST_BYTES_PER_ELEMENT = 16  # norm 4 + normalise/cast 6 + cast back 6
PARAM_BYTES = 2  # bf16 model parameters (what the parameter all-gather moves)


def adam_bytes_per_element(grad_bytes: int) -> int:
    """HBM bytes AdamW moves per fp32-master element, with ``grad_bytes`` per gradient element."""
    return grad_bytes + ADAM_STATE_BYTES_PER_ELEMENT


def muon_bytes_per_element(grad_bytes: int) -> int:
    """HBM bytes the Muon update moves per owned element (Newton–Schulz casts excluded)."""
    return grad_bytes + MUON_STATE_BYTES_PER_ELEMENT

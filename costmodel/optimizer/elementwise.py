"""Element sizes of the optimizer's parameter traffic.

The optimizer's memory-bound kernels (AdamW, Muon's momentum, normalisation, casts, scale, update,
the copies to the model parameters, the gradient norm) are counted per kernel, with their bytes,
in :mod:`costmodel.optimizer.kernel_sequence`.
"""

from __future__ import annotations

PARAM_BYTES = 2  # bf16 model parameters (what the parameter all-gather moves)

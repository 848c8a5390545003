"""Newton–Schulz orthogonalisation: coefficient schedules, precision, transpose rule, scale factors.

Spec: ``../shared/reference/muon-and-distributed-optimizers.md`` §1.2–§1.3 (Emerging-Optimizers
``newton_schulz``). Input is an fp32 matrix; it is transposed when rows > cols (unless the caller
forces the orientation), divided by its Frobenius norm clamped to ``eps``, cast to the matmul
precision (bf16, tf32 or fp32) and iterated ``X ← aX + (bA + cA²)X`` with ``A = XXᵀ``; the result
is cast back to fp32 and un-transposed. The normalisation (``F.normalize``), the ``addmm`` calls and
the torch matmul-precision setting are EO 0.3.0's, so the result is bitwise EO's. Schedules with
``c = 0`` (cubic5, which needs EO >= 0.4) take EO 0.4's shortcut ``X ← aX + bAX``; EO 0.3.0 forms
``B = bA + 0·A²`` for such tuples (a custom set with c = 0 rounds differently there).

The distributed (tensor-parallel) variant reuses :func:`newton_schulz_iterations` with two
reduction hooks: one for the squared Frobenius norm and one for the Gram matrix (§5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch

Coefficients = tuple[float, float, float]
ScheduleMode = Literal["cycle", "repeat_last", "fixed"]
MatmulPrecision = Literal["bf16", "tf32", "fp32"]
ScaleMode = Literal["shape_scaling", "spectral", "unit_rms_norm"]

_SIMPLE: Coefficients = (3.4445, -4.7750, 2.0315)


@dataclass(frozen=True)
class CoefficientSchedule:
    """A named list of (a, b, c) tuples and what happens once the list runs out."""

    name: str
    tuples: tuple[Coefficients, ...]
    mode: ScheduleMode

    def for_steps(self, steps: int) -> tuple[Coefficients, ...]:
        """The (a, b, c) used by each of ``steps`` iterations (cycle / repeat_last / fixed)."""
        if steps <= 0:
            raise ValueError(f"ns_steps must be positive (got {steps})")
        n = len(self.tuples)
        if self.mode == "fixed" and steps != n:
            raise ValueError(f"coefficient set '{self.name}' requires exactly {n} steps (got {steps})")
        if self.mode == "cycle":
            return tuple(self.tuples[i % n] for i in range(steps))
        return tuple(self.tuples[min(i, n - 1)] for i in range(steps))

    @property
    def is_cubic(self) -> bool:
        """True when every tuple has c = 0 (the A·A product is skipped)."""
        return all(c == 0 for _, _, c in self.tuples)


COEFFICIENT_SETS: dict[str, CoefficientSchedule] = {
    "simple": CoefficientSchedule("simple", (_SIMPLE,), "cycle"),
    "quintic": CoefficientSchedule("quintic", (
        (4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)), "cycle"),
    "polar_express": CoefficientSchedule("polar_express", (
        (8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)), "repeat_last"),
    "cans": CoefficientSchedule("cans", (
        (8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
        (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162)), "repeat_last"),
    "aol": CoefficientSchedule("aol", (
        (4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169)), "cycle"),
    "deepseekv4": CoefficientSchedule("deepseekv4", (_SIMPLE,) * 8 + ((2.0, -1.5, 0.5),) * 2, "repeat_last"),
    "cubic5": CoefficientSchedule("cubic5", (
        (3.3656576, -3.3420992, 0.0), (2.5744352, -1.4957376, 0.0), (2.5368962, -1.4312570, 0.0),
        (2.4418906, -1.2764040, 0.0), (2.2230472, -0.9630650, 0.0)), "fixed"),
}


def coefficient_schedule(name: str, custom: Sequence[Sequence[float]] | None = None,
                         custom_mode: ScheduleMode = "cycle") -> CoefficientSchedule:
    """The named schedule, or a ``custom`` one built from user tuples (cycled by default)."""
    if name == "custom":
        if not custom:
            raise ValueError("ns_coefficients 'custom' needs custom_coefficients: a list of [a, b, c]")
        tuples = tuple(tuple(float(v) for v in t) for t in custom)
        if any(len(t) != 3 for t in tuples):
            raise ValueError("every custom coefficient tuple must have exactly 3 values [a, b, c]")
        return CoefficientSchedule("custom", tuples, custom_mode)  # type: ignore[arg-type]
    if name not in COEFFICIENT_SETS:
        raise ValueError(f"unknown ns_coefficients '{name}'; known: {', '.join(COEFFICIENT_SETS)}, custom")
    return COEFFICIENT_SETS[name]


def scale_factor(rows: int, cols: int, mode: ScaleMode) -> float:
    """Muon update scale for an (out=rows) × (in=cols) matrix (dimensionless, §1.3)."""
    # EO's get_muon_scale_factor expressions, verbatim (``** 0.5``)
    if mode == "shape_scaling":
        return float(max(1, rows / cols) ** 0.5)
    if mode == "spectral":
        return float(max(rows, cols) ** 0.5)
    if mode == "unit_rms_norm":
        return float((rows / cols) ** 0.5)
    raise ValueError(f"unknown scale mode '{mode}'")


_WORK_DTYPE = {"bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}
# Emerging-Optimizers' fp32_matmul_prec names: "medium" (bf16), "high" (TF32), "highest" (fp32)
EO_PRECISION = {"bf16": "medium", "tf32": "high", "fp32": "highest"}


def work_dtype(precision: MatmulPrecision) -> torch.dtype:
    """dtype of the iterated matrix (and of the TP Gram all-reduce) under ``precision``."""
    return _WORK_DTYPE[precision]


@contextmanager
def matmul_precision(precision: MatmulPrecision) -> Iterator[None]:
    """torch's fp32 matmul precision for the block, as EO's ``fp32_matmul_precision`` sets it around
    the orthogonalisation: 'medium' for bf16, 'high' (TF32) for tf32, 'highest' for fp32.

    On CPU torch has no TF32 kernels, so tf32 runs as fp32 there; on GPUs it enables TF32.
    """
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(EO_PRECISION[precision])
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


Reduce = Callable[[torch.Tensor], torch.Tensor]


def newton_schulz_iterations(
    x: torch.Tensor, coefficients: Sequence[Coefficients], precision: MatmulPrecision,
    gram_reduce: Reduce | None = None,
) -> torch.Tensor:
    """Run the iterations on an already oriented and normalised fp32 matrix ``x`` (m × n).

    ``gram_reduce`` (tensor-parallel 'distributed' mode) sums the partial Gram ``XXᵀ`` over the
    ranks that hold column blocks of X; it receives and returns a tensor in the work dtype.
    Returns fp32.
    """
    X = x.to(work_dtype(precision))
    with matmul_precision(precision):
        for a, b, c in coefficients:
            A = X @ X.mT
            if gram_reduce is not None:
                A = gram_reduce(A)
            if c != 0:
                B = torch.addmm(A, A, A, beta=b, alpha=c)
                X = torch.addmm(X, B, X, beta=a)
            else:
                X = torch.addmm(X, A, X, beta=a, alpha=b)
    return X.to(torch.float32)


def newton_schulz(
    x: torch.Tensor, schedule: CoefficientSchedule, steps: int, precision: MatmulPrecision = "bf16",
    eps: float = 1e-7, transpose: bool | None = None, normalize_in: str = "fp32",
) -> torch.Tensor:
    """Orthogonalise a 2-D fp32 matrix (single process); returns fp32 of the same shape.

    ``transpose=None`` applies the default rule (transpose when rows > cols). ``normalize_in``:
    ``fp32`` divides by the Frobenius norm in fp32 before casting (Emerging-Optimizers, Megatron);
    ``work_dtype`` casts first and normalises in the matmul dtype, as ``torch.optim.Muon`` does.
    """
    if x.ndim != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix (got shape {tuple(x.shape)})")
    x = x.to(torch.float32)
    if transpose is None:
        transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.mT
    with matmul_precision(precision):
        if normalize_in == "work_dtype":
            x = x.to(work_dtype(precision))
            x = x / x.norm().clamp(min=eps)  # torch.optim.Muon
        else:
            x = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=eps)  # type: ignore[arg-type]  # EO
        out = newton_schulz_iterations(x, schedule.for_steps(steps), precision)
    return out.mT if transpose else out


def distributed_flops(rows_gram: int, cols_local: int, steps: int, cubic: bool = False) -> float:
    """FLOPs on one rank of tensor-parallel 'distributed' Newton–Schulz (X_loc is R × S/t).

    Per step: partial Gram 2R²(S/t), A·A 2R³ (skipped when c = 0), B·X 2R²(S/t).
    """
    r, s = rows_gram, cols_local
    per_step = 2 * r * r * s + 2 * r * r * s + (0 if cubic else 2 * r ** 3)
    return float(steps * per_step)

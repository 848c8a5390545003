"""The surrogate the factor fit optimises: each run's step time, linearised as an additive roofline.

At a point ``f0`` of its efficiency factors, a run's step time is split into the seconds
attributable to each factor, ``c_j ≈ −∂t/∂log f_j`` (a one-sided secant of the real engine in
``1/f``, exact for a term inversely proportional to ``f``), and a remainder. The surrogate

    t(f) = t0 − Σ_j c_j + Σ_j c_j · f0_j / f_j

is exact at ``f0`` with the right first derivatives, and exact everywhere when the step time is a
sum of terms each inversely proportional to one factor (a serial roofline); overlaps (``max``)
make it approximate away from ``f0``. The fitter (:mod:`costmodel.calibrate.fit`) re-linearises at each new
solution until the surrogate and the engine agree, so the fitted values are those of the engine.

A :class:`SurrogateProblem` vectorises all runs of a fit: parameters are log factor values per
system and log multipliers per release family; a run's effective factor is
``clip(exp(x_system + x_release))``. Residuals are log(surrogate) − log(measured), plus one prior
row per parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Linearization:
    """One run's additive-roofline surrogate at ``f0`` (seconds)."""

    t0_s: float
    names: tuple[str, ...]
    f0: tuple[float, ...]
    c_s: tuple[float, ...]  # seconds attributable to each factor at f0 (≈ −∂t/∂log f_j)

    def time_s(self, factors: Mapping[str, float]) -> float:
        """Surrogate step time at ``factors`` (names not given stay at f0)."""
        t = self.t0_s
        for name, f0, c in zip(self.names, self.f0, self.c_s, strict=True):
            t += c * (f0 / factors.get(name, f0) - 1.0)
        return t


def linearize(predict_s: Callable[[Mapping[str, float]], float], point: Mapping[str, float],
              names: Sequence[str], bounds: Mapping[str, tuple[float, float]], step: float = 0.02,
              t0_s: float | None = None) -> Linearization:
    """Linearise ``predict_s`` at ``point`` over ``names`` (len(names) + 1 engine calls, fewer with t0)."""
    base = dict(point)
    t0 = predict_s(base) if t0_s is None else t0_s
    cs = []
    for name in names:
        f0 = base[name]
        lo, hi = bounds[name]
        h = -step if math.log(f0) + step > math.log(hi) else step
        moved = min(max(f0 * math.exp(h), lo), hi)
        if moved == f0:
            cs.append(0.0)
            continue
        t = predict_s({**base, name: moved})
        cs.append((t - t0) / (f0 / moved - 1.0))  # secant in 1/f: exact for a term ∝ 1/f
    return Linearization(t0, tuple(names), tuple(base[n] for n in names), tuple(cs))


# factors of the host CPU, not of the GPU system: one parameter per host CPU (``SystemSpec.host_cpu``),
# shared by the systems that have it (GB200 and GB300 NVL72 both run on Grace)
HOST_FACTORS = frozenset({"layer_host_s", "moe_host_s", "kernel_issue_s", "local_spec_host_fraction"})


@dataclass(frozen=True)
class Param:
    """One fitted parameter: log of a system's factor (key: the system, or its host CPU for
    ``HOST_FACTORS``), or log of a release family's multiplier."""

    kind: str  # 'system' or 'release'
    key: str  # system name or release family
    factor: str
    center_log: float
    sigma_log: float
    lower_log: float
    upper_log: float


class SurrogateProblem:
    """The robust least-squares problem over the linearised runs (all numpy, no engine calls)."""

    def __init__(self, lins: Sequence[Linearization], systems: Sequence[str], families: Sequence[str],
                 measured_s: Sequence[float], params: Sequence[Param],
                 factor_bounds: Mapping[str, tuple[float, float]], hosts: Sequence[str] | None = None) -> None:
        self.params = list(params)
        index = {(p.kind, p.key, p.factor): i for i, p in enumerate(self.params)}
        run, c, f0, sys_p, rel_p, lo, hi = [], [], [], [], [], [], []
        for i, lin in enumerate(lins):
            for name, f, cj in zip(lin.names, lin.f0, lin.c_s, strict=True):
                key = hosts[i] if hosts is not None and name in HOST_FACTORS else systems[i]
                sp = index.get(("system", key, name))
                if sp is None:
                    continue
                run.append(i)
                c.append(cj)
                f0.append(f)
                sys_p.append(sp)
                rel_p.append(index.get(("release", families[i], name), -1))
                lo.append(math.log(factor_bounds[name][0]))
                hi.append(math.log(factor_bounds[name][1]))
        self.n = len(lins)
        self.run = np.array(run, dtype=np.int64)
        self.c = np.array(c, dtype=float)
        self.f0 = np.array(f0, dtype=float)
        self.sys_p = np.array(sys_p, dtype=np.int64)
        self.rel_p = np.array(rel_p, dtype=np.int64)
        self.lo, self.hi = np.array(lo, dtype=float), np.array(hi, dtype=float)
        self.t0 = np.array([lin.t0_s for lin in lins], dtype=float)
        self.remainder = self.t0 - np.bincount(self.run, weights=self.c, minlength=self.n)
        self.log_measured = np.log(np.asarray(measured_s, dtype=float))
        self.center = np.array([p.center_log for p in self.params])
        self.prior_sigma = np.array([p.sigma_log for p in self.params])
        self.lower = np.array([p.lower_log for p in self.params])
        self.upper = np.array([p.upper_log for p in self.params])

    def effective_log_factors(self, x: np.ndarray) -> np.ndarray:
        """log f_eff per slot: system value plus release multiplier, clipped to the factor's bounds."""
        rel = np.where(self.rel_p >= 0, x[np.maximum(self.rel_p, 0)], 0.0)
        return np.clip(x[self.sys_p] + rel, self.lo, self.hi)

    def log_times(self, x: np.ndarray) -> np.ndarray:
        """log surrogate step time of every run at parameters ``x``."""
        if not len(self.run):
            return np.log(self.t0)
        terms = self.c * self.f0 * np.exp(-self.effective_log_factors(x))
        t = self.remainder + np.bincount(self.run, weights=terms, minlength=self.n)
        return np.log(np.maximum(t, 1e-3 * self.t0))

    def residuals(self, x: np.ndarray, f_scale: float) -> np.ndarray:
        """Data residuals (log time) then prior rows scaled to the data's noise level ``f_scale``."""
        return np.concatenate([self.log_times(x) - self.log_measured,
                               (f_scale / self.prior_sigma) * (x - self.center)])

    def objective(self, log_times: np.ndarray, x: np.ndarray, loss: str, f_scale: float) -> float:
        """The robust cost scipy minimises, for given log step times (engine or surrogate) at ``x``."""
        r = np.concatenate([log_times - self.log_measured, (f_scale / self.prior_sigma) * (x - self.center)])
        return 0.5 * f_scale ** 2 * float(np.sum(robust_rho((r / f_scale) ** 2, loss)))

    def solve(self, x0: np.ndarray, loss: str, f_scale: float, tolerance: float = 1e-8) -> np.ndarray:
        """Robust bounded least squares from ``x0`` (scipy's trust-region reflective)."""
        from scipy.optimize import least_squares

        if not self.params:
            return np.zeros(0)
        start = np.clip(x0, self.lower + 1e-9, self.upper - 1e-9)
        res = least_squares(lambda x: self.residuals(x, f_scale), start, bounds=(self.lower, self.upper),
                            loss=loss, f_scale=f_scale, ftol=tolerance, xtol=tolerance, gtol=tolerance,
                            max_nfev=500)
        return res.x

    def _weighted_jacobian(self, x: np.ndarray, loss: str, f_scale: float) -> np.ndarray:
        """The data rows' Jacobian (one-sided away from bounds) times the robust loss's weights' root."""
        r = self.log_times(x) - self.log_measured
        jac = np.zeros((self.n, len(x)))
        base = self.log_times(x)
        for j in range(len(x)):
            h = -1e-4 if x[j] + 1e-4 > self.upper[j] else 1e-4
            moved = x.copy()
            moved[j] += h
            jac[:, j] = (self.log_times(moved) - base) / h
        z = (r / f_scale) ** 2
        weights = {"soft_l1": 1.0 / np.sqrt(1.0 + z), "huber": np.where(z <= 1.0, 1.0, 1.0 / np.sqrt(np.maximum(z, 1.0)))
                   }.get(loss, np.ones_like(z))
        return jac * np.sqrt(weights)[:, None]

    def shrinkage(self, x: np.ndarray, loss: str, f_scale: float) -> np.ndarray:
        """Posterior over prior 1-σ of each parameter (0-1) in the objective's own weighting: the data
        rows over ``f_scale`` plus the prior rows (``1/σ_prior``). 1 when the data say nothing about a
        parameter; ``1/√2`` when they carry as much information about it as its prior."""
        if not self.params:
            return np.zeros(0)
        rows = np.vstack([self._weighted_jacobian(x, loss, f_scale) / f_scale, np.diag(1.0 / self.prior_sigma)])
        cov = np.linalg.pinv(rows.T @ rows)
        return np.sqrt(np.clip(np.diag(cov), 0.0, None)) / self.prior_sigma

    def sigma(self, x: np.ndarray, loss: str, f_scale: float) -> tuple[np.ndarray, float]:
        """1-σ of each parameter (log units) and the robust residual scale of the data.

        ``σ² (JᵀWJ)⁻¹`` with J the surrogate's Jacobian (one-sided away from bounds), W the robust
        loss's weights on the data rows, the prior rows included, σ = 1.4826 × median |residual|.
        """
        if not self.params:
            return np.zeros(0), 0.0
        r = self.log_times(x) - self.log_measured
        scale = max(1.4826 * float(np.median(np.abs(r))), 0.005) if r.size else 0.0
        rows = np.vstack([self._weighted_jacobian(x, loss, f_scale), np.diag(f_scale / self.prior_sigma)])
        cov = np.linalg.pinv(rows.T @ rows) * scale ** 2
        return np.sqrt(np.clip(np.diag(cov), 0.0, None)), scale


def robust_rho(z: np.ndarray, loss: str) -> np.ndarray:
    """scipy's loss ρ(z) of squared scaled residuals z: soft_l1, huber or linear."""
    if loss == "soft_l1":
        return 2.0 * (np.sqrt(1.0 + z) - 1.0)
    if loss == "huber":
        return np.where(z <= 1.0, z, 2.0 * np.sqrt(np.maximum(z, 1.0)) - 1.0)
    return z

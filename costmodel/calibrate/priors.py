"""What the calibration fit starts from and is held to: the default factor set, each factor's
bounds, and the priors (centres and widths in log space), per host CPU where measured.

Used by :mod:`costmodel.calibrate.fit` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from topologies.hardware import EfficiencyFactors

# The default set, chosen by held-out error on the shipped runs among ~15 candidate settings
# (adding nvlink/network bandwidth, memory or quantisation bandwidth made held-out error worse):
# compute efficiency per precision, grouped GEMM, attention, GEMM size at half efficiency, EP
# all-to-all efficiency.
DEFAULT_FACTORS = ("gemm_bf16", "gemm_fp8", "gemm_fp4", "grouped_gemm", "attention",
                   "gemm_half_efficiency_flops", "alltoall_bandwidth")
# No per-release multipliers by default: a release changes what runs (the recipe settings each run
# carries), not the hardware. ``--release-factors`` still fits them for a custom profile, and
# ``--release-residuals`` reports what residual each release family leaves (a diagnostic).
DEFAULT_RELEASE_FACTORS: tuple[str, ...] = ()

# (lower, upper) for each fittable factor: physically meaningful ranges, tighter than the schema's
FACTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_bf16": (0.2, 1.0), "gemm_fp8": (0.2, 1.0), "gemm_fp4": (0.1, 1.0),
    "gemm_half_efficiency_flops": (1e7, 1e12),
    "grouped_gemm": (0.2, 1.5), "attention": (0.1, 1.0), "memory_bandwidth": (0.3, 1.0),
    "quantize_bandwidth": (0.2, 1.0),
    "newton_schulz_gemm": (0.2, 1.0), "newton_schulz_half_efficiency_flops": (1e7, 1e12),
    "kernel_issue_s": (5e-7, 1e-4), "kernel_min_s": (3e-7, 2e-5), "layer_host_s": (1e-5, 3e-2), "moe_host_s": (1e-5, 3e-2), "nvlink_bandwidth": (0.2, 1.0), "nvls_bandwidth": (0.2, 1.0),
    "network_bandwidth": (0.2, 1.0), "alltoall_bandwidth": (0.05, 1.0),
    "nvlink_step_latency_s": (1e-7, 1e-4), "network_step_latency_s": (1e-7, 1e-3),
    "collective_base_latency_s": (1e-7, 1e-3), "nvls_latency_s": (1e-7, 1e-3),
    "overlap_compute_slowdown": (1e-3, 1.0), "host_sync_s": (1e-6, 1e-4),
    "local_spec_host_fraction": (0.2, 2.0),
}
MULTIPLIER_BOUNDS = (0.5, 2.0)  # a release changes a factor by at most 2x either way
# prior widths (1 sigma of log f) that differ from FitSettings.prior_sigma_log: the GEMM sizes at
# half efficiency are known only to an order of magnitude, the host issue cost per kernel to a factor ~3
# (it depends on the host CPU and on how much Python runs per kernel)
# prior centres of factors whose schema default is 0 ("not modelled unless calibrated"): the fit
# starts from and regularises towards these instead (sources in the factors' descriptions)
PRIOR_CENTERS = {"layer_host_s": 1.0e-3, "moe_host_s": 1.0e-3}
# ... and per host CPU (SystemSpec.host_cpu) where measured: the Megatron CI fit on 8 x H100 (Xeon 8480C),
# 8 x GB200 (Grace) and 8 x A100 (EPYC 7742) (costmodel/data/ci_calibration.yaml, the command in its
# header). Assumptions: the DGX B200/B300 Xeons (8570, 6776P) as the H100's; GB300's Grace as GB200's.
# A factor the runs do not identify stays at this centre, recorded in the profile. (Fitted before the
# CI loader read --overlap-moe-expert-parallel-comm; with it, 4 rows changed and the CI profile's H100
# moe_host_s moved 2.997 -> 2.972 ms, inside its +-0.48 ms: the centres were not refitted. Fitting
# local_spec_host_fraction too moved every centre inside its uncertainty, e.g. H100 layer_host_s
# 2.498 -> 2.548 +- 0.09 ms, A100 3.449 -> 3.507 +- 0.064 ms: not refitted either.)
_XEON_CI = {"layer_host_s": 2.498e-3, "moe_host_s": 3.001e-3}
_GRACE_CI = {"layer_host_s": 3.109e-3, "moe_host_s": 2.935e-3}
HOST_PRIOR_CENTERS: dict[str, dict[str, float]] = {
    "xeon-8480c": _XEON_CI, "xeon-8570": _XEON_CI, "xeon-6776p": _XEON_CI, "grace": _GRACE_CI,
    "epyc-7742": {"layer_host_s": 3.449e-3, "moe_host_s": 2.087e-3},
}
PRIOR_SIGMA_LOG = {"gemm_half_efficiency_flops": 1.5, "newton_schulz_half_efficiency_flops": 1.5,
                   "kernel_issue_s": 1.0, "layer_host_s": 1.0, "moe_host_s": 1.0}


def default_factor_values(names: Sequence[str], defaults: EfficiencyFactors | Mapping[str, float] | None = None,
                          host_cpu: str = "") -> dict[str, float]:
    """Datasheet values of ``names`` (from a system's EfficiencyFactors, or the schema defaults); a
    factor whose datasheet value is 0 ("not modelled unless calibrated") takes its prior centre,
    the host CPU's where measured (``HOST_PRIOR_CENTERS``), else ``PRIOR_CENTERS``."""
    if defaults is None:
        defaults = EfficiencyFactors()
    get = (lambda n: getattr(defaults, n)) if isinstance(defaults, EfficiencyFactors) else defaults.__getitem__
    out = {n: float(get(n)) for n in names}
    centers = {**PRIOR_CENTERS, **HOST_PRIOR_CENTERS.get(host_cpu, {})}
    return {n: centers[n] if v <= 0 and n in centers else v for n, v in out.items()}


# a fitted value within this relative distance of a bound sits on it (the profile rounds to 4 digits)
BOUND_TOLERANCE = 1e-3


def bound_hit(name: str, value: float) -> str | None:
    """'lower' or 'upper' when ``value`` of factor ``name`` sits on that end of its ``FACTOR_BOUNDS``
    range (within ``BOUND_TOLERANCE``, relative), else None (also for factors without bounds).

    A factor the fit leaves on a bound is not a measurement: the runs ask for a value outside its
    physical range, so the model misses a mechanism on them (issue 12: a defect to report)."""
    if name not in FACTOR_BOUNDS or value <= 0:
        return None
    lo, hi = FACTOR_BOUNDS[name]
    if value <= lo * (1 + BOUND_TOLERANCE):
        return "lower"
    if value >= hi * (1 - BOUND_TOLERANCE):
        return "upper"
    return None

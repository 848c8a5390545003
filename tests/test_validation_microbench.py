"""Local microbenchmark fits and the local profile (GEMM rate, NS efficiency, gloo α-β)."""

from __future__ import annotations

import pytest

from costmodel.calibrate.microbench import fit_gemm_paths
from costmodel.calibrate.microbench_ns import (
    NS_POOL_MAX,
    fit_newton_schulz,
    fit_shape_change_s,
    measure_ns_shape_change,
    ns_gemm_flops,
    ns_pool_size,
)
from costmodel.calibrate.profile import (
    CalibrationProfile,
    CollectiveFit,
    LocalMeasurements,
    NewtonSchulzFit,
    SmallGemmPath,
    load_profile,
)
from costmodel.calibrate.timing import fit_linear_time
from costmodel.kernels import KernelSpec
from costmodel.optimizer.kernel_sequence import newton_schulz_call_kernels
from costmodel.optimizer.newton_schulz import NsSettings
from workloads.flops import newton_schulz_flops


def test_linear_time_fit_recovers_latency_and_bandwidth():
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    alpha, beta = 80e-6, 5e9
    intercept, slope = fit_linear_time(sizes, [alpha + s / beta for s in sizes])
    assert intercept == pytest.approx(alpha, rel=1e-9)
    assert 1 / slope == pytest.approx(beta, rel=1e-9)


def test_linear_time_fit_never_returns_a_negative_latency():
    intercept, slope = fit_linear_time([1.0, 2.0, 3.0], [0.9, 2.0, 3.1])
    assert intercept == 0.0 and slope == pytest.approx(1.0, rel=0.05)


def test_ns_gemm_flops_match_the_project_flop_count():
    for shape in ((64, 192), (1024, 256)):
        assert sum(f * k for f, k in ns_gemm_flops(*shape)) == newton_schulz_flops(*shape, 5)


def _local(**kw) -> LocalMeasurements:  # noqa: ANN003
    return LocalMeasurements(machine="test", gemm_flops_per_s={"bf16": 5e11, "fp32": 1e11},
                             gemm_overhead_s={"bf16": 1e-5}, dispatch_s=2e-6, memory_Bps=1e10, **kw)


def _ns_time_s(rows: int, cols: int, small_path: bool) -> float:
    """One NS call by hand on :func:`_local`'s machine with an NS efficiency of 0.8, 8 us of extra setup
    per main-path GEMM and 50 us per call: 15 GEMMs (10 us setup + 8 us, or the small path's 1 us,
    + FLOPs at 0.8 x 500 GFLOP/s, or x 4 GFLOP/s) + 15 other kernels (norm, clamp_min, divide, two casts and the 10
    ``addmm`` copies of self, 5 of the m×m Gram and 5 of the m×n X in bf16, at 2 us + bytes / 10 GB/s)."""
    setup_s, rate = (1e-6, 4e9) if small_path else (1e-5 + 8e-6, 5e11)
    gemm = sum((f / (0.8 * rate) + setup_s) * k for f, k in ns_gemm_flops(rows, cols))
    m = rows * cols
    copies = 5 * 2 * 2 * rows * rows + 5 * 2 * 2 * rows * cols  # read + write, 2 bytes each
    other = 15 * 2e-6 + (4 * m + 8 + 8 * m + 6 * m + 6 * m + copies) / 1e10
    return gemm + other + 5e-5


def test_newton_schulz_fit_recovers_efficiency_setup_and_call_cost():
    """The fit recovers 0.8, 8 us per main-path GEMM and 50 us per call from the calls of
    :func:`_ns_time_s`; the (4, 64) and (8, 64) calls run every GEMM on the small path (m·n·k ≤ 16³:
    4·4·64 = 1,024 and 8·8·64 = 4,096 FLOP/2)."""
    local = _local(gemm_small={"bf16": SmallGemmPath(max_flops=2.0 * 16 ** 3, flops_per_s=4e9, overhead_s=1e-6)})
    shapes = [(4, 64), (8, 64), (32, 64), (64, 192), (128, 512), (256, 1024)]
    times = [_ns_time_s(r, c, small_path=r <= 8) for r, c in shapes]
    # by hand, (4, 64): 15 setups of 1 us, 5·(2·4·4·64 + 2·4³ + 2·4·4·64) = 21,120 FLOPs at 3.2 GFLOP/s,
    # 15 other kernels at 2 us + 24·256 + 8 bytes of casts and norm + 5·2·2·(16 + 256) = 5,440 bytes of
    # copies at 10 GB/s, 50 us: 15 + 6.6 + 30 + 1.1592 + 50 = 102.7592 us
    assert times[0] == pytest.approx(102.7592e-6, rel=1e-6)
    fit = fit_newton_schulz(list(zip(shapes, times, strict=True)), local)
    assert fit.efficiency == pytest.approx(0.8, rel=1e-6)
    assert fit.gemm_setup_s == pytest.approx(8e-6, rel=1e-6)
    assert fit.call_overhead_s == pytest.approx(5e-5, rel=1e-6)
    # the model prices the calls as timed: setups on each GEMM's path, FLOPs at 0.8 of the rate
    priced = local.model_copy(update={"newton_schulz": {"bf16": fit}})
    st = NsSettings(steps=5, cubic=False, precision="bf16", syrk=False, tp_mode="duplicated")
    for (rows, cols), t in zip(shapes, times, strict=True):
        assert priced.kernels_time_s(newton_schulz_call_kernels(rows, cols, st), ns_calls=1) == pytest.approx(t, rel=1e-9)


def test_newton_schulz_fit_is_stable_under_noise():
    """±5 % noise on each timed call moves the fitted efficiency by at most 10 % and the per-call cost
    and setup by at most a few us: the three columns are separable (the old form, with the setup
    divided by the efficiency, swung its per-call cost between 0 and 60-70 us from run to run)."""
    local = _local(gemm_small={"bf16": SmallGemmPath(max_flops=2.0 * 16 ** 3, flops_per_s=4e9, overhead_s=1e-6)})
    shapes = [(4, 64), (8, 64), (32, 64), (64, 128), (128, 128), (64, 192), (128, 512), (256, 1024)]
    exact = [_ns_time_s(r, c, small_path=r <= 8) for r, c in shapes]
    for signs in ((1, -1, 1, -1, 1, -1, 1, -1), (-1, 1, -1, 1, -1, 1, -1, 1), (1, 1, -1, -1, 1, 1, -1, -1)):
        fit = fit_newton_schulz([(s, t * (1 + 0.05 * k)) for s, t, k in zip(shapes, exact, signs, strict=True)], local)
        assert fit.efficiency == pytest.approx(0.8, rel=0.1)
        assert fit.call_overhead_s == pytest.approx(5e-5, abs=1e-5)
        assert fit.gemm_setup_s == pytest.approx(8e-6, abs=3e-6)


def test_local_measurements_times_and_yaml_round_trip(tmp_path):
    local = _local(newton_schulz={"bf16": NewtonSchulzFit(efficiency=0.8, call_overhead_s=2e-5, gemm_setup_s=3e-6)},
                   collectives={"all_gather": CollectiveFit(alpha_s=5e-5, beta_Bps=5e9)})
    assert local.gemm_time_s(1e9, "bf16") == pytest.approx(1e9 / 5e11 + 1e-5)
    assert local.gemm_time_s(1e9, "fp32") == pytest.approx(1e-2)
    ns = KernelSpec("ns_gemm", "ns_gemm", 2, flops=1e9)
    copy = KernelSpec("copy", "memory", 3, bytes=1e6)
    # host-synchronous: the sum of dispatch + execution of every kernel, plus the per-call NS cost
    assert local.kernels_time_s([ns, copy], ns_calls=3) == pytest.approx(
        2 * (2e-3 / 0.8 + 1e-5 + 3e-6) + 3 * (2e-6 + 1e-4) + 3 * 2e-5)
    assert local.kernels_time_s([KernelSpec("g", "ns_gemm", 2, flops=1e9, tensor_class="fp32")]) == pytest.approx(2e-2)
    assert local.collective_time_s("all_gather_v", 5e9) == pytest.approx(1 + 5e-5)
    assert local.collective_time_s("broadcast", 1.0) is None
    path = tmp_path / "local.yaml"
    path.write_text(CalibrationProfile(name="local", local=local).to_yaml(), encoding="utf-8")
    assert load_profile(path).local == local


def test_microbench_cli_writes_a_local_profile(run_cli, tmp_path):
    out = tmp_path / "local.yaml"
    result = run_cli("calibrate", "--microbench", "--out", out)
    assert result.exit_code == 0, result.output
    local = load_profile(out).local
    assert local is not None and local.world_size == 2
    assert set(local.gemm_flops_per_s) == {"bf16", "fp32"}
    assert all(rate > 1e9 for rate in local.gemm_flops_per_s.values())
    assert set(local.collectives) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert all(fit.beta_Bps > 1e6 for fit in local.collectives.values())
    assert 0.1 < local.newton_schulz["bf16"].efficiency <= 1.5
    assert local.dispatch_s is not None and 0 < local.dispatch_s < 1e-3
    assert local.memory_Bps is not None and local.memory_Bps > 1e8
    assert "GFLOP/s" in result.stdout
    assert local.newton_schulz["bf16"].shape_change_s >= 0
    assert local.muon_update_host_s is not None and local.muon_orthogonalize_host_s is not None
    assert "per change of shape" in result.stdout and "reference host layers" in result.stdout


def test_gemm_path_fit_recovers_a_small_matrix_threshold_and_setup():
    """Square bf16 matmuls timed as torch runs them here: m·n·k ≤ 16³ on a 1 us + 4 GFLOP/s loop,
    larger ones with a 15 us setup + 1.2 TFLOP/s (oneDNN). By hand: 16³ is 8192 FLOPs, 1 + 2.048 =
    3.048 us; 20³ is 16000 FLOPs, 15 + 0.0133 = 15.013 us, a step of 4.93x for 1.95x the FLOPs."""
    sizes = (4, 8, 12, 16, 20, 24, 32, 64, 128, 256, 512)

    def t(n: int) -> float:
        f = 2.0 * n ** 3
        return 1e-6 + f / 4e9 if n ** 3 <= 16 ** 3 else 15e-6 + f / 1.2e12

    assert t(16) == pytest.approx(3.048e-6) and t(20) == pytest.approx(15.01333e-6, rel=1e-5)
    (overhead, slope), small = fit_gemm_paths([(2.0 * n ** 3, t(n)) for n in sizes])
    assert small is not None
    assert small.max_flops == 8192.0
    assert small.overhead_s == pytest.approx(1e-6, rel=1e-6) and small.flops_per_s == pytest.approx(4e9, rel=1e-6)
    assert overhead == pytest.approx(15e-6, rel=1e-6) and 1 / slope == pytest.approx(1.2e12, rel=1e-6)
    local = _local().model_copy(update={"gemm_small": {"bf16": small}, "gemm_overhead_s": {"bf16": overhead},
                                        "gemm_flops_per_s": {"bf16": 1 / slope, "fp32": 1e11}})
    # the 4x256 router's X·Xᵀ (4·4·256 = 16³: 8192 FLOPs) on the small path, 32³ on the main one
    assert local.gemm_time_s(8192.0) == pytest.approx(3.048e-6, rel=1e-6)
    assert local.gemm_time_s(2.0 * 32 ** 3) == pytest.approx(15e-6 + 65536 / 1.2e12, rel=1e-6)


def test_gemm_path_fit_finds_one_path_when_time_grows_smoothly():
    """fp32 here: MKL at ~1.2 us per call + 190 GFLOP/s from 4³ up, no step; one slow outlier at
    the top (a busy core) is not a second path."""
    sizes = (4, 8, 12, 16, 20, 24, 32, 64, 128, 256, 512)
    points = [(2.0 * n ** 3, 1.2e-6 + 2.0 * n ** 3 / 1.9e11) for n in sizes]
    (overhead, slope), small = fit_gemm_paths(points)
    assert small is None
    assert overhead == pytest.approx(1.2e-6, rel=1e-6) and 1 / slope == pytest.approx(1.9e11, rel=1e-6)
    points[-1] = (points[-1][0], points[-1][1] * 8)  # 512³ 8x slower than it should be
    assert fit_gemm_paths(points)[1] is None


def test_local_pricing_puts_tiny_newton_schulz_gemms_on_the_small_path():
    """A (4, 256) NS call: X·Xᵀ and B·X are 4·4·256 = 16³ (8192 FLOPs), A·A 4³ (128 FLOPs): all on the
    small path (1 us + FLOPs / 4 GFLOP/s), not at the 10 us main-path cost."""
    small = SmallGemmPath(max_flops=8192.0, flops_per_s=4e9, overhead_s=1e-6)
    local = _local(gemm_small={"bf16": small}, newton_schulz={"bf16": NewtonSchulzFit(efficiency=1.0,
                                                                                      call_overhead_s=0.0)})
    gemm_s = 5 * (2 * (1e-6 + 8192 / 4e9) + (1e-6 + 128 / 4e9))
    assert gemm_s == pytest.approx(35.64e-6)  # 5 · (2 · 3.048 + 1.032) us
    st = NsSettings(steps=5, cubic=False, precision="bf16", syrk=False, tp_mode="duplicated")
    kernels = newton_schulz_call_kernels(4, 256, st)
    assert local.kernels_time_s([k for k in kernels if k.kind == "ns_gemm"]) == pytest.approx(gemm_s, rel=1e-9)


def test_shape_change_fit_is_the_median_excess_over_a_call_of_the_same_shape():
    """(after another shape − after the same) per shape: +100, +20, −50 us; the median is +20 us; never below 0."""
    points = [((32, 64), 5e-4, 4e-4), ((64, 128), 3e-4, 2.8e-4), ((256, 1024), 9e-4, 9.5e-4)]
    assert fit_shape_change_s(points) == pytest.approx(2e-5)
    assert fit_shape_change_s([((32, 64), 1e-4, 2e-4)]) == 0.0


def test_ns_pool_holds_twice_the_l2_of_distinct_inputs():
    """8 MiB of fp32 inputs: 8 of 256×1024 (1 MiB each), 32 of 128×512 (256 KiB); 32×64 (8 KiB) would
    need 1,024, the cap; a matrix larger than the pool still gets 2."""
    assert ns_pool_size(256, 1024) == 8
    assert ns_pool_size(128, 512) == 32
    assert ns_pool_size(32, 64) == 1024 == NS_POOL_MAX
    assert ns_pool_size(4096, 4096) == 2


def test_shape_change_measurement_times_both_orders():
    """A real (short) run on two tiny shapes: one (shape, after another, after the same) per shape."""
    pytest.importorskip("torch")
    points = measure_ns_shape_change("bf16", ((8, 16), (16, 24)), min_time_s=0.001, min_rounds=3, pool_bytes=4096)
    assert [p[0] for p in points] == [(8, 16), (16, 24)]
    assert all(other > 0 and same > 0 for _, other, same in points)


def test_a_profile_without_shape_change_cost_loads_with_zero():
    fit = NewtonSchulzFit.model_validate({"efficiency": 0.7, "call_overhead_s": 0.0})
    assert fit.shape_change_s == 0.0

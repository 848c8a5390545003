"""Muon / AdamW math of the reference backend against torch and against its own spec (single process)."""

from __future__ import annotations

import math

import pytest
import torch

from reference.muon_math import (
    AdamHyper,
    MatrixInfo,
    MuonHyper,
    adamw_step,
    merge_qkv,
    muon_apply,
    muon_prepare,
    orthogonalize_param,
    split_qkv,
)
from reference.newton_schulz import (
    COEFFICIENT_SETS,
    coefficient_schedule,
    newton_schulz,
    scale_factor,
)
from reference.tp_ns import BlockwiseNS, FullMatrixNS

SHAPES = [(48, 32), (32, 80), (64, 64)]


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _hyper(**kw) -> MuonHyper:
    base = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1, schedule=COEFFICIENT_SETS["simple"],
                ns_steps=5, precision="bf16", eps=1e-7, scale_mode="shape_scaling", extra_scale=1.0)
    return MuonHyper(**{**base, **kw})


def _matrices(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * 0.02 for s in SHAPES]


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _own_muon(hyper: MuonHyper, steps: int) -> list[torch.Tensor]:
    params = _matrices()
    bufs = [torch.zeros_like(p) for p in params]
    ortho = FullMatrixNS(hyper)
    for step in range(steps):
        for p, g, buf in zip(params, _grads(step), bufs, strict=True):
            u = muon_prepare(p, g, buf, hyper)
            info = MatrixInfo("w", tuple(p.shape), None, 1, "tp")
            muon_apply(p, orthogonalize_param(u, info, ortho), hyper)
    return params


def test_coefficient_schedules_follow_their_cycling_rules():
    quintic = COEFFICIENT_SETS["quintic"].for_steps(7)
    assert quintic[5] == quintic[0] and quintic[6] == quintic[1]  # cycle
    polar = COEFFICIENT_SETS["polar_express"].for_steps(10)
    assert polar[8] == polar[9] == polar[7] == (1.8750, -1.2500, 0.3750)  # repeat_last
    ds = COEFFICIENT_SETS["deepseekv4"].for_steps(12)
    assert ds[:8] == ((3.4445, -4.7750, 2.0315),) * 8 and ds[8:] == ((2.0, -1.5, 0.5),) * 4
    assert COEFFICIENT_SETS["aol"].for_steps(5)[4] == COEFFICIENT_SETS["aol"].tuples[0]
    assert COEFFICIENT_SETS["cans"].for_steps(6)[5] == COEFFICIENT_SETS["cans"].tuples[4]
    with pytest.raises(ValueError, match="exactly 5"):
        COEFFICIENT_SETS["cubic5"].for_steps(4)
    custom = coefficient_schedule("custom", [[1.5, -0.5, 0.0], [2.0, -1.0, 0.0]])
    assert custom.for_steps(3) == ((1.5, -0.5, 0.0), (2.0, -1.0, 0.0), (1.5, -0.5, 0.0)) and custom.is_cubic


def test_scale_factors():
    assert scale_factor(512, 128, "shape_scaling") == 2.0
    assert scale_factor(128, 512, "shape_scaling") == 1.0
    assert scale_factor(128, 512, "spectral") == math.sqrt(512)
    assert scale_factor(128, 512, "unit_rms_norm") == 0.5


@pytest.mark.parametrize("name", ["quintic", "polar_express", "cans", "aol", "deepseekv4", "cubic5"])
def test_newton_schulz_orthogonalises_rectangular_matrices(name):
    x = torch.randn(64, 192, generator=torch.Generator().manual_seed(1))
    steps = 10 if name in ("polar_express", "deepseekv4") else 5
    out = newton_schulz(x, COEFFICIENT_SETS[name], steps, "fp32")
    sv = torch.linalg.svdvals(out)
    assert out.shape == x.shape and out.dtype == torch.float32
    # Frobenius-normalised input has singular values ~0.07-0.17 here; every schedule lifts them to
    # a narrow band around 1 (aol stays near 0.55 after 5 steps, cubic5 spans 0.77-1.30)
    assert sv.min() > 0.45 and sv.max() < 1.35 and sv.max() / sv.min() < 2.0, (name, sv.min().item(), sv.max().item())


def test_transpose_rule_and_precision():
    x = torch.randn(96, 40, generator=torch.Generator().manual_seed(2))
    sched = COEFFICIENT_SETS["quintic"]
    tall = newton_schulz(x, sched, 5, "fp32")
    wide = newton_schulz(x.T.contiguous(), sched, 5, "fp32")
    forced = newton_schulz(x, sched, 5, "fp32", transpose=False)  # iterate the 96x96 Gram instead
    assert torch.allclose(tall, wide.T, atol=1e-6)  # rows > cols is run transposed: the same computation
    assert torch.allclose(tall, forced, atol=1e-4)  # p(XXᵀ)X = X·p(XᵀX): same result either orientation
    bf16 = newton_schulz(x, sched, 5, "bf16")
    err = (bf16 - tall).abs().max().item()
    assert 1e-5 < err < 5e-2  # bf16 differs from fp32, but only at bf16 resolution


def _run_torch_muon(hyper: MuonHyper, steps: int) -> list[torch.Tensor]:
    params = [p.clone().requires_grad_(True) for p in _matrices()]
    opt = torch.optim.Muon(params, lr=hyper.lr, weight_decay=hyper.weight_decay, momentum=hyper.momentum,
                           nesterov=True, ns_steps=hyper.ns_steps, eps=hyper.eps)
    for step in range(steps):
        for p, g in zip(params, _grads(step), strict=True):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def test_single_process_muon_matches_torch_optim_muon_bf16():
    """Same bf16 math as torch (normalise after the cast): the accumulated updates agree to <= 1e-2."""
    steps = 5
    start = _matrices()
    theirs = _run_torch_muon(_hyper(), steps)
    mine = _own_muon(_hyper(normalize_in="work_dtype"), steps)
    for p0, a, b in zip(start, mine, theirs, strict=True):
        rel = ((a - b).norm() / (b - p0).norm()).item()  # relative to the whole update, not the parameter
        assert rel <= 1e-2, rel


def test_emerging_optimizers_normalisation_differs_from_torch_only_at_bf16_resolution():
    """EO/Megatron normalise in fp32 before the bf16 cast; torch casts first. Different bf16 rounding,
    same math: the accumulated updates differ by about 1 %, far below the update itself."""
    steps = 5
    start = _matrices()
    theirs = _run_torch_muon(_hyper(), steps)
    mine = _own_muon(_hyper(), steps)
    for p0, a, b in zip(start, mine, theirs, strict=True):
        rel = ((a - b).norm() / (b - p0).norm()).item()
        assert 1e-4 < rel <= 3e-2, rel


def _torch_math_fp32(g: torch.Tensor, coeffs: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz with the bf16 cast replaced by fp32 (written out here)."""
    a, b, c = coeffs
    x = g.clone()
    if g.size(0) > g.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.size(0) > g.size(1) else x


def test_fp32_path_matches_fp32_version_of_torch_math():
    hyper = _hyper(precision="fp32")
    steps = 5
    mine = _own_muon(hyper, steps)
    params = _matrices()
    bufs = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        for p, g, buf in zip(params, _grads(step), bufs, strict=True):
            buf.lerp_(g, 1 - hyper.momentum)
            update = _torch_math_fp32(g.lerp(buf, hyper.momentum), (3.4445, -4.7750, 2.0315), 5, hyper.eps)
            p.mul_(1 - hyper.lr * hyper.weight_decay)
            p.add_(update, alpha=-hyper.lr * math.sqrt(max(1, p.shape[0] / p.shape[1])))
    for a, b in zip(mine, params, strict=True):
        assert (a - b).abs().max().item() <= 1e-6


def test_qkv_split_is_per_component_with_global_scale():
    groups, split, cols = 4, (16, 8, 8), 64
    u = torch.randn(groups * sum(split), cols, generator=torch.Generator().manual_seed(3))
    q, k, v = split_qkv(u, groups, split)
    assert q.shape == (64, 64) and k.shape == (32, 64) and v.shape == (32, 64)
    assert torch.equal(k[:8], u[16:24]) and torch.equal(q[16:32], u[32:48])  # group 1's Q follows group 0's
    assert torch.equal(merge_qkv([q, k, v], groups, split), u)
    hyper = _hyper(scale_mode="spectral", precision="fp32")
    info = MatrixInfo("qkv", (128, 64), None, 1, "tp", groups, split)
    out = orthogonalize_param(u, info, FullMatrixNS(hyper))
    ns = FullMatrixNS(_hyper(scale_mode="spectral", precision="fp32", extra_scale=1.0))
    expect_k = ns(k.contiguous(), (32, 64), info)
    assert torch.equal(split_qkv(out, groups, split)[1], expect_k)
    # the scale of K uses its own global shape (32 x 64): sqrt(64)
    unscaled = newton_schulz(k, hyper.schedule, 5, "fp32")
    assert torch.allclose(expect_k, unscaled * 8.0)


def test_blockwise_scales_with_the_local_shape():
    hyper = _hyper(scale_mode="spectral", precision="fp32")
    shard = torch.randn(32, 64, generator=torch.Generator().manual_seed(4))
    info = MatrixInfo("fc1", (128, 64), 0, 4, "tp")
    out = BlockwiseNS(hyper)(shard, info.global_shape, info)
    assert torch.allclose(out, newton_schulz(shard, hyper.schedule, 5, "fp32") * 8.0)  # sqrt(max(32, 64))


def test_adamw_step_matches_torch_adamw():
    hyper = AdamHyper(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    p0 = torch.randn(40, 24, generator=torch.Generator().manual_seed(5))
    mine, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    ref = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([ref], lr=hyper.lr, betas=(hyper.beta1, hyper.beta2), eps=hyper.eps,
                            weight_decay=hyper.weight_decay)
    for step in range(1, 6):
        g = torch.randn(40, 24, generator=torch.Generator().manual_seed(50 + step))
        adamw_step(mine, g, m, v, step, hyper)
        ref.grad = g
        opt.step()
    assert (mine - ref.detach()).abs().max().item() <= 1e-6

"""Newton–Schulz FLOPs and the TP modes' collectives, pinned to the spec's formulas (§2, §5)."""

from __future__ import annotations

import pytest

from costmodel.optimizer.newton_schulz import (
    NsSettings,
    distributed_ns_flops,
    full_ns_gemms,
    tensor_ns_work,
)
from workloads.flops import newton_schulz_flops
from workloads.inventory import TensorSpec


def settings(mode: str = "duplicated", steps: int = 5, precision: str = "bf16", syrk: bool = False,
             cubic: bool = False) -> NsSettings:
    return NsSettings(steps=steps, cubic=cubic, precision=precision, syrk=syrk, tp_mode=mode)


def matrix(shape: tuple[int, int], shard_dim: int | None, t: int, group: str = "tp",
           comps: tuple[tuple[int, int], ...] | None = None) -> TensorSpec:
    return TensorSpec(name="w", role="x", layer=0, stage=0, chunk=0, global_shape=shape, shard_dim=shard_dim,
                      shard_group=group if shard_dim is not None else None, shards=t if shard_dim is not None else 1,
                      dp_group="dp", optimizer="muon", muon_components=comps or (shape,))


SHAPES = [(256, 512), (512, 256), (1024, 1024), (7168, 2048), (4096, 7168)]


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_full_ns_flops_per_spec(rows: int, cols: int) -> None:
    m, n = min(rows, cols), max(rows, cols)
    for syrk, per_step in ((False, 4 * m * m * n + 2 * m ** 3), (True, 3 * m * m * n + m ** 3)):
        st = settings(steps=5, syrk=syrk)
        assert sum(f * k for f, k in full_ns_gemms(rows, cols, st)) == 5 * per_step
        assert newton_schulz_flops(rows, cols, 5, syrk) == 5 * per_step
    cubic = settings(steps=5, cubic=True)
    assert sum(f * k for f, k in full_ns_gemms(rows, cols, cubic)) == 5 * 4 * m * m * n


def test_square_matrix_costs_six_d_cubed_per_step() -> None:
    assert tensor_ns_work(matrix((1024, 1024), None, 1), settings(steps=1)).flops == 6 * 1024 ** 3
    assert tensor_ns_work(matrix((1024, 1024), None, 1), settings(steps=1, syrk=True)).flops == 4 * 1024 ** 3


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("shard_dim", [0, 1])
def test_duplicated_gathers_fp32_full_matrix(rows: int, cols: int, t: int, shard_dim: int) -> None:
    w = tensor_ns_work(matrix((rows, cols), shard_dim, t), settings("duplicated"))
    assert [(c.op, c.group, c.group_size, c.dtype, c.bytes, c.count) for c in w.calls] == [
        ("all_gather", "tp", t, "fp32", 4 * rows * cols, 1)]
    assert w.flops == newton_schulz_flops(rows, cols, 5)  # full NS on every TP rank


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("shard_dim", [0, 1])
@pytest.mark.parametrize("precision,gram_bytes", [("bf16", 2), ("tf32", 4), ("fp32", 4)])
def test_distributed_calls_scalar_plus_steps_gram_allreduces(rows: int, cols: int, t: int, shard_dim: int,
                                                             precision: str, gram_bytes: int) -> None:
    r = cols if shard_dim == 0 else rows  # column-parallel [out/t, in] -> R = in; row-parallel -> R = out
    s = rows if shard_dim == 0 else cols
    w = tensor_ns_work(matrix((rows, cols), shard_dim, t, "etp"), settings("distributed", 5, precision))
    calls = sorted((c.op, c.group, c.group_size, c.dtype, c.bytes, c.count, c.phase) for c in w.calls)
    gram_dtype = "bf16" if precision == "bf16" else "fp32"
    assert calls == sorted([("all_reduce", "etp", t, "fp32", 4, 1, "ns_norm"),
                            ("all_reduce", "etp", t, gram_dtype, r * r * gram_bytes, 5, "ns_gram")])
    assert w.flops == 5 * (4 * r * r * s // t + 2 * r ** 3)


def test_distributed_syrk_and_cubic_flops() -> None:
    r, s, t = 2048, 8192, 4
    assert distributed_ns_flops(r, s, t, settings("distributed", syrk=True)) == 5 * (3 * r * r * s // t + r ** 3)
    assert distributed_ns_flops(r, s, t, settings("distributed", cubic=True)) == 5 * (4 * r * r * s // t)


@pytest.mark.parametrize("r,s", [(7168, 4096), (2048, 7168), (1024, 1024)])
def test_distributed_compute_never_below_r_cubed_term(r: int, s: int) -> None:
    for syrk in (False, True):
        st = settings("distributed", syrk=syrk)
        floor = 5 * (1 if syrk else 2) * r ** 3
        flops = [distributed_ns_flops(r, s, t, st) for t in (1, 2, 4, 8, 16, 32, 64)]
        assert all(f >= floor for f in flops)
        assert all(a >= b for a, b in zip(flops, flops[1:], strict=False))  # shrinks with t ...
        assert flops[-1] - floor < flops[0] - floor  # ... but only its R²S/t part


def test_distributed_uses_the_larger_dim_when_the_sharded_dim_is_small() -> None:
    # Kimi-K2 expert fc1 [2F, H] = [4096, 7168], column-parallel: R = H = 7168 > S
    w = tensor_ns_work(matrix((4096, 7168), 0, 2, "etp"), settings("distributed"))
    gram = next(c for c in w.calls if c.phase == "ns_gram")
    assert gram.bytes == 7168 * 7168 * 2


@pytest.mark.parametrize("mode", ["duplicated", "distributed", "blockwise"])
def test_replicated_and_unsharded_matrices_have_no_tp_calls(mode: str) -> None:
    for spec in (matrix((384, 7168), None, 1), matrix((2048, 7168), 0, 1)):
        w = tensor_ns_work(spec, settings(mode))
        assert w.calls == () and w.flops == newton_schulz_flops(*spec.global_shape, 5)


@pytest.mark.parametrize("t", [2, 8])
def test_blockwise_is_local_ns_without_communication(t: int) -> None:
    w = tensor_ns_work(matrix((4096, 7168), 0, t), settings("blockwise"))
    assert w.calls == ()
    assert w.flops == newton_schulz_flops(4096 // t, 7168, 5)


def test_split_qkv_makes_per_component_collectives() -> None:
    h, q, kv = 4096, 4096, 1024
    qkv = matrix((q + 2 * kv, h), 0, 4, comps=((q, h), (kv, h), (kv, h)))
    dup = tensor_ns_work(qkv, settings("duplicated"))
    assert sorted(c.bytes for c in dup.calls) == sorted([4 * q * h, 4 * kv * h, 4 * kv * h])
    dist = tensor_ns_work(qkv, settings("distributed"))
    assert sum(c.count for c in dist.calls if c.phase == "ns_gram") == 3 * 5
    assert sum(c.count for c in dist.calls if c.phase == "ns_norm") == 3
    fused = tensor_ns_work(matrix((q + 2 * kv, h), 0, 4), settings("duplicated"))
    assert len(fused.calls) == 1 and fused.flops > dup.flops  # one big matrix costs more than Q, K, V apart

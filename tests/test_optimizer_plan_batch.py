"""The plan's per-buffer work made for all distinct stages in one pass (spans_batch, ew_batch) equals
the work made buffer by buffer, bit for bit (buckets, per-rank columns, owners, names, TP calls),
and their one implementation (spans_effects, adam_rows) is what the work is by definition."""

from __future__ import annotations

import random

import numpy as np
import pytest

from costmodel.optimizer import Grid, plan_from_inventory
from costmodel.optimizer import layouts as lay
from costmodel.optimizer import plan as plan_mod
from costmodel.optimizer.ew_batch import adam_rows
from costmodel.optimizer.newton_schulz import NsSettings
from costmodel.optimizer.plan import _stage_buffers
from costmodel.optimizer.spans_batch import memoise_spans_effects, prepare_spans_effects
from costmodel.optimizer.stage_builder import COLUMNS, StageBuilder
from costmodel.optimizer.timer import Timer
from topologies.hardware import load_system
from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.scenario import DEFAULT_SCENARIO, OptimizerSpec

TINY = dict(
    name="tiny", num_layers=8, hidden_size=64, ffn_hidden_size=128, vocab_size=256, tie_embeddings=True,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
    moe=dict(num_experts=8, topk=2, expert_ffn_hidden_size=32, first_dense_layers=1),
)
SYSTEM = load_system("gb300-nvl72")


def _fingerprint(plan) -> list:  # noqa: ANN001 - an OptimizerPlan
    """Everything a plan's stages hold, exactly (floats by bytes)."""
    out: list = []
    for sp in plan.stages:
        t = sp.ranks
        out += [tuple(sp.buckets), sp.bucket_calls, sp.padding_overhead, sp.critical_rank,
                tuple(np.asarray(a).tobytes() for a in (t._ints, t._floats, t._parts)),
                tuple(sp.collectives), tuple(sp.collective_times_s)]
        for r in sp.roles:
            out += [r.owner.dtype.str, r.owner.tobytes(),
                    tuple((tuple(buf.names), idx.tobytes()) for buf, idx in r.name_parts),
                    tuple((tuple(tuple(c) for c in calls), idx.tobytes()) for calls, idx in r.call_parts)]
    return out


def _both(monkeypatch: pytest.MonkeyPatch, make) -> tuple[list, list]:  # noqa: ANN001 - () -> OptimizerPlan
    """The plan ``make()`` builds with the one-pass preparation, and without it (buffer by buffer)."""
    plan_mod.clear_caches()
    batched = _fingerprint(make())
    plan_mod.clear_caches()
    with monkeypatch.context() as m:
        m.setattr(plan_mod, "_prepare", lambda *args: None)
        alone = _fingerprint(make())
    plan_mod.clear_caches()
    return batched, alone


SPECS = [
    OptimizerSpec(kind="muon"),
    OptimizerSpec(kind="muon", bucket_size_elements=3000),  # stage 0 chunk 0: many layer-wise chunks
    OptimizerSpec(kind="muon", bucket_size_elements=3000, load_balance="ping_pong"),
    OptimizerSpec(kind="muon", bucket_size_elements=5000, load_balance="none"),
    OptimizerSpec(kind="muon", overlap_grad_reduce=False),
    OptimizerSpec(kind="adamw"),
    OptimizerSpec(kind="adamw", bucket_size_elements=2000),  # several element-wise buckets per buffer
    OptimizerSpec(kind="adamw", bucket_size_elements=2000, num_distributed_optimizer_instances=2),
]
GRIDS = [Grid(dp=4, expert_dp=2, ep=2), Grid(dp=8, expert_dp=2, ep=4), Grid(dp=2, expert_dp=1, ep=2)]


@pytest.mark.parametrize("vpp", [1, 2])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("spec", SPECS)
def test_one_pass_equals_buffer_by_buffer_tiny(monkeypatch: pytest.MonkeyPatch, spec: OptimizerSpec, grid: Grid,
                                                vpp: int) -> None:
    if spec.num_distributed_optimizer_instances > 1:
        grid = Grid(dp=grid.dp, expert_dp=grid.expert_dp, ep=grid.ep, instances=spec.num_distributed_optimizer_instances)
        if grid.size("expert_dp") < 1:
            pytest.skip("expert_dp below the instances")
    inv = build_inventory(ModelSpec.model_validate(TINY), pp=2, vpp=vpp, ep=grid.ep)
    batched, alone = _both(monkeypatch, lambda: plan_from_inventory(inv, spec, grid, SYSTEM))
    assert batched == alone


@pytest.mark.parametrize(("model", "layout"), [
    ("kimi-k2", (1, 4, 2, 1, 16, 1)), ("kimi-k2", (4, 8, 1, 1, 4, 4)), ("kimi-k2", (2, 2, 1, 1, 64, 1)),
    ("llama3.1-405b", (8, 8, 2, 1, 1, 1)), ("llama3.1-405b", (4, 16, 2, 2, 1, 1)),
])
@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_one_pass_equals_buffer_by_buffer_models(monkeypatch: pytest.MonkeyPatch, model: str, layout: tuple,
                                                  optimizer: str) -> None:
    tp, pp, vpp, cp, ep, etp = layout
    gpus = 256 if model == "kimi-k2" else 1024
    scenario = DEFAULT_SCENARIO.resolve().with_updates(model=model, gpus=gpus, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep,
                                                       etp=etp, optimizer=optimizer)
    batched, alone = _both(monkeypatch, lambda: plan_mod.build_optimizer_plan(scenario))
    assert batched == alone


@pytest.mark.parametrize("critical_only", [False, True])
@pytest.mark.parametrize("precision", ["fp8-cs", "mxfp8"])
def test_one_pass_equals_buffer_by_buffer_fp8_params(monkeypatch: pytest.MonkeyPatch, precision: str,
                                                      critical_only: bool) -> None:
    """FP8 parameters in buffers of their own (AdamW, fp8_param_gather), BF16 first and last layers."""
    spec, grid = OptimizerSpec(kind="adamw", fp8_param_gather=True, bucket_size_elements=4000), Grid(dp=4, expert_dp=2, ep=2)
    inv = build_inventory(ModelSpec.model_validate(TINY), pp=2, vpp=2, ep=2)
    batched, alone = _both(monkeypatch, lambda: plan_from_inventory(
        inv, spec, grid, SYSTEM, precision=precision, bf16_layers=(1, 1), critical_only=critical_only))
    assert batched == alone
    assert any(b.param_dtype == "fp8" for b in plan_from_inventory(
        inv, spec, grid, SYSTEM, precision="fp8-cs", bf16_layers=(1, 1)).stages[0].buckets)


def test_spans_effects_by_hand() -> None:
    """Each buffer's spans effect, made in the plan's one pass and alone (memoise_spans_effects of the
    one buffer, as StageBuilder.layer_wise_current asks on a miss),
    is what stepping its spans whole by their owners adds: per span, rank and column the rows of the
    span's items owned by the rank (StageBuilder.muon_item), added one item after the other in item
    order (bit for bit); the items stepped, their owners, and per span its padded and used numel and
    its last backprop position."""
    spec, grid = OptimizerSpec(kind="muon", bucket_size_elements=3000), Grid(dp=4, expert_dp=2, ep=2)
    inv = build_inventory(ModelSpec.model_validate(TINY), pp=2, vpp=2, ep=2)
    timer, st = Timer(SYSTEM, spec.matmul_precision, None), NsSettings.from_spec(spec)
    stages = [(s, _stage_buffers(inv, s, "muon", None, None)) for s in range(inv.pp)]
    prepare_spans_effects(StageBuilder(0, grid, spec, timer, st), stages, "lpt")
    checked = 0
    for s, buffers in stages:
        b = StageBuilder(s, grid, spec, Timer(SYSTEM, spec.matmul_precision, None), st)
        for buf in buffers:
            sel = np.flatnonzero(buf.muon)
            gs, bucket_size = grid.size(buf.group), b.bucket_size(buf.chunk)
            spans = lay.layer_wise_layout(buf.numel[sel], buf.cost[sel], gs, bucket_size, "lpt", isolate=buf.shared[sel])
            key = (id(buf.numel), len(sel), gs, bucket_size, "lpt")
            numel, one = timer.spans_effects[key]
            memoise_spans_effects(b, [(key, buf, sel, gs, bucket_size)], "lpt")  # alone, on its own timer
            alone_numel, alone = b.timer.spans_effects[key]
            assert numel is buf.numel and alone_numel is buf.numel and alone is not one
            ncol = len(COLUMNS)
            hand = np.zeros((len(spans), ncol, gs))
            owners, buckets = [], []
            for j, span in enumerate(spans):
                assert span.owner is not None
                for i, owner in zip(sel[span.first:span.stop].tolist(), span.owner.tolist(), strict=True):
                    row = b.muon_item(buf.unique[buf.tid[i]])[0]
                    for c in range(ncol):
                        hand[j, c, owner] += row[c]
                    owners.append(owner)
                buckets.append((span.numel, span.used, int(buf.position[sel[span.first:span.stop]].max())))
            calls = [b.muon_item(t)[1] if m else () for t, m in zip(
                buf.unique, [bool(buf.muon[buf.tid == k].any()) for k in range(len(buf.unique))], strict=True)]
            for effect in (one, alone):
                sums = effect.sums if len(spans) > 1 else effect.sums[None]
                assert sums.shape == hand.shape and np.ascontiguousarray(sums).tobytes() == hand.tobytes()
                assert effect.picked.tolist() == sel.tolist() and effect.owners.tolist() == owners
                assert effect.buckets == buckets and effect.calls == calls
            checked += 1
    assert checked >= 4 and any(len(e.buckets) > 2 for _, e in timer.spans_effects.values())


def _adam_by_hand(b: StageBuilder, span: lay.BucketSpan, numel: np.ndarray, gs: int) -> list[list[float]]:
    """The rows of fused Adam on each of the ``gs`` equal shards of bucket ``span``, by their
    definition: a rank's elements are those of the parameters inside its shard (overlaps counted
    one parameter at a time), its pieces the parameters of at least one element intersecting it,
    ⌈elements / 65536⌉ + pieces − 1 chunks (0 with no piece), one launch per piece and per-piece
    kernel, and per kernel max(bytes · s/B, pieces · minimum kernel s) seconds."""
    shard = span.numel // gs
    out = []
    for r in range(gs):
        lo, hi = r * shard, (r + 1) * shard
        elements = pieces = 0
        for start, n in zip(span.starts.tolist(), numel[span.first:span.stop].tolist(), strict=True):
            overlap = max(0, min(hi, start + n) - max(lo, start))
            elements += overlap
            pieces += overlap > 0
        chunks = -(-elements // 65536) + pieces - 1 if pieces else 0
        seconds = 0.0
        for per_byte in b.adam.piece_kernels:
            seconds += max(per_byte * elements * b.timer.s_per_byte, pieces * b.timer.min_s)
        out.append([elements, elements, pieces, chunks, pieces, chunks, len(b.adam.piece_kernels) * pieces, seconds])
    return np.array(out, dtype=np.float64).T.tolist()


def test_adam_rows_by_hand() -> None:
    """Parameters [0, 30), [30, 60), [60, 100) of a 100-element bucket over 4 shards of 25: rank 0
    holds 25 elements of the first, rank 1 5 + 20 of the first two, rank 2 10 + 15 of the last two,
    rank 3 25 of the last; a zero-size parameter is no piece."""
    spec = OptimizerSpec(kind="adamw")
    b = StageBuilder(0, Grid(dp=4, expert_dp=4), spec, Timer(SYSTEM, spec.matmul_precision, None),
                     NsSettings.from_spec(spec))
    span = lay.BucketSpan(0, 4, 100, 100, np.array([0, 30, 60, 100]))
    rows = adam_rows(b, [(span, np.array([30, 30, 40, 0]), 4)])
    assert rows[0].tolist() == rows[1].tolist() == [25, 25, 25, 25]
    assert rows[2].tolist() == rows[4].tolist() == [1, 2, 2, 1]
    assert rows[3].tolist() == rows[5].tolist() == [1, 2, 2, 1]
    assert rows.tolist() == _adam_by_hand(b, span, np.array([30, 30, 40, 0]), 4)


def test_adam_rows_side_by_side_by_hand() -> None:
    """The Adam values of many buckets at once (over dp and expert_dp, padded, isolated, one bucket
    or several per buffer) are, bucket by bucket, their definition (:func:`_adam_by_hand`) and each
    bucket's values alone, bit for bit; every parameter element is in
    exactly one shard."""
    rng = random.Random(7)
    spec, grid = OptimizerSpec(kind="adamw"), Grid(dp=8, expert_dp=4, ep=2)
    b = StageBuilder(0, grid, spec, Timer(SYSTEM, spec.matmul_precision, None), NsSettings.from_spec(spec))
    buckets = []
    for _ in range(60):
        numel = np.array([rng.choice([0, 1, 7, 64, 100, 4096, 70_000, 300_000]) for _ in range(rng.randint(1, 12))],
                         dtype=np.int64)
        isolate = np.array([rng.random() < 0.1 for _ in numel])
        gs = rng.choice([grid.size("dp"), grid.size("expert_dp"), 1, 3])
        for span in lay.ddp_buckets(numel, gs, rng.choice([None, 5000, 200_000]), distributed_optimizer=True,
                                    isolate=isolate):
            buckets.append((span, numel, gs))
    for sizes in ([4096, 100, 7, 65536, 1000, 3], [100, 3, 5000, 64, 1, 777]):  # one bucket per dp
        for d in (1, 2, 3, 8, 48, 128, 256):
            buckets.append((lay.ddp_buckets(np.array(sizes), d, None, distributed_optimizer=True)[0], np.array(sizes), d))
    rows, at = adam_rows(b, buckets), 0
    for span, numel, gs in buckets:
        got, hand = rows[:, at:at + gs], np.array(_adam_by_hand(b, span, numel, gs))
        assert got.tobytes() == hand.tobytes()
        assert got[0].sum() == numel[span.first:span.stop].sum()
        assert got.tobytes() == adam_rows(b, [(span, numel, gs)]).tobytes()
        at += gs
    assert at == rows.shape[1]


def _items_by_hand(buf, kind: str) -> dict[str, list]:  # noqa: ANN001 - a _Buffer
    """The buffer's per-item values from its parts, one item at a time (the definition: each part's
    layers in order, in each layer its pattern's entries, each entry's copies; Muon items only
    under the Muon optimizer ``kind``)."""
    unique: list = []
    out: dict[str, list] = {k: [] for k in ("numel", "cost", "muon", "position", "tid", "shared")}
    for part in buf.parts:
        for layer in range(len(part.layers)):
            for _, t, copies, at in part.pattern:
                if all(u is not t for u in unique):
                    unique.append(t)
                for c in range(copies):
                    out["numel"].append(t.local_numel)
                    shape = t.local_shape
                    out["cost"].append(max(shape) * min(shape) ** 2 if len(shape) == 2 else t.local_numel)
                    out["muon"].append(kind == "muon" and t.optimizer == "muon")
                    out["position"].append(part.position + layer * part.per_layer + at + c)
                    out["tid"].append(next(i for i, u in enumerate(unique) if u is t))
                    out["shared"].append(t.shared_embedding)
    assert tuple(unique) == buf.unique
    return out


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("kind", ["muon", "adamw"])
def test_buffers_of_all_stages_at_once_equal_the_definition(kind: str, fp8: bool) -> None:
    """The buffers of every stage made in one pass (plan._stages_buffers) hold, item by item, what
    their parts define, read-only; made stage by stage and chunk by chunk they are the same."""
    from costmodel.optimizer import buffers
    from costmodel.optimizer.plan import _stages_buffers
    from workloads.fp8_params import is_fp8_param

    inv = build_inventory(ModelSpec.model_validate(TINY), pp=2, vpp=2, ep=2)
    fp8_of = (lambda t, layer: is_fp8_param(t, inv.model.num_layers, (1, 1), layer)) if fp8 else None
    key = (1, 1) if fp8 else None
    buffers.clear_memo()
    plan_mod._BUFFERS.clear()
    together = _stages_buffers(inv, [0, 1], kind, fp8_of, key)
    assert sum(len(b) for b in together.values()) >= 8 and (not fp8 or any(b.fp8 for b in together[0]))
    for s, bufs in together.items():
        buffers.clear_memo()
        alone = [b for c in range(inv.vpp) for b in buffers.chunk_buffers(inv.chunk_runs(s, c), c, kind, fp8_of)]
        assert len(alone) == len(bufs)
        for a, b in zip(alone, bufs, strict=True):
            want = _items_by_hand(b, kind)
            for name, values in want.items():
                got, other = getattr(b, name), getattr(a, name)
                assert got.tolist() == values and not got.flags.writeable, name
                assert other.dtype == got.dtype and np.array_equal(other, got), name
            assert (a.chunk, a.group, a.fp8, a.unique, a.names) == (b.chunk, b.group, b.fp8, b.unique, b.names)
            # the item selections every pass and stage of a plan reads: made once, read-only
            muon = want["muon"]
            assert b.muon_items.tolist() == [i for i, m in enumerate(muon) if m] and b.muon_items is b.muon_items
            assert b.adam_items.tolist() == [i for i, m in enumerate(muon) if not m]
            assert b.all_items.tolist() == list(range(len(muon)))
            assert not any(x.flags.writeable for x in (b.muon_items, b.adam_items, b.all_items))
            assert b.muon.dtype == bool and b.numel.dtype == np.int64 and b.position.dtype == np.int64
    plan_mod._BUFFERS.clear()

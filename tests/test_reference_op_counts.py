"""Every operator the reference's optimizer step dispatches, against the cost model's kernel lists.

Deterministic (a ``TorchDispatchMode`` records operator names, no timing): per Muon tensor the
reference runs exactly the model's kernels (``muon_tensor_kernels``: 36 for a plain matrix, 104 for a
split QKV, each out-of-place ``addmm`` with its nested copy of ``self``, counted as ``addmm.copy_``) plus its own ``buf.clone()`` (``reference_clone_kernels``), per element-wise AdamW shard
the 8 operators of ``eager_adam_kernels`` plus the copy to the model parameter; the rest are views
(metadata, no kernel) and, for the QKV split, three ``_unsafe_view`` (the metadata half of
``reshape`` on a copy). Hand counts below follow ``reference/muon_math.py`` and
``reference/newton_schulz.py`` line by line.
"""

from __future__ import annotations

from collections import Counter

import pytest

from costmodel.calibrate.reference_check import _items, reference_clone_kernels, reference_plan
from costmodel.optimizer.kernel_sequence import (
    eager_adam_kernels,
    kernel_count,
    muon_tensor_kernels,
)
from costmodel.optimizer.newton_schulz import NsSettings, tensor_ns_work
from reference.config import make_config
from reference.op_count import optimizer_for_rank, record_optimizer_step
from reference.workload import load_shapes

# muon_prepare: p.add_ (decay), buf.lerp_, buf.clone(); newton_schulz: F.normalize = linalg_vector_norm,
# clamp_min, div; X.to(bf16); 5 x (X @ X.mT = mm, addmm(A, A, A), addmm(X, B, X), each addmm with its
# nested copy of self into the output); X.to(fp32);
# scale_update: 2 mul; muon_apply: p.add_; bucket.param(name).copy_(master)
PLAIN = Counter({"add_": 2, "lerp_": 1, "clone": 1, "linalg_vector_norm": 1, "clamp_min": 1, "div": 1,
                 "_to_copy": 2, "mm": 5, "addmm": 10, "addmm.copy_": 10, "mul": 2, "copy_": 1})
# bucket.grad / bucket.param: slice + view each; F.normalize: expand; X.mT per iteration; a tall matrix
# (rows > cols) is transposed in and out
PLAIN_VIEWS = Counter({"slice": 2, "view": 2, "expand": 1, "transpose": 5})
TALL_VIEWS = PLAIN_VIEWS + Counter({"transpose": 2})
# split_qkv: reshape (view) + split + per part reshape of a non-contiguous view = clone + _unsafe_view;
# NS + scale per part; merge_qkv: 3 reshape views, cat, reshape view
QKV = Counter({"add_": 2, "lerp_": 1, "clone": 1 + 3, "_unsafe_view": 3, "linalg_vector_norm": 3, "clamp_min": 3,
               "div": 3, "_to_copy": 6, "mm": 15, "addmm": 30, "addmm.copy_": 30, "mul": 6, "cat": 1, "copy_": 1})
# adamw_step with the decay factor tensor: p.mul_, m.lerp_, v.mul_, addcmul_, sqrt, / bias, add_ eps, addcdiv_;
# then the copy into the model parameter shard
ADAM_SHARD = Counter({"mul_": 2, "lerp_": 1, "addcmul_": 1, "sqrt": 1, "div": 1, "add_": 1, "addcdiv_": 1, "copy_": 1})
METADATA = {"_unsafe_view"}


@pytest.fixture(scope="module")
def tiny_dense_step():  # noqa: ANN201
    cfg = make_config(world_size=1, shapes="tiny-dense", check=False)
    opt = optimizer_for_rank(cfg, 0)
    opt.step(1)  # state created; the recorded step is a steady one
    return cfg, opt, record_optimizer_step(opt, 2)


def test_reference_operators_per_tensor_by_hand(tiny_dense_step) -> None:  # noqa: ANN001
    """Operator histograms per Muon tensor and per AdamW shard equal the hand counts above."""
    _, opt, rec = tiny_dense_step
    seen = set()
    for label in rec.labels():
        compute, views = rec.compute.get(label, Counter()), rec.views.get(label, Counter())
        if label.startswith("shard"):
            assert compute == ADAM_SHARD and views == Counter({"slice": 2})
            seen.add("shard")
            continue
        spec = opt.specs[label]
        if spec.qkv_groups:
            assert compute == QKV and sum(views.values()) == 28
            seen.add("qkv")
        else:
            rows, cols = spec.local_shape
            assert compute == PLAIN and views == (TALL_VIEWS if rows > cols else PLAIN_VIEWS)
            seen.add("tall" if rows > cols else "plain")
    assert seen == {"shard", "qkv", "plain", "tall"}
    assert "(step)" not in rec.compute  # nothing dispatched outside the per-tensor updates


def test_reference_kernels_equal_the_model_plus_the_reference_clone(tiny_dense_step) -> None:  # noqa: ANN001
    """Per tensor, the reference's computing operators = the cost model's kernels (36 / 104) + the clone."""
    cfg, opt, rec = tiny_dense_step
    inventory, spec, _ = reference_plan(load_shapes("tiny-dense"), cfg.model_dump(mode="json"))
    items = _items(inventory)
    st = NsSettings.from_spec(spec)
    for label in rec.labels():
        ops = sum(n for op, n in rec.compute[label].items() if op not in METADATA)
        if label.startswith("shard"):
            assert ops == kernel_count(eager_adam_kernels(1, 1000.0)) == 9
            continue
        tensor = items[label]
        model = kernel_count(muon_tensor_kernels(tensor, tensor_ns_work(tensor, st), st))
        clone = kernel_count(tuple(reference_clone_kernels([tensor.local_numel], nesterov=False)))
        assert ops == model + clone
        assert model == (104 if opt.specs[label].qkv_groups else 36)

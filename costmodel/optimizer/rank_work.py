"""Per-GPU optimizer-step work of a stage: one :class:`RankWork` per class of identical GPUs.

Internal to :mod:`costmodel.optimizer.plan` (its tables go to :meth:`StageBuilder.finish`): a stage's
accumulated per-rank columns (:data:`costmodel.optimizer.plan_types.COLUMNS`) of its dense and
expert roles, summed per (dense index, expert index) class, become the kernel launches by part,
the GPU and host-issue seconds of each class's optimizer step (seconds are modelled GPU times).
"""

from __future__ import annotations

import numpy as np

from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer.elementwise import PARAM_BYTES
from costmodel.optimizer.plan_types import KERNEL_PARTS, RankTable
from costmodel.optimizer.stage_builder import COLUMNS, Grid, StageBuilder, Timer, _Role
from topologies.hardware import SystemSpec

__all__ = ["host_adam_s", "rank_work", "rank_works"]


def _role_extras(roles: list[_Role], cols: np.ndarray, timer: Timer,
                 adam_bytes: float = ks.ADAM_BYTES_PER_ELEMENT) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(fused-Adam launches, their GPU s, legacy gather-copy launches, their GPU s) of some ranks of a
    role in each of some stages, ``cols`` being their accumulators (stages × columns × ranks: each
    stage's ``role.acc[:, ranks]``; ``roles``: that role in each stage; ``adam_bytes``: HBM bytes per
    element of the fused Adam kernel); stages × ranks each."""
    adam = ks.multi_tensor_launches(cols[:, _ADAM_PIECES], cols[:, _ADAM_CHUNKS], 4)
    adam_s = np.where(adam > 0, timer.floored_s(adam, adam_bytes * cols[:, _ADAM_NUMEL]), 0.0)
    copies = np.zeros(adam.shape)
    copy_s = np.zeros(adam.shape)
    for at, role in enumerate(roles):
        if role.gather_items:  # legacy: flatten the owned parameters, copy back every other one
            owned = cols[at, _OWNED]
            stage_copies = role.gather_items - cols[at, _ITEMS]
            copy_s[at] = (timer.floored_s(stage_copies, 4.0 * (role.gather_numel - owned))
                          + timer.floored_s(1, 4.0 * owned))
            copies[at] = stage_copies + 1
    return adam, adam_s, copies, copy_s


_OWNED, _ADAM_PIECES, _ADAM_CHUNKS, _ADAM_NUMEL, _ITEMS = (COLUMNS.index(c) for c in (
    "owned", "adam_pieces", "adam_chunks", "adam_numel", "items"))


def host_adam_s(numel: np.ndarray, grad_bytes: int, system: SystemSpec | None) -> np.ndarray:
    """Seconds of an AdamW step offloaded to the host (``optimizer_cpu_offload``) on ``numel`` elements:
    the gradient shard down the host link (``grad_bytes`` each), Adam on the host's memory (the fp32
    state traffic of the fused kernel, ``ADAM_BYTES_PER_ELEMENT``) and the bf16 parameters back up,
    one after the other (Megatron's hybrid device optimizer pipelines them per parameter group; not
    modelled: an upper bound)."""
    if system is None:
        return np.zeros(np.shape(numel))
    link, mem = system.gpu.host_link_Bps, system.gpu.host_memory_Bps
    return numel * ((grad_bytes + PARAM_BYTES) / link + ks.ADAM_BYTES_PER_ELEMENT / mem)


_CLASSES: dict[Grid, tuple[np.ndarray, ...]] = {}


def gpu_classes(g: Grid) -> tuple[np.ndarray, ...]:
    """(class keys, first GPU, GPUs, dense index, expert index) of each distinct (dense index, expert
    index) pair of a stage's GPUs under grid ``g`` (memoised per grid, read-only)."""
    hit = _CLASSES.get(g)
    if hit is None:
        gpu = np.arange(g.gpus_per_stage)
        d, e = gpu // g.tp % g.size("dp"), gpu // (g.etp * g.ep) % g.size("expert_dp")  # instances work alike
        keys, first, counts = np.unique(d * g.expert_dp + e, return_index=True, return_counts=True)
        hit = (keys, first, counts, d[first], e[first])
        for a in hit:
            a.setflags(write=False)
        if len(_CLASSES) >= 1024:
            _CLASSES.clear()
        _CLASSES[g] = hit
    return hit


def rank_work(b: StageBuilder) -> RankTable:
    """The :func:`rank_works` of one stage."""
    return rank_works([b])[0]


def rank_works(builders: list[StageBuilder]) -> list[RankTable]:
    """One RankWork per distinct (dense index, expert index) pair of the GPUs of each stage (only
    the slowest one's with ``critical_only``), for stages of one plan (one grid, optimizer spec
    and timer: ``builders[0]``'s), computed for every stage at once along a stage axis (each
    element takes the same float operations as one stage alone would).

    A GPU's optimizer step is one eager kernel stream after the gradient-norm synchronisation:
    per-tensor kernels of both roles, the fused-Adam launches of each role's optimizer, one
    gradient-norm pass over all its main gradients, and (legacy layout) the gather copies;
    ``RankWork.total_s`` takes the larger of its GPU time and its host issue time.
    """
    if not builders:
        return []
    b = builders[0]
    g, timer = b.grid, b.timer
    _, first, counts, dd, ee = gpu_classes(g)
    dense, expert = [x.roles["dp"] for x in builders], [x.roles["expert_dp"] for x in builders]
    d_cols = np.stack([r.acc for r in dense])[:, :, dd]  # stages × columns × GPU classes
    e_cols = np.stack([r.acc for r in expert])[:, :, ee]
    summed = d_cols + e_cols  # every column of both roles, per GPU class

    def both(name: str) -> np.ndarray:
        return summed[:, COLUMNS.index(name)]

    owned, ns_kernels, copies_per_piece = both("owned"), both("ns_kernels"), len(b.adam.piece_kernels)
    adam_d, adam_d_s, gather_d, gather_d_s = _role_extras(dense, d_cols, timer, b.adam.fused)
    adam_e, adam_e_s, gather_e, gather_e_s = _role_extras(expert, e_cols, timer, b.adam.fused)
    norm_pieces = both("norm_pieces")
    norm = ks.multi_tensor_launches(norm_pieces, both("norm_chunks"), 1)
    norm_s = np.where(norm > 0, timer.floored_s(norm, ks.NORM_BYTES_PER_ELEMENT * owned)
                      + ks.GRAD_NORM_EXTRA * timer.min_s, 0.0)
    norm = np.where(norm > 0, norm + ks.GRAD_NORM_EXTRA, 0.0)
    adam_copies = copies_per_piece * both("adam_pieces")
    parts = {"newton_schulz_gemm": ns_kernels, "muon_elementwise": both("kernels") - ns_kernels - adam_copies,
             "adam_multi_tensor": adam_d + adam_e, "adam_param_copy": adam_copies, "grad_norm": norm,
             "gather_copy": gather_d + gather_e}
    kernels = sum(parts.values())
    ew_s = both("ew_s") + adam_d_s + adam_e_s + norm_s + gather_d_s + gather_e_s
    if b.spec.optimizer_cpu_offload:  # AdamW on the host: its GPU kernels give way to the copies and host time
        ew_s = norm_s + gather_d_s + gather_e_s + host_adam_s(both("adam_numel"), b.gb, timer.system)
        kernels = kernels - parts["adam_multi_tensor"] - parts["adam_param_copy"]
        parts["adam_multi_tensor"] = parts["adam_param_copy"] = np.zeros(owned.shape)
    assert tuple(parts) == KERNEL_PARTS
    ns_s, tp_s, issue_s = both("ns_s"), both("tp_s"), kernels * timer.issue_s
    total_s = np.maximum(ns_s + ew_s + tp_s, issue_s)  # RankWork.step_s for every GPU class at once
    # the columns as they are: each RankWork is built when first read (RankTable); stages × rows × classes
    ints = np.empty((len(builders), 6, len(first)), dtype=np.int64)
    ints[:, :4] = np.stack([first, counts, dd, ee])
    ints[:, 4], ints[:, 5] = owned.astype(np.int64), both("muon_items").astype(np.int64)
    floats = np.stack([both("flops"), ns_s, ew_s, tp_s, issue_s, total_s], axis=1)
    parts_rows = np.stack(list(parts.values()), axis=1)  # float64 each
    tables = []
    for at, x in enumerate(builders):
        keep = slice(None)
        if x.critical_only:  # the slowest class alone (the first of equals, as max() picks it)
            top = int(np.argmax(total_s[at]))
            keep = slice(top, top + 1)
        tables.append(RankTable(ints[at][:, keep], floats[at][:, keep], parts_rows[at][:, keep]))
    return tables

"""Reference-backend runs against the cost model: per-phase times and the exact collective list.

A reference run (``muonsim reference run --out run.json``) measured, on local gloo processes, the
phase times of every rank and every collective each rank issued in one step. The cost model
predicts the same run from its own description of the work:

* **collectives**: :func:`costmodel.optimizer.expected_rank_collectives` on the same inventory,
  optimizer settings and group sizes, compared with each rank's list call by call (op, group,
  group size, dtype, bytes, count, phase): they must be identical;
* **Newton–Schulz and optimizer time** per rank: the Muon items the plan gives each rank
  (``StageOptimizerPlan.owned_tensors``), each as its kernel sequence
  (:func:`costmodel.optimizer.kernel_sequence.muon_tensor_kernels`: the NS GEMMs with FLOPs by
  ``workloads.flops.newton_schulz_flops``, normalisation, casts, scale, momentum, update, copy),
  plus the reference's AdamW on its element-wise shards (8 torch operations each), run eagerly on
  this machine: each kernel at its measured cost (GEMMs at the matmul rate and per-call cost over
  the NS efficiency, the rest at the eager dispatch cost plus bytes over the element-wise
  bandwidth), summed (the CPU executes what it dispatches), plus the host cost per NS call
  (``LocalMeasurements`` from ``muonsim calibrate --microbench``). Measured NS time is the
  ``newton_schulz`` phase minus the time blocked in its TP collectives (``ns_comm``); the
  ``optimizer`` phase (NS included) minus the same. Each comparison also carries the phase's thread
  CPU time when the run recorded it (on a shared machine a phase's wall time includes the time other
  processes held the core; its CPU time does not) and the FLOP-only prediction (NS FLOPs at the
  measured peak matmul rate, nothing else) for contrast. Each NS call whose previous call in the
  rank's step (model order, :func:`ns_shape_changes`) had another shape costs
  ``NewtonSchulzFit.shape_change_s`` more: the microbenchmark times its shapes in blocks of equal
  calls, a step changes shape between layers and roles. The reference's Python around the kernels
  (``update_param``, the orthogonaliser's layers), measured on a tiny matrix by ``calibrate
  --microbench`` (each call right after a main-path NS call, whose eviction the step's updates pay) (``LocalMeasurements.muon_update_host_s`` per Muon tensor,
  ``muon_orthogonalize_host_s`` per NS call), is added when the profile has it. The kernel sequence is Megatron's and EO's,
  plus the one copy per Muon tensor the reference makes and EO does not (without Nesterov,
  ``muon_prepare`` returns ``buf.clone()`` where EO reads the momentum buffer in place:
  :func:`reference_clone_kernels`), counted in the optimizer phase;
* **grad_reduce** per rank: the plan's gradient collectives at the measured gloo α-β (loopback
  figures: indicative only).

The reference run's shapes (``extra.config.shapes``) are resolved by the caller (the CLI, which may
import the reference package); this module never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.calibrate.profile import LocalMeasurements
from costmodel.kernels import KernelSpec
from topologies.inputs import UserInputError
from workloads.comm import CollectiveCall, merge_calls
from workloads.inventory import Inventory, build_inventory
from workloads.measured import MeasuredRun
from workloads.models import ModelSpec
from workloads.scenario import OptimizerSpec

NS_GOAL_PCT = 15.0
MATMUL_DTYPE = {"bf16": "bf16", "tf32": "fp32", "fp32": "fp32"}


@dataclass(frozen=True)
class PhaseComparison:
    """Measured vs predicted seconds of one phase on one rank (per step)."""

    phase: str
    rank: int
    measured_s: float
    predicted_s: float
    flop_only_s: float | None = None  # NS FLOPs / measured peak matmul rate: the model without kernels
    measured_cpu_s: float | None = None  # the phase's thread CPU time (immune to other processes on the cores)
    measured_faults: float | None = None  # the phase's minor page faults per step (reference.allocator)
    measured_preemptions: float | None = None  # the phase's involuntary context switches per step (other load)

    @property
    def cpu_error_pct(self) -> float:
        """Signed prediction error in percent of the measured CPU time (NaN when absent)."""
        if self.measured_cpu_s is None or self.measured_cpu_s <= 0:
            return math.nan
        return 100.0 * (self.predicted_s - self.measured_cpu_s) / self.measured_cpu_s

    @property
    def flop_only_error_pct(self) -> float:
        """Signed error of the FLOP-only prediction in percent (NaN when absent)."""
        if self.flop_only_s is None or self.measured_s <= 0:
            return math.nan
        return 100.0 * (self.flop_only_s - self.measured_s) / self.measured_s

    @property
    def error_pct(self) -> float:
        """Signed prediction error in percent of the measured time (NaN when nothing was measured)."""
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else math.nan


@dataclass(frozen=True)
class CollectiveDiff:
    """Calls one rank issued but the model does not expect, and the reverse."""

    rank: int
    missing: tuple[CollectiveCall, ...]  # expected by the model, not issued
    unexpected: tuple[CollectiveCall, ...]  # issued, not expected


@dataclass
class ReferenceCheck:
    """A reference run checked against the cost model: collectives per rank, phase seconds, NS FLOPs."""

    run_id: str
    world_size: int
    phases: list[PhaseComparison]
    ns_flops: dict[int, tuple[float, float]]  # rank -> (measured, predicted) per step
    calls_per_rank: dict[int, int]
    diffs: list[CollectiveDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def collectives_match(self) -> bool:
        """True when every rank issued exactly the collectives the cost model expects."""
        return not self.diffs

    def phase(self, name: str) -> list[PhaseComparison]:
        """The comparisons of phase ``name``, one per rank that measured it."""
        return [p for p in self.phases if p.phase == name]

    def summary_lines(self) -> list[str]:
        """Human-readable lines for the CLI."""
        total = sum(self.calls_per_rank.values())
        if self.collectives_match:
            lines = [f"collectives: exact match on all {self.world_size} ranks ({total} call kinds)"]
        else:
            lines = [f"collectives: MISMATCH on ranks {', '.join(str(d.rank) for d in self.diffs)}"]
            for d in self.diffs:
                for c in d.missing:
                    lines.append(f"  rank {d.rank} expected but not issued: {_call_text(c)}")
                for c in d.unexpected:
                    lines.append(f"  rank {d.rank} issued but not expected: {_call_text(c)}")
        for rank, (measured, predicted) in sorted(self.ns_flops.items()):
            same = "equal" if measured == predicted else f"predicted {predicted:.4g}"
            lines.append(f"rank {rank} Newton-Schulz FLOPs/step: measured {measured:.4g}, {same}")
        for p in self.phases:
            goal = f" (goal ±{NS_GOAL_PCT:.0f} %)" if p.phase in ("newton_schulz", "optimizer") else ""
            flop = (f"; FLOP-only {p.flop_only_s * 1e3:.3f} ms ({p.flop_only_error_pct:+.1f} %)"
                    if p.flop_only_s is not None else "")
            cpu = (f"; CPU time {p.measured_cpu_s * 1e3:.3f} ms, error {p.cpu_error_pct:+.1f} %"
                   if p.measured_cpu_s is not None else "")
            cpu += f"; {p.measured_faults:.0f} page faults" if p.measured_faults else ""
            cpu += f"; {p.measured_preemptions:.0f} preemptions" if p.measured_preemptions else ""
            lines.append(f"rank {p.rank} {p.phase}: measured {p.measured_s * 1e3:.3f} ms, predicted "
                         f"{p.predicted_s * 1e3:.3f} ms, error {p.error_pct:+.1f} %{goal}{cpu}{flop}")
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` form: collective diffs, per-phase seconds, NS FLOPs and notes."""
        return {
            "run_id": self.run_id, "world_size": self.world_size, "collectives_match": self.collectives_match,
            "calls_per_rank": self.calls_per_rank,
            "collective_diffs": [{"rank": d.rank, "missing": [c.to_dict() for c in d.missing],
                                  "unexpected": [c.to_dict() for c in d.unexpected]} for d in self.diffs],
            "ns_flops_per_step": {r: {"measured": m, "predicted": p} for r, (m, p) in self.ns_flops.items()},
            "phases": [{"phase": p.phase, "rank": p.rank, "measured_s": p.measured_s, "predicted_s": p.predicted_s,
                        "error_pct": p.error_pct, "measured_cpu_s": p.measured_cpu_s, "cpu_error_pct": p.cpu_error_pct,
                        "flop_only_s": p.flop_only_s, "measured_faults": p.measured_faults,
                        "measured_preemptions": p.measured_preemptions,
                        "flop_only_error_pct": p.flop_only_error_pct} for p in self.phases],
            "notes": self.notes,
        }


def _call_text(c: CollectiveCall) -> str:
    return f"{c.op} {c.group}[{c.group_size}] {c.dtype} {c.bytes} B ×{c.count} ({c.phase})"


def run_config(run: MeasuredRun) -> dict[str, Any]:
    """The reference run's configuration (``extra.config``), or a one-line error."""
    config = (run.extra or {}).get("config")
    if not isinstance(config, dict):
        raise UserInputError(f"run '{run.run_id}' has no extra.config; write it with 'muonsim reference run --out'")
    return config


def optimizer_spec(config: Mapping[str, Any]) -> OptimizerSpec:
    """The cost model's OptimizerSpec of a reference run configuration."""
    coefficients = config.get("ns_coefficients", "quintic")
    return OptimizerSpec(
        kind=config.get("optimizer", "muon"), distribution=config.get("distribution"),
        layer_wise_layout=config.get("layout", "current"), ns_steps=config.get("ns_steps", 5),
        ns_coefficients=coefficients, tp_mode=config.get("tp_mode", "blockwise"),  # the reference default
        matmul_precision=config.get("matmul_precision", "bf16"), split_qkv=config.get("split_qkv", True),
        load_balance=config.get("load_balance"), hide_param_gather=config.get("hide_param_gather", True),
        grad_reduce_dtype=config.get("grad_dtype", "fp32"), bucket_size_elements=config.get("bucket_size"),
    )


def reference_plan(model: ModelSpec, config: Mapping[str, Any]) -> tuple[Inventory, OptimizerSpec, Any]:
    """(inventory, OptimizerSpec, Grid) of a reference run: pp = ep = 1, dp = world / tp."""
    from costmodel.optimizer import Grid

    world, tp, etp = int(config.get("world_size", 2)), int(config.get("tp", 1)), int(config.get("etp", 1))
    inventory = build_inventory(model, tp=tp, pp=1, vpp=1, ep=1, etp=etp, split_qkv=config.get("split_qkv", True))
    grid = Grid(dp=world // tp, expert_dp=world // etp, tp=tp, etp=etp, ep=1)
    return inventory, optimizer_spec(config), grid


def _items(inventory: Inventory) -> dict[str, Any]:
    """Muon item name (tensor name, plus the expert index for experts) -> TensorSpec."""
    out: dict[str, Any] = {}
    for t in inventory.tensors:
        if t.num_experts > 1:
            for k in range(t.experts_per_rank):
                out[f"{t.name}{k}"] = t
        else:
            out[t.name] = t
    return out


def _rank_key(mapping: Mapping[Any, Any], rank: int) -> Any:
    return mapping.get(str(rank), mapping.get(rank))


def _reference_adam_kernels(plan: Any, inventory: Inventory, rank: int, muon_names: list[str],
                            items: dict[str, Any], grad_bytes: int) -> tuple[Any, ...]:
    """The reference backend's AdamW kernels on GPU ``rank``: one eager AdamW per element-wise bucket
    shard (its padded equal share) and per whole non-Muon parameter the rank owns."""
    from costmodel.optimizer.kernel_sequence import eager_adam_kernels

    tp = inventory.tp
    work = next(r for r in plan.ranks if r.dense_rank == rank // tp and r.expert_rank == rank // (inventory.etp * inventory.ep))
    shards = [b for b in plan.buckets if b.kind == "element_wise"]
    pieces = float(len(shards))
    numel = float(sum(b.numel // b.group_size for b in shards))
    if not shards:  # legacy / replicated: AdamW on the whole non-Muon parameters this rank owns
        whole = dict(work.kernel_counts).get("adam_param_copy", 0.0) / (1 + (grad_bytes != 4))
        pieces += whole
        numel += work.owned_numel - sum(items[n].local_numel for n in muon_names)
    return eager_adam_kernels(pieces, numel, grad_bytes)


def reference_clone_kernels(muon_numels: list[int], nesterov: bool) -> list[KernelSpec]:
    """The reference backend's extra copy per Muon tensor (``reference.muon_math.muon_prepare``:
    ``buf.clone()`` of the fp32 momentum, 4 B read + 4 B written per element) when Nesterov is off;
    none with Nesterov (``g.lerp(buf, ...)`` is EO's own kernel)."""
    if nesterov:
        return []
    return [KernelSpec("reference_momentum_clone", "memory", 1, bytes=8.0 * n) for n in muon_numels]


def ns_call_shapes(tensor: Any, st: Any) -> list[tuple[int, int]]:
    """The (rows, cols) of each Newton-Schulz call of one Muon item, in order: per component (Q, K, V
    of a split QKV), the local shard, or the whole component under ``duplicated`` TP of a sharded
    matrix (gathered first)."""
    if st.tp_mode == "duplicated" and tensor.shard_dim is not None and tensor.shards > 1:
        return [tuple(c) for c in tensor.muon_components]
    return [tuple(c) for c in tensor.local_muon_components]


def ns_shape_changes(shapes: list[tuple[int, int]]) -> int:
    """NS calls of a step whose previous call had another shape; the step's first call counts (the
    phases before the optimizer ran other code)."""
    return sum(1 for k, shape in enumerate(shapes) if k == 0 or shapes[k - 1] != shape)


@dataclass(frozen=True)
class RankKernels:
    """The kernels the cost model expects of one rank's optimizer step in a reference run."""

    names: list[str]  # Muon items the rank updates (plan order)
    works: list[Any]  # their NsWork
    muon: list[tuple[KernelSpec, ...]]  # kernel sequence per Muon item
    adam: tuple[KernelSpec, ...]  # eager AdamW on the rank's element-wise shards (or whole parameters)
    clones: list[KernelSpec]  # the reference's own momentum clone per Muon item
    ns_shape_changes: int = 0  # NS calls after a call of another shape, in the rank's step order

    @property
    def optimizer_kernels(self) -> list[KernelSpec]:
        """Every kernel of the optimizer phase."""
        return [k for ks in self.muon for k in ks] + list(self.adam) + self.clones


def reference_rank_kernels(model: ModelSpec, config: Mapping[str, Any], rank: int) -> RankKernels:
    """The cost model's kernels of rank ``rank``'s optimizer step in the reference run ``config``
    (``extra.config``): Muon per owned item, AdamW per shard, the reference's clones."""
    from costmodel.optimizer import plan_from_inventory

    inventory, spec, grid = reference_plan(model, config)
    return _rank_kernels(inventory, spec, plan_from_inventory(inventory, spec, grid).stages[0], config, rank)


def _rank_kernels(inventory: Any, spec: Any, plan: Any, config: Mapping[str, Any], rank: int) -> RankKernels:
    """:func:`reference_rank_kernels` from the run's inventory, optimizer spec and stage plan."""
    from costmodel.optimizer.kernel_sequence import muon_tensor_kernels
    from costmodel.optimizer.newton_schulz import NsSettings, tensor_ns_work

    items = _items(inventory)
    st = NsSettings.from_spec(spec)
    grad_bytes = 4 if config.get("grad_dtype", "fp32") == "fp32" else 2
    nesterov = bool(config.get("nesterov", False))
    names = plan.owned_tensors(rank) if spec.kind == "muon" else []
    works = [tensor_ns_work(items[name], st) for name in names]
    muon = [muon_tensor_kernels(items[n], w, st, grad_bytes=grad_bytes, nesterov=nesterov,
                                weight_decay=float(config.get("weight_decay", 0.01)) != 0.0)
            for n, w in zip(names, works, strict=True)]
    adam = _reference_adam_kernels(plan, inventory, rank, names, items, grad_bytes)
    clones = reference_clone_kernels([items[n].local_numel for n in names], nesterov)
    order = {name: k for k, name in enumerate(items)}  # definition order: the reference's update order
    shapes = [shape for n in sorted(names, key=order.__getitem__) for shape in ns_call_shapes(items[n], st)]
    return RankKernels(names, works, muon, adam, clones, ns_shape_changes(shapes))


def check_reference_run(run: MeasuredRun, local: LocalMeasurements, model: ModelSpec) -> ReferenceCheck:
    """Compare a reference run with the cost model's plan at this machine's measured rates."""
    from costmodel.optimizer import expected_rank_collectives, plan_from_inventory
    from costmodel.optimizer.kernel_sequence import orthogonalize_kernels

    config = run_config(run)
    extra = run.extra or {}
    inventory, spec, grid = reference_plan(model, config)
    world = grid.gpus_per_stage
    expected = expected_rank_collectives(inventory, spec, grid)
    by_rank = extra.get("collectives_by_rank") or {"0": run.collectives or []}
    diffs: list[CollectiveDiff] = []
    calls_per_rank: dict[int, int] = {}
    for rank in range(world):
        issued_raw = _rank_key(by_rank, rank)
        if issued_raw is None:
            continue
        issued = merge_calls(CollectiveCall(**c) for c in issued_raw)
        want = merge_calls(expected[rank])
        calls_per_rank[rank] = len(issued)
        if issued != want:
            diffs.append(CollectiveDiff(rank, tuple(c for c in want if c not in issued),
                                        tuple(c for c in issued if c not in want)))
    items = _items(inventory)
    plan = plan_from_inventory(inventory, spec, grid).stages[0]
    dtype = MATMUL_DTYPE[spec.matmul_precision]
    phases_by_rank = extra.get("phase_times_s_by_rank") or {"0": run.phase_times_s or {}}
    cpu_by_rank = extra.get("phase_cpu_s_by_rank") or {}
    faults_by_rank = extra.get("phase_minor_faults_by_rank") or {}
    preempt_by_rank = extra.get("phase_preemptions_by_rank") or {}
    flops_by_rank = extra.get("ns_flops_per_step_by_rank") or {}
    phases: list[PhaseComparison] = []
    ns_flops: dict[int, tuple[float, float]] = {}
    notes: list[str] = []
    for rank in range(world):
        measured = _rank_key(phases_by_rank, rank)
        if measured is None:
            continue
        rk = _rank_kernels(inventory, spec, plan, config, rank)
        names, works, muon = rk.names, rk.works, rk.muon
        flops = sum(w.flops for w in works)
        if _rank_key(flops_by_rank, rank) is not None:
            ns_flops[rank] = (float(_rank_key(flops_by_rank, rank)), flops)
        calls = sum(len(items[name].muon_components) for name in names)
        flop_only = flops / local.gemm_flops_per_s[dtype]
        comm = measured.get("ns_comm", 0.0)
        cpu = _rank_key(cpu_by_rank, rank) or {}
        faults = _rank_key(faults_by_rank, rank) or {}
        preempts = _rank_key(preempt_by_rank, rank) or {}
        ortho_host_s = calls * (local.muon_orthogonalize_host_s or 0.0)
        update_host_s = len(names) * (local.muon_update_host_s or 0.0)
        if works and measured.get("newton_schulz"):
            ns_s = local.kernels_time_s([k for ks in muon for k in orthogonalize_kernels(ks)], calls, dtype,
                                        rk.ns_shape_changes) + ortho_host_s
            phases.append(PhaseComparison("newton_schulz", rank, measured["newton_schulz"] - comm, ns_s, flop_only,
                                          cpu.get("newton_schulz"), faults.get("newton_schulz"),
                                          preempts.get("newton_schulz")))
        if measured.get("optimizer"):
            opt_s = local.kernels_time_s(rk.optimizer_kernels, calls, dtype, rk.ns_shape_changes) + ortho_host_s + update_host_s
            phases.append(PhaseComparison("optimizer", rank, measured["optimizer"] - comm, opt_s, flop_only,
                                          cpu.get("optimizer"), faults.get("optimizer"), preempts.get("optimizer")))
        if measured.get("grad_reduce"):
            reduce_calls = [c for c in expected[rank] if c.phase == "grad_reduce"]
            times = [local.collective_time_s(c.op, c.bytes) for c in reduce_calls]
            known = [t for t in times if t is not None]
            if reduce_calls and len(known) == len(times):
                predicted = sum(t * c.count for t, c in zip(known, reduce_calls, strict=True))
                phases.append(PhaseComparison("grad_reduce", rank, measured["grad_reduce"], predicted))
    if config.get("param_dtype", "bf16") != "bf16":
        notes.append(f"param_dtype {config.get('param_dtype')}: the cost model's parameter gathers assume bf16")
    if local.world_size != world:
        notes.append(f"collective α-β measured on {local.world_size} ranks, the run has {world}")
    return ReferenceCheck(run.run_id, world, phases, ns_flops, calls_per_rank, diffs, notes)

"""The reference backend's public API: run a configuration and get a :class:`RunResult`.

``run_reference(config)`` forks the ranks, runs, and assembles what they measured: the collectives
each rank issued per step (merged :class:`workloads.comm.CollectiveCall` lists, byte-exact), phase
times, Newton–Schulz FLOPs and GFLOP/s, the final global parameters and numerical checks against
the single-process reference (:mod:`reference.serial`). ``RunResult.to_measured_run()`` gives the
project's MeasuredRun (model ``reference-…``, system ``local-cpu``).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reference.config import RunConfig, make_config
from reference.runner import RankOutput, run_specs
from workloads.comm import CollectiveCall, merge_calls
from workloads.measured import MeasuredRun


@dataclass(frozen=True)
class RunResult:
    """What a reference run measured (times in seconds, FLOPs per step, bytes per collective)."""

    config: RunConfig
    collectives: list[CollectiveCall]  # rank 0, one steady step, merged
    collectives_by_rank: dict[int, list[CollectiveCall]]
    step_time_s: float  # mean over the timed steps, max over ranks
    phase_times_s: dict[str, float]  # per phase: mean per step, max over ranks
    phase_times_s_by_rank: dict[int, dict[str, float]]
    ns_flops_by_rank: dict[int, float]  # per step
    ns_gflops_per_s_by_rank: dict[int, float]
    params: dict[str, torch.Tensor] = field(repr=False)  # final global model parameters (fp32 view)
    checks: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def collectives_all_ranks(self) -> list[CollectiveCall]:
        """Every rank's calls of one step, merged (counts summed over ranks)."""
        return merge_calls(c for calls in self.collectives_by_rank.values() for c in calls)

    def to_measured_run(self) -> MeasuredRun:
        """The run in the project's measured-run schema."""
        cfg = self.config
        model = run_model_name(cfg)
        return MeasuredRun(
            run_id=f"{model}-{cfg.optimizer}-{cfg.resolved_distribution}-ws{cfg.world_size}-tp{cfg.tp}",
            source="muonsim reference backend", release="reference", model=model, system="local-cpu",
            num_gpus=cfg.world_size, precision="bf16", global_batch_size=cfg.dp, micro_batch_size=1,
            seq_length=cfg.forward_tokens, tp=cfg.tp, etp=cfg.etp, optimizer=cfg.optimizer,
            step_time_s=max(self.step_time_s, 1e-9),
            optimizer_distribution=cfg.resolved_distribution,
            muon_tp_mode=cfg.tp_mode if cfg.optimizer == "muon" else None,
            muon_ns_steps=cfg.ns_steps if cfg.optimizer == "muon" else None,
            overlap_param_gather=cfg.hide_param_gather,
            notes=(f"layout={cfg.layout} load_balance={cfg.resolved_load_balance} shapes={cfg.shapes} "
                   f"params={cfg.param_dtype} grads={cfg.grad_dtype} ns_matmul={cfg.matmul_precision} "
                   f"backend={cfg.backend}"),
            phase_times_s=self.phase_times_s,
            collectives=[c.to_dict() for c in self.collectives],
            extra={"checks": self.checks, **self.extra, "config": cfg.model_dump(mode="json")},
        )

    def write_json(self, path: str | Path) -> None:
        """Write the MeasuredRun JSON (whole file or nothing)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_measured_run().model_dump_json(indent=2, exclude_none=True), encoding="utf-8")
        tmp.replace(path)

    def summary_line(self) -> str:
        """One line: step time (ms), collectives per step, best NS GFLOP/s, checks."""
        ns = max(self.ns_gflops_per_s_by_rank.values(), default=0.0)
        return (f"step {self.step_time_s * 1e3:.2f} ms, {sum(c.count for c in self.collectives)} collectives/step "
                f"on rank 0, NS {ns:.1f} GFLOP/s, checks: {json.dumps(self.checks, default=str)}")


def run_model_name(cfg: RunConfig) -> str:
    """``reference-tiny`` etc. for presets, the model's own name for files."""
    from reference.workload import load_shapes

    return load_shapes(cfg.shapes).name


def _timed(values: list[float]) -> list[float]:
    """Drop the first (warm-up) step when there is more than one."""
    return values[1:] if len(values) > 1 else values


def _calls_of_step(out: RankOutput, step: int) -> list[CollectiveCall]:
    return merge_calls(CollectiveCall(**d) for s, d, _, _ in out.records if s == step)


@contextmanager
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def global_params(cfg: RunConfig, outputs: list[RankOutput]) -> tuple[dict[str, torch.Tensor], float]:
    """Assemble global parameters from the shards of ranks (dp 0 / expert-dp 0 replicas).

    Returns them and the largest difference between any rank's local copy and the assembled
    tensor's corresponding shard (0.0 when every replica agrees).
    """
    by_rank = {o.rank: o for o in outputs}
    params: dict[str, torch.Tensor] = {}
    worst = 0.0
    for spec in run_specs(cfg):
        if spec.shard_dim is None or spec.shards == 1:
            full = by_rank[0].params[spec.name]
        else:
            shards = [by_rank[r].params[spec.name] for r in range(spec.shards)]  # ranks 0..shards-1: tp/etp 0..
            full = torch.cat(shards, dim=spec.shard_dim)
        params[spec.name] = full
        for o in outputs:
            idx = 0
            if spec.shard_dim is not None and spec.shards > 1:
                idx = o.tp_rank if spec.shard_group == "tp" else o.etp_rank
            expect = full.chunk(spec.shards, dim=spec.shard_dim)[idx] if spec.shards > 1 and spec.shard_dim is not None else full
            worst = max(worst, (o.params[spec.name] - expect).abs().max().item())
    return params, worst


def compare(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
            initial: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max absolute difference, and max difference relative to the largest reference update."""
    diff = max((params[n] - reference[n]).abs().max().item() for n in reference)
    update = max((reference[n] - initial[n]).abs().max().item() for n in reference)
    return {"max_abs_diff": diff, "max_rel_update_diff": diff / update if update else 0.0}


def numerical_checks(cfg: RunConfig, params: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Compare a run's final parameters with the single-process reference (one thread, in-process)."""
    from reference.serial import SerialNS, initial_params, serial_reference

    sharded_tp = cfg.optimizer == "muon" and (cfg.tp > 1 or cfg.etp > 1)
    with _one_thread():
        initial = initial_params(cfg)
        same_math: SerialNS = "blockwise" if sharded_tp and cfg.tp_mode == "blockwise" else "full"
        ref = serial_reference(cfg, same_math)
        out: dict[str, Any] = {"serial_math": same_math, **compare(params, ref, initial)}
        out["bitwise_equal_serial"] = all(torch.equal(params[n], ref[n]) for n in ref)
        if same_math == "blockwise":
            full = serial_reference(cfg, "full")
            cmp = compare(params, full, initial)
            out["blockwise_vs_full_max_abs_diff"] = cmp["max_abs_diff"]
            out["blockwise_vs_full_max_rel_update_diff"] = cmp["max_rel_update_diff"]
    return out


def _phase_means(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per phase (sorted by name), the mean over the timed steps (:func:`_timed`) of a per-step
    figure (seconds, page faults, preemptions); a step without the phase counts 0."""
    names = sorted({k for p in steps for k in p})
    return {k: statistics.fmean(_timed([p.get(k, 0.0) for p in steps])) for k in names}


def assemble(cfg: RunConfig, outputs: list[RankOutput]) -> RunResult:
    """Turn the ranks' outputs into a RunResult (and run the numerical checks if configured)."""
    outputs = sorted(outputs, key=lambda o: o.rank)
    last = cfg.steps - 1
    by_rank = {o.rank: _calls_of_step(o, last) for o in outputs}
    steady = all(_calls_of_step(o, s) == by_rank[o.rank] for o in outputs for s in range(1, cfg.steps))
    phases_by_rank = {o.rank: _phase_means(o.phases_s) for o in outputs}
    cpu_by_rank = {o.rank: _phase_means(o.phases_cpu_s) for o in outputs if o.phases_cpu_s}
    faults_by_rank = {o.rank: _phase_means(o.phases_faults) for o in outputs if o.phases_faults}
    preempt_by_rank = {o.rank: _phase_means(o.phases_preemptions) for o in outputs if o.phases_preemptions}
    phase_names = sorted({k for p in phases_by_rank.values() for k in p})
    phases = {k: max(p.get(k, 0.0) for p in phases_by_rank.values()) for k in phase_names}
    step_time = max(statistics.fmean(_timed(o.step_times_s)) for o in outputs)
    ns_flops = {o.rank: statistics.fmean(_timed(o.ns_flops)) for o in outputs}
    ns_rate = {}
    for o in outputs:
        secs = sum(_timed(o.ns_seconds))
        ns_rate[o.rank] = sum(_timed(o.ns_flops)) / secs / 1e9 if secs > 0 else 0.0
    params, replica_diff = global_params(cfg, outputs)
    checks: dict[str, Any] = {"replicas_max_abs_diff": replica_diff, "collectives_same_every_step": steady}
    if cfg.check:
        checks.update(numerical_checks(cfg, params))
    wall: dict[tuple, list[float]] = defaultdict(list)
    for o in outputs:
        for s, d, w, _ in o.records:
            if s >= min(1, last):
                wall[(d["op"], d["group"], d["bytes"], d["dtype"], d["phase"])].append(w)
    extra = {
        "ns_gflops_per_s_by_rank": ns_rate, "ns_flops_per_step_by_rank": ns_flops,
        "phase_times_s_by_rank": phases_by_rank,
        "phase_cpu_s_by_rank": cpu_by_rank,
        "phase_minor_faults_by_rank": faults_by_rank,
        "phase_preemptions_by_rank": preempt_by_rank,
        "collective_wall_s": [{"op": k[0], "group": k[1], "bytes": k[2], "dtype": k[3], "phase": k[4],
                               "mean_s": statistics.fmean(v), "calls": len(v)} for k, v in sorted(wall.items())],
        "collectives_by_rank": {r: [c.to_dict() for c in calls] for r, calls in by_rank.items()},
        "padding_overhead": outputs[0].padding_overhead,
        "owned_by_rank": {o.rank: o.owned for o in outputs},
        "buckets": outputs[0].buckets,
    }
    return RunResult(config=cfg, collectives=by_rank[0], collectives_by_rank=by_rank, step_time_s=step_time,
                     phase_times_s=phases, phase_times_s_by_rank=phases_by_rank, ns_flops_by_rank=ns_flops,
                     ns_gflops_per_s_by_rank=ns_rate, params=params, checks=checks, extra=extra)


def run_reference(config: RunConfig | dict[str, Any]) -> RunResult:
    """Run a configuration on local forked gloo processes and assemble the result.

    Raises UserInputError for a bad configuration and ReferenceRunError (one line) when the run
    fails or times out.
    """
    from reference.processes import launch_local

    cfg = config if isinstance(config, RunConfig) else make_config(**config)
    return assemble(cfg, launch_local(cfg))

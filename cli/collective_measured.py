"""``muonsim collective OP --measured FILE``: the collective model against a user's nccl-tests output.

Every size in the file is predicted on the same group and placement as ``muonsim collective``.
``error_pct = 100 · (predicted busbw − measured busbw) / measured busbw`` (negative: the model is
slower than the cluster). It is computed from the times, ``measured time / predicted time − 1``,
which is the same ratio for one size (both sides use nccl-tests' bus factor) and does not suffer
from the file's two-decimal GB/s at small sizes. MAPE is the mean of ``|error_pct|`` over all sizes
and over sizes >= 1 MB (1e6 bytes), where latency no longer dominates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from cli.common import CliError, print_json

if TYPE_CHECKING:
    from topologies.collectives import CollectiveCost
    from topologies.groups import GroupShape
    from topologies.hardware import SystemSpec
    from topologies.nccl_tests import NcclTestsRun

LARGE_MIN_BYTES = 1e6  # MAPE is also reported over sizes at or above this (1 MB)


@dataclass(frozen=True)
class SizeCheck:
    """One size of the file: measured out-of-place time (s) and busbw (bytes/s) against the prediction."""

    measured_time_s: float
    measured_busbw_Bps: float
    predicted: CollectiveCost

    @property
    def error_pct(self) -> float | None:
        """Predicted vs measured busbw in % (from times); None when the model predicts no time (0 B)."""
        if self.predicted.time_s <= 0:
            return None
        return 100.0 * (self.measured_time_s / self.predicted.time_s - 1.0)


def mape_pct(checks: list[SizeCheck], min_size_bytes: float = 0.0) -> float | None:
    """Mean |error_pct| (%) over checks with size >= ``min_size_bytes`` (bytes); None if there are none."""
    errors = [c.error_pct for c in checks if c.predicted.size_bytes >= min_size_bytes and c.error_pct is not None]
    return sum(abs(e) for e in errors) / len(errors) if errors else None


def check_op(op: str, run: NcclTestsRun) -> None:
    """Raise CliError when the file's program is not ``op`` (or not a collective muonsim models)."""
    if run.program is None:
        return
    if run.collective is None:
        raise CliError(f"{run.source} is {run.program}_perf output, which muonsim does not model; "
                       "it models all_reduce, all_gather, reduce_scatter, alltoall, broadcast and sendrecv")
    if run.collective != op:
        raise CliError(f"{run.source} is {run.program}_perf output ({run.collective}) but the command asks "
                       f"for {op}; run 'muonsim collective {run.collective} --measured {run.source}'")


def resolve_gpus(gpus: int | None, group: str, run: NcclTestsRun) -> int:
    """GPUs in the job: ``--gpus`` if given, else the ranks the file lists."""
    from topologies.inputs import plural
    if gpus is not None:
        if group == "world" and run.ranks is not None and run.ranks != gpus:
            raise CliError(f"--gpus {gpus} but {run.source} ran on {plural(run.ranks, 'rank')}; drop --gpus or make them agree")
        return gpus
    if run.ranks is None:
        raise CliError(f"{run.source} lists no ranks ('#  Rank  0 Group  0 Pid ...' lines); pass --gpus")
    return run.ranks


def check_group_size(shape: GroupShape, group: str, run: NcclTestsRun) -> None:
    """Raise CliError if the file's rank count is not the size of the group being predicted."""
    from topologies.inputs import plural
    if run.ranks is not None and run.ranks != shape.size:
        raise CliError(f"{run.source} ran on {plural(run.ranks, 'rank')} but group '{group}' has {shape.size}; "
                       "choose --gpus/--group/--tp ... so the group has as many ranks as the file")


def compare_measured(op: str, run: NcclTestsRun, shape: GroupShape, system: SystemSpec,
                     algorithm: str | None) -> list[SizeCheck]:
    """Predict every size of ``run`` for ``op`` on ``shape`` (out-of-place measurements)."""
    from topologies.collectives import collective_cost

    return [SizeCheck(r.time_s, r.busbw_Bps, collective_cost(op, float(r.size_bytes), shape, system, algorithm))
            for r in run.rows]


def _device_note(run: NcclTestsRun, system: SystemSpec) -> str | None:
    gpu = system.gpu.name.split()[0]
    odd = [d for d in run.devices if gpu.lower() not in d.lower()]
    if odd:
        return f"the file ran on '{odd[0]}' but {system.name} has {system.gpu.name} GPUs"
    return None


def _pct(value: float | None, fmt: str = "+.1f") -> str:
    return "n/a" if value is None else f"{value:{fmt}}"


def report(op: str, run: NcclTestsRun, checks: list[SizeCheck], shape: GroupShape, system: SystemSpec,
           group: str, gpus: int, json_out: bool) -> None:
    """Print the comparison: an nccl-tests-style table and a MAPE line, or ``--json``."""
    from topologies.inputs import plural
    mape_all, mape_large = mape_pct(checks), mape_pct(checks, LARGE_MIN_BYTES)
    note = _device_note(run, system)
    if json_out:
        print_json({
            "op": op, "system": system.name, "gpus": gpus, "group": group, "group_size": shape.size,
            "domains": shape.domains, "ranks_per_domain": shape.ranks_per_domain, "fabric_tiers_crossed": shape.fabric_tiers,
            "measured": run.source, "measured_program": run.program, "measured_ranks": run.ranks,
            "measured_devices": list(run.devices), "notes": [note] if note else [],
            "mape_pct": mape_all, "mape_pct_from_1MB": mape_large,
            "results": [{
                "size_bytes": int(c.predicted.size_bytes), "time_s": c.predicted.time_s,
                "algbw_Bps": c.predicted.algbw_Bps, "busbw_Bps": c.predicted.busbw_Bps,
                "algorithm": c.predicted.algorithm, "detail": c.predicted.detail,
                "measured_time_s": c.measured_time_s, "measured_busbw_Bps": c.measured_busbw_Bps,
                "busbw_error_pct": c.error_pct} for c in checks],
        })
        return
    ranks = plural(run.ranks, "rank") if run.ranks is not None else "ranks not listed"
    source = f"{run.program}_perf, " if run.program else ""
    typer.echo(f"# {op} on {system.name}: group '{group}' of {plural(shape.size, 'rank')} over "
               f"{plural(shape.domains, 'NVLink domain')}, {shape.ranks_per_domain} per domain; measured: {run.source} ({source}{ranks})")
    if note:
        typer.echo(f"# note: {note}")
    typer.echo(f"# {'size (B)':>14} {'meas (us)':>11} {'pred (us)':>11} {'meas busbw':>10} {'pred busbw':>10} "
               f"{'error %':>8}  algorithm")
    for c in checks:
        p = c.predicted
        typer.echo(f"  {p.size_bytes:>14.0f} {c.measured_time_s * 1e6:>11.2f} {p.time_s * 1e6:>11.2f} "
                   f"{c.measured_busbw_Bps / 1e9:>10.2f} {p.busbw_Bps / 1e9:>10.2f} {_pct(c.error_pct):>8}  {p.detail}")
    n_large = sum(1 for c in checks if c.predicted.size_bytes >= LARGE_MIN_BYTES)
    typer.echo("# busbw in GB/s, out-of-place; error = predicted vs measured busbw (negative: model slower)")
    typer.echo(f"# MAPE {_pct(mape_large, '.1f')} % over {n_large} size(s) >= 1 MB, "
               f"{_pct(mape_all, '.1f')} % over all {len(checks)}")


def run_measured(op: str, path: str, system: str, gpus: int | None, group: str, algorithm: str | None,
                 parallel: dict[str, Any], json_out: bool) -> None:
    """The ``--measured`` path of ``muonsim collective`` (``parallel``: tp, pp, cp, ep, etp, gpus_per_domain)."""
    from topologies.hardware import load_system
    from topologies.nccl_tests import load_nccl_tests
    from topologies.placement import place_job

    run = load_nccl_tests(path)
    check_op(op, run)
    n = resolve_gpus(gpus, group, run)
    sys_spec = load_system(system)
    placement = place_job(sys_spec, n, **parallel)
    shape = placement.shape(group)
    check_group_size(shape, group, run)
    report(op, run, compare_measured(op, run, shape, sys_spec, algorithm), shape, sys_spec, group, n, json_out)

"""``muonsim collective`` (nccl-tests-style cost table) and ``muonsim topology`` (fabric summary)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import CliError, JsonOpt, print_json, user_errors, write_text_atomically

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


SIZE_CONVENTION = "sizes: G, GB = 1e9 B; GiB = 2^30 B (nccl-tests' -e 8G is 8 GiB)"
MAX_SWEEP_SIZES = 200
ONE_RANK_NOTE = "the group has 1 rank: a collective over one rank moves no data and takes 0 s"


def parse_size(text: str, what: str = "--size") -> int:
    """Whole bytes from '4G', '512MB', '1GiB', '1e9' or '4096' (see :data:`SIZE_CONVENTION`); a one-line
    CliError naming the flag ``what`` for anything else, a fraction of a byte included."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise CliError(f"{what}: must be bytes or a size with a unit, e.g. 4096, 512M, 4GB, 1GiB (got '{text}')")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value):
        raise CliError(f"{what}: must be a finite size (got '{text}')")
    if value != int(value):  # a buffer holds whole bytes: '1.5' would be shown as 2 B and costed as 1.5
        raise CliError(f"{what}: must be a whole number of bytes (got '{text}' = {value:g} B)")
    return int(value)


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """Sizes in whole bytes from min multiplying by ``factor`` (nccl-tests ``-b -e -f``), ending at max.

    Each step is truncated to whole bytes, as nccl-tests' ``size_t`` arithmetic does (``-f 1.5`` from
    1000 B: 1000, 1500, 2250, 3375, 5062, ...). When max is not on the grid (``--min-size 1KB
    --max-size 8GB``: 1000·2^23 > 8e9) the sweep adds max itself as its last size rather than
    stopping short of it.
    """
    if not math.isfinite(factor) or factor <= 1:
        raise CliError(f"--step-factor: must be a number greater than 1 (got {factor})")
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise CliError(f"need 0 < --min-size <= --max-size, got {min_bytes:,.0f} B and {max_bytes:,.0f} B")
    sizes: list[int] = []
    s = int(min_bytes)
    while s <= max_bytes * (1 + 1e-9) and len(sizes) < MAX_SWEEP_SIZES:
        sizes.append(s)
        s = max(int(s * factor), s + 1)
    if sizes[-1] < max_bytes * (1 - 1e-9) and len(sizes) < MAX_SWEEP_SIZES:
        sizes.append(int(max_bytes))
    return sizes


def _fmt_size(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b:g} B"


def register(app: typer.Typer) -> None:
    """Add the ``collective`` and ``topology`` commands."""
    app.command("collective")(collective)
    app.command("topology")(topology)


def check_counts(**flags: int | None) -> None:
    """Raise CliError ``--flag: must be greater than 0 (got N)`` for a count flag (``gpus_per_domain=0``
    names ``--gpus-per-domain``) below 1; None (not given) passes."""
    for name, value in flags.items():
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')}: must be greater than 0 (got {value})")


def _place(system: str, gpus: int, tp: int, pp: int, cp: int, ep: int, etp: int, gpus_per_domain: int | None):  # noqa: ANN202
    from topologies.hardware import load_system
    from topologies.placement import place_job

    sys_spec = load_system(system)
    return sys_spec, place_job(sys_spec, gpus, tp=tp, cp=cp, ep=ep, etp=etp, pp=pp, gpus_per_domain=gpus_per_domain)


@user_errors
def collective(
    op: Annotated[str, typer.Argument(metavar="OP", help="all_reduce, reduce_scatter, all_gather, all_gather_v, broadcast, all_to_all, send_recv")],
    system: Annotated[str, typer.Option("--system", metavar="NAME|FILE", help="system: catalogue name or YAML file")] = "gb300-nvl72",
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="INT", help="GPUs in the job (default 72, or the ranks listed in --measured FILE)")] = None,
    size: Annotated[str | None, typer.Option("--size", metavar="BYTES", help="one size: bytes, or 512M, 4GB (decimal), 1GiB (binary)")] = None,
    min_size: Annotated[str | None, typer.Option("--min-size", metavar="BYTES", help="sweep start (default 1KB = 1000 bytes; 1KiB = 1024)")] = None,
    max_size: Annotated[str | None, typer.Option("--max-size", metavar="BYTES", help="sweep end, always included (default 8GB = 8e9 bytes; 8GiB = 2^33)")] = None,
    step_factor: Annotated[float | None, typer.Option("--step-factor", metavar="FACTOR", help="sweep multiplier (default 2)")] = None,
    group: Annotated[str, typer.Option("--group", metavar="GROUP", help="tp, cp, dp, etp, ep, expert_dp, pp or world")] = "world",
    algorithm: Annotated[str | None, typer.Option("--algorithm", metavar="ALGO", help="force ring, tree, nvls, nvls_tree, pat, direct, or the idealised hierarchical (never chosen by the tuner)")] = None,
    tp: Annotated[int, typer.Option("--tp", metavar="INT", help="tensor parallel size (shapes the groups)")] = 1,
    pp: Annotated[int, typer.Option("--pp", metavar="INT", help="pipeline parallel size")] = 1,
    cp: Annotated[int, typer.Option("--cp", metavar="INT", help="context parallel size")] = 1,
    ep: Annotated[int, typer.Option("--ep", metavar="INT", help="expert parallel size")] = 1,
    etp: Annotated[int, typer.Option("--etp", metavar="INT", help="expert tensor parallel size")] = 1,
    gpus_per_domain: Annotated[int | None, typer.Option("--gpus-per-domain", metavar="INT", help="GPUs used per NVLink domain")] = None,
    measured: Annotated[Path | None, typer.Option("--measured", metavar="FILE", help="nccl-tests output (e.g. all_reduce_perf stdout): predict its sizes and report the error")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Predicted cost of a collective over a size sweep, as nccl-tests prints it (algbw, busbw).

    With --measured FILE (nccl-tests stdout) the sizes come from the file and each prediction
    is compared with the measured busbw (error %, MAPE).
    """
    from topologies.collectives import OPS, collective_cost
    from topologies.inputs import guess_hint, plural

    typed, op = op, op.replace("-", "_")
    if op not in OPS:
        raise CliError(f"unknown collective '{typed}'{guess_hint(op, OPS)}; valid: {', '.join(OPS)}")
    if size is not None and (min_size is not None or max_size is not None or step_factor is not None):
        raise CliError("give either --size or --min-size/--max-size/--step-factor, not both")
    check_counts(gpus=gpus, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
    if measured is not None:
        from cli.collective_measured import run_measured

        if size is not None or min_size is not None or max_size is not None or step_factor is not None:
            raise CliError("--measured takes its sizes from the file; drop --size/--min-size/--max-size/--step-factor")
        run_measured(op, str(measured), system, gpus, group, algorithm,
                     {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "gpus_per_domain": gpus_per_domain}, json_out)
        return
    if gpus is None:
        gpus = 72
    sizes = [parse_size(size)] if size is not None else size_sweep(
        parse_size(min_size or "1KB", "--min-size"), parse_size(max_size or "8GB", "--max-size"),
        2.0 if step_factor is None else step_factor)
    sys_spec, placement = _place(system, gpus, tp, pp, cp, ep, etp, gpus_per_domain)
    shape = placement.shape(group)
    rows = [collective_cost(op, s, shape, sys_spec, algorithm) for s in sizes]
    note = ONE_RANK_NOTE if shape.size == 1 else None
    if json_out:
        print_json({
            "op": op, "system": sys_spec.name, "gpus": gpus, "group": group, "group_size": shape.size,
            "size_convention": SIZE_CONVENTION,
            "domains": shape.domains, "ranks_per_domain": shape.ranks_per_domain,
            "fabric_tiers_crossed": shape.fabric_tiers,
            "results": [{"size_bytes": int(r.size_bytes), "time_s": r.time_s, "algbw_Bps": r.algbw_Bps,
                         "busbw_Bps": r.busbw_Bps, "algorithm": r.algorithm, "detail": r.detail} for r in rows],
        } | ({"note": note} if note else {}))
        return
    typer.echo(f"# {op} on {sys_spec.name}: group '{group}' of {plural(shape.size, 'rank')} over "
               f"{plural(shape.domains, 'NVLink domain')}, {shape.ranks_per_domain} per domain, fabric tiers crossed {shape.fabric_tiers}")
    typer.echo(f"# {SIZE_CONVENTION}; GB/s = 1e9 B/s")
    if note:
        typer.echo(f"# note: {note}")
    typer.echo(f"# {'size (B)':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  algorithm")
    for r in rows:
        typer.echo(f"  {r.size_bytes:>14.0f} {r.time_s * 1e6:>12.2f} {r.algbw_Bps / 1e9:>13.2f} "
                   f"{r.busbw_Bps / 1e9:>13.2f}  {r.detail}")


@user_errors
def topology(
    system: Annotated[str, typer.Option("--system", metavar="NAME|FILE", help="system: catalogue name or YAML file")] = "gb300-nvl72",
    gpus: Annotated[int, typer.Option("--gpus", metavar="INT", help="GPUs in the job")] = 72,
    gpus_per_domain: Annotated[int | None, typer.Option("--gpus-per-domain", metavar="INT", help="GPUs used per NVLink domain")] = None,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write a plotly picture of (a representative part of) the fabric")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Summarise the fabric under a job: GPUs, domains, switches per tier, bisection, NIC rails."""
    from topologies.fabric import fabric_summary
    from topologies.inputs import plural

    check_counts(gpus=gpus)
    sys_spec, placement = _place(system, gpus, 1, 1, 1, 1, 1, gpus_per_domain)
    summary = fabric_summary(placement.layout, sys_spec)
    if html is not None:
        from topologies.fabric_plot import fabric_figure_html

        write_text_atomically(html, fabric_figure_html(placement.layout, sys_spec))
        summary["html"] = str(html)
    if json_out:
        print_json(summary)
        return
    s: dict[str, Any] = summary
    lines = [
        f"{sys_spec.display_name or sys_spec.name}: {plural(s['gpus'], 'GPU')} on {plural(s['domains'], 'NVLink domain')} of "
        f"{s['domain_size']} ({s['gpus_per_domain']} used per domain)",
        f"  NVLink: {s['nvlink_gpu_Bps'] / 1e9:g} GB/s/dir per GPU, {s['nvlink_switch_chips']} switch chips, "
        f"NVLS {'yes' if s['nvls'] else 'no'}, domain bisection {s['nvlink_domain_bisection_Bps'] / 1e12:.1f} TB/s/dir",
        f"  NICs: {s['job_nics']} x {s['nic_Bps'] * 8 / 1e9:g} Gb/s used by the job's GPUs, on {s['job_rails']} of "
        f"{plural(s['rails'], 'rail')} (up to {s['job_nics_per_rail_per_domain']} per rail per domain); the occupied "
        f"{'domain holds' if s['domains'] == 1 else 'domains hold'} {s['nics']} ({s['nics_per_rail_per_domain']} per rail per domain), {plural(s['planes'], 'plane')}",
        f"  switches (radix {s['switch_radix']}, {plural(s['tiers'], 'tier')}, oversubscription {s['oversubscription']:g}:1): "
        f"{s['leaves']} leaf, {s['spines']} spine, {s['cores']} core; a leaf reaches {plural(s['domains_per_leaf'], 'domain')} "
        f"of its rail, a pod {s['domains_per_pod']}",
        f"  scale-out bisection: {s['network_bisection_Bps'] / 1e12:.2f} TB/s/dir"
        + (" (none crossed: the job is in one NVLink domain)" if s["domains"] == 1 else ""),
    ]
    if html is not None:
        lines.append(f"  wrote {html}")
    import textwrap

    from cli.terminal import console

    width = console().width
    typer.echo("\n".join(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False,
                                        break_long_words=False) for line in lines))

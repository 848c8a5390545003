"""``muonsim catalog``, ``describe`` and ``inventory``: what the catalogues hold, how a model splits
over ranks, and the memory per GPU of each pipeline stage by component."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.common import (
    JsonOpt,
    ScenarioFileArg,
    print_json,
    resolve_scenario,
    user_errors,
    with_scenario_flags,
)

# the memory table's component headers, short enough for nine columns in 80 (a caption spells them out)
MEMORY_HEADERS = {"weights": "weights", "weight_buffers": "w. bufs", "gradients": "grads",
                  "optimizer_state": "opt. state", "optimizer_workspace": "opt. work", "activations": "activ."}


def register(app: typer.Typer) -> None:
    """Add the ``catalog``, ``describe`` and ``inventory`` commands."""
    app.command("catalog")(catalog)
    app.command("describe")(describe)
    app.command("inventory")(inventory)


@user_errors
def catalog(json_out: JsonOpt = False) -> None:
    """List the systems and models in the catalogues."""
    from topologies.hardware import load_system, system_names
    from workloads.models import load_model, model_names

    systems = [load_system(n) for n in system_names()]
    models = [load_model(n) for n in model_names()]
    if json_out:
        print_json({"systems": [_system_json(s) for s in systems], "models": [_model_json(m) for m in models]})
        return
    from rich.console import Console
    from rich.table import Table

    # Two-line headers keep the number columns 4 wide, so the table fits 80 columns; the names are what
    # users type (never wrapped), the GPU names wrap at spaces and are never cut.
    t = Table(title="Systems", caption="NVL: NVLink (GPUs per domain; GB/s per GPU and direction); NIC: GB/s per "
                                       "NIC; PF: dense peak PFLOP/s per GPU; HBM: GB per GPU")
    t.add_column("name", no_wrap=True)
    t.add_column("GPU", overflow="fold", min_width=10)
    for col in ("NVL\nGPUs", "NVL\nGB/s", "NIC\nGB/s", "BF16\nPF", "FP8\nPF", "FP4\nPF", "HBM\nGB"):
        t.add_column(col, no_wrap=True, justify="right")
    for s in systems:
        pk = s.gpu.peak_flops_per_s
        t.add_row(s.name, s.gpu.name, str(s.nvlink.domain_size), f"{s.nvlink.gpu_bandwidth_Bps / 1e9:.0f}",
                  f"{s.scale_out.nic_bandwidth_Bps / 1e9:.0f}", f"{pk.bf16 / 1e15:.2f}", f"{pk.fp8 / 1e15:.2f}" if pk.fp8 is not None else "-",
                  f"{pk.fp4 / 1e15:.1f}" if pk.fp4 else "-", f"{s.gpu.hbm_bytes / 1e9:.0f}")
    m_t = Table(title="Models")
    for col in ("name", "layers", "hidden", "attention", "experts\n(top-k)", "vocab", "MTP"):
        m_t.add_column(col, no_wrap=True, justify="right" if col in ("layers", "hidden", "vocab", "MTP") else "left")
    for m in models:
        moe = f"{m.moe.num_experts} ({m.moe.topk})" if m.moe else "dense"
        m_t.add_row(m.name, str(m.num_layers), str(m.hidden_size), m.attention.kind, moe, str(m.vocab_size), str(m.mtp_layers))
    console = Console()
    console.print(t)
    console.print(m_t)


def _system_json(s: Any) -> dict[str, Any]:
    """A system's row of ``catalog --json``: what the table shows, under topology --json's names
    (``domain_size``, ``nvlink_gpu_Bps``, ``nic_Bps``); peaks in FLOP/s per GPU (None: no such tensor
    cores), HBM in bytes per GPU."""
    pk = s.gpu.peak_flops_per_s
    return {"name": s.name, "display_name": s.display_name, "gpu": s.gpu.name, "domain_size": s.nvlink.domain_size,
            "nvlink_gpu_Bps": s.nvlink.gpu_bandwidth_Bps, "nic_Bps": s.scale_out.nic_bandwidth_Bps,
            "bf16_peak_flops_per_s": pk.bf16, "fp8_peak_flops_per_s": pk.fp8, "fp4_peak_flops_per_s": pk.fp4,
            "hbm_bytes": int(s.gpu.hbm_bytes)}


def _model_json(m: Any) -> dict[str, Any]:
    """A model's row of ``catalog --json``: what the table shows (experts and top-k None for a dense model)."""
    return {"name": m.name, "display_name": m.display_name, "layers": m.num_layers, "hidden_size": m.hidden_size,
            "attention": m.attention.kind, "moe": m.moe is not None,
            "num_experts": m.moe.num_experts if m.moe else None, "topk": m.moe.topk if m.moe else None,
            "vocab_size": m.vocab_size, "mtp_layers": m.mtp_layers}


@user_errors
def describe(
    model: Annotated[str | None, typer.Argument(metavar="MODEL", help="catalogue name or model YAML file")] = None,
    model_flag: Annotated[str | None, typer.Option("--model", metavar="NAME|FILE",
                                                   help="the same as MODEL (the flag every other command takes)")] = None,
    seq_flag: Annotated[str, typer.Option("--seq", metavar="INT", help="sequence length for attention FLOPs (tokens)")] = "4096",
    tp_flag: Annotated[str, typer.Option("--tp", metavar="INT", help="tensor parallel size (pads the vocabulary)")] = "1",
    json_out: JsonOpt = False,
) -> None:
    """Parameters (total, active) and model FLOPs per token of a model."""
    from workloads.flops import model_flop_terms
    from workloads.inventory import active_params, build_inventory
    from workloads.models import load_model

    seq, tp = _count_flag("--seq", seq_flag), _count_flag("--tp", tp_flag)
    spec = load_model(_one_model(model, model_flag))
    inv = build_inventory(spec)
    terms = model_flop_terms(spec, seq, tp)
    data: dict[str, Any] = {
        "model": spec.name,
        "params_total": inv.params_total,
        "params_active": active_params(spec),
        "params_active_excl_embeddings": active_params(spec, include_embeddings=False),
        "seq_length": seq,
        "flops_per_token": terms.total,
        "flops_per_token_terms": {k: v for k, v in vars(terms).items()},
        "layers": spec.num_layers, "moe_layers": spec.num_moe_layers, "mtp_layers": spec.mtp_layers,
    }
    if json_out:
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{spec.display_name or spec.name}", show_header=False)
    t.add_row("parameters, total", f"{data['params_total'] / 1e9:,.2f} billion")
    t.add_row("parameters, active (incl. embedding + head)", f"{data['params_active'] / 1e9:,.2f} billion")
    t.add_row("parameters, active (excl. embedding + head)", f"{data['params_active_excl_embeddings'] / 1e9:,.2f} billion")
    t.add_row("layers (MoE / MTP)", f"{spec.num_layers} ({spec.num_moe_layers} / {spec.mtp_layers})")
    t.add_row(f"model FLOPs per token @ seq {seq}", f"{terms.total / 1e9:,.3f} GFLOP")
    for k, v in vars(terms).items():
        t.add_row(f"  {k.replace('_', ' ')}", f"{v / 1e9:,.3f} GFLOP")
    Console().print(t)


def _one_model(model: str | None, model_flag: str | None) -> str:
    """The model ``describe`` was given, as MODEL or ``--model`` (a one-line UserInputError when neither
    or two different ones are given)."""
    from topologies.inputs import UserInputError

    if model is not None and model_flag is not None and model != model_flag:
        raise UserInputError(f"two models given: MODEL '{model}' and --model '{model_flag}'; give one")
    chosen = model if model is not None else model_flag
    if chosen is None:
        raise UserInputError("Missing argument 'MODEL' (or --model NAME|FILE); see 'muonsim describe --help'")
    return chosen


def _count_flag(flag: str, value: str, minimum: int = 1) -> int:
    """Parse an integer flag; a one-line UserInputError (exit 2) unless it is an integer >= minimum."""
    from topologies.inputs import UserInputError

    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        number = int(value)
    except ValueError:
        raise UserInputError(f"{flag}: must be {what} (got {value!r})") from None
    if number < minimum:
        raise UserInputError(f"{flag}: must be {what} (got {number})")
    return number


@user_errors
@with_scenario_flags
def inventory(
    scenario_file: ScenarioFileArg = None,
    per_tensor: Annotated[bool, typer.Option("--tensors", help="list every tensor of the chosen stage")] = False,
    stage_flag: Annotated[str | None, typer.Option("--stage", metavar="INT", help="pipeline stage for --tensors "
                                                                                 "(default 0)")] = None,
    json_out: JsonOpt = False,
    *, scenario_flags: dict[str, str],
) -> None:
    """The tensor inventory of a scenario: per pipeline stage and per rank."""
    from topologies.inputs import UserInputError, plural
    from workloads.inventory import inventory_for
    from workloads.memory import memory_by_stage

    if stage_flag is not None and not per_tensor:
        raise UserInputError("--stage needs --tensors (it picks the pipeline stage whose tensors are listed)")
    sc = resolve_scenario(scenario_file, scenario_flags)
    stage = _count_flag("--stage", stage_flag or "0", minimum=0)
    if stage >= sc.par.pp:
        raise UserInputError(f"--stage: must be a pipeline stage, 0..{sc.par.pp - 1} (got {stage})")
    inv = inventory_for(sc)
    memory = memory_by_stage(sc)
    stages: list[dict[str, Any]] = []
    for st in range(sc.par.pp):
        ts = inv.stage_tensors(st)
        stages.append({
            "stage": st,
            "tensor_count": len(ts),
            "params_per_rank": inv.rank_numel(st),
            "muon_params_per_rank": sum(t.rank_numel for t in ts if t.optimizer == "muon"),
            "adamw_params_per_rank": sum(t.rank_numel for t in ts if t.optimizer == "adamw"),
            "expert_params_per_rank": sum(t.rank_numel for t in ts if t.is_expert),
            "muon_matrices_per_rank": sum(len(t.muon_components) * t.experts_per_rank for t in ts if t.optimizer == "muon"),
            "memory": {"total_bytes": memory[st].total_bytes, "components_bytes": memory[st].components_bytes},
        })
    tensors: list[dict[str, Any]] = []
    if per_tensor or json_out:
        for t in inv.tensors:
            if per_tensor and t.stage != stage:
                continue
            tensors.append({
                "name": t.name, "role": t.role, "stage": t.stage, "chunk": t.chunk, "global_shape": list(t.global_shape),
                "shard_dim": t.shard_dim, "shard_group": t.shard_group, "local_shape": list(t.local_shape),
                "dp_group": t.dp_group, "optimizer": t.optimizer, "copies": t.num_experts,
                "copies_per_rank": t.experts_per_rank, "muon_matrices": [list(c) for c in t.local_muon_components],
            })
    data: dict[str, Any] = {"params_total": inv.params_total, "dp": sc.dp, "expert_dp": sc.expert_dp, "stages": stages}
    if json_out:
        data["tensors"] = tensors
        print_json(data)
        return
    from rich.console import Console
    from rich.table import Table

    st_t = Table(title=f"{sc.model.name} on {plural(sc.gpus, 'GPU')}: tp {sc.par.tp}, pp {sc.par.pp}, vpp {sc.par.vpp}, "
                       f"ep {sc.par.ep}, dp {sc.dp}")
    for col in ("stage", "tensors", "params/rank", "Muon", "AdamW", "experts", "Muon matrices/rank"):
        st_t.add_column(col, justify="right")
    st_t.caption = "parameters per rank in billions (params/rank, of which Muon, AdamW, experts)"
    for s in stages:  # parameter counts in billions, not "B" (which reads as bytes beside the memory table)
        st_t.add_row(str(s["stage"]), str(s["tensor_count"]), f"{s['params_per_rank'] / 1e9:.3f}",
                     f"{s['muon_params_per_rank'] / 1e9:.3f}", f"{s['adamw_params_per_rank'] / 1e9:.3f}",
                     f"{s['expert_params_per_rank'] / 1e9:.3f}", str(s["muon_matrices_per_rank"]))
    console = Console()
    console.print(st_t)
    mt = Table(title=f"memory per GPU, GB (capacity {sc.system.gpu.hbm_bytes / 1e9:.0f} GB; "
                     f"recompute {sc.par.recompute}; total = peak: the activations and the optimizer "
                     "workspace never coexist)")
    names = list(memory[0].components_bytes)
    short = [MEMORY_HEADERS.get(n, n.replace("_", " ")) for n in names]
    mt.caption = "; ".join(f"{h}: {n.replace('_', ' ')}" for h, n in zip(short, names, strict=True)
                           if h != n.replace("_", " "))
    for col in ("stage", *short, "total", "fits"):
        mt.add_column(col, justify="right")
    for m in memory:
        parts = m.components_bytes
        mt.add_row(str(m.stage), *(f"{parts[n] / 1e9:.2f}" for n in names), f"{m.total_bytes / 1e9:.2f}",
                   "yes" if m.fits() else "NO")
    console.print(mt)
    if per_tensor:
        tt = Table(title=f"stage {stage} tensors")
        for col in ("name", "global shape", "local shape", "shard", "dp group", "optimizer", "copies/rank"):
            tt.add_column(col)
        for x in tensors:
            tt.add_row(x["name"], str(tuple(x["global_shape"])), str(tuple(x["local_shape"])),
                       f"{x['shard_group']}:{x['shard_dim']}" if x["shard_group"] else "-", x["dp_group"],
                       x["optimizer"], str(x["copies_per_rank"]))
        console.print(tt)

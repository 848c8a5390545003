"""``muonsim predict``: the step time of a scenario and where it goes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import print_json, resolve_scenario, user_errors, with_scenario_flags


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)


@user_errors
@with_scenario_flags
def predict(
    scenario_file: Annotated[Path | None, typer.Argument(help="scenario YAML (default: built-in scenario)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    *, scenario_flags: dict[str, str],
) -> None:
    """Predict one training step (engines pending: prints the workload accounting only)."""
    from workloads.flops import model_flops_per_token
    from workloads.inventory import inventory_for

    sc = resolve_scenario(scenario_file, scenario_flags)
    inv = inventory_for(sc)
    fpt = model_flops_per_token(sc.model, sc.par.seq_length, sc.par.tp)
    data = {
        "scenario": sc.config.model_dump(mode="json"),
        "dp": sc.dp, "expert_dp": sc.expert_dp, "microbatches_per_step": sc.num_microbatches,
        "params_total": inv.params_total,
        "model_flops_per_step": fpt * sc.tokens_per_step,
        "params_per_rank_by_stage": [inv.rank_numel(s) for s in range(sc.par.pp)],
    }
    if json_out:
        print_json(data)
        return
    typer.echo(f"{sc.model.name} on {sc.gpus} x {sc.system.name}: dp {sc.dp}, {sc.num_microbatches} micro-batches/step, "
               f"{data['model_flops_per_step'] / 1e18:.2f} EFLOP/step (timing engines not yet available)")

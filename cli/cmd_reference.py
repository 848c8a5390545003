"""`muonsim reference run`: the reference backend on local processes (gloo), as a MeasuredRun JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import CliError, fail, print_json, user_errors, write_text_atomically

reference_app = typer.Typer(help="Run the real optimizer math on torch.distributed (local gloo processes).",
                            no_args_is_help=True)

# option name -> help; every value is passed as a string and validated by reference.config.RunConfig
_FLAGS: dict[str, str] = {
    "world_size": "processes (dp × tp)",
    "tp": "tensor-parallel size",
    "etp": "expert tensor-parallel size (1 or a divisor of tp)",
    "optimizer": "adamw or muon",
    "distribution": "replicated, element_wise (adamw) or layer_wise (muon)",
    "layout": "layer-wise layout: legacy or current",
    "tp_mode": "Muon TP Newton-Schulz mode: duplicated, distributed or blockwise",
    "load_balance": "none, ping_pong or lpt (default: lpt for current, ping_pong for legacy)",
    "hide_param_gather": "overlap the parameter all-gather with the next forward (on/off)",
    "steps": "optimizer steps (the first is warm-up for timings)",
    "shapes": "shape preset (tiny, tiny-dense, small) or a model YAML file",
    "split_qkv": "orthogonalise Q, K, V separately (on/off)",
    "matmul_precision": "Newton-Schulz matmuls: bf16, tf32 or fp32",
    "ns_steps": "Newton-Schulz iterations",
    "ns_coefficients": "simple, quintic, polar_express, cans, aol, deepseekv4, cubic5 or custom",
    "custom_coefficients": "for custom: 'a,b,c;a,b,c;...' (cycled)",
    "scale_mode": "update scale: shape_scaling, spectral or unit_rms_norm",
    "extra_scale_factor": "extra factor on the Muon update scale",
    "lr": "learning rate",
    "momentum": "Muon momentum",
    "nesterov": "Nesterov momentum (on/off)",
    "weight_decay": "decoupled weight decay",
    "param_dtype": "model parameter dtype: bf16 or fp32 (fp32 masters always)",
    "grad_dtype": "gradient buffer / reduction dtype: fp32 or bf16",
    "bucket_size": "bucket size in elements (default max(40e6, 1e6·dp))",
    "forward_tokens": "activation rows of the stand-in forward/backward matmuls",
    "seed": "seed of parameters and synthetic gradients",
    "timeout_s": "wall-clock limit of the whole run in seconds",
    "check": "compare with the single-process reference (on/off)",
}


def _run(out: Path | None, as_json: bool, inject_failure: str | None, values: dict[str, str | None]) -> None:
    from reference.api import run_reference
    from reference.launch import ReferenceRunError, config_from_strings

    if out is not None and not Path(out).parent.exists():
        raise CliError(f"directory '{Path(out).parent}' does not exist")
    cfg = config_from_strings({**values, "inject_failure": inject_failure})
    try:
        result = run_reference(cfg)
    except ReferenceRunError as err:
        fail(str(err), code=1)
        return
    run = result.to_measured_run()
    if out is not None:
        write_text_atomically(out, run.model_dump_json(indent=2, exclude_none=True) + "\n")
    if as_json:
        print_json(run.model_dump(mode="json", exclude_none=True))
    else:
        _print_summary(result, out)


def _print_summary(result, out: Path | None) -> None:  # noqa: ANN001 - RunResult (lazy import)
    from rich.console import Console
    from rich.table import Table

    cfg = result.config
    console = Console()
    console.print(f"[bold]reference run[/bold] {cfg.optimizer} {cfg.resolved_distribution} "
                  f"world {cfg.world_size} (dp {cfg.dp} × tp {cfg.tp}), shapes {cfg.shapes}: "
                  f"step {result.step_time_s * 1e3:.2f} ms")
    phases = Table("phase", "ms/step (max over ranks)")
    for name, secs in result.phase_times_s.items():
        phases.add_row(name, f"{secs * 1e3:.3f}")
    console.print(phases)
    calls = Table("op", "group", "size", "dtype", "bytes", "count", "phase", title="collectives per step (rank 0)")
    for c in result.collectives:
        calls.add_row(c.op, c.group, str(c.group_size), c.dtype, f"{c.bytes:,}", str(c.count), c.phase)
    console.print(calls)
    ns = result.ns_gflops_per_s_by_rank
    if any(ns.values()):
        console.print("Newton-Schulz GFLOP/s by rank: " + ", ".join(f"{r}: {v:.1f}" for r, v in ns.items()))
    console.print("checks: " + ", ".join(f"{k}={v}" for k, v in result.checks.items()))
    if out is not None:
        console.print(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add the ``reference`` command group (``muonsim reference run ...``)."""
    import inspect

    params = [
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--out", help="MeasuredRun JSON to write")),
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--json", help="print the MeasuredRun JSON")),
        inspect.Parameter("inject_failure", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                          default=typer.Option(None, "--inject-failure", hidden=True,
                                               help="test hook: RANK[:STEP[:exit|hang|raise]]")),
    ]
    for name, help_text in _FLAGS.items():
        flag = "--timeout" if name == "timeout_s" else f"--{name.replace('_', '-')}"
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                        default=typer.Option(None, flag, help=help_text)))

    def command(**kwargs: object) -> None:
        out, as_json, inject = kwargs.pop("out"), kwargs.pop("as_json"), kwargs.pop("inject_failure")
        _run(out, bool(as_json), inject, kwargs)  # type: ignore[arg-type]

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = "Run one configuration on local gloo processes and write a MeasuredRun JSON."
    reference_app.command("run")(user_errors(command))
    app.add_typer(reference_app, name="reference")

"""`muonsim reference run`: the reference backend on local processes (gloo), as a MeasuredRun JSON."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from typer.core import TyperCommand, TyperGroup

from cli.common import (
    CliError,
    fail,
    hide_flag_types,
    print_json,
    user_errors,
    write_text_atomically,
)

if TYPE_CHECKING:
    from reference.config import RunFlag

_CLI_SKIPS = ("backend",)  # local runs are gloo; nccl runs go through torchrun (python -m reference.launch)
_METAVARS = {"shapes": "<preset|file>", "custom_coefficients": "<a,b,c;...>", "inject_failure": "<rank[:step[:mode]]>"}


def _on_off(value: object) -> bool:
    from reference.config import on_off

    try:
        return on_off(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _option(flag: RunFlag) -> inspect.Parameter:
    """A typed typer option for a RunConfig field: its type, choices, default and help."""
    default = flag.default
    kwargs: dict[str, Any] = {"help": flag.help, "hidden": flag.name == "inject_failure"}
    annotation: Any
    if flag.kind == "bool":
        annotation, kwargs["parser"], kwargs["metavar"] = Any, _on_off, "<on|off>"
        default = None if default is None else ("on" if default else "off")
    elif flag.kind == "choice":
        annotation = Literal[flag.choices]  # type: ignore[valid-type]
    else:
        annotation = {"int": int, "float": float, "str": str}[flag.kind]
        if flag.name in _METAVARS:
            kwargs["metavar"] = _METAVARS[flag.name]
    if default is None:
        annotation = annotation | None
    return inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, flag.flag, **kwargs))


class _OneLineErrors(TyperCommand):
    """A bad option value is one ``error:`` line and exit code 2, like every other user error."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        try:
            return super().make_context(*args, **kwargs)
        except typer.BadParameter as err:
            # '--flag: must be ...' as the other verbs word a bad flag value (not click's "Invalid value for")
            from topologies.inputs import flag_words

            msg = flag_words(err.message)
            opts = getattr(err.param, "opts", None)
            choice = re.fullmatch(r"'(.*)' is not one of (.*?)\.?", " ".join(msg.split()))
            if choice:  # click's "'sgd' is not one of 'adamw', 'muon'." in the other verbs' words
                msg = f"must be one of {choice.group(2).replace(chr(39), '')} (got '{choice.group(1)}')"
            fail(f"{opts[0]}: {msg}" if opts else err.format_message().replace("Value error, ", ""))


def _run_command() -> Any:
    """The ``reference run`` click command, its options generated from RunConfig's fields."""
    from reference.config import run_flags

    params = [
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--out", metavar="<file>", help="MeasuredRun JSON to write")),
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--json", help="print the MeasuredRun JSON")),
    ]
    params += [_option(f) for f in run_flags() if f.name not in _CLI_SKIPS]

    def command(**kwargs: Any) -> None:
        out, as_json = kwargs.pop("out"), kwargs.pop("as_json")
        _run(out, bool(as_json), kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = "Run one configuration on local gloo processes and write a MeasuredRun JSON."
    app = typer.Typer(add_completion=False)
    app.command("run", cls=_OneLineErrors)(user_errors(command))
    return typer.main.get_command(app)


class _LazyRunGroup(TyperGroup):
    """``muonsim reference``: builds ``run`` (which imports pydantic and RunConfig) only when it is
    used, so that ``muonsim --help`` and the other verbs start fast."""

    _run: Any = None

    def list_commands(self, ctx: Any) -> list[str]:  # noqa: D102
        return sorted({*super().list_commands(ctx), "run"})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # noqa: D102
        if cmd_name != "run":
            return super().get_command(ctx, cmd_name)
        if _LazyRunGroup._run is None:
            _LazyRunGroup._run = _run_command()
            hide_flag_types(_LazyRunGroup._run)
        return _LazyRunGroup._run


reference_app = typer.Typer(cls=_LazyRunGroup, no_args_is_help=True,
                            help="Run the real optimizer math on torch.distributed (local gloo processes).")


def _run(out: Path | None, as_json: bool, values: dict[str, Any]) -> None:
    from reference.api import run_reference
    from reference.launch import ReferenceRunError, config_from_strings

    if out is not None and not Path(out).parent.exists():
        raise CliError(f"directory '{Path(out).parent}' does not exist")
    cfg = config_from_strings(values)
    if cfg.steps == 1:  # the timings then include the warm-up step's one-off costs (allocation, first calls)
        typer.echo("warning: --steps 1 times the warm-up step (allocation and first-call costs included); "
                   "give --steps 2 or more for steady-state timings", err=True)
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
    from rich.table import Column, Table

    cfg = result.config
    console = Console()
    console.print(f"[bold]reference run[/bold] {cfg.optimizer} {cfg.resolved_distribution} "
                  f"world {cfg.world_size} (dp {cfg.dp} × tp {cfg.tp}), shapes {cfg.shapes}: "
                  f"step {result.step_time_s * 1e3:.2f} ms")
    phases = Table("phase", Column("ms/step (max over ranks)", justify="right"))
    for name, secs in result.phase_times_s.items():
        phases.add_row(name, f"{secs * 1e3:.3f}")
    console.print(phases)
    calls = Table("op", "group", Column("ranks", justify="right"), "dtype", Column("bytes", justify="right"),
                  Column("count", justify="right"), "phase", title="collectives per step (rank 0)")
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
    app.add_typer(reference_app, name="reference")

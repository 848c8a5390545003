"""The ``muonsim`` command-line interface (typer). Each verb lives in its own ``cli/cmd_*`` module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x carries its own click
    from typer._click import exceptions as click_exceptions
except ImportError:  # older typer (pyproject allows >= 0.12): click itself
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from cli.common import hide_flag_types

# click >= 8.2 raises this after printing the help of a command given no arguments (none before)
NO_ARGS_IS_HELP: Any = getattr(click_exceptions, "NoArgsIsHelpError", ())


class OneLineErrorGroup(TyperGroup):
    """The root command: a usage error (unknown flag or command, missing argument, a flag value of the
    wrong type) is one line on stderr with exit code 2, like every other input error, instead of
    typer's usage line, hint and boxed panel."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the command line; usage errors become ``error: ...; see 'muonsim CMD --help'``."""
        hide_flag_types(self)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NO_ARGS_IS_HELP as err:  # the help is already printed
            sys.exit(err.exit_code)
        except click_exceptions.ClickException as err:
            typer.echo(f"error: {one_line_usage_error(err, sys.argv[1:] if args is None else list(args))}", err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def one_line_usage_error(err: click_exceptions.ClickException, argv: list[str]) -> str:
    """A click error as one line: its message, the value given to a rejected flag (from ``argv``), then
    where the command's help is."""
    message = " ".join(err.format_message().split()).rstrip(".")
    param = getattr(err, "param", None)
    if isinstance(err, click_exceptions.BadParameter) and param is not None:
        opts = getattr(param, "opts", [])
        flags = [o for o in opts if o.startswith("--")]
        if flags:  # '--seed: must be ...' as every other bad flag value is worded, not "Invalid value for '--seed'"
            from topologies.inputs import flag_words

            message = f"{max(flags, key=len)}: {flag_words(' '.join(err.message.split())).rstrip('.')}"
        given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in opts]
        given += [a.split("=", 1)[1] for a in argv if "=" in a and a.split("=", 1)[0] in opts]
        if given:
            message += f" (got {given[-1]!r})"
    ctx = getattr(err, "ctx", None)
    if ctx is None:
        return message
    return f"{message}; see '{ctx.command_path} --help'"


app = typer.Typer(
    name="muonsim",
    cls=OneLineErrorGroup,
    help="Predict, explain and plan LLM training steps with Muon and AdamW on GB300 NVL72 clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = (
    "cli.cmd_catalog",
    "cli.cmd_predict",
    "cli.cmd_compare",
    "cli.cmd_plan",
    "cli.cmd_sweep",
    "cli.cmd_collective",
    "cli.cmd_validate",
    "cli.cmd_reference",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def version_text() -> str:
    """``muonsim X.Y.Z`` from the installed package metadata (or 'not installed' from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"muonsim {version('muonsim')}"
    except PackageNotFoundError:
        return "muonsim (version unknown: not installed; run 'pip install .')"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_show_version,
                                          help="print the version and exit")] = False,
) -> None:
    """Predict, explain and plan LLM training steps with Muon and AdamW on GB300 NVL72 clusters."""


def main() -> None:
    """Console-script entry point (output streams made safe for non-UTF-8 encodings first)."""
    from cli.terminal import make_streams_safe

    make_streams_safe()
    app()


if __name__ == "__main__":
    main()

"""The ``muonsim`` command-line interface (typer). Each verb lives in its own ``cli/cmd_*`` module."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

app = typer.Typer(
    name="muonsim",
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

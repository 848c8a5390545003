"""The ``muonsim`` command-line interface (typer). Each verb lives in its own ``cli/cmd_*`` module."""

from __future__ import annotations

import importlib

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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

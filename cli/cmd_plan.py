"""`muonsim plan` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Nothing registered yet."""

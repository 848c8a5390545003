"""The ``python -m reference.launch`` entry: local runs, or one rank under ``torchrun``.

torchrun: ``torchrun --nproc-per-node N -m reference.launch --world-size N ... --out run.json``
(env:// rendezvous, ``--backend gloo`` or ``nccl``); rank 0 gathers the ranks' outputs and writes
the MeasuredRun JSON. Without torchrun's environment, ``python -m reference.launch`` runs locally
(:func:`reference.processes.launch_local`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from reference.processes import ReferenceRunError, free_port, launch_local
from topologies.inputs import UserInputError

__all__ = ["ReferenceRunError", "config_from_strings", "free_port", "launch_local", "main"]


# ----- python -m reference.launch -----

def _parse_failure(text: str) -> dict[str, Any]:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise UserInputError(f"inject_failure '{text}' must be RANK[:STEP[:exit|hang|raise]]")
    try:
        out: dict[str, Any] = {"rank": int(parts[0])}
        if len(parts) > 1:
            out["step"] = int(parts[1])
    except ValueError:
        raise UserInputError(f"inject_failure '{text}' must be RANK[:STEP[:exit|hang|raise]]") from None
    if len(parts) > 2:
        out["mode"] = parts[2]
    return out


def _parse_custom(text: str) -> list[list[float]]:
    try:
        tuples = [[float(v) for v in t.split(",")] for t in text.split(";") if t.strip()]
    except ValueError:
        tuples = []
    if not tuples or any(len(t) != 3 for t in tuples):
        raise UserInputError(f"--custom-coefficients: must look like 'a,b,c;a,b,c', three numbers per tuple (got '{text}')")
    return tuples


def config_from_strings(values: dict[str, Any]) -> Any:
    """Build a RunConfig from flag values (CLI / argparse; strings or already typed, None = not
    given); one-line UserInputError on problems."""
    from reference.config import make_config

    data: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    if "inject_failure" in data:
        data["inject_failure"] = _parse_failure(str(data["inject_failure"]))
    if "custom_coefficients" in data:
        data["custom_coefficients"] = _parse_custom(str(data["custom_coefficients"]))
    return make_config(**data)


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error:`` line and exit code 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)


def _argparser() -> argparse.ArgumentParser:
    """Options generated from RunConfig's fields (types, choices, defaults, help); values the
    user does not give stay None so that RunConfig (or torchrun's WORLD_SIZE) decides."""
    from reference.config import on_off, run_flags

    parser = _OneLineParser(prog="python -m reference.launch",
                            description="Run the muonsim reference backend (local or under torchrun).")
    types: dict[str, Any] = {"int": int, "float": float, "bool": on_off, "str": str}
    for f in run_flags():
        shown = {True: "on", False: "off"}.get(f.default, f.default) if f.kind == "bool" else f.default
        names = dict.fromkeys([f.flag, f"--{f.name.replace('_', '-')}"])  # --timeout and --timeout-s
        extra: dict[str, Any] = {"choices": f.choices} if f.kind == "choice" else {"type": types[f.kind]}
        if f.kind == "bool":
            extra["metavar"] = "{on,off}"
        parser.add_argument(*names, dest=f.name, default=None, **extra,
                            help=f.help + ("" if f.default is None else f" (default: {shown})"))
    parser.add_argument("--out", required=True, help="MeasuredRun JSON to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (2 bad arguments, 1 failed run)."""
    args = vars(_argparser().parse_args(argv))
    out = Path(args.pop("out"))
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if under_torchrun and args.get("world_size") is None:
        args["world_size"] = os.environ["WORLD_SIZE"]
    try:
        cfg = config_from_strings(args)
        if under_torchrun:
            return _torchrun(cfg, out)
        from reference.api import run_reference

        result = run_reference(cfg)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ReferenceRunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result.write_json(out)
    print(result.summary_line())
    return 0


def _torchrun(cfg: Any, out: Path) -> int:
    from reference.api import assemble
    from reference.runner import run_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise UserInputError(f"--world-size {cfg.world_size} does not match torchrun's WORLD_SIZE {world}")
    outputs = run_rank(cfg, rank, world, "env://", cfg.backend, gather=True)
    if rank == 0:
        result = assemble(cfg, outputs)
        result.write_json(out)
        print(result.summary_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())

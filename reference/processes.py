"""Local reference runs on forked processes: gloo over tcp://127.0.0.1, supervised.

:func:`launch_local` forks ``world_size`` children (each sets one intra-op thread first, which fork
needs once the parent has used OpenMP), supervises them, and on any failure — a rank that raises,
dies or outlives ``timeout_s`` — terminates every child and raises :class:`ReferenceRunError` with
one line. Nothing hangs: process-group init and collectives carry the same timeout, and the parent
kills what is left. Workers also die with the parent: if it is killed (even by SIGKILL, which
runs no clean-up), each worker ends at once on Linux (``PR_SET_PDEATHSIG``) and within half a second
elsewhere (a thread polling ``os.getppid()``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from topologies.inputs import UserInputError


class ReferenceRunError(RuntimeError):
    """A reference run failed (a rank raised, died or timed out); ``str`` is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text[:400]}"


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send ``sig`` to this process when its parent (thread) dies. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library is already loaded: its symbols
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """Portable fallback: a daemon thread that ends this process once ``os.getppid()`` is no longer
    ``parent_pid`` (the parent died and the process was re-parented)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="muonsim-parent-watchdog", daemon=True).start()


def die_with_parent(parent_pid: int) -> None:
    """End this forked worker when its parent ``parent_pid`` dies, however it dies.

    Linux: ``PR_SET_PDEATHSIG`` (SIGKILL, immediate); elsewhere the polling watchdog. Both check the
    parent once more afterwards, in case it died between the fork and the call.
    """
    if not _parent_death_signal(signal.SIGKILL):
        watch_parent(parent_pid)
    if os.getppid() != parent_pid:
        os._exit(1)


def _child(cfg: Any, rank: int, init_method: str, outdir: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    import torch

    torch.set_num_threads(1)
    code = 0
    try:
        from reference.runner import run_rank

        out = run_rank(cfg, rank, cfg.world_size, init_method, "gloo")
        torch.save(out, Path(outdir) / f"rank{rank}.pt")
    except BaseException as err:  # noqa: BLE001 - report anything, then exit
        Path(outdir, f"rank{rank}.err").write_text(_one_line(err), encoding="utf-8")
        code = 1
    os._exit(code)


_PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote worker")


def _describe_failure(failed: list[tuple[int, int]], outdir: str) -> str:
    """One line naming the root cause: a rank that died, else one whose error is not a peer's echo."""
    messages = {r: Path(outdir, f"rank{r}.err").read_text(encoding="utf-8")
                for r, _ in failed if Path(outdir, f"rank{r}.err").exists()}
    died = [(r, c) for r, c in failed if r not in messages]
    if died:
        r, c = died[0]
        what = f"killed by signal {-c}" if c < 0 else f"exited with code {c}"
        main = f"rank {r} died ({what})"
    else:
        own = [r for r in messages if not any(p in messages[r] for p in _PEER_ERRORS)]
        r = own[0] if own else failed[0][0]
        main = f"rank {r} failed: {messages[r]}"
    others = len(failed) - 1
    return f"reference run failed: {main}" + (f" (and {others} other rank(s) failed)" if others else "")


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(2.0)


def _supervise(procs: list[Any], outdir: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.exitcode for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            time.sleep(0.3)  # let peers that saw the failure report it too
            codes = [p.exitcode for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            raise ReferenceRunError(_describe_failure(failed, outdir))
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            running = [r for r, c in enumerate(codes) if c is None]
            raise ReferenceRunError(f"reference run timed out after {timeout_s:g} s (ranks still running: {running})")
        time.sleep(0.01)


def launch_local(cfg: Any, attempts: int = 2) -> list[Any]:
    """Run ``cfg`` on ``cfg.world_size`` forked gloo processes; return their RankOutputs.

    A run whose rendezvous port was taken between choosing and binding it is retried once on a
    new port; every other failure raises ReferenceRunError at once.
    """
    for attempt in range(attempts):
        try:
            return _launch_once(cfg)
        except ReferenceRunError as err:
            if attempt + 1 == attempts or "address already in use" not in str(err).lower():
                raise
    raise AssertionError("unreachable")


def _launch_once(cfg: Any) -> list[Any]:
    import multiprocessing as mp

    import torch

    if cfg.backend != "gloo":
        raise UserInputError("local runs use the gloo backend; use torchrun for nccl")
    ctx = mp.get_context("fork")
    init_method = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="muonsim-ref-") as outdir:
        args = (init_method, outdir, os.getpid())
        procs = [ctx.Process(target=_child, args=(cfg, r, *args)) for r in range(cfg.world_size)]
        try:
            for p in procs:
                p.start()
            _supervise(procs, outdir, cfg.timeout_s)
        finally:
            _stop(procs)
        return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(cfg.world_size)]

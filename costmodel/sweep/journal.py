"""The sweep's journal: an append-only JSON-lines file, one line per finished point.

Each line is ``{"key": ..., "result": {...}, "run": ...}``, written with one ``write`` on an
``O_APPEND`` descriptor as soon as the point's result reaches the parent: a Ctrl-C, a crash or a
``kill`` keeps every point written so far (the operating system holds the bytes; ``fsync`` runs at
most every ``SYNC_INTERVAL_S`` and on close, for a machine that loses power). A torn last line
(the process died inside a write) is cut off when the journal is opened again; a line that does
not parse is skipped (its point runs again). ``run`` names the sweep run that computed the point.
An exclusive lock on the file keeps two sweeps from writing one journal.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from topologies.inputs import UserInputError

SYNC_INTERVAL_S = 1.0


class Journal:
    """Finished points by key (``open`` reads them; ``append`` records one more)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._last_sync = 0.0
        self.skipped_lines = 0

    def open(self) -> dict[str, dict[str, Any]]:
        """Lock the journal, repair a torn tail, and return the finished results by key."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _lock(fd, self.path)
            data = _read_all(fd)
            if data and not data.endswith(b"\n"):
                os.ftruncate(fd, data.rfind(b"\n") + 1)
                data = data[:data.rfind(b"\n") + 1]
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        done: dict[str, dict[str, Any]] = {}
        for line in data.splitlines():
            try:
                entry = json.loads(line)
                done[str(entry["key"])] = dict(entry["result"])
            except (ValueError, KeyError, TypeError):
                self.skipped_lines += 1
        return done

    def entries(self) -> list[dict[str, Any]]:
        """Every parsable line (key, result, run), in the order written."""
        out = []
        for line in self.path.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def append(self, key: str, result: dict[str, Any], run: str) -> None:
        """Record one finished point (one write; synced to disk at most every SYNC_INTERVAL_S)."""
        assert self._fd is not None, "open the journal first"
        line = json.dumps({"key": key, "result": result, "run": run}, separators=(",", ":")) + "\n"
        data = line.encode()
        written = os.write(self._fd, data)
        while written < len(data):  # pragma: no cover - regular files write whole buffers
            written += os.write(self._fd, data[written:])
        now = time.monotonic()
        if now - self._last_sync >= SYNC_INTERVAL_S:
            os.fsync(self._fd)
            self._last_sync = now

    def close(self) -> None:
        """Sync and unlock."""
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _lock(fd: int, path: Path) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserInputError(f"another muonsim sweep is writing '{path}' (its journal is locked)") from None

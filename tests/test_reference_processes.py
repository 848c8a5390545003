"""Reference worker ranks die with their parent: SIGKILL of ``muonsim reference run`` (or of
``python -m reference.launch``) ends every worker within seconds, not at the end of the run.

Real processes, no mocks: the run is started in a subprocess with a workload that lasts minutes, the
test waits until the worker ranks exist (their pids appear as the parent's children in /proc), kills
the parent with SIGKILL and watches the workers go.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process state from /proc")

# a run that would take minutes: many steps of the small shapes, nothing checked at the end
LONG_RUN = ["--world-size", "2", "--shapes", "small", "--steps", "1000", "--check", "off", "--timeout", "600"]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None once it is gone (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return None if state in ("Z", "X") else (state, int(ppid))


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] == pid:
                out.append(int(entry.name))
    return out


def _wait_for(predicate, timeout_s: float):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def _kill_parent_and_check_workers(argv: list[str], expected_workers: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        # readiness: the worker ranks have been forked (no fixed sleep)
        workers = _wait_for(lambda: len(kids := _children(parent.pid)) >= expected_workers and kids, 120) or []
        assert len(workers) == expected_workers, f"workers never appeared (found {workers})"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        alive = _wait_for(lambda: not [w for w in workers if _stat(w)], 5.0)
        left = [w for w in workers if _stat(w)]
        assert alive and not left, f"workers {left} outlived their SIGKILLed parent by 5 s"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        for w in workers:  # only the pids this test started
            if _stat(w):
                os.kill(w, signal.SIGKILL)


@pytest.mark.parametrize("entry", ["cli", "launch"])
def test_sigkill_of_the_parent_ends_every_worker(entry, tmp_path):
    out = str(tmp_path / "run.json")
    if entry == "cli":
        argv = ["-c", "from cli.app import main; main()", "reference", "run", *LONG_RUN, "--out", out]
    else:
        argv = ["-m", "reference.launch", *LONG_RUN, "--out", out]
    _kill_parent_and_check_workers(argv, expected_workers=2)


def _watched_grandchild(ready_w: int) -> None:
    """Intermediate process: forks a child that relies on the polling watchdog alone, then sleeps."""
    from reference.processes import watch_parent

    pid = os.fork()
    if pid == 0:
        watch_parent(os.getppid(), poll_s=0.05)
        os.write(ready_w, b"%d\n" % os.getpid())
        time.sleep(600)
        os._exit(0)
    time.sleep(600)
    os._exit(0)


def test_the_portable_watchdog_alone_ends_an_orphan():
    """The fallback where PR_SET_PDEATHSIG does not exist: a thread polling os.getppid()."""
    ready_r, ready_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            _watched_grandchild(ready_w)
        finally:
            os._exit(1)
    grandchild = 0
    try:
        grandchild = int(os.read(ready_r, 64).split()[0])
        assert _stat(grandchild) is not None
        os.kill(middle, signal.SIGKILL)
        os.waitpid(middle, 0)
        assert _wait_for(lambda: _stat(grandchild) is None, 5.0), "the watchdog did not end the orphan"
    finally:
        os.close(ready_r)
        os.close(ready_w)
        for pid in (middle, grandchild):
            if pid and _stat(pid):
                os.kill(pid, signal.SIGKILL)

"""Start-up time of the CLI: wall time of ``muonsim --help`` and ``muonsim describe kimi-k2``.

Each command runs in a fresh process (the installed console script) several times; the script
prints the first run, the median and the minimum, against the goal of 0.5 s, and, with
``--imports``, the slowest top-level imports (``python -X importtime``) to show what loads eagerly.

    python benchmarks/bench_cli_startup.py [--repeat 7] [--imports]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

GOAL_S = 0.5
COMMANDS = (["--help"], ["describe", "kimi-k2"])


def wall_time_s(argv: list[str]) -> float:
    """Wall time of one run of ``argv`` in a new process, in seconds (raises if it fails)."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def slowest_imports(args: list[str], top: int = 12) -> list[tuple[float, str]]:
    """The ``top`` slowest cumulative imports of ``cli.app`` running ``args`` (seconds, module)."""
    code = f"import sys; sys.argv = ['muonsim', *{args!r}]; from cli.app import main; main()"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=False)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # top-level imports only (nested ones are indented further)
            rows.append((int(cumulative) / 1e6, name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    """Measure and print the start-up figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per command")
    parser.add_argument("--imports", action="store_true", help="also list the slowest top-level imports")
    opts = parser.parse_args()
    exe = shutil.which("muonsim")
    if exe is None:
        sys.exit("muonsim console script not found: pip install -e .")
    print(f"{'command':<28} {'first s':>8} {'median s':>9} {'min s':>7}  goal {GOAL_S} s")
    for cmd in COMMANDS:
        times = [wall_time_s([exe, *cmd]) for _ in range(opts.repeat)]
        median = statistics.median(times)
        verdict = "ok" if median < GOAL_S else "OVER"
        print(f"{'muonsim ' + ' '.join(cmd):<28} {times[0]:8.3f} {median:9.3f} {min(times):7.3f}  {verdict}")
    print(f"(python -c pass for reference: {statistics.median(wall_time_s([sys.executable, '-c', 'pass']) for _ in range(3)):.3f} s)")
    if opts.imports:
        for cmd in COMMANDS:
            print(f"\nslowest top-level imports for 'muonsim {' '.join(cmd)}' (cumulative s):")
            for seconds, name in slowest_imports(cmd):
                print(f"  {seconds:7.3f}  {name}")


if __name__ == "__main__":
    main()

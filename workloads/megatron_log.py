"""The text of a Megatron-LM / Megatron-Bridge training log: its iteration lines and its argument dump.

:func:`parse_megatron_log` reads the lines carrying ``elapsed time per iteration (ms)`` (and
``throughput per GPU (TFLOP/s/GPU)``): warm-up iterations, iterations reported as skipped or nan and
lines with a nan loss are dropped, and the step time is the median of the remaining lines (robust
to checkpoint or GC stalls). :func:`log_argument_values` reads Megatron-LM's printed ``arguments``
block (``name ..... value``). What the values mean for a measured run (scenario fields, recipe
settings) is :mod:`workloads.loaders`' business.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterator
from typing import Any

from topologies.inputs import UserInputError

DEFAULT_WARMUP_ITERATIONS = 10

_ITER_RE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)")
_ELAPSED_RE = re.compile(r"elapsed time per iteration \(ms\):\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_TFLOPS_RE = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_GBS_RE = re.compile(r"global batch size:\s*(\d+)")
_LOSS_RE = re.compile(r"lm loss:\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_SKIPPED_RE = re.compile(r"number of skipped iterations:\s*(\d+)")
_NAN_RE = re.compile(r"number of nan iterations:\s*(\d+)")
_ARG_RE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?([a-z_][a-z0-9_]*)\s+\.{3,}\s+(\S.*?)\s*$")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def log_argument_values(lines: list[str]) -> Iterator[tuple[str, str]]:
    """(name, value as printed) of every line of Megatron-LM's argument block (``name ..... value``)."""
    for line in lines:
        m = _ARG_RE.match(line)
        if m:
            yield m.group(1), m.group(2)


def parse_megatron_log(text: str, warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS,
                       source: str = "log") -> dict[str, Any]:
    """Measured figures of a Megatron training log (no scenario): step time and throughput.

    Returns ``step_time_s`` (median of the kept lines' elapsed time per iteration, in seconds),
    ``model_tflops_per_gpu`` (median, when logged), ``global_batch_size`` (when logged) and
    ``extra`` (iterations used, lines dropped and why). A line reports the mean over the
    iterations since the previous line; it is kept only when all of them are past the warm-up.
    Raises UserInputError when no iteration line survives.
    """
    kept_ms: list[float] = []
    kept_tflops: list[float] = []
    gbs: set[int] = set()
    dropped = {"warmup": 0, "skipped": 0, "nan": 0}
    previous_iteration = 0
    n_lines = 0
    unread: list[int] = []  # line numbers holding one of the two parts of an iteration line, not both
    for number, line in enumerate(text.splitlines(), start=1):
        elapsed = _ELAPSED_RE.search(line)
        it = _ITER_RE.search(line)
        if not elapsed or not it:
            if elapsed or it or "elapsed time per" in line.lower():
                unread.append(number)
            continue
        n_lines += 1
        iteration = int(it.group(1))
        window_start = previous_iteration + 1
        previous_iteration = iteration
        ms = _float(elapsed.group(1))
        loss = _LOSS_RE.search(line)
        skipped, nans = _SKIPPED_RE.search(line), _NAN_RE.search(line)
        if window_start <= warmup_iterations:
            dropped["warmup"] += 1
        elif skipped and int(skipped.group(1)) > 0:
            dropped["skipped"] += 1
        elif (nans and int(nans.group(1)) > 0) or (loss and not math.isfinite(_float(loss.group(1)))) \
                or not math.isfinite(ms) or ms <= 0:
            dropped["nan"] += 1
        else:
            kept_ms.append(ms)
            tflops = _TFLOPS_RE.search(line)
            if tflops and math.isfinite(_float(tflops.group(1))) and _float(tflops.group(1)) > 0:
                kept_tflops.append(_float(tflops.group(1)))
            g = _GBS_RE.search(line)
            if g:
                gbs.add(int(g.group(1)))
    if not kept_ms:
        why = ""
        if unread and not n_lines:
            many = len(unread) > 1
            look = "lines look like iteration lines but lack" if many else "line looks like an iteration line but lacks"
            why = (f"; {len(unread)} {look} 'iteration N/M' or 'elapsed time per iteration (ms): X' "
                   f"(the first is line {unread[0]})")
        elif n_lines and dropped["warmup"] == n_lines:
            # the last line keeps iterations window_start..last: it is used when --warmup < window_start
            why = f"; the log ends at iteration {previous_iteration}: give --warmup below {window_start}"
        raise UserInputError(
            f"{source}: no usable iteration lines ('elapsed time per iteration (ms)') after skipping "
            f"{warmup_iterations} warm-up iterations ({n_lines} found: {dropped['warmup']} warm-up, "
            f"{dropped['skipped']} skipped, {dropped['nan']} nan){why}")
    out: dict[str, Any] = {
        "step_time_s": statistics.median(kept_ms) / 1e3,
        "extra": {"log_lines_used": len(kept_ms), "log_lines_dropped": dropped,
                  "last_iteration": previous_iteration, "warmup_iterations": warmup_iterations},
    }
    if kept_tflops:
        out["model_tflops_per_gpu"] = statistics.median(kept_tflops)
    if len(gbs) == 1:
        out["global_batch_size"] = gbs.pop()
    elif len(gbs) > 1:
        raise UserInputError(f"{source}: the global batch size changes during the run ({sorted(gbs)}; "
                             "batch ramp-up); use a log of a fixed-batch run")
    return out

"""Pins of every number the engines produce for a broad scenario set (speed work must not move one).

For each scenario (models × systems × optimizers × layouts × TP modes × load balance × recompute,
CP, FSDP, hiding, bucket sizes, gradient dtypes, ...) this records, through public entry points only
(so it runs unchanged on any checkout of muonsim):

* the analytic StepReport (step time, breakdown, throughput, memory by component, optimizer
  section with every collective, notes, warnings) and the planner's fast path (step, breakdown
  terms, pipeline bound);
* the optimizer plan: every bucket, every rank class's work, every collective of the critical GPU
  with its time, padding, and digests of the owner arrays, owned names and TP calls of each role;
* memory by stage;
* for a subset, the discrete-event StepReport (and a digest of its timeline).

Floats are compared to 1e-9 relative (``compare``), everything else exactly. Regenerate after a
deliberate model change, from the code whose numbers are the reference (e.g. main)::

    PYTHONPATH=/path/to/checkout python tests/pinned_numbers.py --write tests/data/pinned_numbers.json.gz
    PYTHONPATH=. python tests/pinned_numbers.py --check tests/data/pinned_numbers.json.gz

``--check`` prints every difference (first 40) and exits 1 on any. Scenarios a checkout rejects
are recorded with their error line (also pinned).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import gzip
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

REL_TOL = 1e-9
ABS_TOL = 1e-300  # zeros stay zeros; tiny values are compared relatively

# ------------------------------------------------------------------------------------------------
# The scenario set: (label, flat overrides on the default scenario, run the DES too)

KIMI_LAYOUTS = [  # 256 GPUs
    {},
    {"tp": 1, "pp": 8, "vpp": 2, "ep": 32, "micro_batch_size": 1},
    {"tp": 2, "pp": 4, "vpp": 2, "ep": 32, "micro_batch_size": 1},
    {"tp": 1, "pp": 2, "vpp": 7, "ep": 32, "micro_batch_size": 1},
    {"tp": 1, "pp": 16, "vpp": 1, "ep": 8, "micro_batch_size": 1},
    {"tp": 4, "pp": 4, "vpp": 2, "ep": 8, "etp": 2, "micro_batch_size": 1},
    {"tp": 2, "pp": 4, "vpp": 2, "cp": 2, "ep": 16, "micro_batch_size": 1},
    {"tp": 8, "pp": 8, "vpp": 4, "ep": 4, "etp": 2, "micro_batch_size": 2, "recompute": "full"},
    {"tp": 1, "pp": 4, "vpp": 1, "ep": 64, "micro_batch_size": 4, "recompute": "selective"},
]
KIMI_OPTIMIZERS = [
    {},
    {"load_balance": "ping_pong"},
    {"load_balance": "none"},
    {"layer_wise_layout": "legacy"},
    {"layer_wise_layout": "legacy", "load_balance": "lpt"},
    {"optimizer": "adamw"},
    {"tp_mode": "distributed"},
    {"tp_mode": "blockwise", "hide_param_gather": True},
    {"hide_param_gather": True, "grad_reduce_dtype": "bf16"},
]


def scenario_set() -> list[tuple[str, dict[str, Any], bool]]:
    """(label, overrides, with DES) of every pinned scenario."""
    out: list[tuple[str, dict[str, Any], bool]] = []
    for i, lay in enumerate(KIMI_LAYOUTS):
        for j, opt in enumerate(KIMI_OPTIMIZERS):
            if (i + j) % 3 and not (i == 0 or j == 0):
                continue  # a Latin-square subset of layouts × optimizers
            out.append((f"kimi L{i} O{j}", {**lay, **opt}, (i + j) % 4 == 0))
    base_kimi = {"tp": 1, "pp": 8, "vpp": 2, "ep": 32, "micro_batch_size": 1}
    out += [
        ("kimi 2048 gpus", {"gpus": 2048, "global_batch_size": 8192, **base_kimi}, True),
        ("kimi 2048 adamw tp2", {"gpus": 2048, "global_batch_size": 8192, "tp": 2, "pp": 8, "vpp": 2, "ep": 64,
                                 "optimizer": "adamw"}, False),
        ("kimi 8192 distributed", {"gpus": 8192, "global_batch_size": 8192, "tp": 2, "pp": 16, "vpp": 1, "ep": 32,
                                   "tp_mode": "distributed"}, False),
        ("kimi replicated muon", {**base_kimi, "distribution": "replicated"}, False),
        ("kimi no grad overlap", {**base_kimi, "overlap_grad_reduce": False}, True),
        ("kimi small buckets", {**base_kimi, "bucket_size_elements": 5_000_000}, False),
        ("kimi small buckets legacy", {**base_kimi, "bucket_size_elements": 5_000_000,
                                       "layer_wise_layout": "legacy"}, False),
        ("kimi tf32 ns no split", {**base_kimi, "matmul_precision": "tf32", "split_qkv": False, "ns_steps": 6}, False),
        ("kimi gb200", {**base_kimi, "system": "gb200-nvl72"}, True),
        ("kimi ep comm overlap", {"ep_comm_overlap": True}, False),
        ("kimi tp comm overlap", {"tp": 2, "pp": 4, "vpp": 2, "ep": 32, "micro_batch_size": 1,
                                  "tp_comm_overlap": True}, False),
        ("kimi gpus per domain 64", {"gpus_per_domain": 64}, False),
        ("kimi pipeline split", {"pp": 4, "vpp": 1, "pipeline_split": "balanced"}, False),
    ]
    llama405 = {"model": "llama3.1-405b", "gpus": 1024, "global_batch_size": 1024, "seq_length": 8192,
                "micro_batch_size": 1, "ep": 1, "tp": 8, "pp": 8, "vpp": 2}
    for name, extra, des in [
        ("llama405", {}, True),
        ("llama405 tp4 pp16", {"tp": 4, "pp": 16, "vpp": 2}, False),
        ("llama405 lpt legacy", {"layer_wise_layout": "legacy", "load_balance": "lpt"}, False),
        ("llama405 distributed", {"tp_mode": "distributed", "pp": 16, "vpp": 1}, False),
        ("llama405 blockwise", {"tp_mode": "blockwise", "cp": 2, "pp": 4}, False),
        ("llama405 adamw", {"optimizer": "adamw", "recompute": "full"}, True),
        ("llama405 adamw replicated", {"optimizer": "adamw", "distribution": "replicated"}, False),
        ("llama405 ping pong", {"load_balance": "ping_pong", "hide_param_gather": True}, False),
        ("llama405 dgx-b300", {"system": "dgx-b300", "pp": 16}, True),
    ]:
        out.append((name, {**llama405, **extra}, des))
    for name, extra, des in [
        ("llama70b 64", {"model": "llama3-70b", "gpus": 64, "tp": 4, "pp": 2, "vpp": 5, "ep": 1,
                         "global_batch_size": 256, "seq_length": 4096, "micro_batch_size": 1}, True),
        ("llama70b adamw fsdp", {"model": "llama3-70b", "gpus": 64, "tp": 2, "pp": 1, "vpp": 1, "ep": 1,
                                 "fsdp": 32, "optimizer": "adamw", "global_batch_size": 256,
                                 "seq_length": 4096, "micro_batch_size": 1}, True),
        ("llama8b h100", {"model": "llama3-8b", "system": "dgx-h100", "gpus": 8, "tp": 1, "pp": 1, "vpp": 1,
                          "ep": 1, "global_batch_size": 64, "seq_length": 8192, "micro_batch_size": 1}, True),
        ("llama8b b200 lpt", {"model": "llama3-8b", "system": "dgx-b200", "gpus": 16, "tp": 2, "pp": 2,
                              "vpp": 1, "ep": 1, "global_batch_size": 64, "seq_length": 8192,
                              "micro_batch_size": 1, "load_balance": "lpt", "layer_wise_layout": "legacy"}, False),
        ("deepseek-v3", {"model": "deepseek-v3", "gpus": 256, "tp": 1, "pp": 8, "vpp": 1, "ep": 32,
                         "micro_batch_size": 1}, True),
        ("deepseek-v3-mtp", {"model": "deepseek-v3-mtp", "gpus": 512, "tp": 2, "pp": 8, "vpp": 2, "ep": 16,
                             "global_batch_size": 4096, "micro_batch_size": 1, "tp_mode": "distributed"}, False),
        ("qwen3-235b", {"model": "qwen3-235b-a22b", "gpus": 128, "tp": 2, "pp": 4, "vpp": 1, "ep": 16,
                        "micro_batch_size": 1, "global_batch_size": 1024}, True),
        ("qwen3-235b adamw", {"model": "qwen3-235b-a22b", "gpus": 128, "tp": 2, "pp": 4, "vpp": 2, "ep": 8,
                              "etp": 2, "micro_batch_size": 1, "global_batch_size": 1024, "optimizer": "adamw"}, False),
        ("qwen3-30b", {"model": "qwen3-30b-a3b", "gpus": 32, "tp": 1, "pp": 2, "vpp": 1, "ep": 8,
                       "micro_batch_size": 2, "global_batch_size": 512, "layer_wise_layout": "legacy"}, False),
        ("qwen3-30b dp1", {"model": "qwen3-30b-a3b", "gpus": 8, "tp": 2, "pp": 4, "vpp": 1, "ep": 2,
                           "micro_batch_size": 1, "global_batch_size": 64, "layer_wise_layout": "legacy"}, False),
    ]:
        out.append((name, extra, des))
    return out


# ------------------------------------------------------------------------------------------------
# Serialisation: generic over dataclasses, pydantic models and numpy arrays (new fields are pinned
# automatically); integer arrays and name lists become digests.


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def to_plain(obj: Any) -> Any:  # noqa: PLR0911
    """A JSON-able copy of ``obj`` (floats kept as floats; see the module docstring)."""
    import numpy as np

    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "iub":
            return {"int_array": len(obj), "digest": _digest(np.ascontiguousarray(obj, dtype=np.int64).tobytes())}
        return [float(x) for x in obj.ravel().tolist()]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return to_plain(obj.model_dump())
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if len(obj) > 8 and all(isinstance(x, str) for x in obj):
            return {"strings": len(obj), "digest": _digest("\n".join(obj).encode())}
        return [to_plain(x) for x in obj]
    return repr(obj)


def plan_record(plan: Any) -> Any:
    """Every stage's buckets, rank work, collectives and times; role owners, names, calls as digests."""
    out = []
    for s in plan.stages:
        rec = to_plain(s)
        rec["roles"] = [{"group": r.group, "size": r.size, "owner": to_plain(r.owner),
                         "names": {"strings": len(r.names), "digest": _digest("\n".join(r.names).encode())},
                         "item_calls": _digest(repr([to_plain(c) for c in r.item_calls]).encode())}
                        for r in s.roles]
        rec["critical_gpu_collectives"] = to_plain(s.gpu_collectives(s.ranks[s.critical_rank].rank)) if s.ranks else []
        out.append(rec)
    return {"kind": plan.kind, "distribution": plan.distribution, "layout": plan.layout, "tp_mode": plan.tp_mode,
            "load_balance": plan.load_balance, "notes": list(plan.notes),
            "hide_param_gather": plan.hide_param_gather, "stages": out}


def _report_record(report: Any, timeline: bool) -> Any:
    rec = report.to_json_dict() if hasattr(report, "to_json_dict") else to_plain(report)
    rec = to_plain(rec)
    rec.pop("events", None)
    if timeline:
        ev = report.events
        rec["timeline"] = {"events": len(ev), "start_sum_s": math.fsum(e.start_s for e in ev),
                           "duration_sum_s": math.fsum(e.duration_s for e in ev),
                           "names": _digest("\n".join(sorted(f"{e.rank}/{e.stream}/{e.name}" for e in ev)).encode())}
    return rec


def scenario_record(overrides: dict[str, Any], with_des: bool) -> Any:
    """Everything pinned for one scenario (or its one-line error)."""
    from costmodel.analytic import run_analytic
    from costmodel.optimizer.plan import build_optimizer_plan
    from costmodel.planner.fast_analytic import FastAnalytic
    from workloads.memory import memory_by_stage
    from workloads.scenario import DEFAULT_SCENARIO

    try:
        sc = DEFAULT_SCENARIO.resolve().with_updates(**overrides)
    except Exception as err:  # noqa: BLE001 - a rejected scenario is pinned by its message
        return {"error": f"{type(err).__name__}: {err}"}
    rec: dict[str, Any] = {}
    try:
        rec["analytic"] = _report_record(run_analytic(sc), timeline=False)
        rec["plan"] = plan_record(build_optimizer_plan(sc))
        fast = FastAnalytic()
        step, terms = fast.step(sc)
        rec["fast"] = {"step_s": step, "terms": to_plain(terms), "bound_s": fast.pipeline_bound_s(sc)}
        rec["memory_by_stage"] = to_plain(memory_by_stage(sc))
        if with_des:
            from costmodel.des import run_des

            rec["des"] = _report_record(run_des(sc), timeline=True)
    except Exception as err:  # noqa: BLE001 - pinned too
        rec["error"] = f"{type(err).__name__}: {err}"
    return rec


def compute_pins(labels: set[str] | None = None) -> dict[str, Any]:
    """label -> record for the whole set (or the given labels)."""
    return {label: {"overrides": overrides, **scenario_record(overrides, des)}
            for label, overrides, des in scenario_set() if labels is None or label in labels}


# ------------------------------------------------------------------------------------------------


def compare(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Differences between two records: floats beyond ``REL_TOL`` relative, anything else unequal."""
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, (int, float)) and isinstance(actual, (int, float)) and not isinstance(expected, bool):
            e, a = float(expected), float(actual)
            if e == a or (math.isnan(e) and math.isnan(a)):
                return []
            if abs(e - a) <= max(REL_TOL * max(abs(e), abs(a)), ABS_TOL):
                return []
        return [f"{path}: expected {expected!r}, got {actual!r}"]
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in expected.keys() | actual.keys():
            if k not in actual:
                out.append(f"{path}.{k}: missing")
            elif k not in expected:
                out.append(f"{path}.{k}: unexpected (new)")
            else:
                out += compare(expected[k], actual[k], f"{path}.{k}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: length {len(expected)} -> {len(actual)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            out += compare(e, a, f"{path}[{i}]")
        return out
    return [] if expected == actual else [f"{path}: expected {expected!r}, got {actual!r}"]


def load(path: str | Path) -> dict[str, Any]:
    """Read a pins file (gzip JSON)."""
    with gzip.open(path, "rt") as f:
        return json.load(f)


def write(pins: dict[str, Any], path: str | Path) -> None:
    """Write a pins file (gzip JSON, one scenario per line, stable bytes)."""
    body = "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in pins.items()) + "\n}\n"
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(body.encode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="compute the pins and write them")
    mode.add_argument("--check", metavar="FILE", help="compute the pins and compare with FILE")
    ap.add_argument("--only", nargs="*", help="labels to compute (default: all)")
    args = ap.parse_args()
    import costmodel

    start = time.perf_counter()
    pins = compute_pins(set(args.only) if args.only else None)
    print(f"{len(pins)} scenarios computed in {time.perf_counter() - start:.1f} s with {Path(costmodel.__file__).parent.parent}",
          file=sys.stderr)
    if args.write:
        write(pins, args.write)
        return 0
    expected = load(args.check)
    diffs = []
    for label in pins:
        if label not in expected:
            diffs.append(f"{label}: not in {args.check}")
            continue
        diffs += compare(expected[label], pins[label], label)
    if not args.only:
        diffs += [f"{label}: missing" for label in expected if label not in pins]
    for d in diffs[:40]:
        print(d)
    print(f"{len(diffs)} differences over {len(pins)} scenarios")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())

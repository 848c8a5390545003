"""Pins of every number the engines produce for a broad scenario set (speed work must not move one).

For each scenario this records, through public entry points only (so it runs unchanged on any
checkout of muonsim):

* the analytic StepReport (step time, breakdown, throughput, memory by component, optimizer
  section with every collective and kernel count, notes, warnings) and the planner's fast path
  (step, breakdown terms, pipeline bound);
* the optimizer plan: every bucket, every rank class's work (kernel launches by part included),
  every collective of the critical GPU with its time, padding, and digests of the owner arrays,
  owned names and TP calls of each role;
* memory by stage;
* for a subset, the discrete-event StepReport (and a digest of its timeline).

The set (:func:`scenario_set`): hand-written scenarios (models x systems x optimizers x layouts x
TP modes x load balance x recompute, CP, FSDP and its sharding strategies, distributed-optimizer
instances, hiding, buckets, gradient dtypes, FP8 parameter gathers, precision-aware and offloaded
optimizers, CUDA graphs, EP / TP overlap, dispatchers, activation offloading, BF16 layers, pipeline
layouts, logging...), every run of the shipped ``megatron-bridge`` dataset (each with its recipe
settings) and every run of ``megatron-ci-all`` (the CI architectures: GELU, LayerNorm, learned
positions, tied embeddings, biases), plus small ``plan`` searches (ranking, reference, Pareto
front, best DES report, sensitivity; not the search-effort counters or wall times).

Floats are compared to 1e-9 relative (``compare``), everything else exactly. Regenerate after a
deliberate model change, from the code whose numbers are the reference (e.g. main)::

    PYTHONPATH=. python tests/pinned_numbers.py --against main           # the whole set, both checkouts
    PYTHONPATH=/path/to/main python tests/pinned_numbers.py --subset --write tests/data/pinned_numbers.json.gz
    PYTHONPATH=. python tests/pinned_numbers.py --check FILE [--subset | --only LABEL...]

The test suite (``tests/test_pinned_numbers.py``) checks the representative :data:`SUBSET` against
``tests/data/pinned_numbers.json.gz`` (written from main's code); the whole set (about 900 entries,
two minutes) is checked against another checkout with ``--against REF``. ``--check`` and
``--against`` print every difference (first 40) and exit 1 on any. Scenarios a checkout rejects are
recorded with their error line (also pinned).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import gzip
import hashlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REL_TOL = 1e-9
ABS_TOL = 1e-300  # zeros stay zeros; tiny values are compared relatively

# The scenario set lives beside this script (loaded by path: ``--against`` runs this script with
# another checkout's packages on PYTHONPATH).
_spec = importlib.util.spec_from_file_location("pinned_scenarios", Path(__file__).resolve().parent / "pinned_scenarios.py")
assert _spec is not None and _spec.loader is not None
_scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scenarios)
SUBSET = _scenarios.SUBSET
scenario_set = _scenarios.scenario_set


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
    if isinstance(obj, (list, tuple, Sequence)):  # a RankTable (lazy RankWork) is a Sequence: pinned as its list
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
            "hide_param_gather": plan.hide_param_gather, "hypothetical": plan.hypothetical, "stages": out}


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


def _dataset_scenario(name: str, run_id: str) -> Any:
    from costmodel.calibrate.validation import scenario_for_run
    from workloads.datasets import load_dataset_rows

    runs, _ = load_dataset_rows(name)
    return scenario_for_run(next(r for r in runs if r.run_id == run_id))


def _scenario(source: dict[str, Any]) -> Any:
    from workloads.scenario import DEFAULT_SCENARIO

    if "dataset" in source:
        return _dataset_scenario(source["dataset"], source["run_id"])
    return DEFAULT_SCENARIO.resolve().with_updates(**source["overrides"])


def calibrated_record(dataset: str) -> Any:
    """Every run of a shipped dataset predicted with the built-in calibration profile (what
    ``muonsim validate --dataset NAME`` prints): the pins above run at datasheet factors, where the
    fitted host-time and efficiency factors of a profile do nothing."""
    from cli.common import load_calibration
    from costmodel.calibrate.validation import validate_runs
    from workloads.datasets import load_dataset_rows

    runs, skipped = load_dataset_rows(dataset)
    report = validate_runs(runs, load_calibration(None), "analytic", skipped)
    return {"calibration": report.calibration,
            "predicted_step_time_s": {r.run_id: r.predicted_step_time_s for r in report.rows},
            "unsupported": sorted(u.run_id for u in report.unsupported)}


def scenario_record(source: dict[str, Any], with_des: bool) -> Any:
    """Everything pinned for one entry (or its one-line error)."""
    if "plan" in source:
        return plan_search_record(source["plan"])
    if "calibrated" in source:
        return calibrated_record(source["calibrated"])
    from costmodel.analytic import run_analytic
    from costmodel.optimizer.plan import build_optimizer_plan
    from costmodel.planner.fast_analytic import FastAnalytic
    from workloads.memory import memory_by_stage

    try:
        sc = _scenario(source)
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


# search-effort counters and wall times: how the search got there, not what it found
_PLAN_STATS_SKIPPED = ("bounds_computed", "groups_expanded", "groups_infeasible", "candidates_evaluated",
                       "candidates_pruned", "candidates_unexamined", "jobs", "screening_wall_s", "engine_calls_per_s",
                       "candidates_per_s", "des_wall_s", "sensitivity_wall_s", "total_wall_s")


def plan_search_record(spec: dict[str, Any]) -> Any:
    """A small ``plan`` search in process: ranking, reference, Pareto front, best report, sensitivity."""
    from costmodel.planner.pins import parse_pins
    from costmodel.planner.plan import PlanOptions, run_plan
    from workloads.scenario import DEFAULT_SCENARIO

    base = DEFAULT_SCENARIO.resolve().with_updates(**spec["base"]) if spec["base"] else DEFAULT_SCENARIO.resolve()
    pins = parse_pins(spec["pins"], allow_hypothetical=spec.get("allow_hypothetical", False))
    options = PlanOptions(pins=pins, jobs=1, top_k=spec["top_k"], limit=spec["limit"], samples=spec["samples"],
                          headroom=spec["headroom"], exhaustive=spec.get("exhaustive", False))
    result = run_plan(base, options).result.model_dump(mode="json")
    for key in _PLAN_STATS_SKIPPED:
        result["stats"].pop(key, None)
    return {"result": to_plain(result)}


def compute_pins(labels: set[str] | None = None) -> dict[str, Any]:
    """label -> record for the whole set (or the given labels)."""
    return {label: {"source": source, **scenario_record(source, des)}
            for label, source, des in scenario_set() if labels is None or label in labels}


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


# JSON keys renamed since pins were first written (old -> new; the figures are the same): units in every
# name (fractions say _fraction, the max/mean imbalance says _ratio)
RENAMED_KEYS = {"mfu": "mfu_fraction", "imbalance": "imbalance_ratio", "memory_headroom": "memory_headroom_fraction",
                "top1_stability": "top1_stability_fraction"}


def upgrade(record: Any) -> Any:
    """``record`` with today's key names: :data:`RENAMED_KEYS`, and a plan row's flat ``breakdown_s``
    (``comm:<kind>`` keys) nested as a StepReport's (``exposed_comm: {<kind>: ...}``). Pins written by older
    code (a pins file, another checkout's ``--against`` run) compare with this checkout's figure by figure."""
    if isinstance(record, list):
        return [upgrade(x) for x in record]
    if not isinstance(record, dict):
        return record
    out = {RENAMED_KEYS.get(k, k): upgrade(v) for k, v in record.items()}
    flat = out.get("breakdown_s")
    if isinstance(flat, dict) and any(k.startswith("comm:") for k in flat):
        nested = {k: v for k, v in flat.items() if not k.startswith("comm:")}
        nested["exposed_comm"] = {k.removeprefix("comm:"): v for k, v in flat.items() if k.startswith("comm:")}
        out["breakdown_s"] = nested
    return out


def load(path: str | Path) -> dict[str, Any]:
    """Read a pins file (gzip JSON), with today's key names (:func:`upgrade`)."""
    with gzip.open(path, "rt") as f:
        return {label: upgrade(record) for label, record in json.load(f).items()}


def write(pins: dict[str, Any], path: str | Path) -> None:
    """Write a pins file (gzip JSON, one entry per line, stable bytes)."""
    body = "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in pins.items()) + "\n}\n"
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(body.encode())


def _pins_of_ref(ref: str, subset: bool) -> dict[str, Any]:
    """The pins computed by git ref ``ref``'s code (a temporary worktree; this script runs there)."""
    import os
    import shutil
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="muonsim-pins-"))
    tree, out = tmp / "tree", tmp / "pins.json.gz"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--write", str(out),
                        *(["--subset"] if subset else [])],
                       check=True, env=os.environ | {"PYTHONPATH": str(tree)}, cwd=str(tree))
        return load(out)
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="compute the pins and write them")
    mode.add_argument("--check", metavar="FILE", help="compute the pins and compare with FILE")
    mode.add_argument("--against", metavar="REF", help="compute the pins with git ref REF's code (a temporary "
                      "worktree) and with this checkout's, and compare")
    ap.add_argument("--only", nargs="*", help="labels to compute (default: all)")
    ap.add_argument("--subset", action="store_true", help="only the representative subset the test suite checks")
    args = ap.parse_args()
    import costmodel

    if args.write and args.only:
        print("--write takes the whole set or --subset, not --only", file=sys.stderr)
        return 2
    labels = set(args.only) if args.only else (set(SUBSET) if args.subset else None)
    expected = _pins_of_ref(args.against, args.subset) if args.against else None
    start = time.perf_counter()
    pins = compute_pins(labels)
    print(f"{len(pins)} entries computed in {time.perf_counter() - start:.1f} s with "
          f"{Path(costmodel.__file__).parent.parent}", file=sys.stderr)
    if args.write:
        write(pins, args.write)
        return 0
    if expected is None:
        expected = load(args.check)
    diffs = []
    for label in pins:
        if label not in expected:
            diffs.append(f"{label}: not in the reference pins")
            continue
        diffs += compare(expected[label], pins[label], label)
    diffs += [f"{label}: missing" for label in expected if label not in pins and (labels is None or label in labels)]
    for d in diffs[:40]:
        print(d)
    print(f"{len(diffs)} differences over {len(pins)} entries")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())

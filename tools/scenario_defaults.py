"""Generate ``workloads/data/scenario_defaults.yaml``: every catalogue model's default layout on every system.

    python tools/scenario_defaults.py            # rewrites the shipped table (about 5-20 min on 2 cores)
    python tools/scenario_defaults.py --check    # exit 1 when a catalogue model × system pair is missing
    python tools/scenario_defaults.py --systems dgx-a100   # recompute one system's pairs, keep the rest

For each model × system (see :mod:`workloads.scenario_defaults` for how the table is used):

1. **recipe**: for each precision, the newest Megatron-Bridge release's run of that model on that
   system in the shipped ``megatron_bridge_perf_summary.csv`` (with the dataset's documented recipe
   settings applied) whose layout the default optimizer (Muon) can run; Megatron rejects
   Megatron-FSDP with the layer-wise optimizer, so FSDP runs are skipped (and named). A run is the
   recipe of a catalogue model with the same architecture; one whose MTP layers differ (DeepSeek-V3
   with and without its MTP layer) still gives the layout, and the source says so. The entry used without ``--precision`` is
   the first of mxfp8, fp8-cs, bf16, nvfp4 the GPU supports (muonsim's preference).
2. **published**: :data:`PUBLISHED` (a layout published outside the table, e.g. NVIDIA's Kimi K2 run).
3. **search**: otherwise the best plan of ``muonsim plan`` with every optimizer setting pinned to
   muonsim's defaults (:func:`search_pins`: Muon, current layer-wise layout, duplicated TP mode,
   LPT, Megatron's synchronous parameter gather) and tp/pp/vpp/cp/ep/etp/micro-batch/recompute searched, with the built-in calibration,
   seed 0, ranked by the analytic engine (what predict uses by default). GPUs, global batch and sequence come from the model's
   newest run on another system (or its published layout); when no plan fits in memory the GPU
   count doubles (up to 8x). Precision: the system's preferred one.

The output is deterministic for a given code base (the planner's ranking is).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from topologies.hardware import Precision, SystemSpec, load_system, system_names  # noqa: E402
from topologies.inputs import UserInputError  # noqa: E402
from workloads.measured import MeasuredRun  # noqa: E402
from workloads.models import ModelSpec, load_model, model_names  # noqa: E402
from workloads.scenario import ScenarioConfig, build_config  # noqa: E402
from workloads.scenario_defaults import (  # noqa: E402
    DEFAULTS_PATH,
    PRECISION_PREFERENCE,
    DefaultsEntry,
    DefaultsTable,
    preferred_precision,
)

DATASET = "megatron-bridge"
CSV_NAME = "workloads/data/measured/megatron_bridge_perf_summary.csv"
def search_pins() -> dict[str, str]:
    """Every optimizer setting pinned to muonsim's default (what ``predict`` uses unless told otherwise)."""
    from workloads.scenario import OptimizerSpec

    spec = OptimizerSpec()
    return {"optimizer": spec.kind, "layer_wise_layout": spec.layer_wise_layout, "tp_mode": spec.tp_mode,
            "load_balance": spec.resolved_load_balance, "hide_param_gather": "on" if spec.hide_param_gather else "off"}


MAX_DOUBLINGS = 3
OPTIMIZER_KEYS = {"optimizer", "distribution", "tp_mode", "ns_steps", "hide_param_gather", "layer_wise_layout",
                  "load_balance"}
SYSTEM_ORDER = ("gb300-nvl72", "gb200-nvl72", "dgx-b300", "dgx-b200", "dgx-h100")

PUBLISHED: list[dict[str, Any]] = [{
    "model": "kimi-k2", "system": "gb300-nvl72", "precision": "mxfp8", "gpus": 256,
    "parallelism": {"tp": 1, "pp": 4, "vpp": 4, "cp": 1, "ep": 64, "micro_batch_size": 2,
                    "global_batch_size": 4096, "seq_length": 4096},
    "source": "NVIDIA's Kimi K2 run on 256 GB300 (PP4 DP64 EP64, MXFP8, Megatron-Bridge 26.02; NVIDIA Technical "
              "Blog 'Advancing Emerging Optimizers for Accelerated LLM Training with NVIDIA Megatron'); vpp 4, "
              "micro-batch 2, global batch 4096 and sequence 4096 are muonsim's assumptions",
}]


def release_key(release: str) -> tuple[int, ...]:
    """'26.04.01' -> (26, 4, 1): releases compare as version numbers."""
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def _architecture(spec: ModelSpec) -> dict[str, Any]:
    return spec.model_dump(exclude={"name", "display_name"})


def runs_of(model: str, runs: list[MeasuredRun]) -> list[tuple[MeasuredRun, str]]:
    """(run, note) for every run describing catalogue ``model``: the same architecture with the MTP
    layers the run had, or the same architecture up to its MTP layers (noted: the layout applies)."""
    spec = load_model(model)
    target = _architecture(spec)
    without_mtp = {k: v for k, v in target.items() if k != "mtp_layers"}
    out = []
    for run in runs:
        arch = _architecture(load_model(run.model).model_copy(update={"mtp_layers": run.mtp}))
        if arch == target:
            out.append((run, ""))
        elif {k: v for k, v in arch.items() if k != "mtp_layers"} == without_mtp:
            out.append((run, f"that run had {run.mtp} MTP layer(s); this model has {spec.mtp_layers}"))
    return out


def layout_of(run: MeasuredRun) -> tuple[int, Precision, dict[str, Any], dict[str, Any]]:
    """(gpus, precision, parallelism, runtime) of a run: its scenario without model, system, optimizer, MTP."""
    from workloads.scenario import _SECTION_OF

    flat = {k: v for k, v in run.scenario_overrides().items()
            if k not in OPTIMIZER_KEYS | {"model", "system", "gpus", "precision", "mtp_layers"}}
    par = {k: v for k, v in flat.items() if _SECTION_OF.get(k) == "parallelism"}
    runtime = {k: v for k, v in flat.items() if _SECTION_OF.get(k) == "runtime"}
    if par.get("etp") == 1:
        par.pop("etp")  # Megatron's default (None = 1)
    if par.get("fsdp") == 0:
        par.pop("fsdp")
    return run.num_gpus, run.precision, par, runtime


def config_of(model: str, system: str, gpus: int, precision: Precision, par: dict[str, Any],
              runtime: dict[str, Any] | None = None) -> ScenarioConfig:
    data: dict[str, Any] = {"model": model, "system": system, "gpus": gpus, "precision": precision.value,
                            "parallelism": par}
    if runtime:
        data["runtime"] = runtime
    return build_config(data, {})


def recipe_entries(model: str, system: SystemSpec, runs: list[tuple[MeasuredRun, str]]) -> tuple[list[DefaultsEntry], list[str]]:
    """One recipe entry per precision (newest Muon-compatible run) and notes on what was skipped."""
    entries, notes = [], []
    by_precision: dict[Precision, list[tuple[MeasuredRun, str]]] = {}
    for run, note in runs:
        if run.system == system.name:
            by_precision.setdefault(run.precision, []).append((run, note))
    for precision in PRECISION_PREFERENCE:
        candidates = sorted(by_precision.get(precision, []), key=lambda rn: release_key(rn[0].release), reverse=True)
        skipped = []
        for run, note in candidates:
            gpus, prec, par, runtime = layout_of(run)
            try:
                config_of(model, system.name, gpus, prec, par, runtime).resolve()
            except UserInputError as err:
                skipped.append(f"{run.run_id} ({err})")
                continue
            extra = f"; newer runs skipped: {'; '.join(skipped)}" if skipped else ""
            source = (f"Megatron-Bridge {run.release} performance recipe, published run {run.run_id} "
                      f"({CSV_NAME})" + (f"; {note}" if note else "") + extra)
            entries.append(DefaultsEntry(model=model, system=system.name, precision=prec, kind="recipe", source=source,
                                         gpus=gpus, parallelism=par, runtime=runtime))
            break
        else:
            if skipped:
                notes.append(f"{precision.value} recipe runs not usable with Muon: {'; '.join(skipped)}")
    return entries, notes


def search_template(model: str, runs: list[tuple[MeasuredRun, str]]) -> tuple[int, int, int, str]:
    """(gpus, global batch, sequence, where from) for a search: the model's newest run elsewhere."""
    published = next((p for p in PUBLISHED if p["model"] == model), None)
    if published is not None:
        par = published["parallelism"]
        return published["gpus"], par["global_batch_size"], par["seq_length"], f"its published layout on {published['system']}"
    if not runs:
        return 256, 4096, 4096, "no published run of this model: 256 GPUs, gbs 4096, seq 4096 (assumption)"
    order = {name: i for i, name in enumerate(SYSTEM_ORDER)}
    run = max(runs, key=lambda rn: (release_key(rn[0].release), -order.get(rn[0].system, 99)))[0]
    return run.num_gpus, run.global_batch_size, run.seq_length, f"run {run.run_id}"


def search_entry(model: str, system: SystemSpec, template: tuple[int, int, int, str], jobs: int,
                 why: str) -> DefaultsEntry:
    """The best plan of a pinned search (GPU count doubled until a plan fits)."""
    from costmodel.calibrate.profile import default_profile
    from costmodel.planner.pins import parse_pins
    from costmodel.planner.plan import PlanOptions, run_plan, scenario_from_config

    gpus, gbs, seq, origin = template
    precision = preferred_precision(system)
    profile = default_profile()
    tried = []
    for _ in range(MAX_DOUBLINGS + 1):
        config = config_of(model, system.name, gpus, precision, {"global_batch_size": gbs, "seq_length": seq})
        base = scenario_from_config(config)
        if profile is not None:
            base = profile.apply(base)
        options = PlanOptions(pins=parse_pins(search_pins()), top_k=0, limit=1, jobs=jobs, samples=0, seed=0)
        try:
            outcome = run_plan(base, options, reference_error="no reference", profile=profile)
        except UserInputError as err:
            tried.append(f"{gpus} GPUs: {err}")
            gpus *= 2
            continue
        best = outcome.result.best
        if best is None:
            tried.append(f"{gpus} GPUs: no plan fits in memory")
            gpus *= 2
            continue
        par = {k: best.settings[k] for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "recompute")}
        par = {k: v for k, v in par.items() if not (k == "etp" and v == 1) and not (k == "recompute" and v == "none")}
        par |= {"global_batch_size": gbs, "seq_length": seq}
        step = best.des_step_time_s if best.des_step_time_s is not None else best.step_time_s
        more = f"; {'; '.join(tried)}" if tried else ""
        source = (f"best plan of a pinned search ({why}): 'muonsim plan' with muonsim's Muon defaults pinned, "
                  f"{precision.value} (preferred on {system.gpu.name}), {gpus} GPUs, gbs {gbs}, seq {seq} from "
                  f"{origin}{more}; {step:.3f} s/step when generated")
        return DefaultsEntry(model=model, system=system.name, precision=precision, kind="search", source=source,
                             gpus=gpus, parallelism=par)
    raise SystemExit(f"{model} on {system.name}: no plan fits up to {gpus // 2} GPUs ({'; '.join(tried)})")


def published_entries(model: str, system: SystemSpec) -> list[DefaultsEntry]:
    return [DefaultsEntry(model=p["model"], system=p["system"], precision=Precision(p["precision"]), kind="published",
                          source=p["source"], gpus=p["gpus"], parallelism=p["parallelism"])
            for p in PUBLISHED if p["model"] == model and p["system"] == system.name]


def with_default(entries: list[DefaultsEntry], system: SystemSpec) -> list[DefaultsEntry]:
    """Mark the entry used without ``--precision``: the first preferred precision the GPU supports."""
    supported = [e for e in entries if e.precision in system.gpu.supported_precisions] or entries
    first = min(supported, key=lambda e: PRECISION_PREFERENCE.index(e.precision))
    return [e.model_copy(update={"default": e is first}) for e in entries]


def build_table(jobs: int, models: list[str] | None = None, systems: list[str] | None = None,
                keep: list[DefaultsEntry] | None = None, log: Any = print) -> DefaultsTable:
    """The table; only the ``models`` × ``systems`` pairs (default: all) are computed, the other
    pairs' entries are taken from ``keep`` (the current table)."""
    from workloads.datasets import load_dataset

    runs = load_dataset(DATASET)
    entries: list[DefaultsEntry] = []
    for model in model_names():
        model_runs = runs_of(model, runs)
        for system_name in system_names():
            if (models and model not in models) or (systems and system_name not in systems):
                entries += [e for e in keep or [] if e.model == model and e.system == system_name]
                continue
            system = load_system(system_name)
            t0 = time.perf_counter()
            cell, notes = recipe_entries(model, system, model_runs)
            cell = cell or published_entries(model, system)
            if not cell:
                why = "; ".join(notes) if notes else "no published recipe run for this pair"
                cell = [search_entry(model, system, search_template(model, model_runs), jobs, why)]
            cell = with_default(cell, system)
            entries += cell
            kinds = ", ".join(f"{e.precision.value} {e.kind}{' (default)' if e.default else ''}" for e in cell)
            log(f"{model:>16} on {system_name:<12} {kinds}  [{time.perf_counter() - t0:.1f} s]")
    return DefaultsTable(generated_by=f"{Path(__file__).relative_to(ROOT)} ({DATASET} dataset, {CSV_NAME})",
                         entries=entries)


HEADER = """\
# Default layout of every catalogue model on every system: what `muonsim predict --model M --system S`
# inherits for what the user does not set. GENERATED by `python tools/scenario_defaults.py`: do not edit;
# rerun it after adding a model or a system. See workloads/scenario_defaults.py for the rules.
"""


def to_yaml(table: DefaultsTable) -> str:
    import yaml

    data = table.model_dump(mode="json")
    for entry in data["entries"]:
        if not entry["runtime"]:
            entry.pop("runtime")
    return HEADER + yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True)


def missing_pairs() -> list[str]:
    from workloads.scenario_defaults import load_table

    have = {(e.model, e.system) for e in load_table().entries}
    return [f"{m} on {s}" for m in model_names() for s in system_names() if (m, s) not in have]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULTS_PATH)
    ap.add_argument("--jobs", type=int, default=0, help="planner worker processes (0 = every core)")
    ap.add_argument("--check", action="store_true", help="only list catalogue pairs the shipped table lacks")
    ap.add_argument("--models", default="", help="recompute only these models (comma list); keep the rest")
    ap.add_argument("--systems", default="", help="recompute only these systems (comma list); keep the rest")
    args = ap.parse_args()
    if args.check:
        missing = missing_pairs()
        print("\n".join(missing) if missing else "every catalogue model × system has defaults")
        raise SystemExit(1 if missing else 0)
    from workloads.scenario_defaults import load_table

    pick = [[x.strip() for x in text.split(",") if x.strip()] for text in (args.models, args.systems)]
    keep = list(load_table(args.out).entries) if any(pick) and args.out.is_file() else []
    table = build_table(args.jobs, pick[0], pick[1], keep)
    args.out.write_text(to_yaml(table), encoding="utf-8")
    print(f"wrote {args.out} ({len(table.entries)} entries)")


if __name__ == "__main__":
    main()

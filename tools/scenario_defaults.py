"""Generate ``workloads/data/scenario_defaults.yaml``: every catalogue model's default layout on every system.

    python tools/scenario_defaults.py            # rewrites the shipped table (about 5-20 min on 2 cores)
    python tools/scenario_defaults.py --check    # exit 1 when a catalogue model × system pair is missing
    python tools/scenario_defaults.py --systems dgx-a100   # recompute one system's pairs, keep the rest

For each model × system (see :mod:`workloads.scenario_defaults` for how the table is used):

1. **recipe**: for each precision, the newest Megatron-Bridge release's run of that model on that
   system in the shipped ``megatron_bridge_perf_summary.csv`` whose layout the default optimizer
   (Muon) can run and fit in memory (as ``predict`` judges it, no headroom) with that run's recipe
   settings: the ones ``--release`` applies for it (its row of ``megatron_bridge_recipe_settings.csv``,
   :func:`workloads.recipe_settings.release_settings`), stored in the entry's ``parallelism``,
   ``optimizer`` and ``runtime`` sections where they differ from muonsim's defaults. Megatron
   rejects Megatron-FSDP with the layer-wise optimizer, so FSDP runs are skipped; runs Muon does not
   fit are skipped for an older run of the same precision; both are named in the source. When the
   preferred precision has no usable run but another has, that one is the default and says why. A run is the
   recipe of a catalogue model with the same architecture; one whose MTP layers differ (DeepSeek-V3
   with and without its MTP layer) still gives the layout, and the source says so. The entry used without ``--precision`` is
   the first of mxfp8, fp8-cs, bf16, nvfp4 the GPU supports (muonsim's preference).
2. **published**: :data:`PUBLISHED` (a layout published outside the table, e.g. NVIDIA's Kimi K2 run),
   when Muon fits it.
3. **search**: otherwise the best plan of ``muonsim plan`` with every optimizer setting pinned to
   muonsim's defaults (:func:`search_pins`: Muon, current layer-wise layout, blockwise TP mode,
   LPT, Megatron's synchronous parameter gather) and tp/pp/vpp/cp/ep/etp/micro-batch/recompute searched, with the built-in calibration,
   seed 0, ranked by the analytic engine (what predict uses by default). GPUs, global batch and sequence come from the model's
   newest run on this system (one Muon could not run or fit), else its published layout, else its
   newest run on another system; when no plan fits in memory the GPU count doubles (up to 8x).
   Precision: the system's preferred one.

The output is deterministic for a given code base (the planner's ranking is).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from topologies.hardware import Precision, SystemSpec, load_system, system_names  # noqa: E402
from topologies.inputs import UserInputError  # noqa: E402
from workloads.measured import MeasuredRun  # noqa: E402
from workloads.models import ModelSpec, load_model, model_names  # noqa: E402
from workloads.recipe_settings import (  # noqa: E402
    SETTINGS_FILE,
    RecipeChoice,
    ReleaseSettings,
    release_settings,
    shipped_settings,
)
from workloads.scenario import ScenarioConfig, build_config, section_of, setting_default  # noqa: E402
from workloads.scenario_defaults import (  # noqa: E402
    DEFAULTS_PATH,
    PRECISION_PREFERENCE,
    DefaultsEntry,
    DefaultsTable,
    preferred_precision,
)

DATASET = "megatron-bridge"
CSV_NAME = "workloads/data/measured/megatron_bridge_perf_summary.csv"
SETTINGS_NAME = f"workloads/data/measured/{SETTINGS_FILE.name}"
def search_pins() -> dict[str, str]:
    """Every optimizer setting pinned to muonsim's default (what ``predict`` uses unless told otherwise)."""
    from workloads.scenario import OptimizerSpec

    spec = OptimizerSpec()
    return {"optimizer": spec.kind, "layer_wise_layout": spec.layer_wise_layout, "tp_mode": spec.tp_mode,
            "load_balance": spec.resolved_load_balance, "hide_param_gather": "on" if spec.hide_param_gather else "off"}


MAX_DOUBLINGS = 3
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


@dataclass(frozen=True)
class RecipeLayout:
    """A run's layout and recipe settings as a default of a catalogue model: the table's sections
    (recipe settings only where they differ from muonsim's defaults) and the resolved config."""

    run: MeasuredRun
    gpus: int
    precision: Precision
    parallelism: dict[str, Any]
    optimizer: dict[str, Any]
    runtime: dict[str, Any]
    settings: ReleaseSettings
    config: ScenarioConfig
    adapted: str = ""  # how a setting was adapted to the catalogue model (its MTP layers), or ""

    @property
    def differing(self) -> int:
        """Recipe settings stored (those that differ from muonsim's defaults)."""
        return len(self.optimizer) + len(self.runtime) + len(set(self.parallelism) - set(LAYOUT_KEYS))

    def settings_source(self) -> str:
        """One clause: where the recipe settings come from and how many differ from muonsim's defaults."""
        ref = self.settings.choice.cells.get("source_ref", "")
        skipped = "".join(f"; not applied: {k} ({why})" for k, why in self.settings.skipped.items())
        return (f"with that run's recipe settings as '--release {self.run.release}' applies them ({SETTINGS_NAME}"
                f"{', ' + ref if ref else ''}; {self.differing} of {len(self.settings.applied)} differ from "
                f"muonsim's defaults and are stored here{skipped}{'; ' + self.adapted if self.adapted else ''})")


LAYOUT_KEYS = ("global_batch_size", "micro_batch_size", "seq_length", "tp", "pp", "vpp", "cp", "ep", "etp", "fsdp")


def recipe_settings_of(run: MeasuredRun, model: ModelSpec) -> ReleaseSettings:
    """The recipe settings ``--release`` applies for ``run`` (its own row of the settings file), for
    catalogue ``model`` (its MTP layers stay the model's; a truncated pipeline layout is completed for it)."""
    choice = RecipeChoice(run.run_id, run.release, shipped_settings()[run.run_id], "the run this default comes from")
    sizes = {"pp": run.pp, "vpp": run.vpp, "ep": run.ep, "num_layers": model.num_layers, "mtp_layers": model.mtp_layers}
    return release_settings(choice, {"mtp_layers"}, sizes)


def layout_of(run: MeasuredRun, model: ModelSpec, system: str) -> RecipeLayout:
    """``run``'s layout (its own columns) with its recipe settings, as a default of ``model`` on ``system``.
    Raises UserInputError when the scenario is invalid (e.g. Megatron-FSDP with Muon)."""
    par: dict[str, Any] = {"global_batch_size": run.global_batch_size, "micro_batch_size": run.micro_batch_size,
                           "seq_length": run.seq_length, "tp": run.tp, "pp": run.pp, "vpp": run.vpp, "cp": run.cp,
                           "ep": run.ep}
    if run.etp != 1:
        par["etp"] = run.etp  # 1 is Megatron's default (None = 1)
    if run.fsdp:
        par["fsdp"] = run.fsdp
    settings = recipe_settings_of(run, model)
    flat = {k: v for k, v in settings.applied.items() if section_of(k) is not None}
    adapted = ""
    layout = flat.get("pipeline_model_parallel_layout")
    if isinstance(layout, str) and "m" in layout and model.mtp_layers == 0:
        flat["pipeline_model_parallel_layout"] = layout.replace("m", "")  # the same split, without the MTP layer
        adapted = f"its pipeline layout {layout!r} without the MTP layer(s) this model lacks"
    config = build_config({"model": model.name, "system": system, "gpus": run.num_gpus,
                           "precision": run.precision.value, "parallelism": par}, flat)
    config.resolve()
    dump = config.model_dump(mode="json")
    sections: dict[str, dict[str, Any]] = {"parallelism": dict(par), "optimizer": {}, "runtime": {}}
    for key in flat:
        section = section_of(key)
        if section not in sections:
            raise SystemExit(f"{run.run_id}: recipe setting {key} is in section {section}, which the table lacks")
        if getattr(getattr(config, str(section)), key) != setting_default(key):
            sections[str(section)][key] = dump[str(section)][key]
    out = RecipeLayout(run, run.num_gpus, run.precision, sections["parallelism"], sections["optimizer"],
                       sections["runtime"], settings, config, adapted)
    stored = config_of(model.name, system, run.num_gpus, run.precision, out.parallelism, out.runtime, out.optimizer)
    if stored.model_dump() != config.model_dump():  # the table must reproduce the run's scenario exactly
        raise SystemExit(f"{run.run_id}: the stored defaults do not reproduce its recipe settings")
    return out


def config_of(model: str, system: str, gpus: int, precision: Precision, par: dict[str, Any],
              runtime: dict[str, Any] | None = None, optimizer: dict[str, Any] | None = None) -> ScenarioConfig:
    data: dict[str, Any] = {"model": model, "system": system, "gpus": gpus, "precision": precision.value,
                            "parallelism": par}
    if runtime:
        data["runtime"] = runtime
    if optimizer:
        data["optimizer"] = optimizer
    return build_config(data, {})


def memory_shortfall(config: ScenarioConfig) -> str | None:
    """None when ``config`` (with the default optimizer, Muon) fits in memory as ``predict`` judges it
    (no headroom), else one clause saying by how much it does not."""
    from workloads.memory import memory_breakdown

    mem = memory_breakdown(config.resolve())
    if mem.fits():
        return None
    return f"Muon needs {mem.total_bytes / 1e9:.1f} GB per GPU of {mem.capacity_bytes / 1e9:.0f} GB even with its recipe settings"


def grouped(skipped: list[tuple[str, str]]) -> str:
    """'run, run (why); run (why)': skipped runs grouped by reason, in order."""
    reasons: dict[str, list[str]] = {}
    for run_id, why in skipped:
        reasons.setdefault(why, []).append(run_id)
    return "; ".join(f"{', '.join(ids)} ({why})" for why, ids in reasons.items())


def recipe_entries(model: str, system: SystemSpec, runs: list[tuple[MeasuredRun, str]]
                   ) -> tuple[list[DefaultsEntry], dict[Precision, str]]:
    """One recipe entry per precision (the newest run whose layout Muon can run and fit in memory)
    and, per precision without one, a note on the runs skipped and why."""
    entries: list[DefaultsEntry] = []
    notes: dict[Precision, str] = {}
    spec = load_model(model)
    by_precision: dict[Precision, list[tuple[MeasuredRun, str]]] = {}
    for run, note in runs:
        if run.system == system.name:
            by_precision.setdefault(run.precision, []).append((run, note))
    for precision in PRECISION_PREFERENCE:
        candidates = sorted(by_precision.get(precision, []), key=lambda rn: release_key(rn[0].release), reverse=True)
        skipped: list[tuple[str, str]] = []
        for run, note in candidates:
            try:
                layout = layout_of(run, spec, system.name)
            except UserInputError as err:
                skipped.append((run.run_id, str(err)))
                continue
            short = memory_shortfall(layout.config)
            if short is not None:
                skipped.append((run.run_id, short))
                continue
            extra = f"; newer runs skipped: {grouped(skipped)}" if skipped else ""
            source = (f"Megatron-Bridge {run.release} performance recipe, published run {run.run_id} "
                      f"({CSV_NAME}) {layout.settings_source()}" + (f"; {note}" if note else "") + extra)
            entries.append(DefaultsEntry(model=model, system=system.name, precision=precision, kind="recipe",
                                         source=source, gpus=layout.gpus, parallelism=layout.parallelism,
                                         optimizer=layout.optimizer, runtime=layout.runtime))
            break
        else:
            if skipped:
                notes[precision] = f"{precision.value} recipe runs not usable with Muon: {grouped(skipped)}"
    return entries, notes


def search_template(model: str, system: str, runs: list[tuple[MeasuredRun, str]]) -> tuple[int, int, int, str]:
    """(gpus, global batch, sequence, where from) for a search: the model's newest run on ``system``
    (one whose layout Muon cannot run or fit), else its published layout, else its newest run elsewhere."""
    order = {name: i for i, name in enumerate(SYSTEM_ORDER)}

    def newest(pool: list[tuple[MeasuredRun, str]]) -> MeasuredRun:
        return max(pool, key=lambda rn: (release_key(rn[0].release), -order.get(rn[0].system, 99)))[0]

    here = [rn for rn in runs if rn[0].system == system]
    published = next((p for p in PUBLISHED if p["model"] == model), None)
    if here:
        run = newest(here)
    elif published is not None:
        par = published["parallelism"]
        return published["gpus"], par["global_batch_size"], par["seq_length"], f"its published layout on {published['system']}"
    elif runs:
        run = newest(runs)
    else:
        return 256, 4096, 4096, "no published run of this model: 256 GPUs, gbs 4096, seq 4096 (assumption)"
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
        short = memory_shortfall(config_of(model, system.name, gpus, precision, par))
        if short is not None:  # the planner keeps a headroom, so this would be a memory-model mismatch
            tried.append(f"{gpus} GPUs: its best plan does not fit as predict judges it ({short})")
            gpus *= 2
            continue
        step = best.des_step_time_s if best.des_step_time_s is not None else best.step_time_s
        more = f"; {'; '.join(tried)}" if tried else ""
        source = (f"best plan of a pinned search ({why}): 'muonsim plan' with muonsim's Muon defaults pinned, "
                  f"{precision.value} (preferred on {system.gpu.name}), {gpus} GPUs, gbs {gbs}, seq {seq} from "
                  f"{origin}{more}; {step:.3f} s/step when generated")
        return DefaultsEntry(model=model, system=system.name, precision=precision, kind="search", source=source,
                             gpus=gpus, parallelism=par)
    raise SystemExit(f"{model} on {system.name}: no plan fits up to {gpus // 2} GPUs ({'; '.join(tried)})")


def published_entries(model: str, system: SystemSpec) -> tuple[list[DefaultsEntry], dict[Precision, str]]:
    """The :data:`PUBLISHED` layouts of the pair that Muon fits in memory, and notes on those it does not."""
    entries, notes = [], {}
    for p in PUBLISHED:
        if p["model"] != model or p["system"] != system.name:
            continue
        precision = Precision(p["precision"])
        short = memory_shortfall(config_of(model, system.name, p["gpus"], precision, p["parallelism"]))
        if short is not None:
            notes[precision] = f"published layout not usable with Muon: {p['source']} ({short})"
            continue
        entries.append(DefaultsEntry(model=model, system=system.name, precision=precision, kind="published",
                                     source=p["source"], gpus=p["gpus"], parallelism=p["parallelism"]))
    return entries, notes


def with_default(entries: list[DefaultsEntry], system: SystemSpec,
                 notes: dict[Precision, str] | None = None) -> list[DefaultsEntry]:
    """Mark the entry used without ``--precision``: the first preferred precision the GPU supports.
    When a more preferred precision's recipe runs were skipped (``notes``), its source says why."""
    supported = [e for e in entries if e.precision in system.gpu.supported_precisions] or entries
    first = min(supported, key=lambda e: PRECISION_PREFERENCE.index(e.precision))
    rank = PRECISION_PREFERENCE.index(first.precision)
    why = [note for p, note in (notes or {}).items()
           if PRECISION_PREFERENCE.index(p) < rank and p in system.gpu.supported_precisions]
    out = []
    for e in entries:
        update: dict[str, Any] = {"default": e is first}
        if e is first and why and e.kind == "recipe":
            update["source"] = f"{e.source}; the default precision, as the preferred ones' {'; '.join(why)}"
        out.append(e.model_copy(update=update))
    return out


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
            if not cell:
                cell, unfit = published_entries(model, system)
                notes |= unfit
            if not cell:
                why = "; ".join(notes.values()) if notes else "no published recipe run for this pair"
                cell = [search_entry(model, system, search_template(model, system_name, model_runs), jobs, why)]
            cell = with_default(cell, system, notes)
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
        for section in ("optimizer", "runtime"):
            if not entry[section]:
                entry.pop(section)
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

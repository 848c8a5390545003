"""The MeasuredRun schema: one measured training run (published table row, log, reference run).

Schema: ``../shared/data/README.md``. A measured run is a scenario (model, system, GPUs, precision,
parallel sizes, optimizer) plus what was measured (step time at least). Loaders for CSV, JSON and
training logs live in :mod:`workloads.loaders`.

Optional **recipe-settings columns** (the names of the Megatron-Bridge recipe-settings file, listed
in :data:`workloads.recipe_columns.COLUMNS`: ``recompute_granularity``, ``cuda_graph_impl``,
``moe_token_dispatcher_type``, ``overlap_moe_expert_parallel_comm``, ``env_NCCL_NVLS_ENABLE`` ...)
are kept as text in ``recipe_settings`` and resolved into scenario settings by
:mod:`workloads.recipe_settings` (value conventions ``default(v; class)``, ``None``, ``n/a(...)``,
``unknown``, ``unset`` as documented there). The run's own columns win over them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from topologies.hardware import Precision
from topologies.inputs import NoBoolNumbers
from workloads.models import ModelSpec
from workloads.recipe_columns import PartialLayout
from workloads.recipe_settings import RecipeResolution, normalise_cell, resolve_recipe_cells

_DEFAULT_CELL = re.compile(r"^default\((.*);[^;]*\)$", re.DOTALL)


def _convention(value: Any) -> Any:
    """A typed optional column's cell under the recipe-file conventions: default(v; c) -> v;
    unknown, n/a(...), None -> not given."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    m = _DEFAULT_CELL.match(text)
    if m:
        text = m.group(1).strip()
    if text in ("unknown", "None", "") or text.startswith(("n/a(", "unknown:")):
        return None
    return text


class MeasuredRun(NoBoolNumbers):
    """A measured run. Required: the scenario columns and ``step_time_s``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf/NaN measurements are rejected

    run_id: str
    source: str = ""
    release: str = ""
    model: str
    system: str
    num_gpus: int = Field(gt=0)
    precision: Precision
    global_batch_size: int = Field(gt=0)
    micro_batch_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    vpp: int = Field(1, gt=0)
    cp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    etp: int = Field(1, gt=0)
    fsdp: int = Field(0, ge=0)
    mtp: int = Field(0, ge=0)
    optimizer: Literal["adamw", "muon"] = "adamw"
    step_time_s: float = Field(gt=0)
    tokens_per_s_per_gpu: float | None = Field(None, gt=0)
    model_tflops_per_gpu: float | None = Field(None, gt=0)
    # optional columns
    optimizer_distribution: Literal["replicated", "element_wise", "layer_wise"] | None = None
    muon_tp_mode: Literal["duplicated", "distributed", "blockwise"] | None = None
    muon_ns_steps: int | None = Field(None, gt=0)
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    recompute: str | None = None
    notes: str | None = None
    fit_exclusion: str | None = Field(
        None, description="why the run is predicted and scored but not fitted on (a dataset's declared "
                          "list, e.g. a mechanism the model lacks); empty: fitted")
    recipe_settings: dict[str, str] | None = Field(
        None, description="recipe-settings columns (names of workloads.recipe_columns.COLUMNS) as text")
    # reference-backend extras (phase times in seconds, collectives as CollectiveCall dicts)
    phase_times_s: dict[str, float] | None = None
    collectives: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None
    # a run of a model outside the catalogue carries its architecture (``model`` is then its name)
    model_spec: ModelSpec | None = None
    # further scenario settings (flat CLI-style keys, e.g. overlap_grad_reduce, moe_token_dispatcher_type)
    scenario_settings: dict[str, Any] | None = None

    @field_validator("tp_comm_overlap", "overlap_param_gather", "muon_tp_mode", "muon_ns_steps", "recompute",
                     mode="before")
    @classmethod
    def _conventions(cls, value: Any) -> Any:
        return _convention(value)

    @field_validator("recipe_settings", mode="before")
    @classmethod
    def _recipe_cells(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        cells = {str(k): normalise_cell(v) for k, v in value.items() if v is not None and normalise_cell(v) != ""}
        resolve_recipe_cells(cells)  # ValueError 'column: problem' on the first bad cell
        return cells or None

    def recipe_resolution(self) -> RecipeResolution:
        """The run's recipe settings as scenario overrides, with the source of each."""
        return resolve_recipe_cells(self.recipe_settings or {})

    def mtp_layers(self, recipe_mtp: int | None = None) -> int:
        """The run's MTP layers: its ``mtp`` column; when the recipe says otherwise and the run has
        the published model TFLOP/s and tokens/s, the one whose FLOPs per token (Megatron's
        convention, :mod:`workloads.flops`) matches them (the DeepSeek-V3 26.02 rows: table 0, recipe
        1, published 260 GFLOP/token = with MTP)."""
        if recipe_mtp is None or recipe_mtp == self.mtp:
            return self.mtp if "mtp" in self.model_fields_set or recipe_mtp is None else recipe_mtp
        if "mtp" not in self.model_fields_set:
            return recipe_mtp
        if not (self.model_tflops_per_gpu and self.tokens_per_s_per_gpu):
            return self.mtp
        from workloads.flops import model_flops_per_token
        from workloads.models import load_model

        measured = self.model_tflops_per_gpu * 1e12 / self.tokens_per_s_per_gpu
        model = load_model(self.model)

        def mismatch(mtp: int) -> float:
            return abs(model_flops_per_token(model.model_copy(update={"mtp_layers": mtp}), self.seq_length) - measured)

        return min((self.mtp, recipe_mtp), key=mismatch)

    def scenario_overrides(self) -> dict[str, Any]:
        """Flat overrides (CLI-style keys) that describe this run's scenario: its recipe settings, then
        its own columns on top (``fsdp`` only when given: the settings' Megatron-FSDP switch applies
        otherwise; MTP layers by :meth:`mtp_layers`)."""
        resolved = self.recipe_resolution()
        recipe = dict(resolved.overrides)
        given = self.model_fields_set
        recipe["mtp_layers"] = self.mtp_layers(recipe.get("mtp_layers"))
        layout = recipe.get("pipeline_model_parallel_layout")
        if isinstance(layout, PartialLayout):
            from workloads.models import load_model

            full = layout.complete(load_model(self.model).num_layers, self.pp * self.vpp, recipe["mtp_layers"])
            if full is None:
                recipe.pop("pipeline_model_parallel_layout")
            else:
                recipe["pipeline_model_parallel_layout"] = full
        if resolved.use_megatron_fsdp and "fsdp" not in given:
            recipe["fsdp"] = self.num_gpus // (self.tp * self.pp)  # Megatron-FSDP shards over dp·cp
        out: dict[str, Any] = {
            "model": self.model_spec if self.model_spec is not None else self.model, "system": self.system, "gpus": self.num_gpus, "precision": self.precision.value,
            "global_batch_size": self.global_batch_size, "micro_batch_size": self.micro_batch_size,
            "seq_length": self.seq_length, "tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp,
            "ep": self.ep, "etp": self.etp, "optimizer": self.optimizer,
        }
        if "fsdp" in given or "fsdp" not in recipe:
            out["fsdp"] = self.fsdp
        if self.optimizer_distribution:
            out["distribution"] = self.optimizer_distribution
        if self.muon_tp_mode:
            out["tp_mode"] = self.muon_tp_mode
        if self.muon_ns_steps:
            out["ns_steps"] = self.muon_ns_steps
        if self.overlap_param_gather is not None:
            out["hide_param_gather"] = self.overlap_param_gather
        if self.tp_comm_overlap is not None:
            out["tp_comm_overlap"] = self.tp_comm_overlap
        if self.recompute and self.recompute.strip().lower() in ("none", "selective", "full"):
            out["recompute"] = self.recompute.strip().lower()
        if resolved.use_megatron_fsdp and not out.get("fsdp", recipe.get("fsdp")):
            # the settings come from a Megatron-FSDP configuration the run did not use (the two 25.11
            # Llama 3.1 405B rows, RECIPE_SETTINGS.md): its FSDP-only choices do not apply
            recipe.pop("num_distributed_optimizer_instances", None)
            recipe.update(NON_FSDP_RECIPE_SWITCHES)
        if recipe.get("cpu_offloading") and self.pp > 1:
            # Megatron has no activation CPU offloading with pipeline parallelism: such a settings row
            # describes another layout (the same two rows, reconstructed from a pp 1 configuration)
            recipe["cpu_offloading"] = False
        return recipe | out | (self.scenario_settings or {})


# What Megatron-Bridge's perf recipes set without Megatron-FSDP for the two switches its Megatron-FSDP
# override changes: in the settings file each of the 14 Megatron-FSDP rows (25.09-26.04.01) has
# gradient_accumulation_fusion false and average_in_collective false (default), each of the 114 other rows
# with known values fusion on and average_in_collective true. A run whose settings come from an FSDP
# configuration it did not use (table fsdp 0) gets the non-FSDP values.
NON_FSDP_RECIPE_SWITCHES: dict[str, Any] = {"gradient_accumulation_fusion": True, "average_in_collective": True}


@dataclass(frozen=True)
class SkippedRun:
    """A row of a measured dataset that is not a run the model predicts: why, in one line
    (``unsupported: ...`` when the model cannot express it, ``not used: ...`` when a dataset's
    selection leaves it out). Listed by validate and calibrate, never dropped silently."""

    run_id: str
    model: str
    system: str
    reason: str

    def to_json_dict(self) -> dict[str, str]:
        """Plain dict of the fields for JSON."""
        return asdict(self)

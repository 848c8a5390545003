"""Per model × system defaults: ``--model M [--system S]`` alone is valid, and says where its layout
came from; a conflict with an inherited value names it and its source (issue 14, item 1).

The tests read the shipped table instead of hard-coding layouts: the lead regenerates it
(``python tools/scenario_defaults.py``) when models and systems change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.hardware import Precision, load_system, system_names
from workloads.models import model_names
from workloads.scenario_defaults import (
    fallback_defaults,
    layered_config,
    load_table,
    lookup_defaults,
    resolve_layered,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_catalogue_pair_has_exactly_one_default_entry() -> None:
    """If this fails after adding a model or a system: run python tools/scenario_defaults.py."""
    table = load_table()
    for model in model_names():
        for system in system_names():
            entries = [e for e in table.entries if e.model == model and e.system == system]
            assert entries, f"no defaults for {model} on {system}: run python tools/scenario_defaults.py"
            assert sum(e.default for e in entries) == 1, (model, system)
            supported = load_system(system).gpu.supported_precisions
            assert all(e.precision in supported for e in entries), (model, system)
            for e in entries:
                assert e.source and (e.kind != "recipe" or "mb-" in e.source), e  # recipe entries cite their run


@pytest.mark.parametrize("model", model_names())
def test_predict_model_alone_and_on_every_system(run_cli, model: str) -> None:
    """Acceptance: ``predict --model M`` and ``predict --model M --system S`` for every S, each
    printing the layout it picked and its source."""
    for system in [None, *system_names()]:
        args = ["predict", "--model", model] + (["--system", system] if system else [])
        res = run_cli(*args)
        assert res.exit_code == 0, (args, res.output)
        assert "layout from" in res.stdout, res.stdout
        chosen = lookup_defaults(model, system or "gb300-nvl72")
        assert chosen is not None and chosen.kind in res.stdout, (args, res.stdout)


def test_json_names_the_defaults_and_what_the_user_set(run_cli) -> None:
    data = json.loads(run_cli("predict", "--model", "llama3-70b", "--system", "dgx-h100", "--mbs", "1", "--json").stdout)
    layout = data["layout"]
    assert layout["defaults"]["model"] == "llama3-70b" and layout["defaults"]["system"] == "dgx-h100"
    assert layout["defaults"]["source"] and "micro_batch_size" in layout["set_by_user"]
    assert "tp" in layout["inherited"] and data["scenario"]["precision"] == layout["defaults"]["precision"]


def test_conflict_with_an_inherited_value_names_it_and_its_source(run_cli) -> None:
    """Kimi K2 on GB300 inherits vpp 4 (NVIDIA's published run): --pp 1 conflicts with it."""
    chosen = lookup_defaults("kimi-k2", "gb300-nvl72")
    assert chosen is not None and chosen.parallelism["vpp"] > 1
    res = run_cli("predict", "--pp", "1")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("error: vpp > 1 needs pp > 1"), err
    assert f"vpp {chosen.parallelism['vpp']}" in err and "not set by you" in err
    assert "defaults of kimi-k2 on gb300-nvl72" in err and "--vpp" in err


def test_a_value_the_user_set_is_not_blamed_on_the_defaults(run_cli) -> None:
    res = run_cli("predict", "--model", "llama3-70b", "--ep", "8")
    assert res.exit_code == 2 and "ep and etp must be 1" in res.stderr and "not set by you" not in res.stderr


def test_switching_system_takes_that_systems_defaults() -> None:
    """plan --system dgx-h100 must not keep GB300's mxfp8 (H100 has no MXFP8) or its batch silently."""
    from cli.cmd_plan import _base_and_reference

    base, _, _, layered = _base_and_reference(None, {"system": "dgx-h100"})
    chosen = lookup_defaults("kimi-k2", "dgx-h100")
    assert chosen is not None
    assert base.precision == chosen.precision and base.precision in base.system.gpu.supported_precisions
    assert base.gpus == chosen.gpus
    assert base.par.global_batch_size == chosen.parallelism["global_batch_size"]
    assert "defaults of kimi-k2 on dgx-h100" in layered.summary()


def test_a_named_precision_picks_that_precisions_entry() -> None:
    pairs = {}
    for e in load_table().entries:
        pairs.setdefault((e.model, e.system), []).append(e)
    model, system, entry = next((m, s, e) for (m, s), es in pairs.items() if len(es) > 1 for e in es if not e.default)
    layered = layered_config(None, {"model": model, "system": system, "precision": entry.precision.value})
    sc = resolve_layered(layered)
    assert sc.precision == entry.precision and sc.gpus == entry.gpus
    assert all(getattr(sc.par, k) == v for k, v in entry.parallelism.items())


def test_scenario_file_layers_over_the_defaults(tmp_path: Path) -> None:
    """A file without a parallelism section takes the pair's; with one, its own (missing fields at
    Megatron's defaults); a file that sets no precision takes the pair's, never GB300's mxfp8."""
    f = tmp_path / "s.yaml"
    f.write_text("model: llama3-8b\nsystem: dgx-h100\n", encoding="utf-8")
    from workloads.scenario import read_scenario_file

    chosen = lookup_defaults("llama3-8b", "dgx-h100")
    assert chosen is not None
    layered = layered_config(read_scenario_file(f), {}, file=str(f))
    sc = resolve_layered(layered)
    assert sc.precision == chosen.precision and sc.gpus == chosen.gpus
    f.write_text("model: llama3-8b\nsystem: dgx-h100\ngpus: 8\nparallelism: {global_batch_size: 64, seq_length: 2048}\n",
                 encoding="utf-8")
    layered = layered_config(read_scenario_file(f), {"tp": "2"}, file=str(f))
    sc = resolve_layered(layered)
    assert (sc.par.tp, sc.par.pp, sc.par.vpp, sc.par.global_batch_size) == (2, 1, 1, 64)
    assert layered.origin["tp"] == "flag" and layered.origin["pp"] == "built-in"
    assert layered.origin["global_batch_size"] == "file" and layered.origin["precision"] == "defaults"


def test_unknown_pair_falls_back_and_says_so(tmp_path: Path, run_cli) -> None:
    """A model file with a name the table does not know gets a minimal layout that says what it is."""
    text = (ROOT / "workloads/data/models/llama3-8b.yaml").read_text(encoding="utf-8")
    (tmp_path / "mini.yaml").write_text(text.replace("name: llama3-8b", "name: my-llama"), encoding="utf-8")
    res = run_cli("predict", "--model", str(tmp_path / "mini.yaml"), "--system", "dgx-b200", "--json")
    assert res.exit_code == 0, res.output
    defaults = json.loads(res.stdout)["layout"]["defaults"]
    assert defaults["kind"] == "fallback" and "no shipped defaults" in defaults["source"]
    fb = fallback_defaults("my-llama", load_system("dgx-h100"))
    assert fb.precision == Precision.FP8_CS and fb.gpus == 8

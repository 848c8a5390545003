"""Defects a new-user audit of the CLI found: each test runs the command as a user would and asserts the
exact behaviour (one-line errors with exit code 2, notes, readable tables, the job's own NICs)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("version", ["9.9.9", "0.2.0", "0.5.0"])
def test_unknown_eo_version_is_refused_naming_the_known_releases(one_line_error, run_cli, version: str) -> None:
    """The model has rules for Emerging-Optimizers 0.3.0 (Megatron-Core's pin), 0.3.1 and 0.4.0 (SYRK on the
    TP path, cubic5); any other version was accepted silently and modelled as one of them."""
    err = one_line_error(run_cli("predict", "--eo-version", version))
    assert err.endswith(f"(got {version})") and "0.3.0, 0.3.1, 0.4.0" in err and err.startswith("error: --eo-version: "), err


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_known_eo_versions_are_accepted(run_cli, version: str) -> None:
    result = run_cli("predict", "--eo-version", version, "--json")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("argv", [["--gpus", "1"], ["--gpus", "8", "--group", "tp"]])
def test_collective_over_one_rank_says_it_costs_nothing(run_cli, argv: list[str]) -> None:
    """A collective over a group of one rank moves no data: the zeros were printed without a word. It is
    not an error (--group tp with tp 1 is a real group of a real job), so the zeros stay and one note says why."""
    result = run_cli("collective", "all_reduce", "--size", "1GB", *argv)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("# note:")]
    assert notes == ["# note: the group has 1 rank: a collective over one rank moves no data and takes 0 s"], result.stdout
    row = result.stdout.splitlines()[-1].split()
    assert row[:4] == ["1000000000", "0.00", "0.00", "0.00"], row
    data = json.loads(run_cli("collective", "all_reduce", "--size", "1GB", *argv, "--json").stdout)
    assert data["group_size"] == 1 and data["note"].startswith("the group has 1 rank")
    assert "note" not in json.loads(run_cli("collective", "all_reduce", "--size", "1GB", "--gpus", "2", "--json").stdout)


MUON_ONLY_FLAGS = [("--tp-mode", "distributed", "tp_mode"), ("--ns-steps", "3", "ns_steps"),
                   ("--ns-coefficients", "polar_express", "ns_coefficients"), ("--syrk", "on", "use_syrk"),
                   ("--split-qkv", "off", "split_qkv"), ("--load-balance", "ping_pong", "load_balance"),
                   ("--layout", "legacy", "layer_wise_layout"), ("--matmul-precision", "fp32", "matmul_precision"),
                   ("--eo-version", "0.4.0", "eo_version")]


@pytest.mark.parametrize(("flag", "value", "key"), MUON_ONLY_FLAGS, ids=[f[0] for f in MUON_ONLY_FLAGS])
def test_muon_only_setting_with_adamw_gets_a_no_effect_note(run_cli, flag: str, value: str, key: str) -> None:
    """AdamW runs no Newton-Schulz and no layer-wise optimizer: a Muon-only setting given with --optimizer
    adamw changed nothing and said nothing. The CLI's 'X has no effect' note now names it."""
    out = " ".join(run_cli("predict", "--optimizer", "adamw", flag, value).stdout.split())
    assert f"note: {key} has no effect with optimizer adamw" in out, out
    assert out.count("has no effect") == 1, out


def test_muon_only_settings_with_muon_stay_quiet(run_cli) -> None:
    out = run_cli("predict", "--optimizer", "muon", "--tp", "2", "--ns-steps", "3", "--layout", "legacy").stdout
    assert "has no effect" not in out
    plain = run_cli("predict", "--optimizer", "adamw").stdout
    assert "has no effect" not in plain


def test_layer_wise_setting_with_replicated_muon_gets_a_no_effect_note(run_cli) -> None:
    """Muon replicated steps every parameter on every rank: the layer-wise layout and balance are unread."""
    out = " ".join(run_cli("predict", "--distribution", "replicated", "--layout", "legacy").stdout.split())
    assert "note: layer_wise_layout has no effect with the replicated distribution" in out, out


@pytest.mark.parametrize("width", [80, 120])
def test_catalog_tables_are_readable_at_80_and_120_columns(run_cli, monkeypatch, width: int) -> None:
    """At 80 columns the Systems table cut the GPU names to 'B300 / (GB3… / supe…'. Now no cell is cut (no
    ellipsis), no line is wider than the terminal, every GPU name reads whole (words may wrap) and each
    system's numbers sit on its name's line."""
    from topologies.hardware import load_system, system_names

    monkeypatch.setenv("COLUMNS", str(width))
    result = run_cli("catalog")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout, result.stdout
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    cells = " ".join(result.stdout.replace("│", " ").split())
    for name in system_names():
        s = load_system(name)
        row = next(line for line in lines if f"│ {name} " in line)
        assert f" {s.nvlink.domain_size} " in row and f" {s.gpu.hbm_bytes / 1e9:.0f} " in row, row
        assert all(word in cells for word in s.gpu.name.split()), s.gpu.name
    if width >= 120:
        assert all(any(f"│ {s.gpu.name} " in line for line in lines) for s in map(load_system, system_names()))


# (argv, job NICs, job rails, job NICs per rail per domain, occupied domains' NICs): GB300 NVL72 has one NIC
# per GPU, 4 per compute tray of 4 GPUs on 4 rails, so a rack holds 72 NICs, 18 per rail; DGX B200 8 per node.
TOPOLOGY_NICS = [
    (["--gpus", "8"], 8, 4, 2, 72),
    (["--gpus", "8", "--gpus-per-domain", "2"], 8, 2, 1, 288),
    (["--gpus", "72"], 72, 4, 18, 72),
    (["--system", "dgx-b200", "--gpus", "4"], 4, 4, 1, 8),
]


@pytest.mark.parametrize(("argv", "nics", "rails", "per_rail", "domain_nics"), TOPOLOGY_NICS,
                         ids=[" ".join(c[0]) for c in TOPOLOGY_NICS])
def test_topology_reports_the_nics_of_the_jobs_gpus(run_cli, monkeypatch, argv: list[str], nics: int, rails: int,
                                                     per_rail: int, domain_nics: int) -> None:
    """'topology --gpus 8' on GB300 NVL72 said 'NICs: 72 x 800 Gb/s': the whole rack's, though the job's 8 GPUs
    (ranks fill slots 0..7) use 8 of them. The job's NICs and rails come first; the occupied domains' are labelled."""
    monkeypatch.setenv("COLUMNS", "200")
    data = json.loads(run_cli("topology", *argv, "--json").stdout)
    assert (data["job_nics"], data["job_rails"], data["job_nics_per_rail_per_domain"]) == (nics, rails, per_rail)
    assert data["nics"] == domain_nics
    text = run_cli("topology", *argv).stdout
    line = next(x for x in text.splitlines() if x.strip().startswith("NICs:"))
    assert line.strip().startswith(f"NICs: {nics} x ") and f"on {rails} of {data['rails']} rails" in line, line
    occupied = "domain holds" if data["domains"] == 1 else "domains hold"
    assert f"the occupied {occupied} {domain_nics} (" in line, line


@pytest.mark.parametrize(("system", "gpus", "per_domain"), [("gb300-nvl72", 8, 8), ("gb300-nvl72", 12, 6),
                                                            ("gb200-nvl72", 8, 2), ("dgx-b200", 16, 8)])
def test_job_rails_agree_with_the_rail_of_each_used_slot(system: str, gpus: int, per_domain: int) -> None:
    from collections import Counter

    from topologies.hardware import load_system
    from topologies.placement import place_job

    layout = place_job(load_system(system), gpus, gpus_per_domain=per_domain).layout
    rails = Counter(layout.rail_of(s, j) for s in range(per_domain) for j in range(layout.nics_per_gpu))
    assert (layout.job_rails, layout.job_nics_per_rail_per_domain) == (len(rails), max(rails.values()))
    assert layout.job_nics == gpus * layout.nics_per_gpu


@pytest.mark.parametrize(("argv", "words"), [
    (["--seq", "0"], ["--seq: must be greater than 0 (got 0)"]),
    (["--model", "llama3-8b", "--tp", "4", "--seq", "4098", "--sequence-parallel", "on"],
     ["sequence parallelism with tp 4", "seq_length = 4098 tokens", "divisible by 4", "multiple of 4 tokens"]),
    (["--model", "llama3-8b", "--tp", "4", "--cp", "2", "--seq", "4100", "--gpus", "64", "--sequence-parallel", "on"],
     ["sequence parallelism with tp 4", "seq_length / cp = 2050 tokens", "multiple of 8 tokens"]),
    (["--tp", "2", "--seq", "4097"], ["sequence parallelism with tp 2", "seq_length = 4097 tokens"]),
    (["--model", "llama3-8b", "--cp", "2", "--seq", "4098", "--gpus", "64"], ["cp 2", "2·cp = 4"]),
])
def test_seq_that_megatron_cannot_split_is_refused(one_line_error, run_cli, argv: list[str], words: list[str]) -> None:
    """Sequence parallelism scatters each micro-batch's seq_length / cp tokens over the tp ranks (Megatron's
    _split_along_first_dim asserts divisibility); --tp 4 --seq 4098 was predicted as if it ran."""
    err = one_line_error(run_cli("predict", *argv))
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("argv", [["--tp", "4", "--seq", "4098", "--sequence-parallel", "off"],
                                  ["--tp", "2", "--cp", "2", "--seq", "4100", "--gpus", "64", "--sequence-parallel", "on"]])
def test_seq_that_megatron_can_split_runs(run_cli, argv: list[str]) -> None:
    result = run_cli("predict", "--model", "llama3-8b", *argv, "--json")
    assert result.exit_code == 0, result.output


def _model_file(tmp_path, position: str, rows: int):  # noqa: ANN001, ANN202
    from pathlib import Path

    base = (Path(__file__).resolve().parents[1] / "workloads/data/models/llama3-8b.yaml").read_text(encoding="utf-8")
    path = tmp_path / "ctx.yaml"
    path.write_text(base.replace("name: llama3-8b", "name: ctx-model")
                    + f"position_embedding: {position}\nmax_position_embeddings: {rows}\n", encoding="utf-8")
    return path


def test_seq_beyond_a_learned_position_table_is_refused(one_line_error, run_cli, tmp_path) -> None:
    """A learned_absolute table has max_position_embeddings rows: position 2048 has none (Megatron asserts
    max_position_embeddings >= seq_length for it)."""
    model = _model_file(tmp_path, "learned_absolute", 2048)
    err = one_line_error(run_cli("predict", "--model", str(model), "--seq", "4096"))
    assert "seq_length 4096 tokens exceeds max_position_embeddings 2048" in err, err
    assert run_cli("predict", "--model", str(model), "--seq", "2048", "--json").exit_code == 0


def test_seq_beyond_a_rope_models_trained_context_is_a_warning(run_cli, tmp_path) -> None:
    """RoPE has no table: a longer sequence runs (Megatron computes the rotary angles for it), but past the
    context the model file declares the user should hear so."""
    model = _model_file(tmp_path, "rope", 2048)
    long = run_cli("predict", "--model", str(model), "--seq", "4096", "--json")
    assert long.exit_code == 0, long.output
    warned = [w for w in json.loads(long.stdout)["warnings"] if "max_position_embeddings" in w]
    assert warned == ["seq_length 4096 tokens exceeds max_position_embeddings 2048 of ctx-model (the context it "
                      "declares; RoPE runs longer sequences, but beyond what the model was trained at)"], warned
    short = json.loads(run_cli("predict", "--model", str(model), "--seq", "2048", "--json").stdout)
    assert not [w for w in short["warnings"] if "max_position_embeddings" in w]

"""Every invalid input a user can type gives one line naming the field, exit code 2, and no files.

The cases are the list of issue 2: GPUs not divisible by tp·pp·cp, tp not dividing the attention
or KV heads, ep·etp not dividing the data-parallel×tp×cp domain, ep not dividing the experts, the
global batch not divisible by micro-batch × dp, vpp not dividing the layers per stage, unknown
names, negative or zero sizes, missing files, malformed YAML and YAML that tries to run code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LLAMA8 = ["--model", "llama3-8b", "--pp", "1", "--vpp", "1", "--ep", "1", "--mbs", "1"]

# (id, argv after "muonsim", words the message must contain: the field and the rule)
CASES: list[tuple[str, list[str], list[str]]] = [
    ("gpus_not_divisible_by_tp_pp_cp", ["inventory", "--gpus", "250"], ["gpus 250", "tp·pp·cp"]),
    ("cp_in_the_product", ["inventory", "--gpus", "256", "--cp", "3"], ["gpus 256", "cp 3"]),
    ("tp_not_dividing_heads", ["inventory", *LLAMA8, "--gpus", "24", "--tp", "3", "--gbs", "8"],
     ["tp 3", "32 attention heads"]),
    ("tp_not_dividing_kv_heads", ["inventory", *LLAMA8, "--gpus", "16", "--tp", "16", "--gbs", "8"],
     ["tp 16", "KV heads"]),
    ("ep_not_dividing_dp_tp_domain", ["inventory", "--ep", "128"], ["ep·etp = 128", "domain of 64"]),
    ("ep_etp_not_dividing_domain", ["inventory", "--ep", "64", "--etp", "2"], ["ep·etp = 128", "domain"]),
    ("ep_not_dividing_experts", ["inventory", "--ep", "7"], ["ep 7", "384 experts"]),
    ("gbs_not_divisible_by_mbs_dp", ["inventory", "--gbs", "4000"], ["global_batch_size 4000", "micro_batch_size·dp"]),
    ("vpp_not_dividing_layers_per_stage", ["inventory", *LLAMA8[:2], "--gpus", "8", "--pp", "4", "--vpp", "3",
                                           "--ep", "1", "--gbs", "16"], ["vpp 3", "8 layers per pipeline stage"]),
    ("too_many_virtual_stages", ["inventory", "--pp", "16", "--vpp", "4", "--gpus", "256"], ["pp·vpp = 64"]),
    ("unknown_model", ["inventory", "--model", "gpt5"], ["model 'gpt5'", "known:"]),
    ("unknown_system", ["inventory", "--system", "nvl576"], ["system 'nvl576'", "known:"]),
    ("unknown_model_describe", ["describe", "gpt5"], ["model 'gpt5'"]),
    ("unknown_precision", ["inventory", "--precision", "fp6"], ["precision", "fp6"]),
    ("unknown_recompute", ["inventory", "--recompute", "partial"], ["recompute", "partial"]),
    ("zero_gpus", ["inventory", "--gpus", "0"], ["--gpus: must be greater than 0 (got 0)"]),
    ("negative_gpus", ["inventory", "--gpus", "-8"], ["--gpus: must be greater than 0 (got -8)"]),
    ("zero_tp", ["inventory", "--tp", "0"], ["--tp: must be greater than 0 (got 0)"]),
    ("negative_pp", ["inventory", "--pp", "-4"], ["--pp: must be greater than 0 (got -4)"]),
    ("zero_mbs", ["inventory", "--mbs", "0"], ["--mbs: must be greater than 0 (got 0)"]),
    ("negative_gbs", ["inventory", "--gbs", "-1"], ["--gbs: must be greater than 0 (got -1)"]),
    ("zero_seq", ["inventory", "--seq", "0"], ["--seq: must be greater than 0 (got 0)"]),
    ("zero_ns_steps", ["inventory", "--ns-steps", "0"], ["--ns-steps: must be greater than 0 (got 0)"]),
    ("not_a_number", ["inventory", "--tp", "two"], ["--tp: must be a valid integer", "(got two)"]),
    ("describe_zero_seq", ["describe", "kimi-k2", "--seq", "0"], ["--seq", "positive integer"]),
    ("describe_negative_tp", ["describe", "kimi-k2", "--tp", "-2"], ["--tp", "positive integer"]),
    ("inventory_stage_out_of_range", ["inventory", "--tensors", "--stage", "4"], ["--stage: must be a pipeline stage", "0..3", "(got 4)"]),
    ("missing_scenario_file", ["inventory", "no-such-scenario.yaml"], ["scenario file 'no-such-scenario.yaml'", "does not exist"]),
    ("missing_model_file", ["inventory", "--model", "models/none.yaml"], ["model 'models/none.yaml'", "does not exist"]),
]

YAML_CASES: dict[str, tuple[str, list[str]]] = {
    "malformed.yaml": ("model: kimi-k2\nparallelism: {tp: 1, pp: [4\n", ["malformed YAML", "line"]),
    "tabs.yaml": ("model: kimi-k2\n\tgpus: 8\n", ["malformed YAML"]),
    "not_a_mapping.yaml": ("- kimi-k2\n- 256\n", ["must contain a YAML mapping"]),
    "unknown_key.yaml": ("model: kimi-k2\nnum_gpus: 8\n", ["num_gpus: unknown key (valid: gpus, model, ", "parallelism"]),
    "zero_in_file.yaml": ("parallelism: {ep: 0, global_batch_size: 64, seq_length: 128}\n", ["parallelism.ep", "greater than 0"]),
    "negative_in_file.yaml": ("gpus: -256\n", ["gpus", "greater than 0"]),
    "bad_module.yaml": ("parallelism: {recompute: selective, recompute_modules: [attention], global_batch_size: 64,"
                        " seq_length: 128}\n", ["recompute_modules", "'attention'"]),
}


def _check_one_line(result, words: list[str]) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in result.stderr and result.stdout == ""
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_flags_give_one_line_and_exit_2(run_cli, workdir: Path, argv: list[str], words: list[str]) -> None:
    before = _listing(workdir)
    _check_one_line(run_cli(*argv), words)
    assert _listing(workdir) == before  # nothing written


@pytest.mark.parametrize("name", sorted(YAML_CASES))
def test_invalid_scenario_files_give_one_line_and_exit_2(run_cli, workdir: Path, name: str) -> None:
    text, words = YAML_CASES[name]
    (workdir / name).write_text(text, encoding="utf-8")
    before = _listing(workdir)
    err = _check_one_line(run_cli("inventory", name), words)
    assert name in err  # names the file
    assert _listing(workdir) == before


def test_malformed_model_file_names_the_model(run_cli, workdir: Path) -> None:
    (workdir / "m.yaml").write_text("name: x\nnum_layers: 0\n", encoding="utf-8")
    _check_one_line(run_cli("describe", "m.yaml"), ["model 'm.yaml'", "num_layers"])


def test_yaml_that_tries_to_execute_code_is_rejected_and_nothing_runs(run_cli, workdir: Path) -> None:
    marker = workdir / "pwned"
    for i, text in enumerate([
        f'!!python/object/apply:os.system ["echo pwned > {marker}"]\n',
        f'model: !!python/object/apply:os.system ["echo pwned > {marker}"]\n',
        f'gpus: !!python/object/new:subprocess.check_output [["touch", "{marker}"]]\n',
    ]):
        (workdir / f"evil{i}.yaml").write_text(text, encoding="utf-8")
        _check_one_line(run_cli("inventory", f"evil{i}.yaml"), [f"evil{i}.yaml", "malformed YAML", "python/"])
        (workdir / "models").mkdir(exist_ok=True)
        (workdir / "models" / f"evil{i}.yaml").write_text(text, encoding="utf-8")
        _check_one_line(run_cli("describe", f"models/evil{i}.yaml"), ["malformed YAML"])
    assert not marker.exists()


def _console_script() -> list[str]:
    exe = shutil.which("muonsim")
    assert exe is not None, "the muonsim console script is not installed (pip install -e .)"
    return [exe]


def test_console_script_prints_one_line_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "evil.yaml").write_text('!!python/object/apply:os.system ["touch pwned"]\n', encoding="utf-8")
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for argv in (["inventory", "--gpus", "250"], ["inventory", "evil.yaml"], ["describe", "gpt5"]):
        proc = subprocess.run([*_console_script(), *argv], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=120, check=False)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.yaml"]  # nothing written, nothing run

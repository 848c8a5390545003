"""CSV and JSON loaders of the measured-run schema: good files, extra columns, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.inputs import UserInputError
from workloads.datasets import dataset_names, get_dataset, load_dataset
from workloads.loaders import REQUIRED_COLUMNS, load_csv, load_json, load_many, load_runs, write_csv

HEADER = ("run_id,source,release,model,system,num_gpus,precision,global_batch_size,micro_batch_size,seq_length,"
          "tp,pp,vpp,cp,ep,etp,fsdp,mtp,optimizer,step_time_s,tokens_per_s_per_gpu,model_tflops_per_gpu")
ROW_A = "a,test,26.02,llama3-8b,dgx-h100,8,fp8-cs,128,1,8192,1,1,1,1,1,1,0,0,adamw,1.25,104857.6,"
ROW_B = "b,test,26.02,llama3-70b,gb300-nvl72,64,mxfp8,128,1,8192,2,4,5,1,1,1,0,0,adamw,3.5,,"


def write(tmp_path: Path, text: str, name: str = "runs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def one_line_error(func, *args) -> str:  # noqa: ANN001
    with pytest.raises(UserInputError) as info:
        func(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_shipped_dataset_loads_every_row():
    runs = load_dataset("megatron-bridge")
    assert len(runs) == 131
    assert len({r.run_id for r in runs}) == 131
    assert {r.system for r in runs} == {"gb300-nvl72", "gb200-nvl72", "dgx-b300", "dgx-b200", "dgx-h100"}
    # step time is derived from the published throughput: gbs·seq / (tokens/s/GPU · GPUs)
    for r in runs:
        derived = r.global_batch_size * r.seq_length / (r.tokens_per_s_per_gpu * r.num_gpus)
        assert r.step_time_s == pytest.approx(derived, rel=2e-4)
    assert "megatron-bridge" in dataset_names()


def test_shipped_dataset_matches_shared_copy():
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "measured" / "megatron_bridge_perf_summary.csv"
    if not shared.is_file():
        pytest.skip("../shared is not present")
    assert get_dataset("megatron-bridge").path.read_bytes() == shared.read_bytes()


def test_unknown_dataset_is_one_line():
    msg = one_line_error(get_dataset, "nope")
    assert "unknown dataset 'nope'" in msg and "megatron-bridge" in msg


def test_csv_reads_values_defaults_and_optional_columns(tmp_path):
    text = (HEADER + ",optimizer_distribution,overlap_param_gather,muon_ns_steps,notes,my_column\n"
            + ROW_A + ",element_wise,1,,first run,17\n" + ROW_B + ",,0,,,\n")
    runs = load_csv(write(tmp_path, text))
    a, b = runs
    assert (a.tp, a.num_gpus, a.step_time_s, a.precision.value) == (1, 8, 1.25, "fp8-cs")
    assert a.model_tflops_per_gpu is None and b.tokens_per_s_per_gpu is None
    assert a.optimizer_distribution == "element_wise" and a.overlap_param_gather is True
    assert b.overlap_param_gather is False and b.optimizer_distribution is None
    assert a.notes == "first run" and a.extra == {"my_column": 17}
    assert b.extra is None


def test_csv_without_optional_parallel_columns_uses_defaults(tmp_path):
    cols = ",".join(REQUIRED_COLUMNS)
    runs = load_csv(write(tmp_path, cols + "\nx,llama3-8b,dgx-h100,8,bf16,64,1,8192,2.0\n"))
    assert (runs[0].tp, runs[0].pp, runs[0].fsdp, runs[0].optimizer) == (1, 1, 0, "adamw")


def test_csv_round_trip(tmp_path):
    runs = load_dataset("megatron-bridge")[:5]
    path = tmp_path / "out.csv"
    write_csv(runs, path)
    assert load_csv(path) == runs


@pytest.mark.parametrize(("text", "expected"), [
    (HEADER.replace(",step_time_s", "") + "\n", "column 'step_time_s': missing column"),
    (HEADER + "\n" + ROW_A + "\n" + ROW_B.replace(",3.5,", ",3.5,7,"), "row 3: malformed row: 23 fields, the header has 22"),
    (HEADER + "\n" + ROW_A.replace("llama3-8b", "llama9-1t"), "row 2, column 'model': unknown model 'llama9-1t'"),
    (HEADER + "\n" + ROW_A.replace("dgx-h100", "dgx-z9"), "row 2, column 'system': unknown system 'dgx-z9'"),
    (HEADER + "\n" + ROW_A + "\n" + ROW_B.replace(",2,4,5,", ",two,4,5,"), "row 3, column 'tp': Input should be a valid integer"),
    (HEADER + "\n" + ROW_A.replace(",1.25,", ",-1,"), "row 2, column 'step_time_s': Input should be greater than 0"),
    (HEADER + "\n" + ROW_A.replace("fp8-cs", "fp6"), "row 2, column 'precision'"),
    (HEADER + "\n" + ROW_A.replace(",8192,", ",,"), "row 2, column 'seq_length': value is empty"),
    (HEADER + "\n" + ROW_A + "\n" + ROW_A, "column 'run_id': duplicate run_id 'a'"),
    (HEADER + ",tp\n", "column 'tp': duplicate column"),
    ("", "empty file"),
])
def test_csv_errors_name_file_row_and_column(tmp_path, text, expected):
    path = write(tmp_path, text)
    msg = one_line_error(load_csv, path)
    assert msg.startswith(f"file '{path}'")
    assert expected in msg


def test_json_list_object_and_runs_key(tmp_path):
    runs = load_dataset("megatron-bridge")[:3]
    dumped = [r.model_dump(mode="json", exclude_none=True) for r in runs]
    for doc in (dumped, {"runs": dumped}):
        path = write(tmp_path, json.dumps(doc), "r.json")
        assert load_json(path) == runs
    single = dict(dumped[0], world_size=2, phase_times_s={"newton_schulz": 0.5},
                  collectives=[{"op": "all_gather", "group": "dp", "group_size": 2, "dtype": "bf16", "bytes": 64}])
    path = write(tmp_path, json.dumps(single), "one.json")
    (run,) = load_runs(path)
    assert run.phase_times_s == {"newton_schulz": 0.5}
    assert run.extra == {"world_size": 2}
    assert run.collectives[0]["bytes"] == 64


@pytest.mark.parametrize(("doc", "expected"), [
    ('[{"run_id": "x"}]', "entry 1, column 'model': missing field"),
    ("[1]", "entry 1: expected an object"),
    ("{not json", "malformed JSON at line 1"),
    ("3", "expected a run object"),
])
def test_json_errors(tmp_path, doc, expected):
    msg = one_line_error(load_json, write(tmp_path, doc, "bad.json"))
    assert expected in msg


def test_json_unknown_model_names_entry(tmp_path):
    run = load_dataset("megatron-bridge")[0].model_dump(mode="json")
    bad = dict(run, run_id="z", model="gpt-9")
    msg = one_line_error(load_json, write(tmp_path, json.dumps([run, bad]), "m.json"))
    assert "entry 2, column 'model': unknown model 'gpt-9'" in msg


def test_dispatch_and_duplicates_across_files(tmp_path):
    a = write(tmp_path, HEADER + "\n" + ROW_A + "\n", "a.csv")
    b = write(tmp_path, HEADER + "\n" + ROW_A + "\n", "b.csv")
    assert "also in" in one_line_error(load_many, [a, b])
    shipped = load_dataset("megatron-bridge")
    again = write(tmp_path, json.dumps([shipped[0].model_dump(mode="json")]), "again.json")
    msg = one_line_error(load_many, [again], None, 10, {"dataset 'megatron-bridge'": shipped})
    assert f"file '{again}', column 'run_id': run '{shipped[0].run_id}' is also in dataset 'megatron-bridge'" in msg
    assert "unknown kind of runs file" in one_line_error(load_runs, write(tmp_path, "x", "runs.parquet"))
    assert "does not exist" in one_line_error(load_runs, tmp_path / "missing.csv")

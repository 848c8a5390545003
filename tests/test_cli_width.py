"""Tables fit 80 columns (COLUMNS=80): predict, compare with 2 and 4 variants, validate, calibrate, plan.

Numbers move with the model: the tests check widths and structure, never step times. ``--wide``
keeps the wide layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80


@pytest.fixture()
def narrow(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))

    def _run(*args: str) -> str:
        res = run_cli(*args)
        assert res.exit_code == 0, (args, res.output)
        too_long = [line for line in res.stdout.splitlines() if len(line) > WIDTH]
        assert not too_long, f"{len(too_long)} lines over {WIDTH} columns in {args}:\n" + "\n".join(too_long)
        return res.stdout

    return _run


@pytest.fixture(scope="module")
def runs_csv(tmp_path_factory) -> Path:
    lines = (ROOT / "workloads/data/measured/megatron_bridge_perf_summary.csv").read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    path.write_text("\n".join(lines[:9]) + "\n", encoding="utf-8")
    return path


def test_predict_fits(narrow) -> None:
    out = narrow("predict")
    assert "step time" in out and "where the step time goes" in out and "layout from" in out


def test_compare_two_variants_fits(narrow) -> None:
    out = narrow("compare", "--optimizer", "adamw,muon")
    assert "A  optimizer=adamw" in out and "B  optimizer=muon" in out and "B vs A:" in out


def test_compare_four_variants_fits(narrow) -> None:
    out = narrow("compare", "--optimizer", "adamw,muon", "--hide-param-gather", "off,on")
    for letter in "ABCD":
        assert f"  {letter}  optimizer=" in out
    assert "step time s" in out and "memory/GPU GB" in out


def test_compare_many_variants_stack(narrow) -> None:
    out = narrow("compare", "--load-balance", "none,ping_pong,lpt", "--layout", "legacy,current")
    assert "F  " in out and out.count("step time s") >= 2  # six variants: stacked tables


def test_validate_fits(narrow, runs_csv: Path) -> None:
    out = narrow("validate", str(runs_csv))
    assert "errors by system" in out and "Kendall" in out


def test_calibrate_fits(narrow, runs_csv: Path, tmp_path: Path) -> None:
    out = narrow("calibrate", str(runs_csv), "--out", str(tmp_path / "p.yaml"), "--no-cv")
    assert "fitted factors per system" in out and "datasheet" in out


def test_plan_fits(narrow) -> None:
    out = narrow("plan", "--tp", "1", "--pp", "4", "--vpp", "4", "--cp", "1", "--ep", "32,64", "--mbs", "1",
                 "--samples", "0", "--top-k", "1", "--jobs", "1")
    assert "ranked plans" in out and "base scenario layout:" in out


def test_wide_keeps_the_wide_layout(run_cli) -> None:
    res = run_cli("compare", "--optimizer", "adamw,muon", "--wide")
    assert res.exit_code == 0 and "Δ vs baseline" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) > WIDTH


@pytest.mark.parametrize("argv", [["inventory"], ["inventory", "--model", "llama3-8b", "--system", "dgx-h100"]])
def test_inventory_memory_headers_are_readable_at_80_columns(narrow, argv):
    """The memory table's nine columns did not fit 80 columns: every component header came out cut
    ('weigh…', 'gradi…', 'optim…', 'activ…'). Short headers and a legend line keep them whole."""
    out = narrow(*argv)
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("memory per GPU, GB"))
    table = "\n".join(lines[start:start + 16])
    assert "…" not in table, table
    assert "weight buffers" in " ".join(out.split()) and "optimizer workspace" in " ".join(out.split())


@pytest.mark.parametrize("gpus", ["8", "144", "4096"])
def test_topology_fits_80_columns(narrow, gpus):
    """topology printed its fabric summary as lines of up to ~130 characters; they wrap at the width
    (continuation lines indented) like every other output."""
    out = narrow("topology", "--system", "gb300-nvl72", "--gpus", gpus)
    text = " ".join(out.split())
    assert f"{gpus} GPUs on" in text and "scale-out bisection" in text and "switches (radix" in text

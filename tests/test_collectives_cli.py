"""``muonsim collective`` and ``muonsim topology`` through the CLI (in-process)."""

from __future__ import annotations

import json

import pytest

from cli.cmd_collective import parse_size, size_sweep
from cli.common import CliError


def test_collective_json_gives_time_algbw_busbw_per_size(run_cli):
    result = run_cli("collective", "all_reduce", "--system", "gb200-nvl72", "--gpus", "144",
                     "--min-size", "1MB", "--max-size", "1GB", "--step-factor", "10", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["group_size"], data["domains"], data["ranks_per_domain"]) == (144, 2, 72)
    rows = data["results"]
    assert [r["size_bytes"] for r in rows] == pytest.approx([1e6, 1e7, 1e8, 1e9])
    for r in rows:
        assert set(r) >= {"size_bytes", "time_s", "algbw_Bps", "busbw_Bps", "algorithm"}
        assert r["algbw_Bps"] == pytest.approx(r["size_bytes"] / r["time_s"])
        assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 2 * 143 / 144)
    assert [r["time_s"] for r in rows] == sorted(r["time_s"] for r in rows)


def test_collective_table_is_nccl_tests_style(run_cli):
    result = run_cli("collective", "all_gather", "--system", "dgx-h100", "--gpus", "64", "--tp", "8",
                     "--group", "dp", "--size", "256M")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "group 'dp' of 8 ranks over 8 NVLink domains" in lines[0]
    assert "GB = 1e9 B" in lines[1] and "GiB = 2^30 B" in lines[1]  # the size convention is stated
    assert "algbw (GB/s)" in lines[2] and "busbw (GB/s)" in lines[2]
    assert lines[3].split()[0] == "256000000"


def test_forced_algorithm_is_used(run_cli):
    result = run_cli("collective", "all_reduce", "--gpus", "72", "--size", "1G", "--algorithm", "ring", "--json")
    assert json.loads(result.stdout)["results"][0]["algorithm"] == "ring"


@pytest.mark.parametrize(("args", "needle"), [
    (("collective", "allreduce", "--size", "1G"), "unknown collective"),
    (("collective", "all_reduce", "--size", "lots"), "--size: must be bytes or a size with a unit"),
    (("collective", "all_reduce", "--size", "1G", "--min-size", "1K"), "either --size"),
    (("collective", "all_reduce", "--gpus", "72", "--size", "1G", "--algorithm", "hierarchical"), "eligible"),
    (("collective", "all_reduce", "--gpus", "72", "--size", "1G", "--group", "rack"), "unknown group"),
    (("collective", "all_reduce", "--gpus", "100", "--tp", "8", "--size", "1G"), "not divisible"),
    (("collective", "all_reduce", "--system", "nvl9000", "--size", "1G"), "unknown system"),
    (("topology", "--gpus", "7", "--gpus-per-domain", "2"), "not a multiple"),
])
def test_bad_input_is_one_line_and_exit_2(run_cli, args, needle):
    result = run_cli(*args)
    assert result.exit_code == 2
    assert needle in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_topology_summary_and_json(run_cli):
    result = run_cli("topology", "--system", "gb300-nvl72", "--gpus", "256")
    assert result.exit_code == 0, result.output
    assert "256 GPUs on 4 NVLink domains of 72 (64 used per domain)" in " ".join(result.stdout.split())  # wrapped
    assert "4 rails" in result.stdout and "bisection" in result.stdout
    data = json.loads(run_cli("topology", "--system", "dgx-b200", "--gpus", "4096", "--json").stdout)
    assert (data["leaves"], data["spines"], data["cores"], data["tiers"]) == (128, 128, 64, 3)


def test_topology_html_writes_a_plotly_page(run_cli, tmp_path):
    out = tmp_path / "fabric.html"
    result = run_cli("topology", "--system", "dgx-h100", "--gpus", "32", "--html", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "plotly" in text and "nvlink_switch" in text
    missing = run_cli("topology", "--gpus", "72", "--html", str(tmp_path / "no" / "f.html"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_size_parsing_and_sweeps():
    assert parse_size("4096") == 4096 and parse_size("512M") == 512e6 and parse_size("4GB") == 4e9
    assert parse_size("1GiB") == 2**30 and parse_size("1e3") == 1000
    assert size_sweep(1e3, 8e3, 2) == [1e3, 2e3, 4e3, 8e3]
    with pytest.raises(CliError):
        size_sweep(8e3, 1e3, 2)


@pytest.mark.parametrize("command", [["topology", "--gpus", "144"], ["collective", "all_reduce", "--gpus", "144"]])
@pytest.mark.parametrize("value", ["0", "-4"])
def test_gpus_per_domain_below_one_is_a_one_line_error(run_cli, command, value):
    """--gpus-per-domain 0 was taken as 'not given' (the default, 72 per GB300 rack) and printed a fabric the
    user did not ask for; like -4 (and like predict's placement.gpus_per_domain) it is an error."""
    result = run_cli(*command, "--gpus-per-domain", value)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and result.stdout == ""
    assert f"gpus_per_domain {value}" in err and "between 1 and the NVLink domain size 72" in err, err

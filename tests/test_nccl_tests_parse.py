"""nccl-tests output parsing (topologies.nccl_tests) and ``muonsim collective OP --measured FILE``.

The all-reduce excerpt carries the H100 8-GPU NVLS figures of the hardware reference §5.5 [S10]
(1 KB -> t = 25.6 us; 1 MB -> busbw 43.7 GB/s; 8 MB -> 172; 64 MB -> 362; 256 MB -> 423;
1 GB -> 466; 8 GB -> 479), laid out as all_reduce_perf 2.x prints them; the in-place columns
are written for the test. The all-gather excerpt is illustrative: only its saturation at ~360 GB/s
busbw follows the §5.5 H100 all-gather report [S64]; it was "run" without checking (``#wrong`` N/A).
"""

from __future__ import annotations

import json

import pytest

from topologies.inputs import UserInputError
from topologies.nccl_tests import load_nccl_tests, parse_nccl_tests

ALL_REDUCE_H100 = """\
$ mpirun -np 8 ./build/all_reduce_perf -b 1K -e 8G -f 8 -g 1
# nThread 1 nGpus 1 minBytes 1024 maxBytes 8589934592 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41021 on  dgx-h100-01 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41022 on  dgx-h100-01 device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  41023 on  dgx-h100-01 device  2 [0x3a] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  41024 on  dgx-h100-01 device  3 [0x5d] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  41025 on  dgx-h100-01 device  4 [0x9a] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  41026 on  dgx-h100-01 device  5 [0xab] NVIDIA H100 80GB HBM3
#  Rank  6 Group  0 Pid  41027 on  dgx-h100-01 device  6 [0xba] NVIDIA H100 80GB HBM3
#  Rank  7 Group  0 Pid  41028 on  dgx-h100-01 device  7 [0xdb] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    25.60    0.04    0.07      0    25.50    0.04    0.07      0
     1048576        262144     float     sum      -1    41.99   24.97   43.70      0    41.80   25.09   43.90      0
     8388608       2097152     float     sum      -1    85.34   98.29  172.00      0    84.90   98.80  172.91      0
    67108864      16777216     float     sum      -1    324.4  206.86  362.00      0    322.8  207.90  363.82      0
   268435456      67108864     float     sum      -1   1110.5  241.71  423.00      0   1105.0  242.93  425.13      0
  1073741824     268435456     float     sum      -1   4032.3  266.29  466.00      0   4012.1  267.62  468.34      0
  8589934592    2147483648     float     sum      -1    31383  273.71  479.00      0    31226  275.09  481.41      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 275.241
#
"""

ALL_GATHER_H100 = """\
# Collective test starting: all_gather_perf
# nThread 1 nGpus 8 minBytes 1048576 maxBytes 1073741824 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 0 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   7310 on     node07 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   7310 on     node07 device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   7310 on     node07 device  2 [0x3a] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   7310 on     node07 device  3 [0x5d] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid   7310 on     node07 device  4 [0x9a] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid   7310 on     node07 device  5 [0xab] NVIDIA H100 80GB HBM3
#  Rank  6 Group  0 Pid   7310 on     node07 device  6 [0xba] NVIDIA H100 80GB HBM3
#  Rank  7 Group  0 Pid   7310 on     node07 device  7 [0xdb] NVIDIA H100 80GB HBM3
node07:7310:7310 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576         32768     float    none      -1    22.88   45.83   40.10    N/A    22.10   47.45   41.52    N/A
    16777216        524288     float    none      -1    72.85  230.29  201.51    N/A    71.93  233.24  204.09    N/A
   134217728       4194304     float    none      -1   333.64  402.29  352.00    N/A   331.20  405.24  354.59    N/A
  1073741824      33554432     float    none      -1  2601.12  412.80  361.20    N/A  2598.70  413.19  361.54    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 238.703
"""


@pytest.fixture()
def all_reduce_file(tmp_path):
    path = tmp_path / "all_reduce_h100.txt"
    path.write_text(ALL_REDUCE_H100)
    return path


def test_all_reduce_run_parses_sizes_units_ranks_and_in_place():
    run = parse_nccl_tests(ALL_REDUCE_H100, "ar.txt")
    assert run.program == "all_reduce" and run.collective == "all_reduce"
    assert run.ranks == 8 and run.devices == ("NVIDIA H100 80GB HBM3",)
    assert [r.size_bytes for r in run.rows] == [1024, 2**20, 2**23, 2**26, 2**28, 2**30, 2**33]
    first, last = run.rows[0], run.rows[-1]
    assert first.time_s == pytest.approx(25.6e-6) and first.count == 256 and first.dtype == "float"
    assert last.busbw_Bps == pytest.approx(479e9) and last.algbw_Bps == pytest.approx(273.71e9)
    assert last.in_place_time_s == pytest.approx(31226e-6) and last.in_place_busbw_Bps == pytest.approx(481.41e9)
    assert last.wrong == 0 and last.line == ALL_REDUCE_H100.splitlines().index(last_row(ALL_REDUCE_H100)) + 1
    assert run.avg_busbw_Bps == pytest.approx(275.241e9)
    for r in run.rows:  # the file is self-consistent: busbw = algbw * 2(n-1)/n, algbw = size / time
        assert r.busbw_Bps == pytest.approx(r.algbw_Bps * 2 * 7 / 8, rel=0.01, abs=0.01e9)
        assert r.algbw_Bps == pytest.approx(r.size_bytes / r.time_s, rel=0.01, abs=0.01e9)


def last_row(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()[:1].isdigit()][-1]


def test_all_gather_run_with_na_wrong_column_and_log_noise():
    run = parse_nccl_tests(ALL_GATHER_H100)
    assert (run.program, run.collective, run.ranks) == ("all_gather", "all_gather", 8)
    assert len(run.rows) == 4 and all(r.wrong is None for r in run.rows)
    assert run.rows[2].busbw_Bps == pytest.approx(352e9) and run.rows[2].time_s == pytest.approx(333.64e-6)


def test_older_format_without_root_and_with_float_error_column_and_program_names():
    text = ("#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
            "     1048576        262144     float     sum    41.99   24.97   43.70  0e+00    41.80   25.09   43.90  0e+00\n")
    run = parse_nccl_tests(text)
    assert run.rows[0].busbw_Bps == pytest.approx(43.7e9) and run.rows[0].wrong is None
    assert run.ranks is None and run.collective is None and run.program is None
    assert parse_nccl_tests("./alltoall_perf_mpi -b 8\n" + text).collective == "all_to_all"
    assert parse_nccl_tests("# sendrecv_perf\n" + text).collective == "send_recv"
    gather = parse_nccl_tests("# gather_perf\n" + text)
    assert gather.program == "gather" and gather.collective is None


@pytest.mark.parametrize(("bad_row", "needle"), [
    ("     8388608       2097152     float     sum      -1    85.34   98.29", "expected 13 columns"),
    ("     8388608       2097152     float     sum      -1    fast   98.29  172.00  0  84.90  98.80  172.91  0",
     "time 'fast' is not a number"),
    ("     8388608       2097152     float     sum      -1     0.00   98.29  172.00  0  84.90  98.80  172.91  0",
     "must be > 0"),
    ("        1024           256     float     sum      -1    25.60    0.04    0.07  0  25.50  0.04  0.07  0", "already given"),
])
def test_malformed_row_names_file_and_line(bad_row, needle):
    lines = ALL_REDUCE_H100.splitlines()
    at = lines.index(last_row(ALL_REDUCE_H100))
    text = "\n".join([*lines[:at], bad_row, *lines[at:]])
    with pytest.raises(UserInputError) as err:
        parse_nccl_tests(text, "ar.txt")
    message = str(err.value)
    assert message.startswith(f"ar.txt, line {at + 1}:") and needle in message and "\n" not in message


def test_file_errors_are_one_line(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_nccl_tests(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nThread 1 nGpus 8 minBytes 8\n#  size count type redop root time algbw busbw #wrong\n")
    with pytest.raises(UserInputError, match="no nccl-tests data rows"):
        load_nccl_tests(empty)
    with pytest.raises(UserInputError, match="several nccl-tests programs"):
        parse_nccl_tests("# all_reduce_perf\n# all_gather_perf\n" + ALL_REDUCE_H100)


def test_cli_measured_all_reduce_on_dgx_h100_json(run_cli, all_reduce_file):
    result = run_cli("collective", "all-reduce", "--system", "dgx-h100", "--measured", all_reduce_file, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpus"] == 8 and data["group_size"] == 8 and data["measured_ranks"] == 8 and data["notes"] == []
    rows = data["results"]
    assert [r["size_bytes"] for r in rows] == [1024, 2**20, 2**23, 2**26, 2**28, 2**30, 2**33]
    for r in rows:
        assert r["busbw_error_pct"] == pytest.approx(100 * (r["measured_time_s"] / r["time_s"] - 1))
        assert r["algorithm"] == "nvls"  # one 8-GPU NVSwitch node: NVLink SHARP, as the measurement used
    at_8gb = rows[-1]
    assert at_8gb["measured_busbw_Bps"] == pytest.approx(479e9)
    assert abs(at_8gb["busbw_error_pct"]) < 10.0
    assert at_8gb["busbw_Bps"] == pytest.approx(479e9, rel=0.10)
    errors = [abs(r["busbw_error_pct"]) for r in rows]
    assert data["mape_pct"] == pytest.approx(sum(errors) / len(errors))
    assert data["mape_pct_from_1MB"] == pytest.approx(sum(errors[1:]) / len(errors[1:]))


def test_cli_measured_table_and_mape_line(run_cli, all_reduce_file):
    result = run_cli("collective", "all_reduce", "--system", "dgx-h100", "--measured", all_reduce_file)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "group 'world' of 8 ranks" in lines[0] and "all_reduce_perf, 8 ranks" in lines[0]
    assert "meas busbw" in lines[1] and "pred busbw" in lines[1] and "error %" in lines[1]
    data = [line.split() for line in lines if not line.startswith("#")]
    assert [row[0] for row in data] == ["1024", "1048576", "8388608", "67108864", "268435456", "1073741824", "8589934592"]
    assert data[-1][3] == "479.00" and data[-1][-1] == "nvls"
    assert lines[-1].startswith("# MAPE ") and "over 6 size(s) >= 1 MB" in lines[-1] and "over all 7" in lines[-1]


def test_cli_measured_all_gather_notes_another_gpu(run_cli, tmp_path):
    path = tmp_path / "ag.txt"
    path.write_text(ALL_GATHER_H100)
    result = run_cli("collective", "all_gather", "--system", "dgx-b200", "--measured", path, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["results"]) == 4 and "NVIDIA H100 80GB HBM3" in data["notes"][0]


def test_cli_measured_group_of_a_larger_job(run_cli, all_reduce_file):
    result = run_cli("collective", "all_reduce", "--system", "dgx-h100", "--gpus", "64", "--tp", "8",
                     "--group", "tp", "--measured", all_reduce_file, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["group_size"] == 8


@pytest.mark.parametrize(("extra", "needle"), [
    (("all_gather",), "all_reduce_perf output (all_reduce) but the command asks for all_gather"),
    (("all_reduce", "--gpus", "16"), "--gpus 16 but"),
    (("all_reduce", "--gpus", "16", "--group", "dp", "--tp", "1"), "ran on 8 ranks but group 'dp' has 16"),
    (("all_reduce", "--size", "1G"), "--measured takes its sizes from the file"),
    (("all-reduce-x",), "unknown collective 'all-reduce-x'"),
])
def test_cli_measured_errors_are_one_line_exit_2(run_cli, all_reduce_file, extra, needle):
    op, *flags = extra
    result = run_cli("collective", op, "--system", "dgx-h100", *flags, "--measured", all_reduce_file)
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_cli_measured_file_errors(run_cli, tmp_path):
    missing = run_cli("collective", "all_reduce", "--measured", tmp_path / "nope.txt")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr and missing.stderr.count("\n") == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("# nThread 1 nGpus 8\n#  Rank  0 Group  0 Pid 1 on h device  0 [0x18] NVIDIA H100\n")
    no_rows = run_cli("collective", "all_reduce", "--measured", empty)
    assert no_rows.exit_code == 2 and "no nccl-tests data rows" in no_rows.stderr
    no_ranks = tmp_path / "noranks.txt"
    no_ranks.write_text("\n".join(line for line in ALL_REDUCE_H100.splitlines() if "Rank" not in line))
    result = run_cli("collective", "all_reduce", "--system", "dgx-h100", "--measured", no_ranks)
    assert result.exit_code == 2 and "pass --gpus" in result.stderr
    assert run_cli("collective", "all_reduce", "--system", "dgx-h100", "--gpus", "8",
                   "--measured", no_ranks).exit_code == 0

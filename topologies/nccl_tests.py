"""Parse the stdout of NVIDIA nccl-tests (``all_reduce_perf``, ``all_gather_perf`` ...), format 2.x.

Users have nccl-tests output from their cluster long before they train; ``muonsim collective OP
--measured FILE`` compares the collective model with it. What this module reads::

    # nThread 1 nGpus 1 minBytes 1024 maxBytes 8589934592 step: 8(factor) ...      (ignored)
    #  Rank  0 Group  0 Pid  4242 on node01 device  0 [0x18] NVIDIA H100 80GB HBM3   (one per rank)
    #       size    count   type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B) (elements)                          (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
            1024       256  float     sum      -1    25.60    0.04    0.07      0    25.40    0.04    0.07      0
    # Avg bus bandwidth    : 230.123

- Columns are located by the header (older versions have no ``root`` or no ``redop``); the first
  ``time algbw busbw`` group is out-of-place, the second in-place. Without a header a data row must
  end with the two groups ``time algbw busbw #wrong`` (the size is the first column).
- ``#wrong`` (or the older ``error``) may be ``N/A``; in-place values may be ``N/A`` too.
- Ranks = the number of distinct ``# Rank N ...`` lines (None when the file has none).
- The collective comes from the program name (``all_reduce_perf``, ``alltoall_perf_mpi`` ...) if any
  line names one (a command line, ``# Collective test starting: all_reduce_perf``), else None.
- Lines that do not start with ``#`` or a digit (NCCL INFO logs, MPI banners, blank lines) are
  ignored; a line starting with a digit that is not a valid data row is a one-line
  :class:`UserInputError` naming the file and the line number.

Units: sizes in bytes; times in the file are µs (returned in s); GB/s in the file are 1e9 bytes/s
(returned in bytes/s, ``_Bps``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from topologies.inputs import UserInputError

#: nccl-tests program stem -> muonsim collective op (programs muonsim does not model map to None).
PROGRAM_OPS: dict[str, str | None] = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "broadcast": "broadcast", "sendrecv": "send_recv",
    "reduce": None, "gather": None, "scatter": None, "hypercube": None,
}

_PROGRAM_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(PROGRAM_OPS, key=len, reverse=True))
                         + r")_perf(?:_mpi)?(?![A-Za-z0-9_])")
_RANK_RE = re.compile(r"^#\s*Rank\s+(\d+)\b(.*)$")
_DEVICE_RE = re.compile(r"\bdevice\s+\d+\s+\[[^\]]*\]\s*(.+?)\s*$")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_GROUP = ("time", "algbw", "busbw")


@dataclass(frozen=True)
class NcclTestsRow:
    """One data row: size (bytes), out-of-place time (s) and bandwidths (bytes/s), in-place too."""

    line: int
    size_bytes: int
    count: int | None
    dtype: str | None
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    in_place_time_s: float | None
    in_place_algbw_Bps: float | None
    in_place_busbw_Bps: float | None
    wrong: int | None
    """Wrong elements over both runs (None when the file says N/A or gives a float error)."""


@dataclass(frozen=True)
class NcclTestsRun:
    """A parsed nccl-tests output: rows in file order plus what the file says about the run."""

    source: str
    rows: tuple[NcclTestsRow, ...]
    ranks: int | None
    collective: str | None
    """muonsim op name (``all_reduce`` ... ``all_to_all``, ``send_recv``) or None if unknown."""
    program: str | None
    """nccl-tests program stem as named in the file (``all_reduce``, ``alltoall``, ``gather`` ...)."""
    devices: tuple[str, ...]
    """Distinct GPU names from the rank lines, e.g. ``NVIDIA H100 80GB HBM3``."""
    avg_busbw_Bps: float | None
    """The trailer ``# Avg bus bandwidth`` (bytes/s), if present."""


def _header_columns(body: str) -> list[str] | None:
    tokens = body.split()
    if tokens and tokens[0] == "size" and all(name in tokens for name in _GROUP):
        return tokens
    return None


def _groups(columns: list[str]) -> list[int]:
    """Start index of each ``time algbw busbw`` group in ``columns`` (out-of-place first)."""
    return [i for i in range(len(columns) - 2) if tuple(columns[i:i + 3]) == _GROUP]


class _RowError(ValueError):
    pass


def _number(token: str, what: str, allow_na: bool = False) -> float | None:
    if allow_na and token.upper() == "N/A":
        return None
    try:
        value = float(token)
    except ValueError:
        raise _RowError(f"{what} '{token}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise _RowError(f"{what} '{token}' must be a finite number >= 0")
    return value


def _wrong(tokens: list[str]) -> int | None:
    total = 0
    for token in tokens:
        if not re.fullmatch(r"\d+", token):
            return None  # N/A, or an older float 'error' column
        total += int(token)
    return total


def _parse_row(tokens: list[str], columns: list[str] | None, line_no: int) -> NcclTestsRow:
    if columns is not None:
        if len(tokens) != len(columns):
            raise _RowError(f"expected {len(columns)} columns ({' '.join(columns)}), got {len(tokens)}")
        starts = _groups(columns)
        named = dict(zip(columns, tokens, strict=False))
        count_tok, dtype = named.get("count"), named.get("type")
        size_tok = tokens[columns.index("size")]
        wrong_toks = [tokens[s + 3] for s in starts if s + 3 < len(columns) and columns[s + 3] in ("#wrong", "error")]
    else:
        if len(tokens) < 9:
            raise _RowError("no column header ('#  size  count  type ... time  algbw  busbw ...') before it, "
                            f"and {len(tokens)} columns are too few for 'size ... time algbw busbw #wrong' x 2")
        starts = [len(tokens) - 8, len(tokens) - 4]
        count_tok = tokens[1] if len(tokens) > 9 else None
        dtype = tokens[2] if len(tokens) > 10 else None
        size_tok = tokens[0]
        wrong_toks = [tokens[-5], tokens[-1]]
    if not re.fullmatch(r"\d+", size_tok):
        raise _RowError(f"size '{size_tok}' is not a whole number of bytes")
    count = int(count_tok) if count_tok is not None and count_tok.isdigit() else None
    time_us, algbw, busbw = (_number(tokens[starts[0] + k], f"out-of-place {_GROUP[k]}") for k in range(3))
    assert time_us is not None and algbw is not None and busbw is not None
    if time_us <= 0:
        raise _RowError(f"out-of-place time '{tokens[starts[0]]}' must be > 0 µs")
    ip: list[float | None] = [None, None, None]
    if len(starts) > 1:
        ip = [_number(tokens[starts[1] + k], f"in-place {_GROUP[k]}", allow_na=True) for k in range(3)]
    return NcclTestsRow(
        line=line_no, size_bytes=int(size_tok), count=count, dtype=dtype,
        time_s=time_us * 1e-6, algbw_Bps=algbw * 1e9, busbw_Bps=busbw * 1e9,
        in_place_time_s=None if ip[0] is None else ip[0] * 1e-6,
        in_place_algbw_Bps=None if ip[1] is None else ip[1] * 1e9,
        in_place_busbw_Bps=None if ip[2] is None else ip[2] * 1e9,
        wrong=_wrong(wrong_toks),
    )


def parse_nccl_tests(text: str, source: str = "<text>") -> NcclTestsRun:
    """Parse nccl-tests stdout (see the module doc); ``source`` names the file in error messages.

    Raises UserInputError (one line, naming ``source`` and the line) for a malformed data row, a
    repeated size (one data type and reduction per file), several programs, or no data rows.
    """
    rows: list[NcclTestsRow] = []
    columns: list[str] | None = None
    ranks: dict[int, str] = {}
    programs: dict[str, int] = {}
    avg: float | None = None
    seen: dict[int, int] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        for m in _PROGRAM_RE.finditer(line):
            programs.setdefault(m.group(1), line_no)
        if line.startswith("#"):
            body = line[1:]
            header = _header_columns(body)
            if header is not None:
                if len(_groups(header)) == 0:
                    raise UserInputError(f"{source}, line {line_no}: header has no 'time algbw busbw' columns")
                columns = header
            elif (rank := _RANK_RE.match(line)) is not None:
                device = _DEVICE_RE.search(rank.group(2))
                ranks[int(rank.group(1))] = device.group(1) if device else ""
            elif (m_avg := _AVG_RE.match(line)) is not None:
                try:
                    avg = float(m_avg.group(1)) * 1e9
                except ValueError:
                    avg = None
            continue
        if not line[:1].isdigit():
            continue
        try:
            row = _parse_row(line.split(), columns, line_no)
        except _RowError as err:
            raise UserInputError(f"{source}, line {line_no}: malformed nccl-tests row: {err}") from None
        if row.size_bytes in seen:
            raise UserInputError(
                f"{source}, line {line_no}: size {row.size_bytes} B already given on line {seen[row.size_bytes]}; "
                "keep one run, one data type and one reduction per file (not nccl-tests -d all / -o all)")
        seen[row.size_bytes] = line_no
        rows.append(row)
    if len(programs) > 1:
        named = ", ".join(f"{p}_perf (line {n})" for p, n in programs.items())
        raise UserInputError(f"{source} holds output of several nccl-tests programs ({named}); give one per file")
    if not rows:
        raise UserInputError(f"{source} has no nccl-tests data rows (lines like '1048576  262144  float  sum  -1  "
                             "41.99  24.97  43.70  0 ...' under the '#  size  count  type ...' header)")
    program = next(iter(programs), None)
    return NcclTestsRun(
        source=source, rows=tuple(rows), ranks=len(ranks) or None,
        collective=PROGRAM_OPS.get(program) if program else None, program=program,
        devices=tuple(dict.fromkeys(d for d in ranks.values() if d)), avg_busbw_Bps=avg,
    )


def load_nccl_tests(path: str | Path) -> NcclTestsRun:
    """Read and parse an nccl-tests output file; one-line UserInputError if missing or malformed."""
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"nccl-tests output '{p}' is a directory, not a file")
    if not p.is_file():
        raise UserInputError(f"nccl-tests output '{p}' does not exist")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise UserInputError(f"nccl-tests output '{p}' cannot be read: {err}") from None
    return parse_nccl_tests(text, source=str(p))

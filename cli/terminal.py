"""Terminal plumbing: output that never crashes on a narrow encoding, and consoles that fit the width.

Some terminals and pipes are not UTF-8 (a Windows console in cp1252, ``PYTHONIOENCODING=ascii``,
``LANG=C``). muonsim prints a few non-ASCII symbols (τ, Δ, σ, →, ≤); on such a stream each one the
encoding lacks is written in ASCII (``tau``, ``d``, ``sigma``, ``->``, ``<=``) instead of raising
UnicodeEncodeError. rich already draws ASCII boxes on such streams.

Tables fit the terminal: :func:`console` returns a rich Console of the terminal's width (``COLUMNS``
when set, 80 when the output is not a terminal), never forced wider; ``--wide`` asks for
:data:`WIDE_COLUMNS`.
"""

from __future__ import annotations

import codecs
import re
import sys
import unicodedata
from typing import Any

ERROR_HANDLER = "muonsim-ascii"
WIDE_COLUMNS = 160

ASCII_OF = {
    "τ": "tau", "Δ": "d", "σ": "sigma", "Σ": "sum", "α": "alpha", "β": "beta", "ρ": "rho",
    "←": "<-", "→": "->", "↔": "<->", "∂": "d", "−": "-", "≈": "~", "≤": "<=", "≥": ">=",
    "⁻": "-", "ᵀ": "T", "∝": "~", "⌊": "floor(", "⌋": ")", "×": "x", "·": "*", "–": "-", "—": "--",
    "…": "...", "±": "+/-", "µ": "u", "²": "^2", "³": "^3", "¹": "^1", "½": "1/2", "§": "S",
}


def ascii_fallback(text: str) -> str:
    """ASCII spelling of ``text``: known symbols by :data:`ASCII_OF`, accents dropped, else '?'."""
    out = []
    for ch in text:
        if ch in ASCII_OF:
            out.append(ASCII_OF[ch])
            continue
        plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
        out.append(plain or "?")
    return "".join(out)


def _replace(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return ascii_fallback(err.object[err.start:err.end]), err.end


codecs.register_error(ERROR_HANDLER, _replace)


def make_streams_safe(*streams: Any) -> None:
    """Reconfigure text streams whose encoding lacks muonsim's symbols to spell them in ASCII."""
    for stream in streams or (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        reconfigure = getattr(stream, "reconfigure", None)
        if not encoding or reconfigure is None:
            continue
        try:
            "τΔσ→≤×·–".encode(encoding)
        except UnicodeEncodeError:
            reconfigure(errors=ERROR_HANDLER)
        except LookupError:
            continue


def console(stderr: bool = False, wide: bool = False) -> Any:
    """A rich Console of the terminal's width (80 columns when not a terminal; ``wide``: 160)."""
    from rich.console import Console

    if wide:
        return Console(stderr=stderr, width=WIDE_COLUMNS)
    return Console(stderr=stderr)


NEGATIVE_ZERO = re.compile(r"(?<![\w.])-(0(?:\.0+)?)(?![\w.])")


def no_negative_zero(text: str) -> str:
    """``text`` with every number that rounded to a negative zero (``-0.0``, ``-0``) written without its sign:
    a value of about -1e-18 printed to one decimal is zero, not a loss of minus nothing."""
    return NEGATIVE_ZERO.sub(r"\1", text)

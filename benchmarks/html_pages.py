"""Every HTML page muonsim writes renders offline: headless Chromium screenshots, checked non-blank.

    python benchmarks/html_pages.py [--out DIR] [--chromium PATH]

Writes the pages of ``predict --html`` (DES timeline beside the breakdown), ``compare --html``
(``--ep-comm-overlap off,on``: two different breakdowns), ``plan --html``, ``validate --html`` and
``topology --html`` into DIR, checks that none loads anything from the network (plotly.js is
embedded), screenshots each with headless Chromium (no network, no GPU, a throw-away profile) and
decodes the PNG: a page is non-blank when enough of its pixels differ from the background and
it has many distinct colours. Prints one line per page; exits 1 when a page is blank.
Install Chromium with ``apt-get install -y chromium``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1400, 1100)
MIN_INK = 0.03  # fraction of pixels that differ from the page background
MIN_COLOURS = 12
REMOTE = re.compile(r"""<script[^>]+src=["']https?://|<link[^>]+href=["']https?://""", re.IGNORECASE)


def pages(out: Path) -> dict[str, list[str]]:
    """muonsim arguments writing each page (small scenarios: the script runs in a minute or two)."""
    runs = out / "runs.csv"
    lines = (ROOT / "workloads/data/measured/megatron_bridge_perf_summary.csv").read_text(encoding="utf-8").splitlines()
    runs.write_text("\n".join(lines[:25]) + "\n", encoding="utf-8")
    return {
        "predict": ["predict", "--html", str(out / "predict.html")],
        "compare": ["compare", "--ep-comm-overlap", "off,on", "--html", str(out / "compare.html")],
        "plan": ["plan", "--pp", "4", "--vpp", "2,4", "--max-tp", "2", "--samples", "0", "--top-k", "2",
                 "--html", str(out / "plan.html")],
        "validate": ["validate", str(runs), "--html", str(out / "validate.html")],
        "topology": ["topology", "--system", "gb200-nvl72", "--gpus", "144", "--html", str(out / "topology.html")],
    }


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> bytearray:
    """PNG scanline unfiltering (filters 0-4), bytes per pixel ``bpp``."""
    stride = width * bpp
    out = bytearray(height * stride)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        kind = raw[pos]
        line = bytearray(raw[pos + 1:pos + 1 + stride])
        pos += 1 + stride
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return out


def png_stats(path: Path) -> tuple[float, int]:
    """(fraction of pixels differing from the top-left background pixel, distinct colours) of an
    8-bit RGB/RGBA PNG (every 4th pixel sampled for the colour count)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, width = 8, bytearray(), 0
    height = depth = colour = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if depth != 8 or colour not in (2, 6):
        raise ValueError(f"{path}: unsupported PNG (bit depth {depth}, colour type {colour})")
    bpp = 3 if colour == 2 else 4
    pixels = _unfilter(zlib.decompress(bytes(idat)), width, height, bpp)
    background = bytes(pixels[:3])
    ink, colours = 0, set()
    for k in range(0, len(pixels), bpp):
        px = bytes(pixels[k:k + 3])
        if px != background:
            ink += 1
        if k % (4 * bpp) == 0:
            colours.add(px)
    return ink / (width * height), len(colours)


def screenshot(chromium: str, page: Path, png: Path, profile: Path) -> None:
    """Headless Chromium, offline, throw-away profile; waits for plotly to draw (virtual time)."""
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
           f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars",
           "--virtual-time-budget=15000", f"--screenshot={png}", page.resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="directory for the pages and screenshots (default: a temp dir)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = ap.parse_args()
    if not args.chromium:
        raise SystemExit("chromium not found: apt-get install -y chromium")
    out = args.out or Path(tempfile.mkdtemp(prefix="muonsim-pages-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    blank = []
    print(f"pages and screenshots in {out} (load average {os.getloadavg()[0]:.2f})")
    for name, argv in pages(out).items():
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "cli.app", *argv], cwd=out, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: muonsim {' '.join(argv)} failed: {proc.stderr.strip()}")
        page = out / f"{name}.html"
        text = page.read_text(encoding="utf-8")
        remote = REMOTE.search(text)
        png = out / f"{name}.png"
        with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
            screenshot(args.chromium, page, png, Path(profile))
        ink, colours = png_stats(png)
        ok = ink >= MIN_INK and colours >= MIN_COLOURS and remote is None
        if not ok:
            blank.append(name)
        print(f"{name:>9}: {page.stat().st_size / 1e6:5.1f} MB page, {'loads ' + remote.group(0) if remote else 'offline'}, "
              f"screenshot {ink:6.1%} ink, {colours:4d} colours -> {'ok' if ok else 'BLANK'} "
              f"({time.perf_counter() - t0:.1f} s)")
    if blank:
        raise SystemExit(f"blank or not offline: {', '.join(blank)}")


if __name__ == "__main__":
    main()

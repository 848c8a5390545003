"""Every figure of the README's "Findings" section, re-measured, each printed with the command it comes from.

    python benchmarks/readme_findings.py [--calibration FILE]

Runs the installed ``muonsim`` CLI with ``--json`` (the built-in calibration profile unless
``--calibration`` is given) and prints one line per figure: the value, then the command that
produced it, so a reader can re-run any single number. Takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from typing import Any

KIMI_TP2_512 = "--tp 2 --etp 2 --gpus 512"
LLAMA70_DP16 = "--model llama3-70b --gpus 64 --pp 4 --vpp 1 --ep 1 --mbs 1 --gbs 256 --seq 8192 --precision fp8-cs"
QWEN30_8 = ("--model qwen3-30b-a3b --system gb300-nvl72 --gpus 8 --tp 1 --pp 1 --vpp 1 --ep 8 --mbs 8 --gbs 512 "
            "--seq 4096 --precision mxfp8")


def muonsim_json(args: str, calibration: str | None) -> Any:
    """The parsed ``--json`` output of ``muonsim ARGS`` (exits with the CLI's message on failure)."""
    argv = ["muonsim", *shlex.split(args), "--json"]
    if calibration:
        argv += ["--calibration", calibration]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"muonsim {args}: {done.stderr.strip() or done.stdout.strip()}")
    return json.loads(done.stdout)


def show(label: str, value: str, command: str) -> None:
    """One figure and its source command."""
    print(f"{label:66s} {value:>22s}   <- muonsim {command}")


def exposed_s(report: dict[str, Any], part: str) -> float:
    """Exposed seconds of communication ``part`` (ep, pp, dp_grad, dp_param, optimizer_tp) of a report."""
    return float(report["breakdown_s"]["exposed_comm"].get(part, 0.0))


def variants(compare: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A ``compare --json`` result's variants by label."""
    return {v["label"]: v for v in compare["variants"]}


def default_scenario(cal: str | None) -> None:
    """Default scenario: step time, Muon over AdamW, hiding, EP overlap, padding."""
    base = muonsim_json("predict", cal)
    opt = base["optimizer"]
    show("default scenario step time", f"{base['step_time_s']:.2f} s", "predict")
    show("  Muon optimizer step on the critical GPU (kernels)", f"{opt['kernels']['gpu_s']:.3f} s", "predict")
    show("  Muon launches on the critical GPU / per plain tensor",
         f"{opt['kernels']['launches']:.0f} / {opt['kernels']['launches_per_muon_tensor']:.0f}", "predict")
    show("  Muon exposed optimizer communication", f"{opt['exposed_s']:.3f} s", "predict")
    show("  current-layout padding", f"{opt['padding_overhead_pct']:.0f} %", "predict")
    show("  exposed EP all-to-all", f"{exposed_s(base, 'ep'):.2f} s", "predict")
    for extra in ("", " --hide-param-gather on", " --hide-param-gather on --align-param-gather on",
                  " --ep-comm-overlap on"):
        cmd = f"compare --optimizer adamw,muon{extra}"
        v = variants(muonsim_json(cmd, cal))
        adamw, muon = v["optimizer=adamw"]["step_time_s"], v["optimizer=muon"]["step_time_s"]
        show(f"  AdamW -> Muon{extra or ' (Megatron defaults)'}",
             f"{adamw:.2f} -> {muon:.2f} s ({100 * (muon / adamw - 1):+.1f} %)", cmd)


def tp_modes(cal: str | None) -> None:
    """Kimi K2 at tp2/etp2 on 512 GPUs: optimizer time on the busiest GPU per TP mode."""
    for label, c in (("calibrated", cal), ("datasheet", "none")):
        cmd = f"compare {KIMI_TP2_512} --tp-mode duplicated,distributed,blockwise"
        v = variants(muonsim_json(cmd, c))
        times = " / ".join(f"{v[f'tp-mode={m}']['report']['optimizer']['per_rank_compute_s']['max']:.2f}"
                           for m in ("duplicated", "distributed", "blockwise"))
        show(f"Kimi K2 tp2 optimizer s, dup/dist/block ({label})", times,
             cmd + (" --calibration none" if c == "none" else ""))


def load_balance() -> None:
    """Llama 3 70B, dp 16: imbalance (max/mean NS work) per layout × load balance."""
    for layout in ("current", "legacy"):
        cmd = f"compare {LLAMA70_DP16} --layout {layout} --load-balance lpt,ping_pong,none"
        v = variants(muonsim_json(cmd, None))
        text = " / ".join(f"{v[f'load-balance={m}']['report']['optimizer']['imbalance_ratio']:.2f}"
                          for m in ("lpt", "ping_pong", "none"))
        show(f"Llama 3 70B dp16 {layout}: imbalance lpt/ping-pong/none", text, cmd)


def qwen_small(cal: str | None) -> None:
    """Qwen3-30B-A3B on 8 GB300 (issue 13's launch-bound case): Muon over AdamW and launches."""
    cmd = f"compare {QWEN30_8} --optimizer adamw,muon"
    v = variants(muonsim_json(cmd, cal))
    adamw, muon = v["optimizer=adamw"], v["optimizer=muon"]
    k = muon["report"]["optimizer"]["kernels"]
    show("Qwen3-30B 8 GB300: AdamW -> Muon",
         f"{adamw['step_time_s']:.3f} -> {muon['step_time_s']:.3f} s "
         f"({100 * (muon['step_time_s'] / adamw['step_time_s'] - 1):+.1f} %)", cmd)
    show("  Muon launches on the critical GPU, GPU s / host issue s",
         f"{k['launches']:.0f}, {k['gpu_s']:.3f} / {k['issue_s']:.3f}", cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=None, help="profile YAML (default: the built-in one)")
    args = parser.parse_args()
    default_scenario(args.calibration)
    tp_modes(args.calibration)
    load_balance()
    qwen_small(args.calibration)


if __name__ == "__main__":
    main()

"""Run NCCL's own topology search and cost model (from its released binary) on a muonsim system.

    python benchmarks/nccl_probe/probe.py --system gb200-nvl72 --nodes 1,2,20 [--size 8G] [--nccl 2.26.2]

NCCL's library ships with its debug information, so its internal functions can be called without a
GPU: this script downloads ``nvidia-nccl-cu12==VERSION`` (about 200 MB, cached in
``~/.cache/muonsim/nccl``), writes an NCCL topology XML for one NVLink domain of the system (GPUs on
an NVSwitch, one NIC per GPU at the system's NIC rate; NVL72 racks as one MNNVL clique), and runs,
inside ``gdb``, ``ncclTopoGetSystemFromXml`` -> ``ncclTopoComputePaths`` -> ``ncclTopoSearchInit``
-> ``ncclTopoCompute`` (ring, tree and NVLS graphs) -> ``ncclTopoTuneModel`` on a zeroed
``ncclComm`` holding the rank and node counts. It prints NCCL's graphs (channels, per-channel
bandwidths), its all-reduce latency and algorithm bandwidth per algorithm (Simple protocol), the
algorithm its model picks for ``--size``, and muonsim's prediction beside it.

What it is not: the real runtime. The XML is a simplification (no PCIe switches, C2C as declared),
``NCCL_IGNORE_DISABLED_P2P=2`` skips NVML (as NCCL's own unit tests do), and NCCL's size-dependent
tree correction factors are not applied. It answers "what does NCCL's cost model say", not "what
does the hardware do". Needs ``gdb`` and network access to the package registry.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
HERE = Path(__file__).parent
CACHE = Path.home() / ".cache" / "muonsim" / "nccl"


def nccl_library(version: str) -> Path:
    """Path of ``libnccl.so.2`` of ``nvidia-nccl-cu12==version`` (downloaded once)."""
    lib = CACHE / version / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    if lib.is_file():
        return lib
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"nvidia-nccl-cu12=={version}", "--no-deps",
                        "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(CACHE / version)
    return lib


def topology_xml(gpus: int, nic_gbps: float, sm: int, grace: bool) -> str:
    """NCCL topology XML of one NVLink domain: ``gpus`` GPUs on one NVSwitch, one NIC per GPU.

    Grace systems: a tray per 4 GPUs (two CPUs, each with two GPUs and two NICs) with a host hash per
    tray, GPU-CPU over C2C; x86 nodes: two CPUs with half the GPUs and NICs each.
    """
    per_cpu = 2 if grace else max(1, gpus // 2)
    cpus = gpus // per_cpu
    cpu_attrs = 'arch="arm64" vendor="NVIDIA"' if grace else 'arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143"'
    lines, rank = ['<system version="1">'], 0
    for c in range(cpus):
        host = 0x1000 + (c // 2 if grace else 0)
        lines.append(f'  <cpu host_hash="0x{host:x}" numaid="{c % 2}" affinity="0000ffff" {cpu_attrs}>')
        for k in range(per_cpu):
            dev = (c % 2) * per_cpu + k
            lines += [
                f'    <pci busid="{dev:04x}:01:00.0" class="0x030200" vendor="0x10de" device="0x2941" '
                'subsystem_vendor="0x10de" subsystem_device="0x2046" link_speed="32.0 GT/s PCIe" link_width="16">',
                f'      <gpu dev="{dev}" sm="{sm}" rank="{rank}" gdr="1">',
                '        <nvlink target="ffff:ff:ff.0" count="18" tclass="0x068000"/>',
                *(['        <c2c bw="40000" count="10"/>'] if grace else []),
                '      </gpu>', '    </pci>',
                f'    <pci busid="{dev:04x}:03:00.0" class="0x020700" vendor="0x15b3" device="0x1021" '
                'subsystem_vendor="0x15b3" subsystem_device="0x0023" link_speed="32.0 GT/s PCIe" link_width="16">',
                f'      <nic><net name="mlx5_{dev}" dev="{dev}" speed="{int(nic_gbps * 1000)}" port="1" '
                f'latency="0.000000" guid="0x{rank:x}" maxconn="131072" gdr="1"/></nic>',
                '    </pci>']
            rank += 1
        lines.append('  </cpu>')
    lines.append('</system>')
    return "\n".join(lines) + "\n"


def run_probe(lib: Path, xml: Path, ranks: int, nodes: int, local: int, sm: int, mnnvl: bool) -> dict:
    """NCCL's graphs and all-reduce (latency µs, algbw GB/s) per algorithm and protocol."""
    script = (HERE / "probe.gdb.in").read_text()
    for key, value in {"XML": str(xml), "HOSTHASH": "0x1000", "NRANKS": ranks, "NNODES": nodes, "LOCAL": local,
                       "SM": sm, "MNNVL": int(mnnvl)}.items():
        script = script.replace(f"@{key}@", str(value))
    with tempfile.NamedTemporaryFile("w", suffix=".gdb", delete=False) as f:
        f.write(script)
    loader = (f"import ctypes,os,signal; ctypes.CDLL('{lib}', mode=ctypes.RTLD_GLOBAL); "
              "os.kill(os.getpid(), signal.SIGTRAP)")
    env = {"NCCL_IGNORE_DISABLED_P2P": "2", "NCCL_NET_GDR_C2C": "1", "NCCL_DEBUG": "WARN", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["gdb", "-batch", "-x", f.name, "--args", sys.executable, "-c", loader],
                         capture_output=True, text=True, env=env, timeout=600).stdout
    graph = re.search(r"GRAPH ring (\d+) (\S+) (\S+) tree (\d+) (\S+) (\S+) nvls (\d+) (\S+) (\S+) rc (\d+)", out)
    if graph is None:
        raise SystemExit(f"gdb run failed:\n{out[-2000:]}")
    rows = {}
    for m in re.finditer(r"ALLREDUCE (\d) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+)", out):
        vals = [float(v) for v in m.groups()[1:]]
        rows[ALGOS[int(m.group(1))]] = {"latency_us": vals[:3], "algbw_GBps": vals[3:]}
    g = [float(v) for v in graph.groups()]
    return {"ring": g[0:3], "tree": g[3:6], "nvls": g[6:9], "rc": int(g[9]), "all_reduce": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="gb200-nvl72")
    parser.add_argument("--nodes", default="1,2,20", help="NVLink domains in the job (comma-separated)")
    parser.add_argument("--size", default="8G")
    parser.add_argument("--nccl", default="2.26.2")
    args = parser.parse_args()
    if shutil.which("gdb") is None:
        raise SystemExit("needs gdb")
    from cli.cmd_collective import parse_size
    from topologies.collectives import collective_time_s
    from topologies.hardware import load_system
    from topologies.placement import place_job

    system = load_system(args.system)
    local = system.nvlink.domain_size
    sm = 90 if "H100" in system.gpu.name or "H200" in system.gpu.name else 100
    grace = local > 8
    nic_gbps = system.scale_out.nic_bandwidth_Bps * 8 / 1e9 if system.scale_out else 0.0
    size = parse_size(args.size)
    lib = nccl_library(args.nccl)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "topo.xml"
        xml.write_text(topology_xml(local, nic_gbps, sm, grace))
        print(f"NCCL {args.nccl} cost model on {args.system} ({local} GPUs per NVLink domain, one {nic_gbps:.0f} Gb/s "
              f"NIC per GPU), all-reduce of {size:.3g} B, Simple protocol")
        for nodes in (int(n) for n in args.nodes.split(",")):
            n = nodes * local
            res = run_probe(lib, xml, n, nodes, local, sm, mnnvl=grace)
            ring, tree, nvls = res["ring"], res["tree"], res["nvls"]
            print(f"\n{nodes} domain(s), {n} ranks: graphs ring {ring[0]:.0f} ch x {ring[1]:g}/{ring[2]:g} GB/s, "
                  f"tree {tree[0]:.0f} ch x {tree[1]:g}/{tree[2]:g}, NVLS {nvls[0]:.0f} heads x {nvls[1]:g}/{nvls[2]:g}")
            best = None
            for algo, row in res["all_reduce"].items():
                lat, bw = row["latency_us"][2], row["algbw_GBps"][2]
                if bw <= 0:
                    continue
                t_us = lat + size / 1e3 / bw
                busbw = 2 * (n - 1) / n * size / (t_us * 1e-6) / 1e9
                print(f"  {algo:10s} latency {lat:9.1f} us  algbw {bw:7.1f} GB/s  -> {t_us / 1e3:8.2f} ms, busbw {busbw:6.0f} GB/s")
                if best is None or t_us < best[1]:
                    best = (algo, t_us, busbw)
            shape = place_job(system, n).shape("world")
            t = collective_time_s("all_reduce", size, shape, system)
            ours = 2 * (n - 1) / n * size / t / 1e9
            if best:
                print(f"  NCCL's model picks {best[0]}: busbw {best[2]:.0f} GB/s; muonsim: {ours:.0f} GB/s")


if __name__ == "__main__":
    main()

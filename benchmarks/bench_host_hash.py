"""Host throughputs of Megatron's weight-hash check on this machine: the priors of
``host_cast_Bps`` and ``host_hash_Bps`` (topologies.hardware.EfficiencyFactors).

Megatron-Core's ``check_param_hashes_across_dp_replicas`` (0.16.1 ``core/utils.py:873-878``) runs
``hashlib.sha1(param.data.to("cpu").float().numpy(force=True))`` per parameter, on one thread
(torchrun starts every rank with ``OMP_NUM_THREADS=1``). This prints, for a 64 MiB BF16 tensor,
the FP32 bytes per second of ``.float()`` on one thread and the bytes per second of SHA-1 over them.

Usage: ``python benchmarks/bench_host_hash.py`` (a few seconds; report the load average).
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time

import torch

BF16_BYTES = 64 * 2**20
REPEATS = 5


def main() -> None:
    """Print the median cast and SHA-1 throughputs (bytes per second) over a few repeats."""
    torch.set_num_threads(1)
    x = torch.randn(BF16_BYTES // 2, dtype=torch.bfloat16)
    cast_Bps, hash_Bps = [], []
    for _ in range(REPEATS):
        t = time.perf_counter()
        y = x.float()
        cast_Bps.append(y.numel() * 4 / (time.perf_counter() - t))
        a = y.numpy(force=True)
        t = time.perf_counter()
        hashlib.sha1(a).digest()
        hash_Bps.append(a.nbytes / (time.perf_counter() - t))
    print(f"load average {os.getloadavg()[0]:.2f}; one thread, {BF16_BYTES / 2**20:.0f} MiB BF16 -> FP32")
    print(f"host_cast_Bps  {statistics.median(cast_Bps):.3e}  (FP32 bytes written per second, .float())")
    print(f"host_hash_Bps  {statistics.median(hash_Bps):.3e}  (bytes hashed per second, hashlib.sha1)")


if __name__ == "__main__":
    main()

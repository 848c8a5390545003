"""Host memory allocator of the reference ranks: keep freed memory in the process, as PyTorch's CUDA
caching allocator does on GPUs.

CPU tensors come from glibc ``malloc``. By default glibc gives the top of its heap back to the
operating system once more than ``M_TRIM_THRESHOLD`` bytes there are free (and serves large blocks by
``mmap``, unmapped on free), so a temporary allocated after such a release touches fresh pages: a
minor page fault and the kernel zeroing 4 KiB per page, host work that no kernel of the optimizer
does. Which temporaries fault depends on the heap's history (measured on the ``small`` preset, rank 0:
4,100–4,560 faults per optimizer step, 0 to 2,208 per tensor from one step to the next; 0 on
``many-small``, whose temporaries are small), at 1.25–1.3 µs of CPU per fault on this VM: about 10 %
of that optimizer phase. A GPU run has no such cost: the caching allocator keeps freed blocks and
reuses them. :func:`keep_freed_memory` makes the ranks behave the same way (no trimming, no ``mmap``
below 32 MiB, glibc's largest setting), so after the warm-up step no step faults; the phase clock
records each phase's page faults (:class:`reference.instrument.PhaseClock`) to show it.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX_BYTES = 32 * 2 ** 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
TRIM_THRESHOLD_BYTES = 2 ** 31 - 1  # mallopt takes an int: trim only past 2 GiB of free heap top


def keep_freed_memory() -> bool:
    """Stop glibc returning freed memory to the OS in this process; True when set (glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX_BYTES))

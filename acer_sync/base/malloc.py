"""glibc's malloc keeps the memory a run frees for its next allocation, instead of handing each
large block back to the kernel and faulting fresh pages in again, 4 KB at a time.

A Pong update allocates and frees blocks of tens of megabytes (the batch's float frames are 38 MB,
the convolutions' activations and gradients about as large): glibc serves every block over its mmap
threshold (at most 32 MB) with a fresh mmap and unmaps it when freed, and trims the heap's top when
more than its threshold lies free there. Each new block then costs a page fault per page. Measured on
the 2-core CPU (docs/performance.md): 1,163 minor page faults an agent step on Pong, 2.3 with
:func:`keep_freed_memory`, and 1.3-1.5x the steps per second end to end; CartPole's small blocks
never crossed the thresholds and ran as fast. The cost: the process keeps its peak memory (Pong's
RSS stays at its peak, 810 MB, instead of varying between 700 and 780 MB).

The entry points that train (:func:`acer_sync.api.train` and ``run``, hence ``train.py``, the sweeps'
trials and ``bench.py``) call it. Where the environment already tunes glibc's malloc (a
``MALLOC_*_`` variable or ``GLIBC_TUNABLES``), or the C library is not glibc, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: The largest trim threshold mallopt takes: the heap is never trimmed.
NEVER_TRIM = 2**31 - 1


def tuned_by_environment() -> bool:
    """Whether the environment tunes glibc's malloc itself (then it is left as it is)."""
    return "GLIBC_TUNABLES" in os.environ or any(key.startswith("MALLOC_") for key in os.environ)


def keep_freed_memory() -> bool:
    """Every block from the heap (``M_MMAP_MAX`` 0) and the heap never trimmed
    (``M_TRIM_THRESHOLD``), for the whole process, from now on. Returns whether it set them: not
    on another C library than glibc, nor where :func:`tuned_by_environment`."""
    if not sys.platform.startswith("linux") or tuned_by_environment():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1

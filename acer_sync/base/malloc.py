"""glibc's malloc keeps the memory a run frees for its next allocation, instead of handing each
large block back to the kernel and faulting fresh pages in again, 4 KB at a time.

A Pong update allocates and frees blocks of tens of megabytes (the batch's float frames are 38 MB,
the convolutions' activations and gradients about as large): glibc serves every block over its mmap
threshold (at most 32 MB) with a fresh mmap and unmaps it when freed, and trims the heap's top when
more than its threshold lies free there. Each new block then costs a page fault per page. Measured on
the 2-core CPU (docs/performance.md#memory-kept-between-updates): ``bench.py --seconds 20`` on Pong
took 6.0 million minor page faults with glibc's own settings and 0.16 million with
:func:`keep_freed_memory`, which ran Pong 1.74x faster end to end (3 alternating rounds). The cost:
the process keeps its peak memory (the bench's peak RSS 937 against 853 MB).

A run (:func:`acer_sync.api.train` and ``run``, hence ``train.py`` and the sweeps' trials) keeps
freed memory while it trains (:func:`freed_memory_kept`). At its end it sets glibc's defaults again
and gives what lies free back to the kernel (``malloc_trim``): the replay buffer's gigabytes, which
glibc would have mapped on their own and unmapped when freed, come from the heap too. glibc's mmap
threshold stays where it was (glibc stops moving it once a program sets any of these). ``bench.py``
keeps freed memory throughout. Where the environment already tunes glibc's malloc (a ``MALLOC_*_``
variable or ``GLIBC_TUNABLES``), or the C library is not glibc, nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: The largest trim threshold mallopt takes: the heap is never trimmed.
NEVER_TRIM = 2**31 - 1
#: glibc's own settings (malloc.c's DEFAULT_MMAP_MAX and DEFAULT_TRIM_THRESHOLD).
DEFAULT_MMAP_MAX, DEFAULT_TRIM_THRESHOLD = 65536, 128 * 1024

#: How many runs of this process keep freed memory now (the last to end sets the defaults again).
_runs_keeping = 0


def tunes_malloc(variable: str) -> bool:
    """Whether an environment variable tunes glibc's malloc (``GLIBC_TUNABLES``, ``MALLOC_*_``)."""
    return variable == "GLIBC_TUNABLES" or variable.startswith("MALLOC_")


def tuned_by_environment() -> bool:
    """Whether the environment tunes glibc's malloc itself (then it is left as it is)."""
    return any(map(tunes_malloc, os.environ))


def keep_freed_memory() -> bool:
    """Every block from the heap (``M_MMAP_MAX`` 0) and the heap never trimmed
    (``M_TRIM_THRESHOLD``), for the whole process, from now on. Returns whether it set them: not
    on another C library than glibc, nor where :func:`tuned_by_environment`."""
    if not sys.platform.startswith("linux") or tuned_by_environment():
        return False
    return _mallopt(M_MMAP_MAX, 0) and _mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)


def give_back_freed_memory() -> None:
    """glibc's defaults again (blocks over the mmap threshold mapped on their own, the heap trimmed
    past 128 KB free), and what lies free in malloc's heaps handed back to the kernel now
    (``malloc_trim(0)``)."""
    _mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
    _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
    malloc_trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    if malloc_trim is not None:
        malloc_trim(0)


@contextlib.contextmanager
def freed_memory_kept() -> Iterator[bool]:
    """Inside: :func:`keep_freed_memory` (the value is whether it took effect). After, where it
    did and no other run of the process still keeps it: :func:`give_back_freed_memory`, which
    returns what the run freed (its buffer, once dropped)."""
    global _runs_keeping
    kept = keep_freed_memory()
    _runs_keeping += kept
    try:
        yield kept
    finally:
        _runs_keeping -= kept
        if kept and not _runs_keeping:
            give_back_freed_memory()


def _mallopt(parameter: int, value: int) -> bool:
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and mallopt(parameter, value) == 1


def _libc_function(name: str, argtypes: tuple):
    """glibc's function ``name`` (returning an int), or None where the C library lacks it."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function

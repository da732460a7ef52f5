"""torch.compile's worker processes, stopped within seconds at a script's end.

Inductor compiles kernels in a pool of worker processes, which Python's exit shuts down
(``torch._inductor.async_compile.shutdown_compile_workers``, an atexit hook): it asks the worker
to stop and waits for it up to 300 s. On a lent H200 (torch 2.11, pytorch/pytorch#162199) the
worker of a cold compile did not stop, and bench.py and train.py waited at exit, their work done,
until a ``timeout`` killed them (docs/performance.md, the fourth report). :func:`stop_compile_workers`
runs that shutdown first, at the end of :func:`acer_sync.base.errors.run_cli`, but kills a worker
still there after :data:`WAIT_SECONDS`; the atexit hook then finds nothing left to wait for.
"""

from __future__ import annotations

import sys
import threading

from acer_sync.base.log import log

#: How long a worker pool may take to stop before its worker is killed (one stops in well under 1 s).
WAIT_SECONDS = 10.0


def stop_compile_workers(wait: float = WAIT_SECONDS) -> int:
    """Shut down torch.compile's worker pools as Python's exit would, giving each ``wait`` seconds
    before its worker process is killed; returns how many were killed. Nothing happens where no
    compile started a pool (the module is not imported), and where torch's internals are not
    those read here, the exit's own shutdown is left to do it."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    pools = getattr(async_compile, "_pool_set", None)
    if not pools:
        return 0
    killed, stuck = 0, False
    for pool in list(pools):
        closing = threading.Thread(target=_shut_down, args=(pool,), name="compile-workers", daemon=True)
        closing.start()
        closing.join(wait)
        process = getattr(pool, "process", None)  # a SubprocPool's worker; a ProcessPoolExecutor has none
        if closing.is_alive() and process is not None:
            process.kill()
            killed += 1
            closing.join(wait)
        stuck = stuck or closing.is_alive()
    if killed:
        log.warning(f"warning: torch.compile's worker did not stop within {wait:.0f} s of the end (pytorch/pytorch#162199): "
                    "killed, the work done")
    if not stuck:
        _shut_down(async_compile, "shutdown_compile_workers")  # forgets the stopped pools, as the exit's hook would
    return killed


def _shut_down(owner, method: str = "shutdown") -> None:
    """``owner.method()``, any error ignored: at the exit, what failed to stop is the exit hook's."""
    try:
        getattr(owner, method)()
    except Exception:  # noqa: BLE001 - torch's internals; nothing here may turn a finished run into a traceback
        pass

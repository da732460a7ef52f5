"""One writer per run directory: an OS file lock (``flock``) on ``RUN_DIR/.lock``, held for the whole run.

The kernel drops the lock when its process ends, however it ends (``kill -9`` included), so a dead
run never leaves a directory locked. A second training or ``--resume`` of a locked directory is
refused at once, naming the process that holds it; readers (``play.py``, ``acer_sync.load``) never
take the lock. The file stays after the run (removing it would race with a process about to lock
it); it holds the PID and host of its last holder, for the refusal's message.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from acer_sync.base.errors import UserError

LOCK_FILE = ".lock"
#: How many times :meth:`RunLock.acquire` tries again, 10 ms apart, before it calls the directory in use.
PROBE_RETRIES = 5


def _holder_text(fd: int) -> str:
    """What the lock file open at ``fd`` says of its holder."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"


class RunLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path, fd: int):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd = fd

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        """Lock ``run_dir``; a one-line UserError naming the holder where another process has it."""
        path = Path(run_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise UserError(f"cannot lock run directory {run_dir}: {error.strerror or error}") from None
        for attempt in range(PROBE_RETRIES + 1):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt < PROBE_RETRIES:  # perhaps another start's probe (:meth:`holder`), held for microseconds
                    time.sleep(0.01)
        else:
            holder = _holder_text(fd)
            os.close(fd)
            raise UserError(
                f"{run_dir} is in use by {holder}: one process trains a run directory at a time "
                "(wait for it to end, or stop it, then --resume)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return cls(run_dir, fd)

    @staticmethod
    def holder(run_dir: Path) -> str | None:
        """Who holds ``run_dir``'s lock now ("process N on HOST"), or None where no one does. It
        holds a shared lock for an instant to find out, which :meth:`acquire` waits out."""
        try:
            fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_text(fd)
        finally:
            os.close(fd)  # closing lets go of a shared lock taken
        return None

    def release(self, remove: bool = False) -> None:
        """Unlock; ``remove`` deletes the lock file too (a run that never started, whose empty
        directory is removed)."""
        if self.fd < 0:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = -1

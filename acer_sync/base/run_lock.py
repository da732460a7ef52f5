"""One writer per run directory: an OS file lock (``flock``) on ``RUN_DIR/.lock``, held for the whole run.

The kernel drops the lock when its process ends, however it ends (``kill -9`` included), so a dead
run never leaves a directory locked. A ``flock`` belongs to the open file, which a forked process
shares: a ``subproc`` env worker, forked while the lock is held, would keep it after the trainer's
death for as long as it lives (a hung one for good), so forked children close their copy at once
(:func:`os.register_at_fork`). On a filesystem without ``flock`` (Lustre mounted ``noflock``, some
FUSE and SMB mounts) the run goes on unlocked, with a warning. A second training or ``--resume`` of a locked directory is
refused at once, naming the process that holds it; readers (``play.py``, ``acer_sync.load``) never
take the lock. The file stays after the run (removing it would race with a process about to lock
it); it holds the PID and host of its last holder, for the refusal's message.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from acer_sync.base.errors import UserError, WriteFailed
from acer_sync.base.log import log

LOCK_FILE = ".lock"
#: How many times :meth:`RunLock.acquire` tries again, 10 ms apart, before it calls the directory in use.
PROBE_RETRIES = 5
#: The errors of ``flock`` on a filesystem that has no such locks.
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)

#: The lock files this process holds open: a forked child closes them (:func:`_close_in_child`).
_held: set[int] = set()


def _close_in_child() -> None:
    """In a forked child: let go of the parent's lock files, which would otherwise keep the locks
    held after the parent's death (a ``flock`` is the open file's, shared with the child)."""
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _holder_text(fd: int) -> str:
    """What the lock file open at ``fd`` says of its holder."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"


class RunLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path, fd: int, made_file: bool = False):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd = fd
        #: Whether :meth:`acquire` made the lock file (a start that fails removes it again).
        self.made_file = made_file

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        """Lock ``run_dir``; a one-line UserError naming the holder where another process has it, a
        :class:`WriteFailed` where the holder's line cannot be written (a lock file it made is removed)."""
        path = Path(run_dir) / LOCK_FILE
        existed = path.exists()
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
            except OSError as error:
                if error.errno not in NO_LOCKS:
                    os.close(fd)
                    raise UserError(f"cannot lock run directory {run_dir}: {error.strerror or error}") from None
                log.warning(f"cannot lock run directory {run_dir} ({error.strerror}): its filesystem has no file "
                            "locks, so nothing stops a second process from training it at the same time")
                break
        else:
            holder = _holder_text(fd)
            os.close(fd)
            raise UserError(
                f"{run_dir} is in use by {holder}: one process trains a run directory at a time "
                "(wait for it to end, or stop it, then --resume)"
            ) from None
        _held.add(fd)
        lock = cls(run_dir, fd, made_file=not existed)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as error:  # a full disk, say
            lock.release(remove=lock.made_file)
            raise WriteFailed(path, error) from None
        return lock

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
        except OSError:  # no file locks on this filesystem: no one can be known to hold it
            return None
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
        _held.discard(self.fd)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        except OSError:  # never locked: a filesystem without file locks
            pass
        os.close(self.fd)
        self.fd = -1

"""How the scripts end: every exit code, and every ``prog: error: ...`` line, in one place.

The library raises :class:`UserError` for bad input and returns an
:class:`~acer_sync.base.outcome.Outcome` from a run; it never exits and never prints an error line.
The scripts (``train.py``, ``play.py``, ``sweep.py``, ...) run their ``main`` under
:func:`run_cli`, which turns a :class:`UserError` into one line and exit code 2, and a run's
outcome into its exit code and line with :func:`exit_code`.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from acer_sync.base.compile_workers import stop_compile_workers
from acer_sync.base.outcome import Outcome, Stop
from atari.errors import EnvFailed, EnvTimedOut, EnvWorkerDied, UserError

__all__ = [
    "EXIT_BROKEN_PIPE", "EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_TRIAL_FAILED", "EXIT_USER_ERROR", "REPEAT_SECONDS", "STOP_SIGNALLED", "PolicyNotFinite", "UserError",
    "WriteFailed", "delivered_again", "env_stop", "exit_code", "names_a_path", "print_error", "run_cli", "say", "signal_stop", "stdout_to_devnull",
]

#: sweep.py: some trial failed for good (after its restarts); the others ran to the end.
EXIT_TRIAL_FAILED = 1
#: Bad input: flags, env id, files, settings.
EXIT_USER_ERROR = 2
#: A script whose standard output's reader went away before it was done (128 + SIGPIPE, as shells
#: report a command a closed pipe ended: ``yes | head -1``). train.py's run ends with its own code.
EXIT_BROKEN_PIPE = 141
#: After SIGINT or SIGTERM (128 + SIGINT, as shells report Ctrl-C). train.py writes a checkpoint
#: first; a second SIGINT exits at once and keeps the previous checkpoint.
EXIT_INTERRUPTED = 130

#: Set by the first SIGINT or SIGTERM that asks this process to stop: the Trainer's (it saves a
#: checkpoint and returns) or one that reached :func:`run_cli`'s handler (a KeyboardInterrupt in
#: whatever else ``main`` was doing). From then on, a Ctrl-C that reaches run_cli's handler exits 130
#: at once (unless it is the first one delivered again, :data:`REPEAT_SECONDS`): what is left is
#: clean-up, where a KeyboardInterrupt would land in a finalizer and print a traceback.
STOP_SIGNALLED = threading.Event()

#: A stop signal that comes again within this many seconds is the same stop delivered twice, not a
#: second one: GNU ``timeout`` sends its signal to the command and then to the command's process
#: group, so the command gets it twice, and Python may run the handler for each
#: (``timeout -s INT 1 python ...`` ran it twice, 21-29 µs apart, in 2 tries of 20). Taken for a
#: second Ctrl-C, the copy exited at once without the checkpoint.
REPEAT_SECONDS = 1.0
_last_stop: tuple[int, float] | None = None  # the last stop signal's number and time.monotonic()


def delivered_again(last: tuple[int, float] | None, signum: int) -> bool:
    """Whether signal ``signum`` coming now is ``last`` (a signal's number and its
    ``time.monotonic()``) delivered again: the same signal within :data:`REPEAT_SECONDS`."""
    return last is not None and last[0] == signum and time.monotonic() - last[1] < REPEAT_SECONDS


def names_a_path(value) -> bool:
    """Whether ``value`` can name a file or directory: a non-blank str or an ``os.PathLike``
    (``Path('')`` is the current directory, so an empty argument must be refused, not taken)."""
    return isinstance(value, (str, os.PathLike)) and bool(str(value).strip())


def signal_stop(signum: int) -> None:
    """Record a stop signal that came now: :data:`STOP_SIGNALLED`, and which it was and when, for
    run_cli's handler to know it again."""
    global _last_stop
    _last_stop = (signum, time.monotonic())
    STOP_SIGNALLED.set()


#: The exit code of a script whose run ended so.
EXIT_CODES: dict[Stop, int] = {
    Stop.FINISHED: 0,
    Stop.INTERRUPTED: EXIT_INTERRUPTED,
    Stop.ENV_DIED: 3,  # a checkpoint was written first
    Stop.ENV_FAILED: 3,  # an env raised or returned NaN: a checkpoint of the last completed iteration
    Stop.NONFINITE: 4,  # non-finite updates, or a policy's non-finite output: the last good checkpoint is kept
    Stop.WRITE_FAILED: 5,  # a full disk, say: the last checkpoint written is kept
    Stop.ENV_TIMEOUT: 6,  # an env hung past --env-timeout: a checkpoint of the last completed iteration
    Stop.CALLBACK: 0,  # a callback stopped it (--stop-at-reward reached): a checkpoint was written
    Stop.CALLBACK_FAILED: 1,  # a user's callback raised (the library raises it on; no script returns this)
    Stop.OUT_OF_MEMORY: 7,  # the device or the host ran out of memory: a checkpoint of where the run stood
    Stop.CRASHED: 1,  # an exception the run did not expect: a checkpoint, then the traceback (no script returns this)
}


def env_stop(error: EnvFailed) -> Stop:
    """Why a run stopped whose env failed with ``error``: it hung, its worker died, or it raised."""
    if isinstance(error, EnvTimedOut):
        return Stop.ENV_TIMEOUT
    return Stop.ENV_DIED if isinstance(error, EnvWorkerDied) else Stop.ENV_FAILED


class PolicyNotFinite(UserError):
    """The network gave non-finite statistics (π's probabilities, a Gaussian's mean or σ) for a
    finite observation, so no action can be drawn from them: a torso that divides by zero, say. A
    run stops with :attr:`Stop.NONFINITE <acer_sync.base.outcome.Stop>`, keeping its last
    checkpoint; ``predict``, evaluation and play.py raise it (one line, as a UserError)."""


class WriteFailed(Exception):
    """A file could not be written: a full disk, a lost mount, no permission. Its message names
    the path and the cause in one line. Whatever was there before stays whole (files are written
    atomically); a run stops with :attr:`Stop.WRITE_FAILED <acer_sync.base.outcome.Stop>`.

    ``cause`` is the error the write raised, or the reason in words. A library may wrap the OS's
    error in its own (``torch.save`` raises a RuntimeError about zip positions, the OSError in its
    context), so the first OSError in the chain names the cause."""

    def __init__(self, path, cause: BaseException | str):
        super().__init__(f"cannot write {path}: {cause if isinstance(cause, str) else _reason(cause)}")
        self.path = path


def _reason(error: BaseException) -> str:
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def stdout_to_devnull() -> None:
    """Standard output's reader went away: what is still written to it goes nowhere (Python's
    last flush at exit would print a BrokenPipeError of its own)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind it (a test's capture)
        pass


def say(line: str) -> None:
    """``print(line)`` to standard output, flushed; where its reader went away (``| head``), nothing."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        stdout_to_devnull()


def print_error(prog: str, message: str) -> None:
    """The one form of an error line: ``prog: error: message`` on stderr."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def exit_code(outcome: Outcome, prog: str) -> int:
    """The exit code of ``outcome``, after printing its error line, if it has one."""
    if outcome.error:
        print_error(prog, outcome.error)
    return EXIT_CODES[outcome.stop]


def run_cli(main: Callable[[], int | None], prog: str) -> None:
    """Run ``main``; a :class:`UserError` becomes ``prog: error: message`` and exit 2, a
    :class:`WriteFailed` or a failed env the same line and their exit codes, and a Ctrl-C or a
    SIGTERM that ``main`` did not handle itself one line and exit 130, never a traceback.

    The Trainer handles SIGINT and SIGTERM itself while it trains, and gives the handlers back when it returns.
    run_cli's handler covers the rest of the process's life, the Trainer's teardown included (env
    workers' finalizers run when the Trainer is freed): see :func:`_interrupt`. torch.compile's
    worker processes are stopped before the exit, within seconds (:mod:`acer_sync.base.compile_workers`)."""
    try:
        _run_main(main, prog)
    finally:
        ending = sys.exc_info()[1]  # the exit _run_main ends with, or a crash on its way out
        for signum in STOP_SIGNALS:  # a signal while it waits: the work is done, and atexit would wait again
            signal.signal(signum, lambda signum, frame: _end_at_once(prog, ending, signum))
        stop_compile_workers()


def _end_at_once(prog: str, ending: BaseException | None, signum: int) -> None:
    """Exit now as ``ending`` would have (its exit code; a crash's traceback and 1; a Ctrl-C's 130),
    after a line saying that signal ``signum`` cut its end short (the compile workers' stop, atexit)."""
    if isinstance(ending, SystemExit):
        code = ending.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)  # sys.exit("message"), as Python ends it
        code = code if isinstance(code, int) else 0 if code is None else 1
    elif isinstance(ending, KeyboardInterrupt):
        code = EXIT_INTERRUPTED
    elif ending is not None:
        traceback.print_exception(ending)
        code = 1
    else:
        code = 0
    print(f"{prog}: {_interrupted(signum)} as it ended", file=sys.stderr)  # (stopping compile workers, atexit)
    _exit_at_once(code)


def _interrupted(signum: int | None = None) -> str:
    """``interrupted``, and by which signal where it was not SIGINT (``signum``, else the last stop signal)."""
    if signum is None and _last_stop is not None:
        signum = _last_stop[0]
    name = signal.Signals(signum).name if signum is not None else "SIGINT"
    return "interrupted" + (f" by {name}" if name != "SIGINT" else "")


def _run_main(main: Callable[[], int | None], prog: str) -> None:
    """:func:`run_cli`'s work: ``main`` run, and its errors and code turned into a line and an exit."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        code = main()
    except UserError as error:
        print_error(prog, str(error))
        sys.exit(EXIT_USER_ERROR)
    except (WriteFailed, EnvFailed) as error:  # outside a run (play.py): a run turns them into its outcome
        print_error(prog, str(error))
        sys.exit(EXIT_CODES[Stop.WRITE_FAILED if isinstance(error, WriteFailed) else env_stop(error)])
    except BrokenPipeError:  # what main printed had no reader any more (| head): quiet, as a pipe's other tools are
        stdout_to_devnull()
        code = EXIT_BROKEN_PIPE
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:  # a path argument of over 255 characters, asked whether it exists
            raise
        name = str(error.filename or "")
        print_error(prog, f"a file name is longer than the file system takes: {name[:60]}{'...' if len(name) > 60 else ''}")
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as interrupt:
        print(f"{prog}: {_interrupted()}", file=sys.stderr)
        for note in getattr(interrupt, "__notes__", ()):  # a run's, which one that no signal sent stopped: its checkpoint
            print(note, file=sys.stderr)
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        STOP_SIGNALLED.set()
        for signum in STOP_SIGNALS:  # main may have put in its own (sweep.py gives Tune its)
            signal.signal(signum, _interrupt)
    sys.exit(code or 0)


#: The signals that stop a script: a SIGTERM (a batch system's, ``kill``) as a Ctrl-C. Before the
#: run's own handler was in (start-up) or after it was given back (teardown), a SIGTERM ended the
#: process by default: exit 143, no line, a ``.lock`` left, and env workers orphaned mid-reset.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum, frame) -> None:
    """run_cli's SIGINT and SIGTERM handler. A first Ctrl-C is a KeyboardInterrupt, so that what ``main`` was
    doing unwinds and cleans up. Once the process is stopping (:data:`STOP_SIGNALLED`), a Ctrl-C
    exits 130 there and then: the checkpoint is saved, and what is left is teardown (finalizers
    closing env pipes, atexit), where a KeyboardInterrupt would print a traceback from inside a
    finalizer instead of stopping anything. In Python's last step, after atexit, the handler is
    SIG_DFL again, and a Ctrl-C there ends the process by SIGINT (which shells show as 130 too).
    The stop's own SIGINT delivered twice (:data:`REPEAT_SECONDS`) is neither."""
    if delivered_again(_last_stop, signum):
        return
    if STOP_SIGNALLED.is_set():
        _exit_at_once()
    signal_stop(signum)
    raise KeyboardInterrupt


def _exit_at_once(code: int = EXIT_INTERRUPTED) -> None:
    """Flush what was printed and exit with ``code`` (130) without running finalizers or atexit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

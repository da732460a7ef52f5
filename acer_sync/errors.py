"""How the scripts end: every exit code, and every ``prog: error: ...`` line, in one place.

The library raises :class:`UserError` for bad input and returns an
:class:`~acer_sync.outcome.Outcome` from a run; it never exits and never prints an error line.
The scripts (``train.py``, ``play.py``, ``sweep.py``, ...) run their ``main`` under
:func:`run_cli`, which turns a :class:`UserError` into one line and exit code 2, and a run's
outcome into its exit code and line with :func:`exit_code`.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

from acer_sync.outcome import Outcome, Stop
from user_errors import UserError

__all__ = [
    "EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_TRIAL_FAILED", "EXIT_USER_ERROR", "UserError", "exit_code", "print_error",
    "run_cli",
]

#: sweep.py: some trial failed for good (after its restarts); the others ran to the end.
EXIT_TRIAL_FAILED = 1
#: Bad input: flags, env id, files, settings.
EXIT_USER_ERROR = 2
#: After SIGINT or SIGTERM (128 + SIGINT, as shells report Ctrl-C). train.py writes a checkpoint
#: first; a second SIGINT exits at once and keeps the previous checkpoint.
EXIT_INTERRUPTED = 130

#: The exit code of a script whose run ended so.
EXIT_CODES: dict[Stop, int] = {
    Stop.FINISHED: 0,
    Stop.INTERRUPTED: EXIT_INTERRUPTED,
    Stop.ENV_DIED: 3,  # a checkpoint was written first
    Stop.NONFINITE: 4,  # the last good checkpoint is kept
}


def print_error(prog: str, message: str) -> None:
    """The one form of an error line: ``prog: error: message`` on stderr."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def exit_code(outcome: Outcome, prog: str) -> int:
    """The exit code of ``outcome``, after printing its error line, if it has one."""
    if outcome.error:
        print_error(prog, outcome.error)
    return EXIT_CODES[outcome.stop]


def run_cli(main: Callable[[], int | None], prog: str) -> None:
    """Run ``main``; a :class:`UserError` becomes ``prog: error: message`` and exit 2, and a
    Ctrl-C that ``main`` did not handle itself becomes one line and exit 130, never a traceback."""
    try:
        code = main()
    except UserError as error:
        print_error(prog, str(error))
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        signal.signal(signal.SIGINT, _exit_at_once)
    sys.exit(code or 0)


def _exit_at_once(signum, frame) -> None:
    """A Ctrl-C after the run has already stopped for one: the checkpoint is saved, and what is
    left is Python's teardown (finalizers closing env pipes, atexit). Exit 130 there and then,
    instead of a KeyboardInterrupt traceback printed from inside a finalizer."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)

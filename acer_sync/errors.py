"""User-facing errors: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

from user_errors import UserError

__all__ = ["EXIT_INTERRUPTED", "EXIT_USER_ERROR", "UserError", "run_cli"]

EXIT_USER_ERROR = 2
#: Exit code after SIGINT or SIGTERM (128 + SIGINT, as shells report Ctrl-C). train.py writes a
#: checkpoint first; a second SIGINT exits at once and keeps the previous checkpoint.
EXIT_INTERRUPTED = 130


def run_cli(main: Callable[[], int | None], prog: str) -> None:
    """Run ``main``; a :class:`UserError` becomes ``prog: error: message`` and exit 2, and a
    Ctrl-C that ``main`` did not handle itself becomes one line and exit 130, never a traceback."""
    try:
        code = main()
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
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

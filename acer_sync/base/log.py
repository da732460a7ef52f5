"""The library's messages: Python's :mod:`logging`, on the logger ``acer_sync``.

The library never prints. What a run says (the run directory, the replay buffer's size, resuming,
saving at a signal) is logged at INFO, a warning (bf16 without native support) at WARNING.
:func:`console` shows them while a run lasts as the scripts always showed them: INFO lines on
standard output, warnings and errors on standard error, the message alone.
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager

from tqdm import tqdm

log = logging.getLogger("acer_sync")


class ConsoleHandler(logging.Handler):
    """INFO to ``sys.stdout``, WARNING and above to ``sys.stderr``, as they are when a record comes
    (a sweep trial's stdout is a stream that puts its name before each line), the message alone.
    Written through tqdm, which takes a progress bar off the terminal's line and draws it again
    below the message (written as it was, the message ran on from the bar's end)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
        try:
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except BrokenPipeError:  # the reader went away (| head): the run goes on, unheard
            pass
        except Exception:  # a closed or broken stream must not stop the run
            self.handleError(record)


def shown_by_the_program() -> bool:
    """Whether the program shows log records on the terminal already: a handler of the root
    logger that writes to standard output or error (``logging.basicConfig``'s). The library's
    records reach it too, so a console handler of the library's would show each twice."""
    terminal = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return any(isinstance(handler, logging.StreamHandler) and handler.stream in terminal for handler in logging.getLogger().handlers)


@contextmanager
def console(verbose: int):
    """While the block runs, show the library's messages: ``verbose`` 1 (or more) shows INFO and
    above, 0 warnings and errors only (as SB3's ``verbose=0`` still shows its warnings: a callback's
    state left out of the checkpoints, a stop that cannot happen). Where the program gave the ``acer_sync`` logger a handler of its own,
    or shows log records on the terminal itself (:func:`shown_by_the_program`), they are left to
    its handlers; ``verbose`` sets only the level."""
    level = logging.INFO if verbose >= 1 else logging.WARNING
    before = log.level
    handler = None if log.handlers or shown_by_the_program() else ConsoleHandler()
    log.setLevel(level)
    if handler is not None:
        log.addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            log.removeHandler(handler)
        log.setLevel(before)


def number_text(value: float) -> str:
    """``value`` with 6 significant digits, and every digit of its whole part below 1e15 (a score
    of 3,703,701.75 is ``3703701.75``, where ``:.6g`` wrote ``3.7037e+06``)."""
    digits = 6
    if math.isfinite(value) and 1e5 <= abs(value) < 1e15:  # beyond, float64 holds no more digits worth a column
        digits = int(math.log10(abs(value))) + 3
    return f"{value:.{digits}g}"

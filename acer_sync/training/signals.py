"""Signals while a run trains: the first SIGINT or SIGTERM asks the loop to stop after its iteration."""

from __future__ import annotations

import signal
import threading

from acer_sync.base.errors import STOP_SIGNALLED


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks; a second SIGINT stops at once.

    Python lets only the main thread install signal handlers. Elsewhere (a Ray Tune trial runs the
    Trainer in a worker thread) it installs none and the signals keep their owner's handling.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self.interrupted_twice = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def request(self, reason: str) -> None:
        """Stop as after a first signal, for ``reason``: a driver's stop that no signal carries (a
        sweep's Ctrl-C reaching its trials). Any thread may call it."""
        if self.signal_name is None:
            self.signal_name = reason

    def _handle(self, signum, frame):
        if self.signal_name is not None:
            # Code that the KeyboardInterrupt lands in may turn it into another error (torch.save's
            # zip writer raises a RuntimeError from its __exit__), so remember that it came.
            self.interrupted_twice = True
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        STOP_SIGNALLED.set()  # from here on, the scripts' own handler exits at once (after train() returns, too)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

"""Signals while a run trains: the first SIGINT or SIGTERM asks the loop to stop after its iteration."""

from __future__ import annotations

import signal
import threading
import time

from acer_sync.base.errors import delivered_again, signal_stop
from atari.envs import end_env_calls_within

#: Seconds an env step or reset that is running when a stop signal comes may still take: a hung
#: env is abandoned then, and the run saves its checkpoint (well within 20 s of the signal).
STOP_GRACE_SECONDS = 10.0


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks; a second one stops at once
    (a signal delivered again, within :data:`~acer_sync.base.errors.REPEAT_SECONDS`, counts once).

    The loop sees the flag after its iteration. An env step that is running when the first
    signal comes gets :data:`STOP_GRACE_SECONDS` to return; past them it raises
    :class:`~atari.errors.EnvTimedOut`, so a hung env cannot keep a run from stopping.

    Python lets only the main thread install signal handlers. Elsewhere (a Ray Tune trial runs the
    Trainer in a worker thread) it installs none and the signals keep their owner's handling.
    """

    def __init__(self):
        self.signal_name: str | None = None
        #: When the stop came (``time.monotonic()``).
        self.signal_time: float | None = None
        #: The name of a second signal, which raises KeyboardInterrupt wherever the run was.
        self.second_signal: str | None = None
        #: The last signal taken: its number and ``time.monotonic()``. The same one again within
        #: REPEAT_SECONDS is that signal delivered twice, and changes nothing.
        self.last_signal: tuple[int, float] | None = None
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
            self.signal_name, self.signal_time = reason, time.monotonic()

    def stopped(self) -> tuple[str, float] | None:
        """The stop's name and when it came, or None."""
        return None if self.signal_name is None else (self.signal_name, self.signal_time)

    @property
    def interrupted_twice(self) -> bool:
        return self.second_signal is not None

    def _handle(self, signum, frame):
        if delivered_again(self.last_signal, signum):
            return  # the signal before delivered twice (GNU timeout sends it to the process and to its group)
        self.last_signal = (signum, time.monotonic())
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            # Code that the KeyboardInterrupt lands in may turn it into another error (torch.save's
            # zip writer raises a RuntimeError from its __exit__), so remember that it came.
            self.second_signal = name
            raise KeyboardInterrupt
        self.signal_name, self.signal_time = name, self.last_signal[1]
        signal_stop(signum)  # from here on, the scripts' own handler exits at once (after train() returns, too)
        end_env_calls_within(STOP_GRACE_SECONDS, f"had not returned {STOP_GRACE_SECONDS:g} s after {name}")

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

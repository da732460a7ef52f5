"""Collection overlapped with learning (``--pipeline overlap``): the envs step in a thread of their
own with an acting copy of the network, while the learner updates the online one.

The acting copy holds the weights of the last finished update: the Runner collects segment k+1
with them while the learner trains on segment k, so the behaviour policy lags the online one by
at most one iteration. ACER stores μ with every step, and its importance weights correct for
exactly that lag. What crosses between the two after each iteration (:meth:`ActingCopy.exchange`)
is fixed: the parameters go to the acting copy, the buffers it updated while acting (the running
observation normalizer's statistics) come back to the online network. The thread draws its
actions from a generator of its own and the learner from the global ones, and the buffer takes
segment k+1 only once the learner is done with k, so a seed gives the same run whichever thread
finishes first.

On CUDA, acting runs on a stream of its own (:attr:`ActingCopy.stream`, the Runner's): its kernels
do not queue behind the learner's, and its read of each step's actions and μ waits for acting's
own work only, not for the updates queued on the learner's stream. The stream has the higher
priority: the collecting thread bounds the loop on a GPU (docs/performance.md) and waits for each
acting step, where the learner's updates wait for nobody, so the GPU's scheduler starts acting's
blocks before the queued blocks of an update. The two streams meet only at
the exchange, on the device: the learner's stream waits for acting's last writes before it reads
the statistics, and acting waits for the new weights before it reads them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

import torch

from acer_sync.nets.networks import Network, named_buffer_slots, network_from_spec, read_slots
from acer_sync.replay.buffer import Segment
from atari.envs import process_continues
from atari.errors import EnvTimedOut, past_env_timeout

#: Acting's CUDA stream priority (lower is higher; the default streams' is 0, and torch maps a value
#: beyond the device's range to the nearest it has).
ACTING_PRIORITY = -1


class ActingCopy:
    """A second network of the online one's spec, for acting while the online one learns."""

    def __init__(self, online: Network):
        self.online = online
        device = next(online.parameters()).device
        self.model = network_from_spec(online.spec()).to(device).requires_grad_(False).eval()  # it only acts
        self._online_params, self._acting_params = list(online.parameters()), list(self.model.parameters())
        # The observation normalizer's statistics are gathered by acting, a user torso's others (a
        # BatchNorm's running statistics) by the updates: each goes from where it is gathered. The
        # buffers are found through their modules at each exchange, so one a torso rebinds is followed.
        online_slots, acting_slots = named_buffer_slots(online), named_buffer_slots(self.model)
        names = list(online_slots)
        gathered = [name for name in names if name.startswith("normalizer.")]
        learned = [name for name in names if name not in gathered]
        self._online_slots, self._acting_slots = list(online_slots.values()), list(acting_slots.values())
        self._gathered = ([acting_slots[name] for name in gathered], [online_slots[name] for name in gathered])
        self._learned = ([online_slots[name] for name in learned], [acting_slots[name] for name in learned])
        #: The CUDA stream acting runs on (None off CUDA), of a higher priority than the learner's.
        self.stream = torch.cuda.Stream(device, priority=ACTING_PRIORITY) if device.type == "cuda" else None
        self.start()

    @torch.no_grad()
    def start(self) -> None:
        """Everything from the online network (a new run, or one just restored from a checkpoint)."""
        with self._between_streams():
            torch._foreach_copy_(self._acting_params, self._online_params)
            if self._acting_slots:
                torch._foreach_copy_(read_slots(self._acting_slots), read_slots(self._online_slots))

    @torch.no_grad()
    def exchange(self) -> None:
        """After an update and a collection: the new weights, and the buffers the updates change,
        to the acting copy; the statistics acting gathered (the normalizer's) to the online network."""
        with self._between_streams():
            torch._foreach_copy_(self._acting_params, self._online_params)
            for sources, targets in (self._gathered, self._learned):
                if targets:
                    torch._foreach_copy_(read_slots(targets), read_slots(sources))

    @contextlib.contextmanager
    def _between_streams(self):
        """Copies on the learner's stream, after acting's last work and before acting's next."""
        if self.stream is None:
            yield
            return
        learner = torch.cuda.current_stream(self.stream.device)
        learner.wait_stream(self.stream)
        yield
        self.stream.wait_stream(learner)


class BackgroundCollector:
    """Runs ``collect()`` (the Runner's ``run``) in a daemon thread; :meth:`wait` returns its segment
    or raises what it raised.

    An env call in the thread has no ``SIGALRM`` timer (only the main thread has one), so
    :meth:`wait` keeps the time instead, of each env call as serial mode times it (``env_call``
    names the one running): a step or reset not back ``timeout`` seconds after it began, or one
    that was running when a stop signal came and is not back ``grace`` seconds after the signal, is
    an :class:`EnvTimedOut`. The calls a segment makes after a stop get the timeout, as in serial
    mode, where the segment goes on to its end. A stop of the whole process does not count: a gap
    of over a second between the waiter's polls, or a SIGCONT since the call began (one that ended
    a stop during an update, when the waiter does not poll), starts the call's time again. A hung
    thread is left behind (a daemon: it cannot keep the process from exiting).

    :param collect: collects a segment.
    :param env_id: the env, for the messages.
    :param env_call: the env call running now, as ``(what, time.monotonic() when it began,
        atari.envs.process_continues() then)``, or None (:meth:`atari.envs.VecEnv.current_call`).
    """

    def __init__(self, collect: Callable[[], Segment], env_id: str, env_call: Callable[[], tuple[str, float, int] | None]):
        self.collect = collect
        self.env_id = env_id
        self.env_call = env_call
        self._thread: threading.Thread | None = None
        self._result: Segment | None = None
        self._error: BaseException | None = None

    def _target(self) -> None:
        try:
            self._result = self.collect()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which raises it
            self._error = error

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a collection is already running")
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._target, name="acer-collect", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread, whatever it returns or raises (a
        collection the run gives up); whether it ended."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
        self._thread = None
        return True

    def wait(self, timeout: float, stopped: Callable[[], tuple[str, float] | None], grace: float) -> Segment:
        """The segment, once the thread is done.

        :param timeout: seconds an env call may take (0: no limit; ``--env-timeout``).
        :param stopped: the stop signal's name and when it came (``time.monotonic()``), or None.
        :param grace: seconds an env call running when a stop signal came may go on after it.
        """
        thread = self._thread
        if thread is None:
            raise RuntimeError("no collection was started")
        last = time.monotonic()
        # The env call timed, when it began (less the time the process was stopped since), and the
        # process's SIGCONTs that its time counts from.
        call, began, continues = None, 0.0, 0
        while thread.is_alive():
            thread.join(0.05)
            if not thread.is_alive():
                break
            now, signal, running = time.monotonic(), stopped(), self.env_call()
            gap = now - last if now - last > 1.0 else 0.0  # the process was stopped (Ctrl-Z, kill -STOP): not the env's time
            if running != call:
                call, began = running, running[1] if running is not None else 0.0
                continues = running[2] if running is not None else 0
                # A call that began before the stop began over gap seconds ago, one after it within a poll's 50 ms.
                if running is not None and now - running[1] > gap / 2:
                    began += gap
            else:
                began += gap
            last = now
            if call is None:
                continue
            seen = process_continues()
            if seen != continues:
                # The process was stopped and continued since the call began, or since the last poll
                # (an update, when nothing polls, may have held a whole stop): its time starts again,
                # as serial mode's SIGALRM handler starts a call's.
                continues, began = seen, now
            what, started, _ = call
            if signal is not None and started <= signal[1] and now - signal[1] > grace:
                raise EnvTimedOut(f"{self.env_id}'s {what} had not returned {grace:g} s after {signal[0]}")
            if timeout > 0 and now - began > timeout:
                raise EnvTimedOut(f"{self.env_id}'s {what} {past_env_timeout(timeout)}")
        self._thread = None
        if self._error is not None:
            raise self._error
        return self._result

"""The replay buffer's arrays as they were at one step, read while training stores on.

``--save-buffer`` writes the buffer beside each checkpoint: 5.7 GB at the Atari defaults, 7-8 s on
the 2-core machine, during which training used to wait. :meth:`ReplayBuffer.freeze
<acer_sync.replay.buffer.ReplayBuffer.freeze>` gives its arrays as :class:`FrozenArray` views
instead, which a thread writes to the file a block of rows at a time while the run goes on: the
buffer's ``put``, before it overwrites a row that the writer has not read yet, keeps a copy of that
row (:meth:`Freeze.keep`), and the writer reads the copy in its place. The file holds the buffer
exactly as it was at the checkpoint's step. The copies cost the memory of the rows stored during
the write, where the buffer lives (the GPU's with ``--replay-device cuda``), up to
:data:`KEPT_FRACTION` of the buffer: past that, ``put`` waits for the write to end.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from acer_sync.base.transfer import numpy_dtype

#: The most the rows kept for a write may take, as a fraction of the buffer's bytes.
KEPT_FRACTION = 0.125


class WriteCancelled(Exception):
    """The write of a frozen buffer was given up (:meth:`Freeze.cancel`)."""


class Freeze:
    """The buffer's arrays (``arrays``, by name) frozen for one write: :attr:`views` reads them."""

    def __init__(self, arrays: dict[str, np.ndarray | torch.Tensor]):
        self.lock = threading.Lock()
        self.views = {name: FrozenArray(array, self) for name, array in arrays.items()}
        #: Bytes of the rows kept now, and the most they may take.
        self.kept_bytes = 0
        self.limit = KEPT_FRACTION * sum(view.row_bytes * view.shape[0] for view in self.views.values())
        self.thawed = threading.Event()
        #: The run exits at once (a second signal): the reader gives up at its next read.
        self.cancelled = False

    def keep(self, rows: dict) -> None:
        """Before ``put`` overwrites ``rows`` (rows by array name: an int, a slice or integer
        indices), a copy of each one the writer has not read yet; once the copies take more than
        their limit, the write's end is waited for instead."""
        if self.kept_bytes > self.limit:
            self.thawed.wait()
            return
        with self.lock:
            for name, array_rows in rows.items():
                self.views[name].keep(array_rows)

    def cancel(self, seconds: float) -> None:
        """Have the reader give up (:class:`WriteCancelled` at its next read; the atomic write then
        removes its temporary file), waiting up to ``seconds`` for it."""
        self.cancelled = True
        self.thawed.wait(seconds)

    def thaw(self) -> None:
        """The write is done (or gave up): the copies go, and a ``put`` waiting goes on."""
        with self.lock:
            for view in self.views.values():
                view.kept.clear()
            self.kept_bytes = 0
        self.thawed.set()


class FrozenArray:
    """One array of the buffer (numpy, or a tensor on the GPU) as it was when frozen.

    :param array: the buffer's array, rows first (the ring's frames, steps or segments).
    :param freeze: the :class:`Freeze` it belongs to (its lock is shared by ``put`` and the reader).
    """

    def __init__(self, array: np.ndarray | torch.Tensor, freeze: Freeze):
        self.array = array
        self.freeze = freeze
        self.shape = tuple(array.shape)
        self.dtype = numpy_dtype(array.dtype) if isinstance(array, torch.Tensor) else array.dtype
        self.row_bytes = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        #: Rows overwritten before the reader got to them: their values when frozen.
        self.kept: dict[int, tuple] = {}
        #: Rows before this one are read.
        self.read_up_to = 0

    def keep(self, rows) -> None:
        """A copy of each of ``rows`` the reader has not read yet, unless one is kept already (the
        value at the freeze). Called under the freeze's lock."""
        if isinstance(rows, slice):
            rows = range(*rows.indices(self.shape[0]))
        for row in np.asarray(rows).reshape(-1).tolist():
            if row >= self.read_up_to and row not in self.kept:
                value = self.array[row]
                self.kept[row] = (value.clone(), _recorded_event(value)) if isinstance(value, torch.Tensor) else (value.copy(), None)
                self.freeze.kept_bytes += self.row_bytes

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as they were when frozen, a host copy (the reader's, in order)."""
        if self.freeze.cancelled:
            raise WriteCancelled("the run exited at once")
        with self.freeze.lock:
            block = _host_copy(self.array[start:stop])
            for row in range(start, stop):
                kept = self.kept.pop(row, None)
                if kept is not None:
                    value, copied = kept
                    if copied is not None:
                        copied.synchronize()
                    block[row - start] = _host_copy(value)
                    self.freeze.kept_bytes -= self.row_bytes
            self.read_up_to = stop
        return block


def _host_copy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).numpy()
    return value.copy()


def _recorded_event(value) -> torch.cuda.Event | None:
    """An event after the work queued so far on the current stream of ``value``'s device, where
    ``put`` overwrites the row next (None off CUDA)."""
    if not (isinstance(value, torch.Tensor) and value.is_cuda):
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(value.device))
    return event

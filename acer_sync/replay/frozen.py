"""The replay buffer's arrays as they were at one step, read while training stores on.

``--save-buffer`` writes the buffer beside each checkpoint: 5.7 GB at the Atari defaults, 7-8 s on
the 2-core machine, during which training used to wait. :meth:`ReplayBuffer.freeze
<acer_sync.replay.buffer.ReplayBuffer.freeze>` gives its arrays as :class:`FrozenArray` views
instead, which a thread writes to the file a block of rows at a time while the run goes on: the
buffer's ``put``, before it overwrites a row that the writer has not read yet, keeps a copy of that
row (:meth:`FrozenArray.keep`), and the writer reads the copy in its place. The file holds the
buffer exactly as it was at the checkpoint's step; what training stores meanwhile costs the copies
of the rows it overwrites, a few segments' worth.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from acer_sync.base.transfer import numpy_dtype


class FrozenArray:
    """One array of the buffer (numpy, or a tensor on the GPU) as it was when frozen.

    :param array: the buffer's array, rows first (the ring's frames, steps or segments).
    :param lock: the buffer's lock of its frozen arrays, shared by ``put`` and the reader.
    """

    def __init__(self, array: np.ndarray | torch.Tensor, lock: threading.Lock):
        self.array = array
        self.lock = lock
        self.shape = tuple(array.shape)
        self.dtype = numpy_dtype(array.dtype) if isinstance(array, torch.Tensor) else array.dtype
        #: Rows overwritten before the reader got to them: their values when frozen.
        self.kept: dict[int, np.ndarray | torch.Tensor] = {}
        #: Rows before this one are read.
        self.read_up_to = 0

    def keep(self, rows) -> None:
        """Before ``put`` overwrites ``rows`` (an int, a slice or integer indices): a copy of each one
        the reader has not read yet, unless one is kept already (the value at the freeze). Called
        under :attr:`lock`."""
        if isinstance(rows, slice):
            rows = range(*rows.indices(self.shape[0]))
        for row in np.asarray(rows).reshape(-1).tolist():
            if row >= self.read_up_to and row not in self.kept:
                value = self.array[row]
                self.kept[row] = (value.clone(), _recorded_event(value)) if isinstance(value, torch.Tensor) else (value.copy(), None)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as they were when frozen, a host copy (the reader's, in order)."""
        with self.lock:
            block = _host_copy(self.array[start:stop])
            for row in range(start, stop):
                kept = self.kept.pop(row, None)
                if kept is not None:
                    value, copied = kept
                    if copied is not None:
                        copied.synchronize()
                    block[row - start] = _host_copy(value)
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

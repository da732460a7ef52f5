"""Arrays between the host and a device: numpy and torch dtypes, the upload through pinned memory,
loads on a side stream, and a scalar read back without waiting."""

from __future__ import annotations

from typing import Callable, Iterator, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy one."""
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch one."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on CUDA through pinned memory, so the copy does not wait for the
    host (a copy from pageable memory waits for every queued kernel). numpy fills the pinned memory,
    in this thread: torch's copy of a frame batch would split it over its OpenMP threads, which then
    wake, or spin, on the cores the envs' threads need (docs/performance.md)."""
    array = np.ascontiguousarray(array)
    if device.type != "cuda":
        return torch.from_numpy(array).to(device)
    pinned = torch.empty(array.shape, dtype=torch_dtype(array.dtype), pin_memory=True)
    np.copyto(pinned.numpy(), array)
    return pinned.to(device, non_blocking=True)


class SideStream:
    """Loads data onto a CUDA device on a stream of its own, so that its copies from the host run
    beside the compute queued before them instead of after it (issue 35: a replay batch from a
    host buffer uploads while the previous update runs). What a load returns is ready for the
    current stream: that stream waits for the side stream on the device (no host sync), and each
    tensor is recorded as used there, so the caching allocator keeps its memory until the current
    stream is done with it. Off CUDA, or not ``enabled``, a load is a plain call.

    A load may read only host memory and the tensors it makes: the side stream does not wait for
    the current one, so a device tensor written there (a replay buffer on the GPU) could be read
    before the write.
    """

    def __init__(self, device: torch.device, enabled: bool = True):
        self.stream = torch.cuda.Stream(device) if enabled and device.type == "cuda" else None

    def __call__(self, load: Callable[[], T]) -> T:
        if self.stream is None:
            return load()
        current = torch.cuda.current_stream(self.stream.device)
        with torch.cuda.stream(self.stream):
            loaded = load()
        current.wait_stream(self.stream)
        for tensor in _tensors(loaded):
            tensor.record_stream(current)
        return loaded


class LaggedRead:
    """A device scalar read from the host without waiting for the device. On CUDA, :meth:`latest`
    returns the value of the newest copy that has landed in pinned host memory (each copy queued
    by :meth:`request` behind the work before it, its arrival known from an event), so a check
    from the host lags the device by the work still queued and never stalls it; only a read
    before any copy has landed waits. Off CUDA both read the tensor itself, exactly.
    """

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.cuda = tensor.device.type == "cuda"
        self.host = torch.zeros((), dtype=tensor.dtype, pin_memory=True) if self.cuda else None
        self.event = torch.cuda.Event() if self.cuda else None
        self.pending = False  # a copy is queued whose value has not been taken
        self.seen: int | float | bool | None = None

    def request(self) -> None:
        """Queue a copy of the tensor's value as of the work queued so far."""
        if self.cuda:
            self.host.copy_(self.tensor, non_blocking=True)
            self.event.record()
            self.pending = True

    def latest(self) -> int | float | bool:
        """The value of the newest copy that has landed (off CUDA: the tensor's value now)."""
        if not self.cuda:
            return self.tensor.item()
        if self.pending and self.event.query():
            self.seen, self.pending = self.host.item(), False
        if self.seen is None:  # nothing has landed yet: read it once, waiting
            self.seen = self.tensor.item()
        return self.seen


def _tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in a (nested) tuple, named tuple, list or dict."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)

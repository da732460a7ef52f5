"""Arrays between the host and a device: numpy and torch dtypes, and the upload through pinned memory."""

from __future__ import annotations

import numpy as np
import torch


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy one."""
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch one."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on CUDA through pinned memory, so the copy does not wait for the host."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    cuda = device.type == "cuda"
    return (tensor.pin_memory() if cuda else tensor).to(device, non_blocking=cuda)

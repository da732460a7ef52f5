"""Every random generator a run draws from, captured as plain data for checkpoints and restored.

The states are lists, strings, numbers and tensors only, so a checkpoint holding them still loads
with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from acer_sync.base.errors import UserError


def capture_rng(sampler: np.random.Generator) -> dict:
    """The states of python's, numpy's, torch's (and CUDA's) global generators and of ``sampler``."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    return {
        "python": [python_state[0], list(python_state[1]), python_state[2]],
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
        "torch": torch.get_rng_state(),
        "sampler": sampler.bit_generator.state,
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict, sampler: np.random.Generator) -> None:
    """Put every generator back where :func:`capture_rng` found it (CUDA only on as many devices); a
    one-line UserError where a state is damaged (CUDA's own errors stay theirs)."""
    try:
        random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
        name, keys, *rest = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        sampler.bit_generator.state = state["sampler"]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise UserError(f"the checkpoint's generator states are damaged ({type(error).__name__})") from None
    if torch.cuda.is_available() and len(state.get("torch_cuda", [])) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["torch_cuda"])

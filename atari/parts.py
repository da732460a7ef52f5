"""Observations of several parts (an image and a vector): a dict of arrays, one per part.

A multi-part env (a Dict or Tuple space with an image in it, :func:`atari.envs.adapt_observations`)
gives frames as ``{key: array [N, *part_shape]}``; every other env gives one array. The code that
moves frames around (the vector env, the frame stack, the Runner, the replay buffer, the network's
unroll) handles both through :func:`map_parts`, so that a part is never copied, cast or stacked
differently from a single array. Works the same for numpy arrays and torch tensors.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def map_parts(fn: Callable, frames, *others):
    """``fn`` applied to each part of ``frames`` (and the same part of each of ``others``), as a
    dict of the same keys; ``fn(frames, *others)`` for a single array."""
    if isinstance(frames, dict):
        return {key: fn(part, *(other[key] for other in others)) for key, part in frames.items()}
    return fn(frames, *others)


def parts_of(frames) -> list:
    """The arrays of ``frames``: its parts in order, or ``[frames]`` for a single array."""
    return list(frames.values()) if isinstance(frames, dict) else [frames]


def leading_shape(frames, dims: int) -> tuple[int, ...]:
    """The first ``dims`` axes of ``frames`` (the same for every part)."""
    return tuple(parts_of(frames)[0].shape[:dims])


def zeros(layout, leading: tuple[int, ...]):
    """Zeros ``[*leading, *shape]`` of ``layout``: a dict ``{key: (shape, dtype)}`` or one ``(shape, dtype)``."""
    if isinstance(layout, dict):
        return {key: np.zeros((*leading, *shape), dtype=dtype) for key, (shape, dtype) in layout.items()}
    shape, dtype = layout
    return np.zeros((*leading, *shape), dtype=dtype)


def assign(target, index, value) -> None:
    """``target[index] = value``, part by part."""
    if isinstance(target, dict):
        for key, part in target.items():
            part[index] = value[key]
    else:
        target[index] = value

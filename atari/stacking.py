"""Frame stacking, masked at episode starts, shared by acting and by the replay buffer."""

from __future__ import annotations

import numpy as np


class FrameStacker:
    """Keeps the last ``stack`` frames of each env, oldest first: ``[N, stack, *frame_shape]``.

    Frames from before the current episode's first frame are zeros, as Baselines' VecFrameStack
    does. The replay buffer rebuilds exactly these stacks from single frames
    (:func:`acer_sync.replay.buffer.rebuild_stacks`), so acting and replay see the same inputs.
    """

    def __init__(self, num_envs: int, stack: int, frame_shape: tuple[int, ...], dtype: np.dtype):
        self.stack = stack
        self.stacked = np.zeros((num_envs, stack, *frame_shape), dtype=dtype)

    def reset(self, frames: np.ndarray) -> np.ndarray:
        self.stacked[:] = 0
        self.stacked[:, -1] = frames
        return self.stacked

    def push(self, frames: np.ndarray, episode_start: np.ndarray) -> np.ndarray:
        """Append the newest frame of each env; ``episode_start[i]`` clears env i's older frames."""
        if self.stack > 1:
            self.stacked[:, :-1] = self.stacked[:, 1:]
            self.stacked[episode_start, :-1] = 0
        self.stacked[:, -1] = frames
        return self.stacked

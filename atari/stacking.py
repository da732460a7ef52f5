"""Frame stacking, masked at episode starts, shared by acting and by the replay buffer."""

from __future__ import annotations

import numpy as np

from atari import parts


class FrameStacker:
    """Keeps the last ``stack`` frames of each env, oldest first: ``[N, stack, *frame_shape]``
    (a dict of them, one per part, for a multi-part observation: :mod:`atari.parts`).

    Frames from before the current episode's first frame are zeros, as Baselines' VecFrameStack
    does. The replay buffer rebuilds exactly these stacks from single frames
    (:func:`acer_sync.replay.buffer.rebuild_stacks`), so acting and replay see the same inputs.

    :param layout: one frame's ``(shape, dtype)``, or a dict of them (``EnvInfo.frame_layout``).
    """

    def __init__(self, num_envs: int, stack: int, layout):
        self.stack = stack
        def stacked(shape_dtype):
            return (stack, *shape_dtype[0]), shape_dtype[1]

        stacked_layout = {key: stacked(part) for key, part in layout.items()} if isinstance(layout, dict) else stacked(layout)
        self.stacked = parts.zeros(stacked_layout, (num_envs,))

    def reset(self, frames):
        def start(stacked: np.ndarray, new: np.ndarray) -> None:
            stacked[:] = 0
            stacked[:, -1] = new

        parts.map_parts(start, self.stacked, frames)
        return self.stacked

    def push(self, frames, episode_start: np.ndarray):
        """Append the newest frame of each env; ``episode_start[i]`` clears env i's older frames."""
        def shift(stacked: np.ndarray, new: np.ndarray) -> None:
            if self.stack > 1:
                stacked[:, :-1] = stacked[:, 1:]
                stacked[episode_start, :-1] = 0
            stacked[:, -1] = new

        parts.map_parts(shift, self.stacked, frames)
        return self.stacked

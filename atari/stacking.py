"""Frame stacking, masked at episode starts, shared by acting and by the replay buffer, and one env's
stack as the Actor keeps it (:class:`LifeFrameStack`, for ``acer_sync.make_env``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from atari import parts
from atari.episodes import lost_life


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


class LifeFrameStack(gym.Wrapper):
    """One Atari env whose observations are stacked as the Actor stacks them for training and
    evaluation: the last ``stack`` frames, zeros before the first, and cleared at a lost life (the
    game going on), where training's episodes start (``acer_sync.rollout.evaluation.evaluate``).
    ``info["episode_start"]`` is True on an observation that starts such an episode, as
    ``episode_start`` in :meth:`Policy.predict <acer_sync.api.policy.Policy.predict>` takes it.

    gymnasium's ``FrameStackObservation`` clears only at ``reset``: after a lost life its stack
    held frames of the life before, which the policy never saw in training.

    :param env: one env of ``(H, W)`` frames whose ``info`` reports ``lives``.
    """

    def __init__(self, env: gym.Env, stack: int):
        super().__init__(env)
        frame = env.observation_space
        self.stacker = FrameStacker(1, stack, (frame.shape, frame.dtype))
        self.observation_space = gym.spaces.Box(0, 255, (stack, *frame.shape), frame.dtype)
        self.lives = 0

    def reset(self, **kwargs):
        frame, info = self.env.reset(**kwargs)
        self.lives = int(info.get("lives", 0))
        return self.stacker.reset(frame[None])[0].copy(), {**info, "episode_start": True}

    def step(self, action):
        frame, reward, terminated, truncated, info = self.env.step(action)
        lives = int(info.get("lives", 0))
        life_lost = bool(lost_life(lives, self.lives, terminated or truncated))
        self.lives = lives
        stacked = self.stacker.push(frame[None], np.array([life_lost]))[0].copy()
        return stacked, reward, terminated, truncated, {**info, "episode_start": life_lost}

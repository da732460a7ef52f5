"""The replay buffer: a per-env ring of ``nsteps`` segments that stores every frame once.

Layout (time-major, the env on the second axis):

* ``frames[slot, env]``: one frame per agent step (the newest frame of that step's observation),
  in a ring of ``nsegments·nsteps + stack`` slots indexed by global step ``g % frame_capacity``.
  The ``stack`` spare slots keep the bootstrap frame of the newest segment and the ``stack − 1``
  frames before the oldest one, so every stored segment can be rebuilt in full.
* ``firsts[slot, env]``: whether that frame is the first of a (training) episode.
* ``actions``, ``mu``, ``rewards``, ``dones``, ``timeout_values``: one row per step in a ring of
  ``nsegments·nsteps`` slots; segment ``j`` holds slots ``j·nsteps … (j+1)·nsteps − 1``. Actions
  and μ are shaped by the policy's distribution (:mod:`acer_sync.distributions`): an action index
  and a probability vector for a categorical policy, an action vector and [mean, log σ] for a
  Gaussian one. ``timeout_values[t]`` is V(final observation) where step t was cut by a time limit,
  else 0.

Stacks are rebuilt when sampling (:func:`rebuild_stacks`), with frames from before an episode's
first frame zeroed, exactly as :class:`atari.stacking.FrameStacker` builds them when acting. The
cost per stored transition is one frame plus ``4·A + 11`` bytes (categorical).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from acer_sync.distributions import Categorical, Distribution


def _stored_action_dtype(distribution: Distribution) -> np.dtype:
    """uint8 indices for up to 256 discrete actions, else int64; float32 action vectors."""
    if distribution.kind == "gaussian":
        return np.dtype(np.float32)
    return np.dtype(np.uint8) if distribution.n <= 256 else np.dtype(np.int64)


class Segment(NamedTuple):
    """``nsteps`` steps of every env; numpy arrays, time-major.

    ``frames[t]`` and ``firsts[t]`` belong to observation t for t = 0..T (``frames[T]`` is the
    bootstrap observation's newest frame); ``actions[t]``, ``mu[t]``, ``rewards[t]``, ``dones[t]``
    and ``timeout_values[t]`` to the step taken from observation t. ``timeout_values`` None means
    no step was cut by a time limit.
    """

    frames: np.ndarray  # [T+1, N, *frame_shape]
    firsts: np.ndarray  # [T+1, N] bool
    actions: np.ndarray  # [T, N] int, or [T, N, d] float32
    mu: np.ndarray  # [T, N, stat_size] float32
    rewards: np.ndarray  # [T, N] float32
    dones: np.ndarray  # [T, N] bool
    timeout_values: np.ndarray | None = None  # [T, N] float32


class Sample(NamedTuple):
    """What :meth:`ReplayBuffer.sample` returns: a frame window per env plus the step data.

    ``frames`` and ``firsts`` cover observations ``-(stack−1) … T`` of the sampled segment
    (``T + stack`` rows); :func:`rebuild_stacks` turns them into ``[T+1, N, stack, ...]``.
    """

    frames: np.ndarray  # [T+stack, N, *frame_shape]
    firsts: np.ndarray  # [T+stack, N] bool
    actions: np.ndarray  # [T, N] or [T, N, d]
    mu: np.ndarray  # [T, N, stat_size]
    rewards: np.ndarray  # [T, N]
    dones: np.ndarray  # [T, N]
    timeout_values: np.ndarray  # [T, N]


def rebuild_stacks(frames: torch.Tensor, firsts: torch.Tensor, stack: int) -> torch.Tensor:
    """Frame stacks ``[T+1, N, stack, ...]`` from a window of single frames ``[T+stack, N, ...]``.

    Observation t (t = 0..T) stacks window rows ``t … t+stack−1`` (oldest first). A frame is
    zeroed when an episode starts after it and at or before the stack's newest frame, which is
    what :class:`atari.stacking.FrameStacker` does when acting.
    """
    if frames.shape[:2] != firsts.shape:
        raise ValueError(f"frames {tuple(frames.shape)} and firsts {tuple(firsts.shape)} disagree on [T+stack, N]")
    n_obs = frames.shape[0] - stack + 1
    if n_obs < 1:
        raise ValueError(f"a window of {frames.shape[0]} frames is too short for stacks of {stack}")
    episode_id = torch.cumsum(firsts.to(torch.int32), dim=0)  # [T+stack, N]
    rows = torch.arange(n_obs, device=frames.device)[:, None] + torch.arange(stack, device=frames.device)[None, :]
    stacked = frames[rows]  # [T+1, stack, N, ...]
    ids = episode_id[rows]  # [T+1, stack, N]
    same_episode = ids == ids[:, -1:]
    mask = same_episode.reshape(*same_episode.shape, *([1] * (frames.dim() - 2)))
    stacked = torch.where(mask, stacked, torch.zeros((), dtype=stacked.dtype, device=stacked.device))
    return stacked.transpose(1, 2)


class ReplayBuffer:
    """Ring buffer of segments; see the module docstring for the layout.

    :param num_envs: N.
    :param nsteps: T, the segment length.
    :param size_per_env: capacity in steps per env; rounded down to whole segments.
    :param frame_shape: shape of one frame (``(84, 84)`` for Atari, ``(D,)`` for vectors).
    :param frame_dtype: uint8 for Atari frames.
    :param stack: frames per observation.
    :param n_actions: A (categorical), or d (Gaussian).
    :param distribution: the policy's distribution; None means ``Categorical(n_actions)``.
    """

    def __init__(
        self,
        num_envs: int,
        nsteps: int,
        size_per_env: int,
        frame_shape: tuple[int, ...],
        frame_dtype: np.dtype,
        stack: int,
        n_actions: int,
        distribution: Distribution | None = None,
    ):
        distribution = distribution or Categorical(n_actions)
        self.num_envs = num_envs
        self.nsteps = nsteps
        self.stack = stack
        self.nsegments = size_per_env // nsteps
        if self.nsegments < 1:
            raise ValueError(f"a buffer of {size_per_env} steps per env holds no segment of {nsteps} steps")
        self.step_capacity = self.nsegments * nsteps
        self.frame_capacity = self.step_capacity + stack
        action_dtype = _stored_action_dtype(distribution)
        self.frames = np.zeros((self.frame_capacity, num_envs, *frame_shape), dtype=frame_dtype)
        self.firsts = np.zeros((self.frame_capacity, num_envs), dtype=bool)
        self.actions = np.zeros((self.step_capacity, num_envs, *distribution.action_shape), dtype=action_dtype)
        self.mu = np.zeros((self.step_capacity, num_envs, distribution.stat_size), dtype=np.float32)
        self.rewards = np.zeros((self.step_capacity, num_envs), dtype=np.float32)
        self.dones = np.zeros((self.step_capacity, num_envs), dtype=bool)
        self.timeout_values = np.zeros((self.step_capacity, num_envs), dtype=np.float32)
        self.segment_start = np.zeros(self.nsegments, dtype=np.int64)  # global step of each segment
        self.steps_written = 0
        self.segments_stored = 0
        self._env_index = np.arange(num_envs)

    @staticmethod
    def bytes_needed(
        num_envs, nsteps, size_per_env, frame_shape, frame_dtype, stack, n_actions, distribution: Distribution | None = None
    ) -> int:
        """Memory the arrays will take, computed before allocating anything."""
        distribution = distribution or Categorical(n_actions)
        step_capacity = (size_per_env // nsteps) * nsteps
        frame_bytes = int(np.prod(frame_shape)) * np.dtype(frame_dtype).itemsize
        action_bytes = _stored_action_dtype(distribution).itemsize * int(np.prod(distribution.action_shape))
        per_step = 4 * distribution.stat_size + action_bytes + 4 + 1 + 4
        return num_envs * ((step_capacity + stack) * (frame_bytes + 1) + step_capacity * per_step)

    @property
    def nbytes(self) -> int:
        arrays = (self.frames, self.firsts, self.actions, self.mu, self.rewards, self.dones, self.timeout_values)
        return sum(a.nbytes for a in arrays)

    @property
    def num_steps_stored(self) -> int:
        """Steps per env currently stored."""
        return self.segments_stored * self.nsteps

    def put(self, segment: Segment) -> None:
        """Store one segment of all envs, overwriting the oldest when full."""
        T, N = segment.actions.shape[:2]
        if (T, N) != (self.nsteps, self.num_envs):
            raise ValueError(f"segment is [{T}, {N}], buffer expects [{self.nsteps}, {self.num_envs}]")
        if segment.frames.shape[:2] != (T + 1, N) or segment.firsts.shape != (T + 1, N):
            raise ValueError("segment frames and firsts must be [T+1, N, ...]")
        start = self.steps_written
        index = (start // T) % self.nsegments
        steps = slice(index * T, (index + 1) * T)
        self.actions[steps] = segment.actions
        self.mu[steps] = segment.mu
        self.rewards[steps] = segment.rewards
        self.dones[steps] = segment.dones
        self.timeout_values[steps] = 0.0 if segment.timeout_values is None else segment.timeout_values
        frame_slots = (start + np.arange(T + 1)) % self.frame_capacity
        self.frames[frame_slots] = segment.frames
        self.firsts[frame_slots] = segment.firsts
        self.segment_start[index] = start
        self.steps_written += T
        self.segments_stored = min(self.segments_stored + 1, self.nsegments)

    def _gather(self, segment_index: np.ndarray) -> Sample:
        """The window and step data of segment ``segment_index[n]`` for each env n."""
        T = self.nsteps
        start = self.segment_start[segment_index]  # [N]
        window = start[None, :] + np.arange(-(self.stack - 1), T + 1)[:, None]  # [T+stack, N]
        frame_slots = window % self.frame_capacity
        step_slots = segment_index[None, :] * T + np.arange(T)[:, None]  # [T, N]
        env = self._env_index[None, :]
        firsts = self.firsts[frame_slots, env]
        # Global steps before 0 were never written; the first frame (a reset) masks them anyway.
        firsts[window == 0] = True
        return Sample(
            frames=self.frames[frame_slots, env],
            firsts=firsts,
            actions=self.actions[step_slots, env],
            mu=self.mu[step_slots, env],
            rewards=self.rewards[step_slots, env],
            dones=self.dones[step_slots, env],
            timeout_values=self.timeout_values[step_slots, env],
        )

    def latest(self) -> Sample:
        """The segment stored last, for every env (the on-policy batch)."""
        if self.segments_stored == 0:
            raise RuntimeError("the buffer is empty")
        index = ((self.steps_written - self.nsteps) // self.nsteps) % self.nsegments
        return self._gather(np.full(self.num_envs, index))

    _STATE_ARRAYS = ("frames", "firsts", "actions", "mu", "rewards", "dones", "timeout_values", "segment_start")
    #: Arrays that buffers saved by earlier versions lack, restored as zeros (no time-limit cut).
    _OPTIONAL_ARRAYS = ("timeout_values",)

    def state(self) -> dict[str, np.ndarray]:
        """Everything needed to restore the buffer, as plain arrays (for ``np.savez``)."""
        arrays = {name: getattr(self, name) for name in self._STATE_ARRAYS}
        arrays["counters"] = np.array([self.steps_written, self.segments_stored], dtype=np.int64)
        return arrays

    def load_state(self, arrays) -> None:
        """Restore from :meth:`state`'s arrays, after a restart of the envs.

        The newest stored segment's last step is marked done: the restart cut its episode, and
        the next segment's first frame (a fresh reset) takes the slot of its bootstrap frame.
        Raises ValueError when the arrays do not fit this buffer's shapes. A buffer saved before
        ``timeout_values`` existed loads with zeros there.
        """
        names = [name for name in self._STATE_ARRAYS if name in arrays or name not in self._OPTIONAL_ARRAYS]
        for name in self._OPTIONAL_ARRAYS:
            if name not in arrays:
                getattr(self, name)[...] = 0
        for name in names:
            if arrays[name].shape != getattr(self, name).shape or arrays[name].dtype != getattr(self, name).dtype:
                raise ValueError(f"{name} is {arrays[name].shape} {arrays[name].dtype}, expected {getattr(self, name).shape}")
        for name in names:
            getattr(self, name)[...] = arrays[name]
        self.steps_written, self.segments_stored = (int(v) for v in arrays["counters"])
        if self.segments_stored:
            last_step = (self.steps_written - 1) % self.step_capacity
            self.dones[last_step] = True

    def sample(self, rng: np.random.Generator) -> Sample:
        """One uniformly chosen stored segment per env, as Baselines samples."""
        if self.segments_stored == 0:
            raise RuntimeError("the buffer is empty")
        return self._gather(rng.integers(0, self.segments_stored, size=self.num_envs))

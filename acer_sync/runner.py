"""The Runner: steps the vector env for ``nsteps`` with the current policy and returns a Segment."""

from __future__ import annotations

import numpy as np
import torch

from acer_sync.buffer import Segment
from acer_sync.distributions import distribution_for
from acer_sync.networks import Network
from acer_sync.profiling import PhaseTimer
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker, LifeLossActions
from atari.stacking import FrameStacker


class Runner:
    """Acts in N envs with π and records what the buffer stores.

    The behaviour policy μ recorded for each step is the statistics of the distribution the
    action was sampled from (:mod:`acer_sync.distributions`): the full probability vector
    π(·|x_t), or the Gaussian's mean and log σ. After a lost life in a FIRE game, the actions
    Baselines plays without the agent (:class:`LifeLossActions`) are stored with a one-hot μ on
    that action. A Gaussian action is stored as sampled; the env gets it clipped to the Box.
    Frame stacks are kept here (:class:`FrameStacker`) and cleared at every training-episode
    start, so they equal what the buffer rebuilds.

    A step the env cut by a time limit (truncated, not terminated) is stored as done, with
    ``timeout_values[t]`` = V(final observation) under the current network, so that Q^ret
    bootstraps from it (:func:`acer_sync.losses.q_retrace`). Observations update the network's
    running normalizer, if it has one, before it acts on them.

    :param env: the vector env.
    :param model: the online network (read only here).
    :param device: where ``model`` lives; stacked uint8 frames are sent there to act.
    :param nsteps: T.
    :param tracker: the training view of episodes (life loss, reward clipping, raw scores).
    :param timer: charges time to the ``acting`` and ``env`` phases (bench.py).
    :param reward_scale: training rewards are multiplied by this (logged returns stay raw).
    """

    def __init__(
        self, env: VecEnv, model: Network, device: torch.device, nsteps: int, tracker: EpisodeTracker,
        timer: PhaseTimer | None = None, reward_scale: float = 1.0,
    ):
        self.timer = timer or PhaseTimer()
        self.env = env
        self.model = model
        self.device = device
        self.nsteps = nsteps
        self.tracker = tracker
        self.reward_scale = reward_scale
        info = env.info
        self.distribution = distribution_for(info)
        self.stacker = FrameStacker(env.num_envs, info.stack, info.frame_shape, info.frame_dtype)
        self.frames: np.ndarray | None = None
        self.first = np.ones(env.num_envs, dtype=bool)
        self.life_loss_actions = LifeLossActions(env.num_envs, info.life_loss_actions)

    def reset(self, seed: int | None) -> None:
        frames, lives = self.env.reset(seed=seed)
        self.tracker.reset(lives)
        self.stacker.reset(frames)
        self.frames = frames
        self.first = np.ones(self.env.num_envs, dtype=bool)
        self.life_loss_actions.reset()

    @torch.inference_mode()
    def act(self, stacked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sample one action per env; returns ``(actions [N, ...], mu [N, stat_size])``."""
        obs = torch.from_numpy(stacked).to(self.device)
        normalizer = getattr(self.model, "normalizer", None)
        if normalizer is not None:
            normalizer.update(obs)
        stats = self.model.policy(obs)
        actions = self.distribution.sample(stats)
        return actions.cpu().numpy(), stats.float().cpu().numpy()

    @torch.inference_mode()
    def final_values(self, stacked: np.ndarray, cut: np.ndarray) -> np.ndarray:
        """V of the final observations of the envs in ``cut`` (0 elsewhere), ``[N]``.

        ``stacked`` is the stack before this step's frame was pushed; the final observation
        drops its oldest frame and appends the env's final frame.
        """
        values = np.zeros(self.env.num_envs, dtype=np.float32)
        envs = np.flatnonzero(cut)
        if len(envs):
            final = np.concatenate([stacked[envs, 1:], self.env.final_frames[envs, None]], axis=1)
            values[envs] = self.model.value(torch.from_numpy(final).to(self.device)).float().cpu().numpy()
        return values

    def run(self) -> Segment:
        if self.frames is None:
            raise RuntimeError("call reset() before run()")
        T, N = self.nsteps, self.env.num_envs
        info = self.env.info
        frames = np.empty((T + 1, N, *info.frame_shape), dtype=info.frame_dtype)
        firsts = np.empty((T + 1, N), dtype=bool)
        dist = self.distribution
        actions = np.empty((T, N, *dist.action_shape), dtype=dist.action_dtype)
        mu = np.empty((T, N, dist.stat_size), dtype=np.float32)
        rewards = np.empty((T, N), dtype=np.float32)
        dones = np.empty((T, N), dtype=bool)
        timeout_values = np.zeros((T, N), dtype=np.float32)
        for t in range(T):
            frames[t] = self.frames
            firsts[t] = self.first
            with self.timer("acting"):
                actions[t], mu[t] = self.act(self.stacker.stacked)
                forced_envs, forced_actions = self.life_loss_actions.forced()
                if len(forced_envs):
                    actions[t, forced_envs] = forced_actions
                    mu[t, forced_envs] = dist.forced_stats(forced_actions)
            with self.timer("env"):
                next_frames, raw_rewards, terminated, truncated, lives = self.env.step(dist.env_actions(actions[t]))
                rewards[t], dones[t], game_over = self.tracker.step(raw_rewards, terminated, truncated, lives)
                if self.reward_scale != 1.0:
                    rewards[t] *= self.reward_scale
            cut = truncated & ~terminated & self.env.final_mask
            if cut.any():
                with self.timer("acting"):
                    timeout_values[t] = self.final_values(self.stacker.stacked, cut)
            with self.timer("env"):
                self.life_loss_actions.step(self.tracker.life_lost, game_over)
                self.stacker.push(next_frames, dones[t])
            self.frames = next_frames
            self.first = dones[t]
        frames[T] = self.frames
        firsts[T] = self.first
        return Segment(frames, firsts, actions, mu, rewards, dones, timeout_values)

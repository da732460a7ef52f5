"""The Runner: steps the vector env for ``nsteps`` with the current policy and returns a Segment."""

from __future__ import annotations

import numpy as np
import torch

from acer_sync.buffer import Segment
from acer_sync.networks import ActorCritic
from acer_sync.profiling import PhaseTimer
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker, LifeLossActions
from atari.stacking import FrameStacker


class Runner:
    """Acts in N envs with π and records what the buffer stores.

    The behaviour policy μ recorded for each step is the full probability vector π(·|x_t) the
    action was sampled from; after a lost life in a FIRE game, the actions Baselines plays
    without the agent (:class:`LifeLossActions`) are stored with a one-hot μ on that action.
    Frame stacks are kept here (:class:`FrameStacker`) and cleared at every training-episode
    start, so they equal what the buffer rebuilds.

    :param env: the vector env.
    :param model: the online network (read only here).
    :param device: where ``model`` lives; stacked uint8 frames are sent there to act.
    :param nsteps: T.
    :param tracker: the training view of episodes (life loss, reward clipping, raw scores).
    :param timer: charges time to the ``acting`` and ``env`` phases (bench.py).
    """

    def __init__(
        self, env: VecEnv, model: ActorCritic, device: torch.device, nsteps: int, tracker: EpisodeTracker,
        timer: PhaseTimer | None = None,
    ):
        self.timer = timer or PhaseTimer()
        self.env = env
        self.model = model
        self.device = device
        self.nsteps = nsteps
        self.tracker = tracker
        info = env.info
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
        """Sample one action per env; returns ``(actions [N], mu [N, A])``."""
        obs = torch.from_numpy(stacked).to(self.device)
        pi = self.model.policy(obs)
        actions = torch.multinomial(pi, 1).squeeze(-1)
        return actions.cpu().numpy(), pi.float().cpu().numpy()

    def run(self) -> Segment:
        if self.frames is None:
            raise RuntimeError("call reset() before run()")
        T, N = self.nsteps, self.env.num_envs
        info = self.env.info
        frames = np.empty((T + 1, N, *info.frame_shape), dtype=info.frame_dtype)
        firsts = np.empty((T + 1, N), dtype=bool)
        actions = np.empty((T, N), dtype=np.int64)
        mu = np.empty((T, N, info.n_actions), dtype=np.float32)
        rewards = np.empty((T, N), dtype=np.float32)
        dones = np.empty((T, N), dtype=bool)
        for t in range(T):
            frames[t] = self.frames
            firsts[t] = self.first
            with self.timer("acting"):
                actions[t], mu[t] = self.act(self.stacker.stacked)
                forced_envs, forced_actions = self.life_loss_actions.forced()
                actions[t, forced_envs] = forced_actions
                mu[t, forced_envs] = np.eye(info.n_actions, dtype=np.float32)[forced_actions]
            with self.timer("env"):
                next_frames, raw_rewards, terminated, truncated, lives = self.env.step(actions[t])
                rewards[t], dones[t], game_over = self.tracker.step(raw_rewards, terminated, truncated, lives)
                self.life_loss_actions.step(self.tracker.life_lost, game_over)
                self.stacker.push(next_frames, dones[t])
            self.frames = next_frames
            self.first = dones[t]
        frames[T] = self.frames
        firsts[T] = self.first
        return Segment(frames, firsts, actions, mu, rewards, dones)

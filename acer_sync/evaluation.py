"""Evaluation: full games with a fixed policy, no life-loss ends, raw scores."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from acer_sync.distributions import distribution_for
from acer_sync.networks import Network
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker, LifeLossActions
from atari.stacking import FrameStacker


@torch.inference_mode()
def evaluate(
    model: Network,
    env: VecEnv,
    episodes: int,
    device: torch.device,
    greedy: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[float]:
    """Play ``episodes`` full games and return their raw scores.

    Actions are sampled from π (with ``generator``, so evaluation leaves the training RNG alone),
    or its mode with ``greedy`` (the argmax, or the Gaussian's mean), clipped to a Box's bounds; after a lost life a FIRE game plays the same forced actions as
    in training (:class:`LifeLossActions`). Frame stacks are cleared only at a real game start,
    and rewards are not clipped: this is the evaluation preprocessing, whatever the training used.
    Each env plays a fixed share of the games, so short games are not favoured over long ones.
    ``on_step`` runs after the reset and after every env step (play.py records video frames there).
    """
    info = env.info
    dist = distribution_for(info)
    n = env.num_envs
    quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
    played = np.zeros(n, dtype=np.int64)
    scores: list[float] = []
    tracker = EpisodeTracker(n, life_loss_ends_episode=False, clip_rewards=False)
    stacker = FrameStacker(n, info.stack, info.frame_shape, info.frame_dtype)
    life_loss_actions = LifeLossActions(n, info.life_loss_actions)
    frames, lives = env.reset(seed=seed)
    tracker.reset(lives)
    stacker.reset(frames)
    if on_step is not None:
        on_step()
    while len(scores) < episodes:
        stats = model.policy(torch.from_numpy(stacker.stacked).to(device))
        actions = dist.greedy(stats) if greedy else dist.sample(stats, generator=generator)
        actions = actions.cpu().numpy()
        forced_envs, forced_actions = life_loss_actions.forced()
        if len(forced_envs):
            actions[forced_envs] = forced_actions
        frames, raw_rewards, terminated, truncated, lives = env.step(dist.env_actions(actions))
        _, game_over, _ = tracker.step(raw_rewards, terminated, truncated, lives)
        life_loss_actions.step(tracker.life_lost, game_over)
        stacker.push(frames, game_over)
        for env_index, score in tracker.finished:
            if played[env_index] < quota[env_index]:
                played[env_index] += 1
                scores.append(score)
        if on_step is not None:
            on_step()
    return scores

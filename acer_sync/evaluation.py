"""Evaluation: full games with a fixed policy, no life-loss ends, raw scores."""

from __future__ import annotations

from typing import Callable

import torch

from acer_sync.networks import ActorCritic
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker
from atari.stacking import FrameStacker


@torch.inference_mode()
def evaluate(
    model: ActorCritic,
    env: VecEnv,
    episodes: int,
    device: torch.device,
    greedy: bool = False,
    seed: int | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[float]:
    """Play until ``episodes`` full games have finished; return their raw scores in finishing order.

    Actions are sampled from π, or its argmax with ``greedy``. Frame stacks are cleared only at a
    real game start, and rewards are not clipped: this is the evaluation preprocessing, whatever
    the training used. ``on_step`` runs after every env step (play.py records video frames there).
    """
    info = env.info
    tracker = EpisodeTracker(env.num_envs, life_loss_ends_episode=False, clip_rewards=False, history=episodes + env.num_envs)
    stacker = FrameStacker(env.num_envs, info.stack, info.frame_shape, info.frame_dtype)
    frames, lives = env.reset(seed=seed)
    tracker.reset(lives)
    stacker.reset(frames)
    if on_step is not None:
        on_step()
    while tracker.episodes < episodes:
        pi = model.policy(torch.from_numpy(stacker.stacked).to(device))
        actions = pi.argmax(-1) if greedy else torch.multinomial(pi, 1).squeeze(-1)
        frames, raw_rewards, terminated, truncated, lives = env.step(actions.cpu().numpy())
        _, game_over, _ = tracker.step(raw_rewards, terminated, truncated, lives)
        stacker.push(frames, game_over)
        if on_step is not None:
            on_step()
    # Several envs may finish on the same step; keep the first ``episodes`` games that ended.
    return list(tracker.recent_returns)[:episodes]

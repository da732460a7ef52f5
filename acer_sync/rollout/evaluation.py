"""Evaluation: full games with a fixed policy, no life-loss ends, raw scores."""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from acer_sync.base.log import log
from acer_sync.nets.networks import Network
from acer_sync.nets.torsos import evaluation_mode
from acer_sync.rollout.actor import Actor
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker

#: The most steps an evaluation game may last: an env whose episodes never end (no time limit, a
#: policy that never reaches the goal) would hold the evaluation, and the run, for ever. An Atari
#: game ends at 108,000 frames (27,000 steps) before it.
MAX_GAME_STEPS = 100_000


class EnvStep(NamedTuple):
    """One vector step of :func:`evaluate`, for its ``on_step``: per env, ``[N]`` (actions ``[N, ...]``)."""

    actions: np.ndarray  # what the env was given
    forced: np.ndarray  # played after a lost life (LifeLossActions), not chosen by the agent
    raw_rewards: np.ndarray
    lives: np.ndarray
    game_over: np.ndarray


@torch.inference_mode()
def evaluate(
    model: Network,
    env: VecEnv,
    episodes: int,
    device: torch.device,
    greedy: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[EnvStep | None], None] | None = None,
    precision: str = "fp32",
    cancelled: Callable[[], bool] | None = None,
    envs_name: str = "env",
    on_score: Callable[[float], None] | None = None,
) -> list[float]:
    """Play ``episodes`` full games and return their raw scores.

    Actions are sampled from π (with ``generator``, so evaluation leaves the training RNG alone),
    or its mode with ``greedy`` (the argmax, or the Gaussian's mean), clipped to a Box's bounds,
    by the same :class:`Actor` as training, so a FIRE game plays the same forced actions after a
    lost life. Games are played to their end over all lives and scored with the raw, unclipped
    rewards; the frame stack and the recurrent state are reset where training resets them, at a
    game start and, on Atari (whose training episodes end at a lost life), at a lost life, so the
    policy is shown what it was trained on (an LSTM never carries a state over a lost life).
    Each env plays a fixed share of the games, so short games are not favoured over long ones.
    ``on_step`` runs after the reset (given None) and after every env step (given its
    :class:`EnvStep`); play.py records video frames and logs the actions there.
    ``precision`` is what the network's passes compute in (:mod:`acer_sync.nets.precision`).
    Once ``cancelled()`` is true (a stop signal in training), it returns the games finished so far,
    after the env step it was asked in. The network plays in evaluation mode (:func:`evaluation_mode`).
    ``envs_name`` is what errors call its envs ("evaluation env" in a training's evaluation).
    ``on_score`` gets each game's score as it ends (play.py prints it then). A game that reaches
    :data:`MAX_GAME_STEPS` steps ends the evaluation: its score so far counts, the games not played
    are left out, and a warning says so.
    """
    with evaluation_mode(model):
        n = env.num_envs
        quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
        played = np.zeros(n, dtype=np.int64)
        scores: list[float] = []
        # Episodes for the policy's memory end where training's do (a lost life on Atari); the scores are full games.
        tracker = EpisodeTracker(n, life_loss_ends_episode=env.info.atari, clip_rewards=False)
        actor = Actor(model, env.info, n, device, greedy=greedy, generator=generator, precision=precision, envs_name=envs_name)
        frames, lives = env.reset(seed=seed)
        tracker.reset(lives)
        actor.reset(frames)
        if on_step is not None:
            on_step(None)
        while len(scores) < episodes and not (cancelled is not None and cancelled()):
            forced = actor.life_loss_actions.pending()  # before act(), which plays them
            actions, _ = actor.act()
            env_actions = actor.distribution.env_actions(actions)
            frames, raw_rewards, terminated, truncated, lives = env.step(env_actions)
            _, memory_starts, game_over = tracker.step(raw_rewards, terminated, truncated, lives)
            actor.observe(frames, memory_starts, tracker.life_lost, game_over)
            endless = [(int(i), float(tracker.running_return[i])) for i in np.flatnonzero(tracker.running_length >= MAX_GAME_STEPS)
                       if played[i] < quota[i]]
            for env_index, score in tracker.finished + endless:
                if played[env_index] < quota[env_index]:
                    played[env_index] += 1
                    scores.append(score)
                    if on_score is not None:
                        on_score(score)
            if on_step is not None:
                on_step(EnvStep(env_actions, forced, raw_rewards, lives, game_over))
            if endless:
                log.warning(f"warning: a game in {envs_name} {endless[0][0]} went on for {MAX_GAME_STEPS:,} steps without "
                            f"ending; its score so far counts, and the evaluation ends with {len(scores)} of its {episodes} "
                            "games (give the env a time limit: gymnasium's max_episode_steps)")
                break
    return scores

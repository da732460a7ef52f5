"""The training view of episodes, and the bookkeeping of full-game scores.

The envs report raw rewards and the real end of each game. For training on Atari, as in
Baselines' EpisodicLifeEnv and ClipRewardEnv, an episode also ends when a life is lost, and rewards
are clipped to their sign. What is logged is different: the raw, unclipped score of each full
game (all lives), as Baselines' Monitor records it.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeTracker:
    """Turns raw env outputs into training rewards and dones, and records full-game returns.

    :param num_envs: N.
    :param life_loss_ends_episode: end the training episode when ``lives`` drops (Atari).
    :param clip_rewards: train on sign(r) instead of r (Atari).
    :param history: how many finished games ``recent_returns`` keeps.
    """

    def __init__(self, num_envs: int, life_loss_ends_episode: bool, clip_rewards: bool, history: int = 100):
        self.life_loss_ends_episode = life_loss_ends_episode
        self.clip_rewards = clip_rewards
        self.lives = np.zeros(num_envs, dtype=np.int64)
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.recent_returns: deque[float] = deque(maxlen=history)
        self.recent_lengths: deque[int] = deque(maxlen=history)
        self.episodes = 0
        self.finished: list[tuple[int, float]] = []  # (env, raw return) of games ended by the last step

    def reset(self, lives: np.ndarray) -> None:
        self.lives = np.asarray(lives, dtype=np.int64).copy()
        self.running_return[:] = 0.0
        self.running_length[:] = 0

    def step(self, raw_rewards, terminated, truncated, lives) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Account one vector step.

        :return: ``(train_rewards, train_dones, game_over)``: the rewards and dones to train on,
            and which envs finished a full game (their next frame starts a new game).
        """
        game_over = np.logical_or(terminated, truncated)
        self.running_return += raw_rewards
        self.running_length += 1
        self.finished = [(int(i), float(self.running_return[i])) for i in np.flatnonzero(game_over)]
        for i in np.flatnonzero(game_over):
            self.recent_returns.append(float(self.running_return[i]))
            self.recent_lengths.append(int(self.running_length[i]))
            self.episodes += 1
        self.running_return[game_over] = 0.0
        self.running_length[game_over] = 0

        lives = np.asarray(lives, dtype=np.int64)
        train_dones = game_over.copy()
        if self.life_loss_ends_episode:
            # After a game over the env has already reset, so lives rising is no life loss.
            train_dones |= (lives < self.lives) & ~game_over
        self.lives = lives.copy()
        train_rewards = np.sign(raw_rewards) if self.clip_rewards else raw_rewards
        return train_rewards.astype(np.float32), train_dones, game_over

    def mean_return(self) -> float:
        """Mean raw return of the last ``history`` finished games (NaN before the first one)."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")

"""The training view of episodes, and the bookkeeping of full-game scores.

The envs report raw rewards and the real end of each game. For training on Atari, as in
Baselines' EpisodicLifeEnv and ClipRewardEnv, an episode also ends when a life is lost, and rewards
are clipped to their sign. What is logged is different: the raw, unclipped score of each full
game (all lives), as Baselines' Monitor records it.
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np


def lost_life(lives, previous_lives, game_over):
    """Where a life was lost: the lives dropped and the game goes on (after a game over the env has
    already reset, so lives rising is no loss). Arrays of envs, or one env's numbers."""
    return np.logical_and(np.less(lives, previous_lives), np.logical_not(game_over))


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
        self.life_lost = np.zeros(num_envs, dtype=bool)  # envs whose last step lost a life, the game going on

    def counted(self) -> tuple[int, tuple[float, ...], tuple[int, ...]]:
        """The finished games as a checkpoint keeps them (their count and the recent ones), for :meth:`uncount_since`."""
        return self.episodes, tuple(self.recent_returns), tuple(self.recent_lengths)

    def uncount_since(self, counted: tuple[int, tuple[float, ...], tuple[int, ...]]) -> None:
        """Forget the games finished since :meth:`counted` gave ``counted`` (steps a run drops)."""
        self.episodes = counted[0]
        self.recent_returns.clear()
        self.recent_returns.extend(counted[1])
        self.recent_lengths.clear()
        self.recent_lengths.extend(counted[2])

    def reset(self, lives: np.ndarray) -> None:
        self.lives = np.asarray(lives, dtype=np.int64).copy()
        self.running_return[:] = 0.0
        self.running_length[:] = 0

    def step(self, raw_rewards, terminated, truncated, lives, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Account one vector step of the envs in ``rows`` (all of them, or a group's: the arrays
        are theirs; ``finished`` and ``life_lost`` then name those envs alone).

        :return: ``(train_rewards, train_dones, game_over)``: the rewards and dones to train on,
            and which envs finished a full game (their next frame starts a new game).
        """
        game_over = np.logical_or(terminated, truncated)
        running_return, running_length = self.running_return[rows], self.running_length[rows]  # views
        running_return += raw_rewards
        running_length += 1
        first = rows.start or 0
        self.finished = [(first + int(i), float(running_return[i])) for i in np.flatnonzero(game_over)]
        for i in np.flatnonzero(game_over):
            self.recent_returns.append(float(running_return[i]))
            self.recent_lengths.append(int(running_length[i]))
            self.episodes += 1
        running_return[game_over] = 0.0
        running_length[game_over] = 0

        lives = np.asarray(lives, dtype=np.int64)
        life_lost = lost_life(lives, self.lives[rows], game_over)
        if rows == slice(None):
            self.life_lost = life_lost
        else:  # a group's: the other envs lost none in this step
            self.life_lost = np.zeros(len(self.lives), dtype=bool)
            self.life_lost[rows] = life_lost
        train_dones = game_over.copy()
        if self.life_loss_ends_episode:
            train_dones |= life_lost
        self.lives[rows] = lives
        train_rewards = np.sign(raw_rewards) if self.clip_rewards else raw_rewards
        return train_rewards.astype(np.float32), train_dones, game_over

    def mean_return(self) -> float:
        """Mean raw return of the last ``history`` finished games (NaN before the first one)."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")


class LifeLossActions:
    """The actions an env plays after each lost life without the agent choosing them.

    Baselines' Atari wrappers play a no-op, FIRE and action 2 after every life loss in a FIRE
    game, inside the reset that follows the life-loss episode end, so an agent never has to learn
    to serve again (``EnvInfo.life_loss_actions``). Here these steps go through the vector env like
    any other step, and whoever acts (the Runner, the evaluation) plays ``forced()`` for the envs
    that :meth:`forced` names. The Runner stores each such step with its forced action and a
    one-hot μ: the behaviour really was that deterministic choice, so the off-policy corrections
    see exactly what happened, and no step is trained on as if the agent had chosen it.

    :param num_envs: N.
    :param sequence: the actions to play after a life loss, in order (empty: none).
    """

    def __init__(self, num_envs: int, sequence: tuple[int, ...]):
        self.sequence = np.asarray(sequence, dtype=np.int64)
        self.position = np.full(num_envs, len(sequence), dtype=np.int64)  # len(sequence): nothing pending

    def reset(self) -> None:
        """A new game in every env (its reset already pressed FIRE where the game needs it)."""
        self.position[:] = len(self.sequence)

    def pending(self) -> np.ndarray:
        """``[N]`` bool: the envs that must play a forced action at this step."""
        return self.position < len(self.sequence)

    def forced(self) -> tuple[np.ndarray, np.ndarray]:
        """``(envs, actions)``: the envs that must play a forced action at this step, and those actions."""
        envs = np.flatnonzero(self.pending())
        return envs, self.sequence[self.position[envs]]

    def step(self, life_lost: np.ndarray, game_over: np.ndarray) -> None:
        """Account one vector step: advance the envs that played a forced action, start the
        sequence where a life was just lost, and drop it where a new game began."""
        if not len(self.sequence):
            return
        self.position[self.pending()] += 1
        self.position[np.asarray(life_lost, dtype=bool)] = 0
        self.position[np.asarray(game_over, dtype=bool)] = len(self.sequence)


class LifeLossActionsWrapper(gym.Wrapper):
    """One env that plays :class:`LifeLossActions` itself: after a step that loses a life (the game
    going on), it steps the forced actions too, and returns their last observation, the summed
    reward and whether the game ended on the way.

    The vector envs leave the forced actions to whoever acts (the Runner, the evaluation); this
    wrapper is for code that acts on one env with a trained policy (:func:`acer_sync.make_env`), so
    that it plays as the evaluation does. Put it outside any frame stack, so that the stack takes in
    every frame the forced steps return, as the Actor's does.

    :param env: an env whose ``info`` reports ``lives``.
    :param sequence: the actions to play after each life loss (``EnvInfo.life_loss_actions``).
    """

    def __init__(self, env: gym.Env, sequence: tuple[int, ...]):
        super().__init__(env)
        self.forced = LifeLossActions(1, sequence)
        self.lives = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.forced.reset()
        self.lives = int(info.get("lives", 0))
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self._step(action)
        total = float(reward)
        started = bool(info.get("episode_start", False))  # a stack within (LifeFrameStack) started at the lost life
        while not (terminated or truncated):
            envs, actions = self.forced.forced()
            if not len(envs):
                break
            obs, reward, terminated, truncated, info = self._step(int(actions[0]))
            total += float(reward)
        if "episode_start" in info:
            info = {**info, "episode_start": started and not (terminated or truncated)}
        return obs, total, terminated, truncated, info

    def _step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = int(info.get("lives", 0))
        game_over = bool(terminated or truncated)
        life_lost = bool(lost_life(lives, self.lives, game_over))
        self.lives = lives
        self.forced.step(np.array([life_lost]), np.array([game_over]))
        return obs, reward, terminated, truncated, info

"""A continuous-control task small enough for CI: steer a point to the origin."""

import gymnasium as gym
import numpy as np


class ReachZero(gym.Env):
    """A point starts at a position ``p`` drawn from [−1, 1] and moves by ``0.25 a`` each step, the
    action ``a`` clipped to [−1, 1]; each step earns ``−|p|`` after the move. Episodes are cut at 20
    steps (a truncation, not a terminal). Observations are ``[p]``.

    The best policy steers straight in (``a = −p / 0.25`` clipped) and then holds still: −0.44 per
    episode on average (500 episodes). A random one (``a`` uniform in [−1, 1]) drifts: −11.6. Learning
    the first takes credit over the steps a move pays back in, through Q_ret and the stochastic
    dueling network's value, and a truncation that bootstraps.
    """

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.position = 0.0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = float(self.np_random.uniform(-1.0, 1.0)), 0
        return np.array([self.position], np.float32), {}

    def step(self, action):
        self.t += 1
        self.position += 0.25 * float(np.clip(action[0], -1.0, 1.0))
        return np.array([self.position], np.float32), -abs(self.position), False, self.t >= 20, {}


ENV_ID = "ReachZero-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=ReachZero)


class AimOffCentre(gym.Env):
    """One observation, ``[1]``; the action is a number in the Box [5, 10], and each step earns
    ``−(a − 7.5)²``; episodes are cut at 10 steps. A Gaussian policy whose mean starts near 0 in the
    action's units sends 5 (the clip) every step, where Q̃ is flat, and never moves: −62.5 an episode."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Box(5.0, 10.0, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([1.0], np.float32), -float(action[0] - 7.5) ** 2, False, self.t >= 10, {}


OFF_CENTRE_ID = "AimOffCentre-v0"
if OFF_CENTRE_ID not in gym.registry:
    gym.register(OFF_CENTRE_ID, entry_point=AimOffCentre)

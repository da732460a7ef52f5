"""A memory task small enough for CI: recall a cue shown at the start of the episode."""

import gymnasium as gym
import numpy as np


class CueRecall(gym.Env):
    """Step 0 shows a cue, +1 or −1; then ``delay`` blank steps; then a query. The action taken at
    the query earns 1 if it names the cue (action 1 for +1, 0 for −1), and ends the episode.

    Observations are ``[cue, query]``: ``[±1, 0]``, then ``[0, 0]``, then ``[0, 1]``. Actions before the
    query earn nothing. A policy without memory sees the same query whatever the cue, so it
    earns 0.5 on average at best; one that remembers earns 1.
    """

    def __init__(self, delay: int = 3):
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cue = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(2))
        self.t = 0
        return np.array([2.0 * self.cue - 1.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t <= self.delay:
            return np.zeros(2, np.float32), 0.0, False, False, {}
        if self.t == self.delay + 1:
            return np.array([0.0, 1.0], np.float32), 0.0, False, False, {}
        return np.zeros(2, np.float32), float(int(action) == self.cue), True, False, {}


ENV_ID = "CueRecall-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=CueRecall)

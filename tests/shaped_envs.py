"""Envs whose observations the trainer stores in another shape than the env's own, for the shapes a
user's torso is shown (tests/test_torsos.py): ``ShapedObs-v0`` with ``space=``

* ``box``: a float Box (2, 3); ``image``: a float image Box (3, 8, 8) in [0, 1]; ``grid``: a uint8
  Box (5, 5) of cell codes 0..9 (not pixels); ``bits``: MultiBinary (2, 3);
* ``dict``: a Dict of a Box (2, 3) ``pos`` and a Discrete(3) ``mode``; ``tuple``: the same as a Tuple;
* ``dict_image``: a Dict of an RGB ``camera`` (40, 40, 3) uint8 and a Box (2, 3) ``pos``;
* ``ordered``: a Dict of a Box (2, 3) ``z`` and a Discrete(3) ``a``, in that order (not sorted).

Each step's observation is random; action 1 earns 1 where the first number of the observation is
positive. Episodes last 10 steps. Registered on import (``--env shaped_envs:ShapedObs-v0`` with
``PYTHONPATH=tests``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

POS = gym.spaces.Box(-1, 1, (2, 3), np.float32)
SPACES = {
    "box": POS,
    "image": gym.spaces.Box(0, 1, (3, 8, 8), np.float32),
    "grid": gym.spaces.Box(0, 9, (5, 5), np.uint8),
    "bits": gym.spaces.MultiBinary([2, 3]),
    "dict": gym.spaces.Dict({"pos": POS, "mode": gym.spaces.Discrete(3)}),
    "tuple": gym.spaces.Tuple((POS, gym.spaces.Discrete(3))),
    "dict_image": gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (40, 40, 3), np.uint8), "pos": POS}),
    "ordered": gym.spaces.Dict([("z", POS), ("a", gym.spaces.Discrete(3))]),  # pairs: not sorted
}


class ShapedObs(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, space: str = "box"):
        self.observation_space = SPACES[space]
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.first = 0.0

    def _observe(self):
        observation = self.observation_space.sample()
        first = observation
        while isinstance(first, (dict, tuple)):
            first = first.get("pos", next(iter(first.values()))) if isinstance(first, dict) else first[0]
        self.first = float(np.asarray(first).flat[0]) - (0.5 if self.observation_space.dtype in (np.int8, np.uint8) else 0.0)
        return observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float((int(action) == 1) == (self.first > 0))
        self.t += 1
        return self._observe(), reward, self.t >= 10, False, {}


gym.register("ShapedObs-v0", entry_point=ShapedObs)

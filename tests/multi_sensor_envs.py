"""A multi-sensor task that needs both of its parts: a camera image and a switch.

``CueSwitch-v0``: each step the camera (an RGB image, height x width x 3, uint8) shows a bright
square in its left or its right half, at a random place; the switch (Discrete(2)) is 0 or 1 at
random. The rewarded action is the side of the square, swapped when the switch is 1: action
``side XOR switch`` earns 1, the other 0. An episode is ``length`` steps (terminated). The image
alone or the switch alone gets half the steps right, 0.5·length per episode; both, ``length``.

``switch=0`` or ``1`` fixes the switch (the image alone then tells the answer). ``space="tuple"`` gives the same observation as a Tuple (camera, switch). Registered on import,
so ``--env multi_sensor_envs:CueSwitch-v0`` works with ``PYTHONPATH=tests``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CueSwitch(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size: int = 48, length: int = 20, space: str = "dict", square: int = 8, switch: int = -1):
        self.size, self.length, self.square, self.switch = int(size), int(length), int(square), int(switch)
        camera = gym.spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)
        switch = gym.spaces.Discrete(2)
        if space == "dict":
            self.observation_space = gym.spaces.Dict({"camera": camera, "switch": switch})
        elif space == "tuple":
            self.observation_space = gym.spaces.Tuple((camera, switch))
        else:
            raise ValueError(f"space must be dict or tuple, got {space!r}")
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.answer = 0

    def _observe(self):
        side, switch = (int(v) for v in self.np_random.integers(0, 2, size=2))
        switch = switch if self.switch < 0 else self.switch
        self.answer = side ^ switch
        camera = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        half = self.size // 2
        row = int(self.np_random.integers(0, self.size - self.square + 1))
        col = int(self.np_random.integers(0, half - self.square + 1)) + side * half
        camera[row:row + self.square, col:col + self.square] = 255
        if isinstance(self.observation_space, gym.spaces.Dict):
            return {"camera": camera, "switch": switch}
        return (camera, switch)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.answer)
        self.t += 1
        return self._observe(), reward, self.t >= self.length, False, {}


gym.register("CueSwitch-v0", entry_point=CueSwitch)

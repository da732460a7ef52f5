"""Partially observed classic control, as rl-zoo registers it: ``CartPoleNoVel-v1`` is CartPole-v1
seen through the cart's position and the pole's angle only (the two velocities zeroed), 500 steps
at most. Registered on import (``--env partial_envs:CartPoleNoVel-v1`` with ``PYTHONPATH=tests``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class NoVelocity(gym.ObservationWrapper):
    """Zero CartPole's cart velocity and pole angular velocity (observation entries 1 and 3)."""

    def observation(self, observation):
        return (observation * np.array([1.0, 0.0, 1.0, 0.0], dtype=observation.dtype)).astype(observation.dtype)


def make_cartpole_no_velocity(**kwargs):
    return NoVelocity(gym.make("CartPole-v1", **kwargs))


if "CartPoleNoVel-v1" not in gym.registry:
    gym.register("CartPoleNoVel-v1", entry_point=make_cartpole_no_velocity)

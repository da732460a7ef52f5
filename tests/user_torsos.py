"""Torsos of a user's own, in Stable-Baselines3's features-extractor contract, for tests/test_torsos.py
(``--torso user_torsos:SmallTorso`` with ``tests`` on PYTHONPATH), and some that break it."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn


class SmallTorso(nn.Module):
    """A ReLU layer on the flattened observation; records the last batch it was given."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 32):
        super().__init__()
        self.features_dim = features_dim
        self.layer = nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(observation_space.shape).prod()), features_dim), nn.ReLU())
        self.seen: torch.Tensor | None = None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.seen = obs.detach()
        return self.layer(obs)


class NoFeaturesDim(nn.Module):
    def __init__(self, observation_space):
        super().__init__()
        self.layer = nn.Linear(4, 8)

    def forward(self, obs):
        return self.layer(obs)


class WrongWidth(SmallTorso):
    def forward(self, obs):
        return torch.zeros(obs.shape[0], self.features_dim + 1)


class Refuses(nn.Module):
    def __init__(self, observation_space, width: int = 8):
        super().__init__()
        raise ValueError(f"width {width} is not supported")


class NotAModule:
    features_dim = 8

    def __init__(self, observation_space):
        pass

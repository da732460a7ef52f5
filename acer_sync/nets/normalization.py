"""Running mean/std observation normalization, kept inside the network so checkpoints carry it."""

from __future__ import annotations

import torch
from torch import nn


class ObservationNormalizer(nn.Module):
    """x ↦ clip((x − mean) / √(var + ε), ±clip), with mean and var running over every observation seen.

    The statistics are buffers, not parameters: they are in the network's ``state_dict`` (so in
    every checkpoint, and restored on resume and in play.py), the optimizer never touches them,
    and :func:`acer_sync.nets.networks.polyak_update` copies them to the average network. Only the
    Runner calls :meth:`update`, with the observations it acts on; replayed observations are
    normalized with the current statistics, as Stable-Baselines3's VecNormalize does.

    :param shape: the shape of one observation.
    :param clip: the bound on each normalized feature.
    :param epsilon: added to the variance, and the initial count (as Baselines' RunningMeanStd).
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge a batch ``[B, *shape]`` into the running moments (Chan et al.'s parallel update)."""
        batch = obs.reshape(-1, *self.mean.shape).to(torch.float64)
        batch_count = batch.shape[0]
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        delta = batch_mean - self.mean
        total = self.count + batch_count
        new_mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta.pow(2) * self.count * batch_count / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(torch.float32)
        std = torch.sqrt(self.var + self.epsilon).to(torch.float32)
        return ((obs.float() - mean) / std).clamp(-self.clip, self.clip)

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


class ImportsWhatTorchHasNot(SmallTorso):
    """Its constructor fails to import a name: an ImportError of the class, not of its module."""

    def __init__(self, observation_space, features_dim: int = 32):
        from torch import no_such_name  # noqa: F401
        super().__init__(observation_space, features_dim)


class RefusesInTwoLines(nn.Module):
    def __init__(self, observation_space):
        super().__init__()
        raise ValueError("the first line\nthe second line")


class NotAModule:
    features_dim = 8

    def __init__(self, observation_space):
        pass


class PartsTorso(nn.Module):
    """For a Dict observation: a small convolution on each image part, the vector parts as they are,
    concatenated; records the last dict it was given."""

    def __init__(self, observation_space: gym.spaces.Dict, features_dim: int = 16):
        super().__init__()
        self.keys = list(observation_space.spaces)
        self.images = nn.ModuleDict()
        width = 0
        for key, box in observation_space.spaces.items():
            if len(box.shape) == 3:
                self.images[key] = nn.Sequential(nn.Conv2d(box.shape[0], 4, 8, stride=8), nn.ReLU(), nn.Flatten())
                with torch.no_grad():
                    width += self.images[key](torch.zeros(1, *box.shape)).shape[1]
            else:
                width += int(torch.tensor(box.shape).prod())
        self.out = nn.Sequential(nn.Linear(width, features_dim), nn.ReLU())
        self.features_dim = features_dim
        self.seen: dict[str, torch.Tensor] | None = None

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen = {key: part.detach() for key, part in obs.items()}
        parts = [self.images[key](obs[key]) if key in self.images else obs[key].flatten(1) for key in self.keys]
        return self.out(torch.cat(parts, dim=1))


class NormedTorso(nn.Module):
    """Linear → BatchNorm → ReLU → Dropout, which act differently in training and evaluation mode;
    records in ``MODES`` (of all instances) whether each forward ran in training mode, by batch size."""

    MODES: list[tuple[bool, int]] = []

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16):
        super().__init__()
        self.features_dim = features_dim
        inputs = int(torch.tensor(observation_space.shape).prod())
        self.layer = nn.Sequential(nn.Flatten(), nn.Linear(inputs, features_dim), nn.BatchNorm1d(features_dim), nn.ReLU(),
                                   nn.Dropout(0.5))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        NormedTorso.MODES.append((self.training, obs.shape[0]))
        return self.layer(obs)


class Float64Torso(SmallTorso):
    """Computes in float64 and returns float64 features (a user's choice the heads must not trip on)."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16):
        super().__init__(observation_space, features_dim)
        self.layer = self.layer.double()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.layer(obs.double())


class UnsavedStateTorso(SmallTorso):
    """Keeps the largest input seen in a buffer it does not save (``persistent=False``)."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16):
        super().__init__(observation_space, features_dim)
        self.register_buffer("running_max", torch.zeros(()), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.running_max.copy_(torch.maximum(self.running_max, obs.abs().max().detach()))
        return self.layer(obs)


class RebindingTorso(SmallTorso):
    """Keeps a running mean of its input in a buffer that its training-mode forward rebinds
    (``self.mean = ...``, a new tensor) rather than updating in place."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16):
        super().__init__(observation_space, features_dim)
        self.register_buffer("mean", torch.zeros(int(torch.tensor(observation_space.shape).prod())))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * obs.flatten(1).mean(0).detach()
        return self.layer(obs - self.mean.reshape(obs.shape[1:]))


class ShapeTorso(nn.Module):
    """Any Box or Dict of Boxes: each part flattened, concatenated, one layer; records the space it
    was built with and the last batch (or dict of batches) it was given."""

    def __init__(self, observation_space: gym.Space, features_dim: int = 8):
        super().__init__()
        self.built_with = observation_space
        boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
        self.layer = nn.Linear(sum(int(torch.tensor(box.shape).prod()) for box in boxes), features_dim)
        self.features_dim = features_dim
        self.seen = None

    def forward(self, obs) -> torch.Tensor:
        self.seen = {key: part.detach() for key, part in obs.items()} if isinstance(obs, dict) else obs.detach()
        parts = obs.values() if isinstance(obs, dict) else [obs]
        return torch.relu(self.layer(torch.cat([part.flatten(1) for part in parts], dim=1)))


class NanWhenActing(SmallTorso):
    """Finite for its first ``finite_acts`` forwards in evaluation mode (acting), NaN after (the
    updates, in training mode, stay finite): a torso that divides by zero on some input."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16, finite_acts: int = 0):
        super().__init__(observation_space, features_dim)
        self.finite_acts = finite_acts
        self.acts = 0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.layer(obs)
        if not self.training:
            self.acts += 1
            if self.acts > self.finite_acts:
                return out * float("nan")
        return out


class NanAtSeven(SmallTorso):
    """NaN features for an observation whose first number is 7 (tests/faulty_envs.py's ``seven_obs``
    and ``seven_at_cut`` return one), finite elsewhere."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.layer(obs)
        return torch.where((obs[:, 0] == 7.0).unsqueeze(1), torch.full_like(out, float("nan")), out)


class SyncsWhileCapturing(SmallTorso):
    """Waits for the device (``torch.cuda.synchronize``) while a CUDA graph records, which the
    capture refuses, and nowhere else: acting's warm-up passes, its recording fails."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.is_cuda and torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return super().forward(obs)


#: What :class:`FailsAt` raises, by name.
FAILURES = {
    "runtime": lambda: RuntimeError("torso bug"),
    "oom": lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.20 GiB is free. "
        "Including non-PyTorch memory, this process has 77.90 GiB memory in use."),
    "allocator": lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: "
                                      "you tried to allocate 123456789 bytes. Error code 12 (Cannot allocate memory)"),
    "memory": MemoryError,
    "keyboard": KeyboardInterrupt,
}


class FailsAt(SmallTorso):
    """Raises ``error`` (a name in :data:`FAILURES`) in its ``at``-th pass of ``where``: ``learn``, a
    pass with gradients (an update's), or ``act``, a batch of at most 4 observations without (acting's,
    in a run of up to 4 envs)."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16, error: str = "runtime",
                 where: str = "learn", at: int = 10):
        super().__init__(observation_space, features_dim)
        self.error, self.where, self.at, self.passes = error, where, at, 0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        learning = torch.is_grad_enabled()
        if (learning and self.where == "learn") or (not learning and self.where == "act" and obs.shape[0] <= 4):
            self.passes += 1
            if self.passes == self.at:
                raise FAILURES[self.error]()
        return super().forward(obs)

"""A run's network from its settings: the one place that turns ``config.network`` and the env into a net."""

from __future__ import annotations

import numpy as np
import torch

from acer_sync.base.config import Config, hidden_sizes
from acer_sync.base.errors import UserError
from acer_sync.nets.networks import (
    RECURRENT_ARCHS,
    ActorCritic,
    GaussianActorCritic,
    Network,
    RecurrentActorCritic,
    RecurrentGaussianActorCritic,
)
from atari.envs import EnvInfo


def select_device(name: str) -> torch.device:
    """``auto`` (cuda if available), ``cpu`` or ``cuda``; a UserError where CUDA was asked for and is missing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def network_arch(info: EnvInfo, config: Config) -> str:
    """The torso ``config.network`` asks for, ``auto`` resolved (cnn for frames, mlp for vectors),
    or a one-line UserError where it does not fit the observations."""
    arch = info.arch if config.network == "auto" else config.network
    frames = info.arch == "cnn"
    if frames != (arch in ("cnn", "cnn_lstm")):
        fits = "cnn or cnn_lstm for image" if frames else "mlp or lstm for vector"
        raise UserError(f"--network {arch} does not fit {info.env_id}; use {fits} observations")
    if info.continuous and frames:
        raise UserError(f"{info.env_id} has image observations and continuous actions; the Gaussian policy takes vectors")
    return arch


def build_model(info: EnvInfo, config: Config) -> Network:
    """A softmax actor-critic for discrete actions, a Gaussian policy with an SDN for a Box, on the
    torso of ``config.network`` (feed-forward, or with an LSTM)."""
    arch, hidden = network_arch(info, config), hidden_sizes(config)
    recurrent = arch in RECURRENT_ARCHS
    if info.continuous:
        half_width = (np.asarray(info.action_high) - np.asarray(info.action_low)) / 2.0
        init_std = (config.policy_std * half_width).tolist()
        if recurrent:
            return RecurrentGaussianActorCritic(
                info.obs_shape, info.n_actions, arch, hidden, init_std, config.lstm_size, config.normalize_obs
            )
        return GaussianActorCritic(info.obs_shape, info.n_actions, hidden, init_std, config.normalize_obs)
    if recurrent:
        return RecurrentActorCritic(info.obs_shape, info.n_actions, arch, hidden, config.lstm_size, config.normalize_obs)
    return ActorCritic(info.obs_shape, info.n_actions, arch, hidden, config.normalize_obs)

"""Heads: the policy and the critic on the features (a torso's, or an LSTM's h_t).

* :class:`CategoricalHead`: π(·|x) = softmax(logits) and Q(x, ·), for discrete actions;
* :class:`GaussianHead`: π(·|x) = N(m(x), diag σ²) with a learned, state-independent log σ, and
  the stochastic dueling network (Wang et al. 2017, §5): V(x), and A(x, a) from an MLP of
  [x, a]; Q̃ is assembled from them by :func:`acer_sync.math.losses.sdn_q`.

Each head may put an MLP of its own (``net_arch``) between the features and each output, as
SB3's ``net_arch=dict(pi=..., qf=...)``: vector observations get the tanh MLPs this way, one per
output, so that the critic's large regression gradients do not swamp the policy's features.
:meth:`CategoricalHead.init_outputs` and :meth:`GaussianHead.init_outputs` apply the scheme of
:mod:`acer_sync.nets.networks` to the output layers.
"""

from __future__ import annotations

import torch
from torch import nn

from acer_sync.nets.torsos import MLP, init_orthogonal

#: The range log σ is clamped to: σ from 0.0067 to 7.4 (in the action's units, or in half-widths of
#: the Box with ``action_scale``). It keeps importance weights and the KL's 1/σ² finite, whatever
#: the optimizer does to log σ.
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """π = softmax(logits) over the last dimension, computed in float32 whatever the logits' dtype.

    Under bf16 autocast (:mod:`acer_sync.nets.precision`) the logits are bf16; CUDA's autocast runs the
    softmax in float32 by itself, CPU's would round π to bf16's 8 significant bits. For
    float32 logits this is the plain softmax, bit for bit.
    """
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


class CategoricalHead(nn.Module):
    """Softmax π(·|x) and Q(x, ·), ``[B, A]`` each, each through its own MLP of ``net_arch``."""

    def __init__(self, features_dim: int, n_actions: int, net_arch: tuple[int, ...] = (), activation: str = "tanh"):
        super().__init__()
        self.pi_mlp = MLP(features_dim, net_arch, activation)
        self.q_mlp = MLP(features_dim, net_arch, activation)
        self.pi = nn.Linear(self.pi_mlp.features_dim, n_actions)
        self.q = nn.Linear(self.q_mlp.features_dim, n_actions)
        self.shared = not net_arch  # the outputs sit on the shared features

    def parameter_bounds(self) -> list[tuple[nn.Parameter, float, float]]:
        """None: every parameter is free."""
        return []

    def init_outputs(self) -> None:
        """π's logits orthogonal, gain 0.01; Q's orthogonal, gain 1, where it sits on the shared features."""
        init_orthogonal(self.pi, 0.01)
        if self.shared:
            init_orthogonal(self.q, 1.0)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return probabilities(self.pi(self.pi_mlp(features))), self.q(self.q_mlp(features))

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        """π(·|x) alone (acting and the average network need only this)."""
        return probabilities(self.pi(self.pi_mlp(features)))

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """V(x) = Σ_a π(a|x) Q(x, a), ``[B]``."""
        pi, q = self(features)
        return (pi * q).sum(-1)


class GaussianHead(nn.Module):
    """φ = [m(x), log σ] and the SDN's V(x) and A(x, a).

    :param features_dim: the features' size.
    :param action_dim: d.
    :param net_arch: the MLP before the mean and before V (empty: the outputs sit on the features).
    :param advantage_arch: the MLP of [x, a] before A.
    :param init_std: σ at initialisation, per action dimension.
    :param action_scale: ``[centre, half_width]`` of the Box per dimension: the mean is
        m(x) = centre + m̂(x), so that it starts at the Box's centre; A takes a − centre; and log σ
        is kept in [−5, 2] + log half_width (σ from 0.0067 to 7.4 half-widths). Everything stays in
        the action's units, so a Box centred on 0 whose σ stays inside both ranges trains bit for
        bit as without it. None: centre 0, bounds [−5, 2] (the runs before it).
    """

    def __init__(self, features_dim: int, action_dim: int, net_arch: tuple[int, ...], advantage_arch: tuple[int, ...],
                 init_std: list[float], activation: str = "tanh", action_scale: list[list[float]] | None = None):
        super().__init__()
        if len(init_std) != action_dim or min(init_std) <= 0:
            raise ValueError(f"init_std must be {action_dim} positive numbers, got {init_std}")
        centre, half_width = action_scale if action_scale is not None else ([0.0] * action_dim, [1.0] * action_dim)
        if len(centre) != action_dim or len(half_width) != action_dim or min(half_width) <= 0:
            raise ValueError(f"action_scale must be [centre, half_width] of {action_dim} numbers each, half_width > 0")
        self.centred = any(value != 0.0 for value in centre)
        #: Buffers that are the spec's constants, not state: never copied between networks.
        self.spec_constants = frozenset({"action_centre", "log_std_low", "log_std_high"})
        # constants of the spec, not state: on the network's device, and out of its state_dict
        self.register_buffer("action_centre", torch.tensor(centre, dtype=torch.float32), persistent=False)
        log_half_width = torch.log(torch.tensor(half_width, dtype=torch.float32))
        self.register_buffer("log_std_low", LOG_STD_MIN + log_half_width, persistent=False)
        self.register_buffer("log_std_high", LOG_STD_MAX + log_half_width, persistent=False)
        self.mean_mlp = MLP(features_dim, net_arch, activation)
        self.mean = nn.Linear(self.mean_mlp.features_dim, action_dim)
        self.log_std = nn.Parameter(torch.log(torch.tensor(init_std)))
        self.value_mlp = MLP(features_dim, net_arch, activation)
        self.value = nn.Linear(self.value_mlp.features_dim, 1)
        self.advantage_mlp = MLP(features_dim + action_dim, advantage_arch, activation)
        self.advantage = nn.Linear(self.advantage_mlp.features_dim, 1)
        self.shared = not net_arch  # the mean and V sit on the shared features

    def init_outputs(self) -> None:
        """The mean orthogonal, gain 0.01; V orthogonal, gain 1, where it sits on the shared features
        (A always has its MLP of [x, a], and keeps PyTorch's default)."""
        init_orthogonal(self.mean, 0.01)
        if self.shared:
            init_orthogonal(self.value, 1.0)

    def parameter_bounds(self) -> list[tuple[nn.Parameter, torch.Tensor, torch.Tensor]]:
        """log σ's bounds (per dimension), which the update projects it back into after each step: the clamp in
        :meth:`policy_of` passes no gradient beyond a bound, so a log σ that a step carried past one
        (σ a state-independent parameter) stayed there for the rest of the run."""
        return [(self.log_std, self.log_std_low, self.log_std_high)]

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        """φ = [m(x), log σ], ``[B, 2d]``."""
        mean = self.mean(self.mean_mlp(features))
        if self.centred:
            mean = self.action_centre + mean
        log_std = self.log_std.clamp(self.log_std_low, self.log_std_high).expand_as(mean)  # all the gradient at a bound
        return torch.cat([mean, log_std], dim=-1)

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """V(x), ``[B]``."""
        return self.value(self.value_mlp(features)).squeeze(-1)

    def advantage_of(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """A(x, a) for features ``[B, F]`` and actions ``[B, k, d]``: ``[B, k]``.

        Each observation is paired with its k actions (the taken one, the n SDN samples u_i, the
        bias-correction sample a').
        """
        k = actions.shape[1]
        actions = actions.float() - self.action_centre if self.centred else actions.float()
        paired = torch.cat([features.unsqueeze(1).expand(-1, k, -1), actions], dim=-1)
        return self.advantage(self.advantage_mlp(paired.reshape(-1, paired.shape[-1]))).reshape(-1, k)

"""The actor-critic networks (softmax policy with a Q head; Gaussian policy with a stochastic
dueling network) and Polyak averaging.

Every network has one interface, for feed-forward and recurrent nets alike, so that acting
(:class:`acer_sync.rollout.actor.Actor`) and the update (:class:`acer_sync.training.acer.ACER`) never ask which
kind they hold:

* ``initial_state(n)``: the recurrent state of n envs at an episode start, a tuple of tensors
  ``[n, ...]`` named by ``state_shapes`` (empty for a feed-forward net);
* ``unroll(obs [T, N, ...], firsts [T, N], state) -> (features [T·N, ...], state)``: the torso over
  T steps from ``state``, reset to ``initial_state`` before every observation that starts an
  episode; a feed-forward net only reshapes (and normalizes);
* ``step(obs [N, ...], state, first [N])``: ``unroll`` of one step, for acting;
* heads on the features: ``policy_of`` gives the statistics φ of the distribution
  (:mod:`acer_sync.nets.distributions`), ``value_of`` V(x); the softmax net's ``forward`` gives (π, Q),
  the Gaussian net's ``advantage_of`` A(x, a);
* ``spec()``: the constructor arguments a checkpoint records.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from acer_sync.nets.normalization import ObservationNormalizer

#: The range log σ is clamped to: σ from 0.0067 to 7.4 (in the action's units). It keeps
#: importance weights and the KL's 1/σ² finite, whatever the optimizer does to log σ.
LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0


def init_orthogonal(layer: nn.Module, gain: float) -> None:
    """Baselines' initialisation of one layer: orthogonal weights scaled by ``gain``, zero biases."""
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)


class NatureCNN(nn.Module):
    """The Nature-DQN torso (Mnih et al. 2015): three convolutions and a 512-unit layer.

    Takes uint8 frames ``[B, stack, H, W]`` (Atari: ``[B, 4, 84, 84]``) or, for images with
    channels, ``[B, stack, C, H, W]``, whose stack and channel axes become the ``in_channels``
    input channels. The conversion to float and the 1/255 scale happen here, on whatever device
    the module lives on.
    """

    def __init__(self, in_channels: int, frame_shape: tuple[int, int]):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, in_channels, *frame_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, 512), nn.ReLU())
        self.out_features = 512

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # channels_last (NHWC) convolutions measured 11% faster per update on the 2-core CPU. The
        # frames go straight to the dtype the convolutions compute in: float32, or bf16 under bf16
        # autocast, where a float32 copy first would cost autocast two more passes over the batch
        # (the update measured 1.5x faster than fp32 with it, 2.2x without it).
        device_type = obs.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32
        frames = obs.reshape(obs.shape[0], -1, *obs.shape[-2:])  # [B, stack·C, H, W]
        frames = (frames.to(dtype) / 255.0).contiguous(memory_format=torch.channels_last)
        return self.fc(self.convs(frames))


class MLP(nn.Module):
    """A tanh MLP torso for vector observations ``[B, stack, D]`` (the stack is flattened)."""

    def __init__(self, in_features: int, hidden: Iterable[int]):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.Tanh()]
            width = size
        self.body = nn.Sequential(*layers)
        self.out_features = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs.float())


State = tuple[torch.Tensor, ...]


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """π = softmax(logits) over the last dimension, computed in float32 whatever the logits' dtype.

    Under bf16 autocast (:mod:`acer_sync.nets.precision`) the logits are bf16; CUDA's autocast runs the
    softmax in float32 by itself, CPU's would round π to bf16's 8 significant bits. For
    float32 logits this is the plain softmax, bit for bit.
    """
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


class FeedForward:
    """The state interface of a feed-forward network: no state, and ``unroll`` only reshapes.

    ``features`` are the (normalized) observations themselves, flattened over ``[T, N]``; the heads
    apply the torsos.
    """

    state_shapes: dict[str, tuple[int, ...]] = {}

    def initial_state(self, n: int) -> State:
        return ()

    def unroll(self, obs: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Features ``[T·N, ...]`` of observations ``[T, N, ...]``; ``firsts`` and ``state`` are unused."""
        if obs.shape[:2] != firsts.shape:
            raise ValueError(f"obs {tuple(obs.shape)} and firsts {tuple(firsts.shape)} disagree on [T, N]")
        return self._normalized(obs.reshape(obs.shape[0] * obs.shape[1], *obs.shape[2:])), state

    def step(self, obs: torch.Tensor, state: State, first: torch.Tensor) -> tuple[torch.Tensor, State]:
        """``unroll`` of one step: features ``[N, ...]`` of observations ``[N, ...]``."""
        return self.unroll(obs.unsqueeze(0), first.unsqueeze(0), state)


class ActorCritic(FeedForward, nn.Module):
    """A policy head π(·|x) (softmax) and a critic head Q(x, ·) on top of torsos.

    ``forward`` returns ``(pi, q)``, both ``[B, A]``. ``arch`` is ``"cnn"`` for frames: one shared
    Nature-CNN torso, as in the paper and Baselines. ``"mlp"`` is for vector observations: two
    separate MLP torsos, one for π and one for Q (as Stable-Baselines' ACER MlpPolicy), so that the
    critic's large regression gradients do not swamp the policy's features. :meth:`spec`
    identifies the architecture in checkpoints.
    """

    def __init__(
        self, obs_shape: tuple[int, ...], n_actions: int, arch: str, hidden: tuple[int, ...] = (64, 64),
        normalize_obs: bool = False,
    ):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.n_actions = n_actions
        self.arch = arch
        self.hidden = tuple(hidden) if arch == "mlp" else ()
        if normalize_obs and arch != "mlp":
            raise ValueError("observation normalization is for vector observations (the mlp architecture)")
        self.normalizer = ObservationNormalizer(self.obs_shape) if normalize_obs else None
        if arch == "cnn":
            self.torso: nn.Module = NatureCNN(math.prod(obs_shape[:-2]), tuple(obs_shape[-2:]))
            self.q_torso: nn.Module | None = None
        elif arch == "mlp":
            in_features = 1
            for size in obs_shape:
                in_features *= size
            self.torso = MLP(in_features, hidden)
            self.q_torso = MLP(in_features, hidden)
        else:
            raise ValueError(f"unknown architecture {arch!r}")
        self.policy_head = nn.Linear(self.torso.out_features, n_actions)
        self.q_head = nn.Linear((self.q_torso or self.torso).out_features, n_actions)
        if arch == "cnn":
            self._init_like_baselines()
            self.torso.to(memory_format=torch.channels_last)

    def _init_like_baselines(self) -> None:
        """Baselines' initialisation for the Atari net: orthogonal weights and zero biases.

        Gain √2 for the ReLU torso, 0.01 for the policy logits (so π starts near uniform) and 1
        for Q. With PyTorch's default (Kaiming-uniform, a = √5) the activations' RMS falls by
        2.1–2.5× at each of the four layers (0.58 at the input, 0.020 at the 512 features, on
        random frames), where this init keeps it near 0.35; Q then starts 10× smaller.
        """
        layers = [m for m in self.torso.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        for layer, gain in [(m, 2**0.5) for m in layers] + [(self.policy_head, 0.01), (self.q_head, 1.0)]:
            init_orthogonal(layer, gain)

    def spec(self) -> dict:
        """The constructor arguments: what a checkpoint must match to be loaded into this net."""
        return dict(
            obs_shape=list(self.obs_shape), n_actions=self.n_actions, arch=self.arch, hidden=list(self.hidden),
            policy="categorical", normalize_obs=self.normalizer is not None,
        )

    @classmethod
    def from_spec(cls, spec: dict) -> "ActorCritic":
        """A new, freshly initialised network with the architecture :meth:`spec` describes."""
        return cls(
            tuple(spec["obs_shape"]), int(spec["n_actions"]), spec["arch"], tuple(spec["hidden"]),
            bool(spec["normalize_obs"]),
        )

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.normalizer is None else self.normalizer(obs)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(π(·|x), Q(x, ·)), ``[B, A]`` each: the training pass (what ``--compile`` compiles)."""
        torso_features = self.torso(features)
        pi = probabilities(self.policy_head(torso_features))
        q_features = torso_features if self.q_torso is None else self.q_torso(features)
        return pi, self.q_head(q_features)

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        """π(·|x) alone, skipping the Q head and torso (acting and the average network need only this)."""
        return probabilities(self.policy_head(self.torso(features)))

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """V(x) = Σ_a π(a|x) Q(x, a), ``[B]``."""
        pi, q = self(features)
        return (pi * q).sum(-1)


class GaussianActorCritic(FeedForward, nn.Module):
    """A Gaussian policy and a stochastic dueling network (Wang et al. 2017, §5).

    * π(·|x) = N(m_θ(x), diag σ²): an MLP for the mean, and a learned log σ that does not depend
      on the state (one parameter per action dimension), clamped to [``LOG_STD_MIN``,
      ``LOG_STD_MAX``]. The paper keeps σ fixed; a learned, state-independent σ starts where a
      fixed one would (``init_std``) and lets the policy narrow as it improves.
    * The SDN: a deterministic V(x) and an advantage A(x, a) that takes the action as input
      (each its own MLP); Q̃ is assembled from them by :func:`acer_sync.math.losses.sdn_q`.

    ``policy_of`` returns φ = [m, log σ], ``[B, 2d]``. Observations go through the running
    normalizer first when ``normalize_obs`` is set.

    :param obs_shape: ``(stack, D)``.
    :param action_dim: d.
    :param hidden: MLP layer sizes, for each of the three MLPs.
    :param init_std: σ at initialisation, per action dimension.
    :param normalize_obs: normalize observations with running statistics.
    """

    def __init__(
        self, obs_shape: tuple[int, ...], action_dim: int, hidden: tuple[int, ...], init_std: Iterable[float],
        normalize_obs: bool,
    ):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.action_dim = action_dim
        self.hidden = tuple(hidden)
        self.init_std = [float(s) for s in init_std]
        if len(self.init_std) != action_dim or min(self.init_std) <= 0:
            raise ValueError(f"init_std must be {action_dim} positive numbers, got {self.init_std}")
        in_features = math.prod(self.obs_shape)
        self.normalizer = ObservationNormalizer(self.obs_shape) if normalize_obs else None
        self.torso = MLP(in_features, hidden)
        self.mean_head = nn.Linear(self.torso.out_features, action_dim)
        self.log_std = nn.Parameter(torch.log(torch.tensor(self.init_std)))
        self.value_torso = MLP(in_features, hidden)
        self.value_head = nn.Linear(self.value_torso.out_features, 1)
        self.advantage_torso = MLP(in_features + action_dim, hidden)
        self.advantage_head = nn.Linear(self.advantage_torso.out_features, 1)
        # A small initial mean keeps the first actions near the middle of the Box.
        init_orthogonal(self.mean_head, 0.01)

    def spec(self) -> dict:
        return dict(
            obs_shape=list(self.obs_shape), n_actions=self.action_dim, arch="mlp", hidden=list(self.hidden),
            policy="gaussian", normalize_obs=self.normalizer is not None, init_std=list(self.init_std),
        )

    @classmethod
    def from_spec(cls, spec: dict) -> "GaussianActorCritic":
        return cls(
            tuple(spec["obs_shape"]), int(spec["n_actions"]), tuple(spec["hidden"]), spec["init_std"],
            bool(spec["normalize_obs"]),
        )

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() if self.normalizer is None else self.normalizer(obs)

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        """φ = [m_θ(x), log σ], ``[B, 2d]``."""
        mean = self.mean_head(self.torso(features))
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).expand_as(mean)
        return torch.cat([mean, log_std], dim=-1)

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """V(x), ``[B]``."""
        return self.value_head(self.value_torso(features)).squeeze(-1)

    def advantage_of(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """A(x, a) for features ``[B, ...]`` and actions ``[B, k, d]``: ``[B, k]``.

        Each observation is paired with its k actions (the taken one, the n SDN samples u_i, the
        bias-correction sample a').
        """
        features = features.flatten(1)  # [B, D]
        k = actions.shape[1]
        paired = torch.cat([features.unsqueeze(1).expand(-1, k, -1), actions.float()], dim=-1)
        return self.advantage_head(self.advantage_torso(paired.reshape(-1, paired.shape[-1]))).reshape(-1, k)


#: The recurrent architectures: an MLP or the Nature CNN, then one LSTM layer.
RECURRENT_ARCHS = ("lstm", "cnn_lstm")


class Recurrent(nn.Module):
    """The recurrent part shared by both recurrent nets: a torso, then an LSTM cell unrolled in time.

    ``arch`` ``"lstm"`` puts a tanh MLP (``hidden``) before the LSTM, for vector observations;
    ``"cnn_lstm"`` the Nature CNN, for frames. The features the heads see are the LSTM's output h_t.
    The state is ``(h, c)``, ``[N, lstm_size]`` each, zero at an episode start: :meth:`unroll`
    zeroes it before every observation whose ``firsts`` flag is set (Baselines' masks), so acting
    step by step and replaying a stored segment from its stored state compute the same thing.
    """

    def _build_core(self, obs_shape: tuple[int, ...], arch: str, hidden: tuple[int, ...], lstm_size: int,
                    normalize_obs: bool) -> None:
        if arch not in RECURRENT_ARCHS:
            raise ValueError(f"unknown recurrent architecture {arch!r}")
        if normalize_obs and arch != "lstm":
            raise ValueError("observation normalization is for vector observations (the lstm architecture)")
        self.obs_shape = tuple(obs_shape)
        self.arch = arch
        self.hidden = tuple(hidden) if arch == "lstm" else ()
        self.lstm_size = lstm_size
        self.normalizer = ObservationNormalizer(self.obs_shape) if normalize_obs else None
        if arch == "cnn_lstm":
            self.torso: nn.Module = NatureCNN(math.prod(obs_shape[:-2]), tuple(obs_shape[-2:]))
            for layer in self.torso.modules():
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    init_orthogonal(layer, 2**0.5)
            self.torso.to(memory_format=torch.channels_last)
        else:
            self.torso = MLP(math.prod(self.obs_shape), hidden)
        self.lstm = nn.LSTMCell(self.torso.out_features, lstm_size)
        self.state_shapes = {"h": (lstm_size,), "c": (lstm_size,)}

    def initial_state(self, n: int) -> State:
        weight = self.lstm.weight_hh
        zeros = torch.zeros(n, self.lstm_size, dtype=weight.dtype, device=weight.device)
        return zeros, zeros.clone()

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalizer is not None:
            return self.normalizer(obs)
        return obs if self.arch == "cnn_lstm" else obs.float()

    def unroll(self, obs: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """h_t for observations ``[T, N, ...]`` from ``state`` (the state before observation 0):
        features ``[T·N, lstm_size]`` and the state after observation T−1.

        (h, c) ← 0 where ``firsts[t]``; then (h, c) ← LSTM(torso(x_t), (h, c)).
        """
        T, N = obs.shape[:2]
        if firsts.shape != (T, N):
            raise ValueError(f"obs {tuple(obs.shape)} and firsts {tuple(firsts.shape)} disagree on [T, N]")
        h, c = state
        if h.shape != (N, self.lstm_size) or c.shape != (N, self.lstm_size):
            raise ValueError(f"the state must be two [{N}, {self.lstm_size}] tensors, got {tuple(h.shape)}, {tuple(c.shape)}")
        inputs = self.torso(self._normalized(obs.reshape(T * N, *obs.shape[2:]))).reshape(T, N, -1)
        keep = (~firsts).to(inputs.dtype).unsqueeze(-1)  # [T, N, 1]
        outputs = []
        for t in range(T):
            h, c = self.lstm(inputs[t], (h * keep[t], c * keep[t]))
            outputs.append(h)
        return torch.stack(outputs).reshape(T * N, self.lstm_size), (h, c)

    def step(self, obs: torch.Tensor, state: State, first: torch.Tensor) -> tuple[torch.Tensor, State]:
        """``unroll`` of one step: features ``[N, lstm_size]`` and the next state."""
        return self.unroll(obs.unsqueeze(0), first.unsqueeze(0), state)


class RecurrentActorCritic(Recurrent):
    """Softmax π(·|h_t) and Q(h_t, ·) heads on an LSTM (:class:`Recurrent`); ``forward`` gives (π, Q)."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, arch: str, hidden: tuple[int, ...] = (64, 64),
                 lstm_size: int = 128, normalize_obs: bool = False):
        super().__init__()
        self._build_core(obs_shape, arch, hidden, lstm_size, normalize_obs)
        self.n_actions = n_actions
        self.policy_head = nn.Linear(lstm_size, n_actions)
        self.q_head = nn.Linear(lstm_size, n_actions)
        for layer, gain in ((self.policy_head, 0.01), (self.q_head, 1.0)):
            init_orthogonal(layer, gain)

    def spec(self) -> dict:
        return dict(
            obs_shape=list(self.obs_shape), n_actions=self.n_actions, arch=self.arch, hidden=list(self.hidden),
            policy="categorical", normalize_obs=self.normalizer is not None, lstm_size=self.lstm_size,
        )

    @classmethod
    def from_spec(cls, spec: dict) -> "RecurrentActorCritic":
        return cls(
            tuple(spec["obs_shape"]), int(spec["n_actions"]), spec["arch"], tuple(spec["hidden"]),
            int(spec["lstm_size"]), bool(spec["normalize_obs"]),
        )

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(π(·|h), Q(h, ·)), ``[B, A]`` each."""
        return probabilities(self.policy_head(features)), self.q_head(features)

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        return probabilities(self.policy_head(features))

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        """V = Σ_a π(a|h) Q(h, a), ``[B]``."""
        pi, q = self(features)
        return (pi * q).sum(-1)


class RecurrentGaussianActorCritic(Recurrent):
    """A Gaussian policy and a stochastic dueling network on an LSTM (:class:`Recurrent`).

    As :class:`GaussianActorCritic`, with h_t in place of the observation: the mean m(h_t), a
    learned state-independent log σ, V(h_t), and A(h_t, a) from an MLP of [h_t, a].
    """

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, arch: str, hidden: tuple[int, ...],
                 init_std: Iterable[float], lstm_size: int = 128, normalize_obs: bool = False):
        super().__init__()
        self._build_core(obs_shape, arch, hidden, lstm_size, normalize_obs)
        self.action_dim = action_dim
        self.init_std = [float(s) for s in init_std]
        if len(self.init_std) != action_dim or min(self.init_std) <= 0:
            raise ValueError(f"init_std must be {action_dim} positive numbers, got {self.init_std}")
        self.mean_head = nn.Linear(lstm_size, action_dim)
        self.log_std = nn.Parameter(torch.log(torch.tensor(self.init_std)))
        self.value_head = nn.Linear(lstm_size, 1)
        self.advantage_torso = MLP(lstm_size + action_dim, hidden or (64,))
        self.advantage_head = nn.Linear(self.advantage_torso.out_features, 1)
        init_orthogonal(self.mean_head, 0.01)

    def spec(self) -> dict:
        return dict(
            obs_shape=list(self.obs_shape), n_actions=self.action_dim, arch=self.arch, hidden=list(self.hidden),
            policy="gaussian", normalize_obs=self.normalizer is not None, init_std=list(self.init_std),
            lstm_size=self.lstm_size,
        )

    @classmethod
    def from_spec(cls, spec: dict) -> "RecurrentGaussianActorCritic":
        return cls(
            tuple(spec["obs_shape"]), int(spec["n_actions"]), spec["arch"], tuple(spec["hidden"]), spec["init_std"],
            int(spec["lstm_size"]), bool(spec["normalize_obs"]),
        )

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        """φ = [m(h), log σ], ``[B, 2d]``."""
        mean = self.mean_head(features)
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).expand_as(mean)
        return torch.cat([mean, log_std], dim=-1)

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        return self.value_head(features).squeeze(-1)

    def advantage_of(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """A(h, a) for features ``[B, H]`` and actions ``[B, k, d]``: ``[B, k]``."""
        k = actions.shape[1]
        paired = torch.cat([features.unsqueeze(1).expand(-1, k, -1), actions.float()], dim=-1)
        return self.advantage_head(self.advantage_torso(paired.reshape(-1, paired.shape[-1]))).reshape(-1, k)


Network = ActorCritic | GaussianActorCritic | RecurrentActorCritic | RecurrentGaussianActorCritic


def network_from_spec(spec: dict) -> Network:
    """A new, freshly initialised network of any kind from its :meth:`spec` (a checkpoint's
    spec of any format, once :func:`acer_sync.training.checkpoint.migrate` brought it up to date)."""
    gaussian = spec["policy"] == "gaussian"
    if spec["arch"] in RECURRENT_ARCHS:
        return (RecurrentGaussianActorCritic if gaussian else RecurrentActorCritic).from_spec(spec)
    return (GaussianActorCritic if gaussian else ActorCritic).from_spec(spec)


@torch.no_grad()
def polyak_update(average: nn.Module, online: nn.Module, alpha: float) -> None:
    """θ_a ← α θ_a + (1 − α) θ, in place, for every parameter (Wang et al. 2017, Sec. 3.3).

    Works on the parameter tensors themselves (not on rebound names), so the average network
    really moves: each parameter moves by exactly (1 − α) of its distance to the online one.
    Buffers (the observation normalizer's running statistics) are copied, not averaged: both
    networks must see observations normalized the same way.
    """
    for avg_buffer, online_buffer in zip(average.buffers(), online.buffers()):
        avg_buffer.copy_(online_buffer)
    avg_params = list(average.parameters())
    online_params = list(online.parameters())
    if len(avg_params) != len(online_params):
        raise ValueError("average and online networks differ in their parameters")
    torch._foreach_mul_(avg_params, alpha)
    torch._foreach_add_(avg_params, online_params, alpha=1.0 - alpha)

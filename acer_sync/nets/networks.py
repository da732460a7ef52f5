"""The actor-critic network: a torso, a memory and a head, composed (and Polyak averaging).

One class, :class:`ActorCriticNet`, for every kind: a torso (:mod:`acer_sync.nets.torsos`: the
flattened vector, the Nature CNN, an MLP before an LSTM, the multi-input torso of an image and a
vector, or a user's own class) turns observations
into features, a memory (:mod:`acer_sync.nets.memory`: none, or an LSTM) carries a state, and a
head (:mod:`acer_sync.nets.heads`) gives the policy and the critic. Acting
(:class:`acer_sync.rollout.actor.Actor`) and the update (:class:`acer_sync.training.acer.ACER`)
use one interface and never ask which kind they hold:

* ``initial_state(n)``: the recurrent state of n envs at an episode start, a tuple of tensors
  ``[n, ...]`` named by ``state_shapes`` (empty without memory);
* ``unroll(obs [T, N, ...], firsts [T, N], state) -> (features [T·N, F], state)`` (``obs`` a
  dict of such tensors by part key for a multi-part observation): normalizer,
  torso and memory over T steps from ``state``, reset to ``initial_state`` before every
  observation that starts an episode;
* ``step(obs [N, ...], state, first [N])``: ``unroll`` of one step, for acting;
* the head on the features: ``policy_of`` gives the statistics φ of the distribution
  (:mod:`acer_sync.nets.distributions`), ``value_of`` V(x); the categorical net's ``forward``
  gives (π, Q), the Gaussian net's ``advantage_of`` A(x, a);
* ``spec()``: what a checkpoint records to build the same network again (:func:`network_from_spec`).

The one place that turns names into parts is :func:`network_from_spec`; the one that turns a
run's settings into a spec, :func:`acer_sync.nets.build.build_model`.

**Initialisation**, one scheme, applied once every part exists (:meth:`ActorCriticNet.initialise`):

1. every layer starts at PyTorch's default (the MLPs, the LSTM);
2. the Nature CNN's layers (each image part's too): orthogonal, gain √2, zero biases (Baselines' Atari init;
   docs/design.md, Initialisation, has why);
3. the policy's output (π's logits, a Gaussian's mean): orthogonal, gain 0.01, so π starts near
   uniform and the mean near the middle of the Box;
4. a critic output (Q, V) that sits on the shared features (the CNN's, the LSTM's, a user's
   torso's): orthogonal, gain 1 (Baselines). One after a critic MLP of its own (vector nets, and
   the SDN's A) keeps the default (docs/design.md, Initialisation, has the measurement).

A user's torso keeps the initialisation its class gives it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from acer_sync.nets.heads import LOG_STD_MAX, LOG_STD_MIN, CategoricalHead, GaussianHead, probabilities
from acer_sync.nets.memory import LayerNormLSTMMemory, LSTMMemory, NoMemory, State
from acer_sync.nets.normalization import ObservationNormalizer
from acer_sync.nets.torsos import MLP, FlattenTorso, MultiInputTorso, NatureCNN, UserTorso, init_orthogonal
from atari import parts

__all__ = [
    "ARCHS", "LOG_STD_MAX", "LOG_STD_MIN", "RECURRENT_ARCHS", "ActorCriticNet", "Network", "PolyakAverage", "State",
    "complete_spec", "network_from_spec",
    "polyak_update", "probabilities",
]

#: The architectures (``spec()["arch"]``): the torso, and whether an LSTM follows it.
ARCHS = ("mlp", "cnn", "lstm", "cnn_lstm", "multi", "multi_lstm", "torso", "torso_lstm")
#: Those with an LSTM memory.
RECURRENT_ARCHS = ("lstm", "cnn_lstm", "multi_lstm", "torso_lstm")
#: Those of the multi-input torso (an observation of several parts).
MULTI_ARCHS = ("multi", "multi_lstm")
#: Those whose torso takes images (uint8 frames).
IMAGE_ARCHS = ("cnn", "cnn_lstm")


class ActorCriticNet(nn.Module):
    """Observations → (normalizer) → torso → memory → head; see the module docstring.

    :param spec: what :meth:`spec` returns: ``obs_shape`` ``(stack, *frame)``, ``n_actions`` (d for
        a Gaussian), ``arch`` (:data:`ARCHS`), ``hidden`` (the MLP sizes), ``activation``,
        ``policy`` (``categorical`` or ``gaussian``), ``normalize_obs``, ``lstm_size`` and ``lstm_norm``
        (``none`` or ``layer``, with an LSTM), ``init_std`` and ``action_scale`` (Gaussian: σ at the start; the Box's
        ``[centre, half-width]`` per dimension where the mean starts at its centre and σ's bounds
        scale with it, absent where they do not), ``torso``, ``torso_kwargs`` and ``torso_view`` (a user's torso,
        ``module:Class``, and the shapes it is shown the observations in: ``acer_sync.nets.build.torso_view``;
        absent in specs written before it, whose torso is shown the frames), ``obs_dtype``, and ``obs_parts``, ``[key, frame shape, dtype]`` per
        part of a multi-part observation (then ``obs_shape`` is ``(stack,)``).
    """

    def __init__(self, spec: dict):
        super().__init__()
        self._spec = complete_spec(spec)
        spec = self._spec
        self.obs_shape = tuple(spec["obs_shape"])
        arch, hidden, activation = spec["arch"], tuple(spec["hidden"]), spec["activation"]
        if arch not in ARCHS:
            raise ValueError(f"unknown architecture {arch!r}")
        obs_parts = [(key, tuple(shape), dtype) for key, shape, dtype in spec.get("obs_parts", [])]
        if spec["normalize_obs"] and (arch in IMAGE_ARCHS or obs_parts):
            raise ValueError("observation normalization is for vector observations")
        if (arch in MULTI_ARCHS) != bool(obs_parts) and arch not in ("torso", "torso_lstm"):
            raise ValueError(f"architecture {arch!r} does not fit {'a multi-part' if obs_parts else 'a single'} observation")
        self.normalizer = ObservationNormalizer(self.obs_shape) if spec["normalize_obs"] else None
        if arch == "mlp":
            self.torso: nn.Module = FlattenTorso(self.obs_shape)
        elif arch == "lstm":
            self.torso = MLP(math.prod(self.obs_shape), hidden, activation)
        elif arch in IMAGE_ARCHS:
            self.torso = NatureCNN(self.obs_shape)
        elif arch in MULTI_ARCHS:
            self.torso = MultiInputTorso(obs_parts, self.obs_shape[0])
        else:
            self.torso = UserTorso(spec["torso"], self.obs_shape, spec["obs_dtype"], spec["torso_kwargs"], obs_parts,
                                   spec.get("torso_view"))
        if arch in RECURRENT_ARCHS:
            memory = LayerNormLSTMMemory if spec["lstm_norm"] == "layer" else LSTMMemory
            self.memory = memory(self.torso.features_dim, spec["lstm_size"])
        else:
            self.memory = NoMemory(self.torso.features_dim)
        head_arch = hidden if arch in ("mlp", "multi") else ()  # the flat torsos' MLPs, one per output
        if spec["policy"] == "gaussian":
            self.head: nn.Module = GaussianHead(
                self.memory.features_dim, spec["n_actions"], head_arch, hidden or (64,), spec["init_std"], activation,
                spec.get("action_scale"),
            )
        else:
            self.head = CategoricalHead(self.memory.features_dim, spec["n_actions"], head_arch, activation)
        self.state_shapes = self.memory.state_shapes
        self.initialise()

    def initialise(self) -> None:
        """Steps 2–4 of the scheme in the module docstring (step 1 is each layer's construction)."""
        for cnn in (module for module in self.torso.modules() if isinstance(module, NatureCNN)):
            for layer in cnn.modules():
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    init_orthogonal(layer, math.sqrt(2))
            cnn.to(memory_format=torch.channels_last)  # NHWC weights, as its forward's frames
        self.head.init_outputs()

    def spec(self) -> dict:
        """What a checkpoint must match to be loaded into this network."""
        return dict(self._spec)

    def compile(self, *args, **kwargs) -> None:
        """``torch.compile`` the torso and the head in place (the state_dict keys stay the same)."""
        self.torso.compile(*args, **kwargs)
        self.head.compile(*args, **kwargs)

    def initial_state(self, n: int) -> State:
        return self.memory.initial_state(n)

    def unroll(self, obs: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Features ``[T·N, F]`` of observations ``[T, N, ...]`` from ``state``, and the state after
        observation T−1 (see the module docstring)."""
        T, N = parts.leading_shape(obs, 2)
        if firsts.shape != (T, N):
            raise ValueError(f"obs {(T, N)} and firsts {tuple(firsts.shape)} disagree on [T, N]")
        flat = parts.map_parts(lambda part: part.reshape(T * N, *part.shape[2:]), obs)
        if self.normalizer is not None:
            flat = self.normalizer(flat)
        features = self.torso(flat)
        return self.memory.unroll(features.reshape(T, N, -1), firsts, state)

    def step(self, obs: torch.Tensor, state: State, first: torch.Tensor) -> tuple[torch.Tensor, State]:
        """``unroll`` of one step: features ``[N, F]`` of observations ``[N, ...]``, and the next state."""
        return self.unroll(parts.map_parts(lambda part: part.unsqueeze(0), obs), first.unsqueeze(0), state)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(π(·|x), Q(x, ·)), ``[B, A]`` each (the categorical head)."""
        return self.head(features)

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.policy_of(features)

    def parameter_bounds(self) -> list[tuple[nn.Parameter, float, float]]:
        """Parameters with bounds, ``(parameter, low, high)``, that the update keeps them in (the head's)."""
        return self.head.parameter_bounds()

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        return self.head.value_of(features)

    def advantage_of(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.head.advantage_of(features, actions)


Network = ActorCriticNet

#: What a spec that lacks a key (one written before the key existed) means.
SPEC_DEFAULTS = {"activation": "tanh", "torso": "", "torso_kwargs": {}, "lstm_size": 128, "lstm_norm": "none", "obs_parts": []}


def complete_spec(spec: dict) -> dict:
    """``spec`` with every key, those it lacks (written before they existed) at what they meant."""
    spec = {**SPEC_DEFAULTS, **spec}
    spec.setdefault("obs_dtype", "uint8" if spec["arch"] in IMAGE_ARCHS else "float32")
    spec["obs_shape"] = [int(size) for size in spec["obs_shape"]]
    spec["hidden"] = [int(size) for size in spec["hidden"]]
    spec["n_actions"] = int(spec["n_actions"])
    spec["obs_parts"] = [[str(key), [int(size) for size in shape], str(dtype)] for key, shape, dtype in spec["obs_parts"]]
    if not spec["obs_parts"]:
        spec.pop("obs_parts")
    if "torso_view" in spec:
        view = spec["torso_view"]
        spec["torso_view"] = ({"parts": [[str(key), [int(size) for size in shape]] for key, shape in view["parts"]]} if "parts" in view
                              else {"shape": [int(size) for size in view["shape"]]} if "shape" in view else {})
    if spec["arch"] not in RECURRENT_ARCHS:
        spec.pop("lstm_size")
        spec.pop("lstm_norm")
    return spec


def network_from_spec(spec: dict) -> Network:
    """A new, freshly initialised network of any kind from its :meth:`~ActorCriticNet.spec` (a
    checkpoint's spec of any format, once :func:`acer_sync.training.checkpoint.migrate` brought it
    up to date)."""
    return ActorCriticNet(spec)


def named_buffer_slots(module: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """:func:`buffer_slots` by the buffers' names in ``module``."""
    slots = {}
    for name, _ in module.named_buffers():
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path)
        if leaf not in getattr(owner, "spec_constants", ()):  # a Box's centre: alike in two networks of one spec
            slots[name] = (owner, leaf)
    return slots


def buffer_slots(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """Each buffer of ``module`` that is its state (not a constant of its spec, which two networks of
    one spec hold alike) as ``(owning module, name)``, in ``named_buffers()`` order. Reading
    ``owner._buffers[name]`` each time finds a buffer that a user's torso rebinds (``self.mean =
    ...``, a new tensor) as well as one updated in place, without walking the modules again."""
    return list(named_buffer_slots(module).values())


def read_slots(slots: list[tuple[nn.Module, str]]) -> list[torch.Tensor]:
    """The tensors :func:`buffer_slots` names, as they are now."""
    return [owner._buffers[name] for owner, name in slots]


class PolyakAverage:
    """θ_a ← α θ_a + (1 − α) θ, in place, for every parameter (Wang et al. 2017, Sec. 3.3).

    Works on the parameter tensors themselves (not on rebound names), so the average network
    really moves: each parameter moves by exactly (1 − α) of its distance to the online one.
    Buffers (the observation normalizer's running statistics) are copied, not averaged: both
    networks must see observations normalized the same way. The parameters are listed once: walking
    the modules for them at every update was measured costly (docs/bench/README.md, The composed
    network); the buffers are found through their modules each time (:func:`buffer_slots`).
    """

    def __init__(self, average: nn.Module, online: nn.Module):
        self.average_params, self.online_params = list(average.parameters()), list(online.parameters())
        self.average_slots, self.online_slots = buffer_slots(average), buffer_slots(online)
        if len(self.average_params) != len(self.online_params) or len(self.average_slots) != len(self.online_slots):
            raise ValueError("average and online networks differ in their parameters")

    @property
    def average_buffers(self) -> list[torch.Tensor]:
        return read_slots(self.average_slots)

    @torch.no_grad()
    def update(self, alpha: float, finite: torch.Tensor | None = None) -> None:
        """One step; with ``finite`` (a bool tensor), a step without a host read that leaves the
        average, its buffers too, as it is where ``finite`` is False (the update it follows was
        skipped), as the eager path, which makes no step then, leaves it."""
        for average_buffer, online_buffer in zip(read_slots(self.average_slots), read_slots(self.online_slots)):
            average_buffer.copy_(online_buffer if finite is None else torch.where(finite, online_buffer, average_buffer))
        if finite is None:
            torch._foreach_mul_(self.average_params, alpha)
            torch._foreach_add_(self.average_params, self.online_params, alpha=1.0 - alpha)
            return
        moved = torch._foreach_mul(self.average_params, alpha)
        torch._foreach_add_(moved, self.online_params, alpha=1.0 - alpha)
        for average, new in zip(self.average_params, moved):
            average.copy_(torch.where(finite, new, average))


def polyak_update(average: nn.Module, online: nn.Module, alpha: float) -> None:
    """One :class:`PolyakAverage` step of ``average`` towards ``online``."""
    PolyakAverage(average, online).update(alpha)

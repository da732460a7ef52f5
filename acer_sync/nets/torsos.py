"""Torsos: what turns an observation batch into features ``[B, features_dim]``.

Every torso follows Stable-Baselines3's features-extractor contract (its ``BaseFeaturesExtractor``):
an ``nn.Module`` with an int attribute ``features_dim`` and ``forward(obs) -> [B, features_dim]``.
The built-ins are :class:`FlattenTorso` (vector observations: the heads' own MLPs do the rest),
:class:`NatureCNN` (frames), :class:`MultiInputTorso` (an observation of several parts, an image
and a vector, as SB3's ``CombinedExtractor``) and a user's own class, wrapped by :class:`UserTorso`.

The initialisation scheme is stated once, in :mod:`acer_sync.nets.networks`; a user's torso keeps
the initialisation its class gives it.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import re
from typing import Iterable, Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from acer_sync.base.errors import UserError


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in evaluation mode (``model.eval()``), and in its mode before after: it acts and
    evaluates so (the Trainer's collection, :func:`acer_sync.rollout.evaluation.evaluate`), as SB3
    collects rollouts, and a user torso is checked so. A user's Dropout is off and a BatchNorm uses
    its running statistics, which only the updates (in training mode) change, so one env's action
    does not depend on another's observation. The built-in networks have no such layers: none of
    their numbers change."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


#: The activations an MLP may use (``--activation``).
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def init_orthogonal(layer: nn.Module, gain: float) -> None:
    """Orthogonal weights scaled by ``gain``, zero biases (Baselines' ``ortho_init``)."""
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)


class MLP(nn.Module):
    """Fully connected layers of ``sizes`` with ``activation`` after each, on inputs ``[B, ...]``
    (flattened first); no layers at all for empty ``sizes`` (the features pass through)."""

    def __init__(self, in_features: int, sizes: Iterable[int], activation: str = "tanh"):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in sizes:
            layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
            width = size
        self.body = nn.Sequential(*layers)
        self.features_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.float())


class FlattenTorso(nn.Module):
    """Vector observations ``[B, stack, D]`` as features ``[B, stack·D]``, in float32; the heads'
    MLPs (``--net-arch``) come after it, one for each head, as SB3's ``net_arch`` does."""

    def __init__(self, obs_shape: tuple[int, ...]):
        super().__init__()
        self.features_dim = math.prod(obs_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float().flatten(1)


class NatureCNN(nn.Module):
    """The Nature-DQN torso (Mnih et al. 2015): three convolutions and a 512-unit layer.

    Takes uint8 frames ``[B, stack, H, W]`` (Atari: ``[B, 4, 84, 84]``) or, for images with
    channels, ``[B, stack, C, H, W]``, whose stack and channel axes become the ``in_channels``
    input channels. The conversion to float and the 1/255 scale happen here, on whatever device
    the module lives on.
    """

    def __init__(self, obs_shape: tuple[int, ...], features_dim: int = 512):
        super().__init__()
        in_channels, frame_shape = math.prod(obs_shape[:-2]), tuple(obs_shape[-2:])
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
        self.fc = nn.Sequential(nn.Linear(n_flat, features_dim), nn.ReLU())
        self.features_dim = features_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # channels_last (NHWC) convolutions, and the frames straight to the dtype the convolutions
        # compute in: float32, or bf16 under bf16 autocast, where a float32 copy first would cost
        # autocast two more passes over the batch (both measured: docs/performance.md, bf16).
        device_type = obs.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else torch.float32
        frames = obs.reshape(obs.shape[0], -1, *obs.shape[-2:])  # [B, stack·C, H, W]
        frames = (frames.to(dtype) / 255.0).contiguous(memory_format=torch.channels_last)
        return self.fc(self.convs(frames))


def is_image_part(shape: tuple[int, ...], dtype: str) -> bool:
    """Whether a part of a multi-part observation, ``(shape, dtype)`` as stored, is an image."""
    return np.dtype(dtype) == np.uint8 and len(shape) in (2, 3)


class MultiInputTorso(nn.Module):
    """An observation of several parts (a dict of ``[B, stack, *part_shape]``), as SB3's
    ``CombinedExtractor``: each image part through a Nature CNN of its own, at its own resolution and
    channels, with a 256-unit output (SB3's ``cnn_output_dim``); each vector part flattened as it is
    (a discrete part arrives one-hot); all concatenated in the parts' order. The heads' MLPs
    (``--net-arch``) come after it, as after :class:`FlattenTorso`.

    :param obs_parts: ``(key, frame shape, dtype name)`` per part (the spec's ``obs_parts``).
    :param stack: frames per observation (1 outside Atari).
    """

    #: Features per image part.
    IMAGE_FEATURES = 256

    def __init__(self, obs_parts, stack: int):
        super().__init__()
        self.keys = [key for key, _, _ in obs_parts]
        extractors: list[nn.Module] = []
        for _, shape, dtype in obs_parts:
            if is_image_part(shape, dtype):
                extractors.append(NatureCNN((stack, *shape), self.IMAGE_FEATURES))
            else:
                extractors.append(FlattenTorso((stack, *shape)))
        self.extractors = nn.ModuleList(extractors)
        self.features_dim = sum(extractor.features_dim for extractor in extractors)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        features = [extractor(obs[key]) for key, extractor in zip(self.keys, self.extractors)]
        dtype = features[0].dtype if all(f.dtype == features[0].dtype for f in features) else torch.float32
        return torch.cat([f.to(dtype) for f in features], dim=1)


# --- A user's own torso ------------------------------------------------------------------------


def observation_space_of(obs_shape: tuple[int, ...], dtype: str) -> gym.spaces.Box:
    """The observation space a user's torso is built with: the env's as ``acer_sync.make_env``
    returns it, ``obs_shape`` without a stack axis of 1 (Atari keeps its 4 stacked frames)."""
    shape = tuple(obs_shape[1:]) if obs_shape[0] == 1 else tuple(obs_shape)
    if np.dtype(dtype) == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    return gym.spaces.Box(-np.inf, np.inf, shape, np.dtype(dtype))


def vector_space_of(shape) -> gym.spaces.Box:
    """The space a user's torso is shown a part of numbers in (not pixels): float32, unbounded, of
    its own ``shape``, as the torso gets it (SB3's ``preprocess_obs`` gives floats)."""
    return gym.spaces.Box(-np.inf, np.inf, tuple(int(size) for size in shape), np.float32)


def parts_space_of(obs_parts, stack: int) -> gym.spaces.Dict:
    """The Dict space a user's torso is built with for a multi-part observation: one Box per part,
    each as :func:`observation_space_of` gives it."""
    return gym.spaces.Dict({key: observation_space_of((stack, *shape), dtype) for key, shape, dtype in obs_parts})


def is_image(space: gym.spaces.Box) -> bool:
    """An image, as SB3 tells one: uint8 with 2 or 3 dimensions (the torso gets it scaled by 1/255)."""
    return space.dtype == np.uint8 and len(space.shape) in (2, 3)


def torso_name(torso: type | str) -> str:
    """``module:Class`` of a torso class, or the text as given."""
    if isinstance(torso, str):
        return torso
    return f"{torso.__module__}:{torso.__qualname__}"


class TorsoError(UserError):
    """A torso class that cannot be imported or refuses its contract, in one line: ``--torso NAME``
    and ``detail`` (from ``": "`` or ``" "`` on), as train.py says it, or ``said`` where given.
    ``torso`` and ``detail`` let a loader or a resume, which have no ``--torso`` flag, say it of the
    run's own torso (:meth:`of_run`); ``cannot_import`` is true where the class's module did not
    import (not on the path where the run is loaded, or failing there)."""

    def __init__(self, torso: str, detail: str, cannot_import: bool = False, said: str | None = None):
        detail = re.sub(r"\s*\n\s*", " ", detail.rstrip())  # a user's error of several lines, in one
        super().__init__(said or f"--torso {torso}{detail}")
        self.torso, self.detail, self.cannot_import = torso, detail, cannot_import

    def __reduce__(self):  # rebuilt from its fields by pickle and copy (its args hold only the message)
        return type(self), (self.torso, self.detail, self.cannot_import, str(self))

    def of_run(self, run) -> str:
        """The error said of ``run``'s own torso, where it is loaded or resumed."""
        where = "; its module must import where the run is loaded (run from its folder, or put that on PYTHONPATH)" \
            if self.cannot_import else ""
        return f"{run} was trained with a network that does not build here: its torso {self.torso or repr(self.torso)}{self.detail}{where}"


def import_torso(name: str) -> type:
    """The class ``module:Class`` names; a one-line TorsoError where it cannot be imported."""
    module_name, colon, class_name = name.partition(":")
    if not colon or not module_name or not class_name:
        raise TorsoError(name, " is not MODULE:CLASS (e.g. my_nets:ImpalaTorso)",
                         said=f"--torso takes MODULE:CLASS, e.g. my_nets:ImpalaTorso; got {name!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any error in the user's module is theirs to read, in one line
        raise TorsoError(name, f": cannot import {module_name} ({type(error).__name__}: {error})", cannot_import=True) from None
    target = module
    for part in class_name.split("."):
        target = getattr(target, part, None)
        if target is None:
            where = " (defined in the script that ran; move it to a module to rebuild it elsewhere)" if module_name == "__main__" else ""
            raise TorsoError(name, f": {module_name} has no {class_name}{where}")
    if not (isinstance(target, type) and issubclass(target, nn.Module)):
        raise TorsoError(name, " is not an nn.Module class")
    return target


class UserTorso(nn.Module):
    """A user's torso class (SB3's contract), built as ``Class(observation_space, **kwargs)``.

    It gets the observations as a float tensor batch ``[B, *observation_space.shape]``: images
    (uint8, 2 or 3 dimensions) scaled by 1/255, anything else as floats, as SB3's
    ``preprocess_obs`` gives its extractors. For a multi-part observation the space is a Dict of
    one Box per part (a Tuple's parts keyed ``"0"``, ``"1"``, ...) and ``forward`` gets a dict of
    such batches. The class is checked here, once: it must be an ``nn.Module`` with an int
    ``features_dim`` >= 1 whose ``forward`` returns floats ``[B, features_dim]`` (of any float
    dtype: they leave the torso as float32).
    """

    def __init__(self, name: str, obs_shape: tuple[int, ...], obs_dtype: str, kwargs: dict, obs_parts=(), view: dict | None = None):
        super().__init__()
        self.name, self.kwargs = name, dict(kwargs)
        #: The sizes of the parts that a flat frame (a Dict or Tuple without an image) is split into; empty otherwise.
        self.split: list[tuple[str, int]] = []
        if view and "parts" in view:  # acer_sync.nets.build.torso_view: each part in its own shape
            images = {key: observation_space_of((obs_shape[0], *shape), dtype) for key, shape, dtype in obs_parts if dtype == "uint8"}
            # pairs, not a dict, which gymnasium would sort: the parts keep the env's order
            self.space = gym.spaces.Dict([(key, images[key] if key in images else vector_space_of(shape)) for key, shape in view["parts"]])
            if not obs_parts:
                self.split = [(key, math.prod(shape)) for key, shape in view["parts"]]
        elif view and "shape" in view:
            self.space = vector_space_of(view["shape"])
        elif obs_parts:
            self.space = parts_space_of(obs_parts, obs_shape[0])
        else:
            self.space = observation_space_of(obs_shape, obs_dtype)
        if isinstance(self.space, gym.spaces.Dict):
            self.scale = {key: is_image(box) for key, box in self.space.spaces.items()}
        else:
            self.scale = is_image(self.space)
        cls = import_torso(name)
        try:
            module = cls(self.space, **self.kwargs)
        except Exception as error:  # noqa: BLE001 - the user's constructor, reported in one line
            raise TorsoError(name, f": {cls.__name__}({self.space}, **{self.kwargs}) raised {type(error).__name__}: {error}") from None
        features_dim = getattr(module, "features_dim", None)
        if not isinstance(module, nn.Module) or not isinstance(features_dim, int) or isinstance(features_dim, bool) or features_dim < 1:
            raise TorsoError(name, " must be an nn.Module with an int attribute features_dim >= 1 "
                                   f"(Stable-Baselines3's BaseFeaturesExtractor contract); it has features_dim={features_dim!r}")
        self.module = module
        self.features_dim = features_dim
        self._check_output()

    def _check_output(self) -> None:
        if isinstance(self.space, gym.spaces.Dict):
            sample = {key: torch.zeros(2, *box.shape) for key, box in self.space.spaces.items()}
            shapes = str({key: tuple(part.shape) for key, part in sample.items()})
        else:
            sample = torch.zeros(2, *self.space.shape)
            shapes = f"shape {tuple(sample.shape)}"
        try:
            with torch.no_grad(), evaluation_mode(self.module):  # its BatchNorm statistics and the RNG untouched
                out = self.module(sample)
        except Exception as error:  # noqa: BLE001
            raise TorsoError(self.name, f": its forward on a batch of {shapes} raised {type(error).__name__}: {error}") from None
        if not isinstance(out, torch.Tensor) or out.shape != (2, self.features_dim) or not out.is_floating_point():
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise TorsoError(self.name, ": forward must return floats of shape [B, features_dim] = "
                                        f"[2, {self.features_dim}] for a batch of 2 observations, got {got}")

    def forward(self, obs) -> torch.Tensor:
        """The module's features, in float32 whatever float it returns (an LSTM after it, and the
        heads' layers, are float32; under bf16 autocast they cast it down again themselves)."""
        if self.split:
            flat = obs.reshape(obs.shape[0], -1)
            obs = dict(zip([key for key, _ in self.split], flat.split([size for _, size in self.split], dim=1)))
        if isinstance(obs, dict):
            out = self.module({key: self._prepare(obs[key], box, self.scale[key]) for key, box in self.space.spaces.items()})
        else:
            out = self.module(self._prepare(obs, self.space, self.scale))
        return out.float()

    @staticmethod
    def _prepare(obs: torch.Tensor, space: gym.spaces.Box, scale: bool) -> torch.Tensor:
        obs = obs.reshape(obs.shape[0], *space.shape).float()
        return obs / 255.0 if scale else obs

"""A run's network from its settings: the one place that turns ``config.network`` and the env into a net."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from acer_sync.base.config import Config, hidden_sizes
from acer_sync.base.errors import UserError
from acer_sync.nets.networks import RECURRENT_ARCHS, Network, complete_spec, network_from_spec
from atari.envs import (
    EnvInfo,
    check_cnn_image_sides,
    env_info,
    image_layout,
    legacy_image_space,
    named_parts,
    space_images,
)


def select_device(name: str) -> torch.device:
    """``auto`` (cuda if available), ``cpu`` or ``cuda``; a UserError where CUDA was asked for and is missing."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"device must be auto, cpu, cuda or another torch device, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name} was asked for, but torch sees no CUDA device")
    if device.type != "cpu":
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as error:  # another device torch knows and this machine has not (mps, cuda:7)
            said = (str(error).strip() or type(error).__name__).splitlines()[0].split(". ")[0]
            raise UserError(f"--device {name} was asked for, but torch cannot use it here ({said[:160]})") from None
    return device


def network_arch(info: EnvInfo, config: Config) -> str:
    """The torso ``config.network`` asks for, ``auto`` resolved (cnn for frames, mlp for vectors),
    or a one-line UserError where it does not fit the observations."""
    frames = info.arch == "cnn"
    if config.torso:
        if config.network not in ("auto", "lstm"):
            raise UserError(f"--torso {config.torso} takes --network auto (its features go to the heads) or lstm "
                            f"(an LSTM after it), not {config.network}")
        return "torso_lstm" if config.network == "lstm" else "torso"
    if info.arch == "multi":
        if config.network not in ("auto", "lstm"):
            raise UserError(f"--network {config.network} does not fit {info.env_id}, whose observations have several parts; "
                            "use auto (the multi-input torso) or lstm (an LSTM after it)")
        check_cnn_image_sides(info)
        return "multi_lstm" if config.network == "lstm" else "multi"
    arch = info.arch if config.network == "auto" else config.network
    if frames != (arch in ("cnn", "cnn_lstm")):
        fits = "cnn or cnn_lstm for image" if frames else "mlp or lstm for vector"
        raise UserError(f"--network {arch} does not fit {info.env_id}; use {fits} observations")
    if info.continuous and frames:
        raise UserError(f"{info.env_id} has image observations and continuous actions; the Gaussian policy takes vectors")
    if frames:
        check_cnn_image_sides(info)
    return arch


def spec_images(spec: dict) -> int:
    """How many images a network of ``spec`` reads: its frames (the CNN's), or its image parts."""
    frames = spec.get("arch") in ("cnn", "cnn_lstm")
    return int(frames) + sum(dtype == "uint8" for _, _, dtype in spec.get("obs_parts", []))


def reads_images_as_before(spec: dict, space: gym.Space) -> bool:
    """Whether a network of ``spec`` on an env of observation ``space`` was built by a version
    before SB3's image rule: it reads more images than today's rule finds in ``space``, and as many
    as that version found (:func:`atari.envs.legacy_image_space`)."""
    return space_images(space) < spec_images(spec) == space_images(legacy_image_space(space))


def image_rule_hint(saved_spec: dict, expected_spec: dict) -> str:
    """Where a checkpoint's network read images that the env's observations are no longer taken for,
    why, as "; ..." to end a message: a uint8 Box is an image only with the bounds 0 and 255 since
    the version that took SB3's rule (before, any uint8 Box of rank 2 or 3 was)."""
    if spec_images(saved_spec) <= spec_images(expected_spec):
        return ""
    return ("; a uint8 Box is an image only with the bounds 0 and 255 since this version (SB3's rule), and this "
            "checkpoint's network read one of other bounds as an image: give the env's space those bounds to use it")


def saved_env_info(saved_spec: dict, env_id: str, env_kwargs: dict, config: Config) -> EnvInfo:
    """The env of a checkpoint whose network is ``saved_spec``, as its run read the observations:
    as this version reads them, or, where that gives another network and a version before SB3's
    image rule gave this one (a uint8 Box of other bounds read as an image, pixels of rank 4
    flattened), as that version read them (``legacy_images``). Its UserError where neither fits
    (the caller says what differs)."""
    def fits(info: EnvInfo) -> bool:
        try:
            return in_saved_form(saved_spec, model_spec(info, config)) == saved_spec
        except (UserError, TypeError, ValueError):
            return False

    try:
        info, refusal = env_info(env_id, env_kwargs), None
    except UserError as error:  # pixels of rank 4, flattened before
        info, refusal = None, error
    if info is None or not fits(info):
        try:
            legacy = env_info(env_id, env_kwargs, legacy_images=True)
        except UserError:
            legacy = None
        if legacy is not None and legacy != info and fits(legacy):
            return legacy
    if refusal is not None:
        raise refusal
    return info


def torso_view(info: EnvInfo) -> dict:
    """How a user's torso is shown observations that the frames store in another shape, as SB3 shows
    its extractors the env's own: ``{"shape": [...]}`` for a Box (or MultiBinary) of rank 2 or more
    that is not pixels (a float image, a grid of cell codes), which the frames flatten; ``{"parts":
    [[key, shape], ...]}`` for a Dict or Tuple, each part in its own shape (an image as its frame,
    channels first; a discrete part as its one-hot vector), whose frames are one flat vector where
    no part is an image; ``{}`` where the frames are the env's own observations (a flat Box, Atari,
    an image)."""
    own = info.observation_space
    if own is None or image_layout(own) is not None:
        return {}
    if isinstance(own, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return {"shape": [int(size) for size in own.shape]} if len(own.shape) > 1 else {}
    if not isinstance(own, (gym.spaces.Dict, gym.spaces.Tuple)):
        return {}
    frames = {key: list(shape) for key, shape, _ in info.frame_parts}
    parts = []
    for key, part in named_parts(own):
        if key in frames and image_layout(part) is not None:
            shape = frames[key]
        elif isinstance(part, (gym.spaces.Box, gym.spaces.MultiBinary)):
            shape = [int(size) for size in part.shape]
        else:
            shape = [int(gym.spaces.flatdim(part))]
        parts.append([key, shape])
    return {"parts": parts}


def in_saved_form(saved: dict, expected: dict) -> dict:
    """``expected`` (:func:`model_spec`) in the form of a checkpoint's network spec ``saved``: a
    spec of a user's torso written before :func:`torso_view` existed lacks ``torso_view``, and
    its torso is shown the frames as they are (flattened)."""
    if "torso_view" not in saved:
        return {key: value for key, value in expected.items() if key != "torso_view"}
    return expected


def model_spec(info: EnvInfo, config: Config) -> dict:
    """The network a run of ``config`` on ``info`` trains, as its full spec (what
    :meth:`~acer_sync.nets.networks.ActorCriticNet.spec` returns): derived, without building it."""
    arch, hidden = network_arch(info, config), hidden_sizes(config)
    spec = dict(
        obs_shape=list(info.obs_shape), n_actions=info.n_actions, arch=arch,
        hidden=list(hidden) if arch in ("mlp", "lstm", "multi", "torso", "torso_lstm") else [],
        activation=config.activation, policy="gaussian" if info.continuous else "categorical",
        normalize_obs=config.normalize_obs, obs_dtype=np.dtype(info.frame_dtype).name,
    )
    if arch in RECURRENT_ARCHS:
        spec["lstm_size"] = config.lstm_size
        spec["lstm_norm"] = config.lstm_norm
    if info.frame_parts:
        spec["obs_parts"] = [[key, list(shape), dtype] for key, shape, dtype in info.frame_parts]
    if config.torso:
        spec.update(torso=config.torso, torso_kwargs=dict(config.torso_kwargs), torso_view=torso_view(info))
    if info.continuous:
        low, high = np.asarray(info.action_low, dtype=np.float64), np.asarray(info.action_high, dtype=np.float64)
        half_width = (high - low) / 2.0
        spec["init_std"] = (config.policy_std * half_width).tolist()
        if config.action_scale == "box":
            spec["action_scale"] = [((low + high) / 2.0).tolist(), half_width.tolist()]
    return complete_spec(spec)


def build_model(info: EnvInfo, config: Config) -> Network:
    """The run's network: the torso ``config.network`` (or ``config.torso``) asks for, with an LSTM
    for the recurrent ones, and a softmax actor-critic for discrete actions or a Gaussian policy
    with an SDN for a Box."""
    return network_from_spec(model_spec(info, config))

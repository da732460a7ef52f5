"""Building vectorized environments: ale-py's C++ vector env, or gymnasium's vector envs.

Every backend returns the same thing: one preprocessed frame per env (no frame stack), the raw
(unclipped) reward, ``terminated``/``truncated`` for the real end of a game, and the lives left.
Frame stacking (:mod:`atari.stacking`) and the training view of episodes (life loss ends an
episode, rewards clipped to their sign; :mod:`atari.episodes`) are applied on top, identically for
every backend, so the backends differ only in how they step the emulator.

Autoreset is SAME_STEP everywhere: the step that ends an episode already returns the first frame
of the next one, so every action sent is an action the env really took. (NEXT_STEP, the default
of both gymnasium and ale-py, spends the step after a done on a reset that ignores the action,
and such a step must never be trained on.)

Atari preprocessing is the DeepMind one: up to 30 no-ops at reset, 4-frame skip with a max-pool
over the last two frames, FIRE at reset where the game needs it, 84×84 grayscale.

Any other env id, or a user's ``module:EnvId`` (the module is imported first, which registers
it), is made with the run's ``env_kwargs``, and its observations become frames too: a vector
(flattened, one-hot where discrete) or a 2-D uint8 image (:func:`adapt_observations`).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState, _async_worker

from atari import parts
from atari.errors import EnvFailed, EnvTimedOut, EnvWorkerDied, UserError, past_env_timeout

#: Where a failed close is reported: a child of the library's logger (``acer_sync.base.log``), so
#: a run shows it as its other warnings, without this package importing the library.
CLOSE_LOG = logging.getLogger("acer_sync.envs")

BACKENDS = ("ale", "subproc", "sync")
#: ale-py's vector env refuses a reset seed of 2**31 - 1 or more (a TypeError from its binding).
ALE_SEED_SPAN = 2**31 - 1
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
ATARI_FRAME = (84, 84)
ATARI_STACK = 4
NOOP_MAX = 30
FRAME_SKIP = 4
#: The smallest image side the Nature CNN accepts: its 8/4, 4/2 and 3/1 convolutions need
#: 36 → 8 → 3 → 1 pixels.
MIN_IMAGE_SIDE = 36
#: Env kwargs that this module sets itself: play.py's rendering, and the Atari preprocessing.
RESERVED_KWARGS = ("render_mode",)
ATARI_RESERVED_KWARGS = ("frameskip", "obs_type")
#: The env kwargs that ale-py's vector env takes (the ``ale`` backend).
ALE_VECTOR_KWARGS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")
SUPPORTED_OBSERVATIONS = (
    "Box, Discrete, MultiDiscrete, MultiBinary, and Tuple and Dict of these (flattened into one vector, "
    f"one-hot for the discrete ones), uint8 images (H, W), (H, W, C) or (C, H, W) of at least "
    f"{MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} (pixels: the bounds 0 and 255; a torso of your own takes smaller ones), "
    "and Tuple and Dict of images and those (one part each)"
)


def _register_ale() -> None:
    # Gymnasium ≥ 1.0 no longer imports ale-py's registrations by itself. The logger mode keeps
    # ALE's banner off stderr, where it would crowd out our one-line errors.
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)


@dataclass(frozen=True)
class EnvInfo:
    """What the rest of the trainer needs to know about an env id."""

    env_id: str
    atari: bool
    frame_shape: tuple[int, ...]
    frame_dtype: np.dtype
    stack: int
    n_actions: int
    #: Actions played after each lost life without the agent choosing them (:class:`atari.episodes.LifeLossActions`).
    life_loss_actions: tuple[int, ...] = ()
    #: The names of the discrete actions where the env has them (ALE's NOOP, FIRE, ...), else empty.
    action_names: tuple[str, ...] = field(default=(), compare=False)
    #: A Box action space; ``n_actions`` is then its dimension d.
    continuous: bool = False
    #: The Box's bounds, ``d`` numbers each (continuous only).
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    #: A Discrete space's first action (``Discrete(n, start)``): the env takes ``start`` to
    #: ``start + n - 1``, which the policy's actions 0 to n-1 are shifted to on their way to it.
    action_start: int = 0
    #: Keyword arguments for ``gym.make``, in every env built from this info (``--env-kwargs``).
    env_kwargs: dict = field(default_factory=dict)
    #: The observation space as the env itself returns it, where the trainer turns its observations
    #: into frames of another shape (:func:`adapt_observations`: flattened, one-hot, channels first);
    #: None where the frames are the env's own observations (and for Atari, whose stacked frames
    #: ``acer_sync.make_env`` returns).
    observation_space: gym.Space | None = field(default=None, compare=False)
    #: The parts of a multi-part observation (a Dict or Tuple with an image in it), in order:
    #: ``(key, frame shape, dtype name)`` each, as :func:`adapt_observations` makes them (an image
    #: uint8 ``(H, W)`` or ``(C, H, W)``, any other part a float32 vector). Empty for one array,
    #: whose shape and dtype are ``frame_shape`` and ``frame_dtype``.
    frame_parts: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    #: The images as the versions before SB3's rule read them (:class:`LegacyImages`), for a run
    #: trained then whose network reads a uint8 Box of other bounds as an image, or pixels of rank 4 flattened.
    legacy_images: bool = False

    @property
    def obs_shape(self) -> tuple[int, ...]:
        """The shape the network sees: ``(stack, *frame_shape)`` (``(stack,)`` for parts)."""
        return (self.stack, *self.frame_shape)

    @property
    def frame_layout(self):
        """One frame's layout for :func:`atari.parts.zeros`: ``{key: (shape, dtype)}`` for a
        multi-part observation, else ``(frame_shape, frame_dtype)``."""
        if self.frame_parts:
            return {key: (tuple(shape), np.dtype(dtype)) for key, shape, dtype in self.frame_parts}
        return tuple(self.frame_shape), np.dtype(self.frame_dtype)

    @property
    def arch(self) -> str:
        """``cnn`` for frames (Atari, and images: (H, W) or (C, H, W)), ``mlp`` for vectors,
        ``multi`` for an observation of several parts."""
        if self.frame_parts:
            return "multi"
        return "cnn" if len(self.frame_shape) > 1 else "mlp"


def import_env_module(module: str, env_id: str) -> None:
    """Import the module named before the colon of ``module:EnvId``, which registers its envs
    (gymnasium's own syntax: ``gym.make`` does this, ``gym.spec`` does not)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module and not module.startswith(f"{error.name}."):
            raise UserError(f"importing {module!r} for env {env_id!r} failed: {error}") from None
        raise UserError(
            f"cannot import module {module!r} for env {env_id!r}: no such module; install it or put its "
            "folder on PYTHONPATH"
        ) from None
    except Exception as error:  # the user's module may fail in any way; say how, in one line
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise UserError(f"importing {module!r} for env {env_id!r} failed: {type(error).__name__}: {first_line}") from None


def resolve_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id`` (``EnvId`` or ``module:EnvId``), or a one-line
    :class:`UserError` with close matches."""
    _register_ale()
    module, _, name = env_id.rpartition(":")
    if module:
        import_env_module(module, env_id)
    try:
        return gym.spec(name)
    except gym.error.Error:
        close = difflib.get_close_matches(name, list(gym.registry.keys()), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        where = f" (module {module!r} was imported and registers no such env)" if module else ""
        raise UserError(f"unknown env id {name!r}{where}{hint}") from None


def kwargs_text(env_kwargs: dict) -> str:
    """``--env-kwargs`` as typed: ``KEY=VALUE`` pairs."""
    return " ".join(f"{key}={value}" for key, value in env_kwargs.items())


#: The largest Box action bound the Gaussian policy takes: its σ starts at a share of the half-width,
#: and σ² of a bound much beyond it overflows float32 (3.4e38), every update then non-finite.
MAX_ACTION_BOUND = 1e18


def env_info(env_id: str, env_kwargs: dict | None = None, legacy_images: bool = False) -> EnvInfo:
    """Inspect ``env_id``, made with ``env_kwargs``, once (builds and closes one env) and check
    that ACER can run it. ``legacy_images``: its images as the versions before SB3's rule read
    them (:class:`LegacyImages`)."""
    env_kwargs = dict(env_kwargs or {})
    spec = resolve_spec(env_id)
    atari = spec.entry_point == ATARI_ENTRY_POINT
    reserved = [key for key in env_kwargs if key in RESERVED_KWARGS + (ATARI_RESERVED_KWARGS if atari else ())]
    if reserved:
        raise UserError(
            f"--env-kwargs {reserved[0]} is acer_sync's to set for {env_id} (render_mode by play.py, "
            "frameskip and obs_type by the Atari preprocessing)"
        )
    try:
        env = gym.make(spec, **env_kwargs) if atari else make_gym_env(env_id, env_kwargs=env_kwargs, legacy_images=legacy_images)
    except UserError:  # what make_gym_env says of the env (not an env, an unsupported space) is said as it is
        raise
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the env's own constructor may raise anything (an OSError from a device)
        first_line = _remote_text(error).splitlines()[0] if _remote_text(error) else type(error).__name__
        if not isinstance(error, (gym.error.Error, ImportError, TypeError, ValueError)):
            first_line = f"{type(error).__name__}: {first_line}"  # not a usage error: its kind says what broke
        made_with = f" with --env-kwargs {kwargs_text(env_kwargs)}" if env_kwargs else ""
        raise UserError(f"cannot build {env_id}{made_with}: {first_line}") from None
    try:
        action_space = env.action_space
        observation_space = env.observation_space
        own_space = getattr(env, "raw_observation_space", None)
        action_meanings = env.unwrapped.get_action_meanings() if atari else user_action_names(env)
    finally:
        close_probe(env, env_id)
    continuous = isinstance(action_space, gym.spaces.Box)
    if continuous and (len(action_space.shape) != 1 or action_space.shape[0] == 0 or not np.all(np.isfinite(action_space.low))
                       or not np.all(np.isfinite(action_space.high))):
        raise UserError(
            f"{env_id} has action space {action_space}; acer_sync supports Box actions only as a flat "
            "vector of at least one number, with finite bounds"
        )
    if continuous and not np.issubdtype(action_space.dtype, np.floating):
        raise UserError(
            f"{env_id} has action space {action_space}: a Box of {action_space.dtype} takes whole numbers, and a "
            "Gaussian policy gives real ones; give the env a float Box (or Discrete actions)"
        )
    if continuous and np.max(np.abs(np.concatenate([action_space.low, action_space.high])), initial=0.0) > MAX_ACTION_BOUND:
        raise UserError(
            f"{env_id} has action space {action_space}: bounds beyond ±{MAX_ACTION_BOUND:.0e}, whose squares (the "
            "Gaussian's variance) float32 cannot hold; rescale its actions (gymnasium.wrappers.RescaleAction)"
        )
    if continuous and not np.all(np.asarray(action_space.high) > np.asarray(action_space.low)):
        raise UserError(
            f"{env_id} has action space {action_space}: a dimension whose low is not below its high leaves the "
            "policy nothing to choose there; leave that dimension out of the env's actions"
        )
    if not continuous and not isinstance(action_space, gym.spaces.Discrete):
        raise UserError(
            f"{env_id} has a {type(action_space).__name__} action space; acer_sync supports "
            "Discrete and Box actions only"
        )
    names = tuple(str(name) for name in action_meanings)
    if atari:
        return EnvInfo(
            env_id, True, ATARI_FRAME, np.dtype(np.uint8), ATARI_STACK, int(action_space.n),
            life_loss_actions=baselines_life_loss_actions(action_meanings), env_kwargs=env_kwargs, action_names=names,
        )
    if isinstance(observation_space, gym.spaces.Dict):  # the parts of a Dict or Tuple with an image
        if continuous:
            raise UserError(f"{env_id} has image observations and Box actions; acer_sync takes images with Discrete actions only")
        frame_parts = tuple((key, tuple(box.shape), box.dtype.name) for key, box in observation_space.spaces.items())
        return EnvInfo(env_id, False, (), np.dtype(np.uint8), 1, int(action_space.n), env_kwargs=env_kwargs,
                       observation_space=own_space, frame_parts=frame_parts, action_start=int(action_space.start),
                       action_names=names, legacy_images=legacy_images)
    # make_gym_env has turned the observations into frames: a vector, or a uint8 image (H, W) or (C, H, W).
    frame_shape = tuple(observation_space.shape)
    image = len(frame_shape) > 1
    if image and continuous:
        raise UserError(f"{env_id} has image observations and Box actions; acer_sync takes images with Discrete actions only")
    frame_dtype = np.dtype(np.uint8 if image else np.float32)
    if continuous:
        return EnvInfo(
            env_id, False, frame_shape, frame_dtype, 1, int(action_space.shape[0]),
            continuous=True, action_low=tuple(float(x) for x in action_space.low),
            action_high=tuple(float(x) for x in action_space.high), env_kwargs=env_kwargs,
            observation_space=own_space, legacy_images=legacy_images,
        )
    return EnvInfo(env_id, False, frame_shape, frame_dtype, 1, int(action_space.n), env_kwargs=env_kwargs,
                   observation_space=own_space, action_start=int(action_space.start), action_names=names,
                   legacy_images=legacy_images)


def user_action_names(env: gym.Env) -> list[str]:
    """The names a Discrete env of the user's gives its actions with ``get_action_meanings()``, as
    ALE's do; none where it has no such method (or it fails: the names only label play.py's log)."""
    meanings = getattr(env.unwrapped, "get_action_meanings", None)
    if not callable(meanings) or not isinstance(env.action_space, gym.spaces.Discrete):
        return []
    try:
        return [str(name) for name in meanings()]
    except Exception:  # noqa: BLE001 - the user's method: a label is not worth a failed start
        return []


def image_layout(space: gym.Space) -> str | None:
    """How a uint8 Box of rank 2 or 3 with the bounds 0 and 255 holds an image, as SB3 tells one:
    ``"hw"`` (one channel), ``"hwc"`` (channels last, gymnasium's layout for RGB frames) or, when
    the first axis is shorter than the last, ``"chw"`` (channels first); None for any other space
    (a uint8 grid of cell codes, bounded 0 and 2, is numbers to flatten, not pixels)."""
    if not is_pixel_box(space) or len(space.shape) not in (2, 3):
        return None
    if len(space.shape) == 2:
        return "hw"
    return "chw" if space.shape[0] < space.shape[-1] else "hwc"


def space_images(space: gym.Space) -> int:
    """How many images (:func:`image_layout`) an observation of ``space`` holds: itself, or its parts."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return sum(image_layout(part) is not None for _, part in named_parts(space))
    return int(image_layout(space) is not None)


def is_pixel_box(space: gym.Space) -> bool:
    """A uint8 Box whose every bound is 0 and 255: pixels."""
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


def all_parts(space: gym.Space) -> list[gym.Space]:
    """``space`` and, for a Dict or Tuple, every part inside it, however deep."""
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict)):
        parts = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
        return [space, *(inner for part in parts for inner in all_parts(part))]
    return [space]


def unsupported_part(space: gym.Space) -> gym.Space | None:
    """The first part of ``space`` that cannot be flattened into a vector of numbers, or None."""
    supported = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Tuple,
                 gym.spaces.Dict)
    return next((part for part in all_parts(space) if not isinstance(part, supported)), None)


def image_size(space: gym.spaces.Box, layout: str) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image of ``layout`` (:func:`image_layout`)."""
    if layout == "hw":
        return 1, *space.shape
    if layout == "hwc":
        height, width, channels = space.shape
        return channels, height, width
    return space.shape


def check_cnn_image_sides(info: "EnvInfo") -> None:
    """A one-line UserError where an image of ``info`` (its frames, or an image part of them) is
    smaller than the Nature CNN takes. A torso of the user's own takes any size (it is not called then)."""
    if info.arch == "cnn":
        images = [("", info.frame_shape)]
    else:
        images = [(key, shape) for key, shape, dtype in info.frame_parts if np.dtype(dtype) == np.uint8 and len(shape) in (2, 3)]
    for key, shape in images:
        height, width = shape[-2:]
        if min(height, width) < MIN_IMAGE_SIDE:
            raise UserError(
                f"{info.env_id} has {height}x{width} images{f' in its part {key!r}' if key else ''}; the CNN takes images "
                f"of at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} (give it a torso of your own with --torso, or register "
                "the env wrapped in gymnasium.wrappers.FlattenObservation to train the MLP on it)"
            )


def channels_first(obs) -> np.ndarray:
    """An HWC image as CHW."""
    return np.ascontiguousarray(np.moveaxis(np.asarray(obs), -1, 0))


def named_parts(space: gym.Space) -> list[tuple[str, gym.Space]]:
    """The parts of a Dict (by key) or a Tuple (keyed ``"0"``, ``"1"``, ...) space."""
    if isinstance(space, gym.spaces.Dict):
        return [(str(key), part) for key, part in space.spaces.items()]
    return [(str(index), part) for index, part in enumerate(space.spaces)]


def has_image_part(space: gym.Space) -> bool:
    """Whether ``space`` is a Dict or Tuple with an image (:func:`image_layout`) among its parts."""
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)) and any(
        image_layout(part) is not None for _, part in named_parts(space)
    )


def part_frames(space: gym.Space, env_id: str) -> tuple[gym.spaces.Dict, object]:
    """The frames of a Dict or Tuple space with an image in it: a Dict space of one Box per part
    (an image uint8, ``(H, W)`` or channels first; any other part flattened to a float32 vector,
    one-hot where discrete), and the function that turns one of the env's observations into it."""
    items = named_parts(space)
    boxes, convert = {}, {}
    for key, part in items:
        layout = image_layout(part)
        if layout is not None:
            channels, height, width = image_size(part, layout)
            boxes[key] = gym.spaces.Box(0, 255, (channels, height, width) if layout == "hwc" else part.shape, np.uint8)
            convert[key] = channels_first if layout == "hwc" else np.asarray
        else:
            bad = unsupported_part(part)
            if bad is not None:
                raise UserError(f"{env_id} has observation space {space} (its {type(bad).__name__} part); "
                                f"acer_sync supports {SUPPORTED_OBSERVATIONS}")
            boxes[key] = gym.spaces.Box(-np.inf, np.inf, (gym.spaces.flatdim(part),), np.float32)
            convert[key] = (lambda p: lambda obs: gym.spaces.flatten(p, obs).astype(np.float32))(part)
    tuple_space = isinstance(space, gym.spaces.Tuple)
    env_keys = dict(zip((key for key, _ in items), space.spaces)) if not tuple_space else {}  # a Dict's keys may be ints

    def to_frames(observation) -> dict[str, np.ndarray]:
        values = {str(i): value for i, value in enumerate(observation)} if tuple_space \
            else {key: observation[env_key] for key, env_key in env_keys.items()}
        return {key: convert[key](values[key]) for key, _ in items}

    return gym.spaces.Dict(boxes), to_frames


def adapt_observations(env: gym.Env, env_id: str) -> gym.Env:
    """``env`` with observations the trainer stores as frames: a flat Box as it is; an image as a
    uint8 frame for the CNN, ``(H, W)`` or channels first ``(C, H, W)``; a Dict or Tuple with an
    image in it as a dict of parts (:func:`part_frames`); any other supported space flattened to a
    float32 vector, one-hot for the discrete parts (``gymnasium.wrappers.FlattenObservation``). A one-line
    UserError otherwise. The CNN takes the stack's frames and their channels as its input channels."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Box) and space.shape and min(space.shape) == 0:
        raise UserError(f"{env_id} has observation space {space}, which holds no numbers: there is nothing to act on")
    layout = image_layout(space)
    if layout is not None:
        if layout != "hwc":
            return env
        frame = gym.spaces.Box(0, 255, image_size(space, layout), np.uint8)
        adapted = gym.wrappers.TransformObservation(env, channels_first, frame)
        adapted.raw_observation_space = space
        return adapted
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return env
    stacked = next((part for part in all_parts(space) if is_pixel_box(part) and len(part.shape) > 3), None)
    if stacked is not None:
        inside = f" (its part {stacked})" if stacked is not space else ""
        raise UserError(
            f"{env_id} has observation space {space}{inside}: pixels of rank {len(stacked.shape)} (a frame stack of RGB "
            "frames?); acer_sync takes an image as (H, W), (H, W, C) or (C, H, W): stack the frames along the channels, "
            "or not at all"
        )
    if has_image_part(space):
        frames_space, to_frames = part_frames(space, env_id)
        adapted = gym.wrappers.TransformObservation(env, to_frames, frames_space)
        adapted.raw_observation_space = space
        return adapted
    bad = unsupported_part(space)
    if bad is not None:
        inside = f" (its {type(bad).__name__} part)" if bad is not space else ""
        raise UserError(f"{env_id} has observation space {space}{inside}; acer_sync supports {SUPPORTED_OBSERVATIONS}")
    flat = gym.wrappers.FlattenObservation(env)
    # float32, the dtype the trainer stores vectors in: a Discrete's one-hot in int64 would read as
    # a batch of the env's own observations (Policy.predict takes both)
    vector = gym.spaces.Box(-np.inf, np.inf, flat.observation_space.shape, np.float32)
    adapted = gym.wrappers.TransformObservation(flat, lambda observation: np.asarray(observation, dtype=np.float32), vector)
    adapted.raw_observation_space = space
    return adapted


class LegacyImages(gym.Wrapper):
    """An env's observations as the versions before SB3's image rule (a uint8 Box is an image only
    with the bounds 0 and 255) read them, for the runs they trained: any uint8 Box of rank 2 or 3
    an image (its space given the bounds 0 and 255), and pixels of rank 4 a vector to flatten (its
    space given the bound 254, so that they are not taken for pixels and refused). The observations
    themselves are untouched."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = legacy_image_space(env.observation_space)


def legacy_image_space(space: gym.Space) -> gym.Space:
    """``space`` with the bounds :class:`LegacyImages` gives its uint8 Boxes, however deep."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: legacy_image_space(part) for key, part in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple(tuple(legacy_image_space(part) for part in space.spaces))
    if isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) >= 2:
        return gym.spaces.Box(0, 255 if len(space.shape) <= 3 else 254, space.shape, np.uint8)
    return space


def adapt_observation(space: gym.Space, observation):
    """One observation of the env's own ``space`` as :func:`adapt_observations` turns it into a
    frame: an image channels first, a Dict or Tuple with an image in it a dict of parts, anything
    else but a flat Box flattened (one-hot for the discrete parts), as ``FlattenObservation`` does."""
    if image_layout(space) == "hwc":
        return channels_first(observation)
    if has_image_part(space):
        return part_frames(space, "")[1](observation)
    return gym.spaces.flatten(space, observation)


def baselines_life_loss_actions(action_meanings: list[str]) -> tuple[int, ...]:
    """What Baselines plays after a lost life, before the agent acts again: NOOP, FIRE, action 2.

    ``wrap_deepmind`` puts ``FireResetEnv`` around ``EpisodicLifeEnv``, so the "reset" that
    follows a life loss steps a no-op (EpisodicLifeEnv), then FIRE and action 2 (FireResetEnv),
    in games whose action 1 is FIRE (FireResetEnv's own condition). Empty for other games.
    """
    if len(action_meanings) >= 3 and action_meanings[1] == "FIRE":
        return (0, 1, 2)
    return ()


class FireReset(gym.Wrapper):
    """Press FIRE after every reset, for games that wait for it (as ale-py's ``use_fire_reset``)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_gym_env(
    env_id: str, render_mode: str | None = None, noop_max: int = NOOP_MAX, env_kwargs: dict | None = None,
    legacy_images: bool = False,
) -> gym.Env:
    """One gymnasium env, made with ``env_kwargs``, with this project's preprocessing (Atari) or
    its observations turned into frames (anything else, :func:`adapt_observations`; with
    ``legacy_images``, as the versions before SB3's rule turned them: :class:`LegacyImages`)."""
    spec = resolve_spec(env_id)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if spec.entry_point != ATARI_ENTRY_POINT:
        env = gym.make(spec, **kwargs)
        return adapt_observations(LegacyImages(env) if legacy_images else env, env_id)
    env = gym.make(spec, frameskip=1, **kwargs)
    if "FIRE" in env.unwrapped.get_action_meanings():
        # Inside the frame skip, so FIRE is one emulator frame, as in ale-py's vector env.
        env = FireReset(env)
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=FRAME_SKIP,
        screen_size=ATARI_FRAME[0],
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    return env


#: The signals a ``subproc`` worker sets its own handlers for, blocked from its fork until it has.
WORKER_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
#: Per thread, while :func:`_workers_forking` is open in it: that thread's signal mask at its start.
_FORKING = threading.local()


def _block_worker_signals_before_fork() -> None:
    if getattr(_FORKING, "mask", None) is not None:
        signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_SIGNALS)


def _restore_mask_after_fork() -> None:
    mask = getattr(_FORKING, "mask", None)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


os.register_at_fork(before=_block_worker_signals_before_fork, after_in_parent=_restore_mask_after_fork)


@contextlib.contextmanager
def _workers_forking():
    """Each process this thread forks in the ``with`` block is born with SIGINT and SIGTERM
    blocked; the thread's own mask is restored as soon as the fork returns, and again at the end.

    A forked worker inherits the trainer's handlers (run_cli's SIGTERM handler, the trainer's
    SIGINT) until :func:`_subproc_worker` replaces them; a signal in between would run the
    trainer's handler in the worker and print its traceback. Blocked, it waits for the worker's
    own handlers, which :func:`_subproc_worker` sets before it unblocks them. Only the thread
    that opened the block forks blocked (other threads' children are theirs). The restore at the
    end is ordinary code: a signal that reached the process during a fork, and whose handler ran
    inside another at-fork hook (where Python drops its exception), cannot leave the mask blocked.
    """
    _FORKING.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask now (blocks nothing more)
    try:
        yield
    finally:
        mask, _FORKING.mask = _FORKING.mask, None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _subproc_worker(*worker_args) -> None:
    """The entry point of each ``subproc`` worker process: ignore SIGINT, take SIGTERM's default
    back, unblock both (:func:`_workers_forking`), then run gymnasium's own worker loop.

    A Ctrl-C reaches the whole process group; the workers ignore it so that the trainer can finish
    its update, checkpoint and close them in order. This is AsyncVectorEnv's ``worker`` hook, the
    target of the worker processes alone, so it can never touch the trainer's own handlers. (The
    env factory is no place for it: AsyncVectorEnv also calls the factory in the trainer's
    process, to read the spaces from a dummy env.)
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the script's handler (run_cli)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_SIGNALS)  # blocked since the fork (_workers_forking)
    index, env_fn, pipe, parent_pipe, _, error_queue = worker_args[:6]
    try:
        env = env_fn()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - gymnasium's worker makes its env outside its error handling
        # Answer its first command (the space check) as gymnasium's worker answers a failure, so the
        # trainer raises the env's error in one line rather than a dead pipe and a traceback here;
        # as gymnasium can rebuild it (_crossing).
        parent_pipe.close()
        crossing = _crossing(error)
        error_queue.put((index, type(crossing), crossing, traceback.format_exc()))
        try:
            pipe.recv()
            pipe.send((None, False))
        except (EOFError, OSError):
            pass
        return
    try:
        _async_worker(index, lambda: _PicklableErrors(env), *worker_args[2:])
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the env's close, in the worker loop's finally
        # reported by VecEnv.close, as text: an exception of the env's own may not unpickle in the trainer
        error_queue.put((index, None, str(_env_raised("", error, "in close")).strip(), ""))


#: The VecEnv whose step or reset is running now (in the main thread), for :func:`end_env_calls_within`.
_CALLING: list = []
#: The SIGALRM and SIGCONT handlers before the first open VecEnv put in :func:`_on_alarm` and
#: :func:`_on_continue`, and how many are open.
_ALARM = {"previous": None, "previous_continue": None, "open": 0}
#: SIGCONTs received: each ends a stop of the process (Ctrl-Z then ``fg``, ``kill -STOP`` then ``-CONT``).
_CONTINUES = [0]
#: Seconds a SIGALRM waits before it ends an env call: the SIGCONT that ends a stop during which
#: the timeout ran out is handled just after that SIGALRM, and a stop is not the env's time.
CONFIRM_SECONDS = 1.0


def _on_alarm(signum, frame) -> None:
    """SIGALRM: the env call running now (if any) has run out of time, unless the process was
    stopped during it: then its time starts again. Confirmed :data:`CONFIRM_SECONDS` later, so
    that a SIGCONT pending beside this SIGALRM is counted first."""
    if not _CALLING:
        return
    call = _CALLING[-1]
    if call.continues_seen != _CONTINUES[0]:
        call.continues_seen, call.confirming = _CONTINUES[0], False
        signal.setitimer(signal.ITIMER_REAL, call.armed_seconds)
        return
    if not call.confirming:
        call.confirming = True
        signal.setitimer(signal.ITIMER_REAL, CONFIRM_SECONDS)
        return
    call.expire()


def _on_continue(signum, frame) -> None:
    """SIGCONT: the process ran again after a stop (its default action, continuing, happens anyway)."""
    _CONTINUES[0] += 1
    previous = _ALARM["previous_continue"]
    if callable(previous):
        previous(signum, frame)


def process_continues() -> int:
    """How many SIGCONTs this process has had while a VecEnv was open: a change between two
    readings means the process was stopped in between (an env call timed from another thread
    starts its time again, as :func:`_on_alarm` starts a main-thread call's)."""
    return _CONTINUES[0]


def _hold_alarm() -> bool:
    """Install :func:`_on_alarm` and :func:`_on_continue` while any VecEnv is open (main thread
    only); False elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if _ALARM["open"] == 0:
        _ALARM["previous"] = signal.signal(signal.SIGALRM, _on_alarm)
        _ALARM["previous_continue"] = signal.signal(signal.SIGCONT, _on_continue)
    _ALARM["open"] += 1
    return True


def _release_alarm() -> None:
    _ALARM["open"] -= 1
    if _ALARM["open"] == 0:
        for sig, key in ((signal.SIGALRM, "previous"), (signal.SIGCONT, "previous_continue")):
            previous = _ALARM[key]
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)


def end_env_calls_within(seconds: float, reason: str) -> None:
    """Make an env step or reset that is running now in the main thread raise
    :class:`EnvTimedOut` if it has not returned within ``seconds`` (sooner, if its own timeout
    comes first), its message ending with ``reason``. Called from a signal handler (a stop asked
    for while an env hangs); does nothing when no env call is running."""
    if not _CALLING:
        return
    remaining = signal.getitimer(signal.ITIMER_REAL)[0]
    if remaining == 0 or remaining > seconds:
        call = _CALLING[-1]
        call.armed_seconds, call.confirming, call.expiry_reason = seconds, False, reason
        signal.setitimer(signal.ITIMER_REAL, seconds)


@contextlib.contextmanager
def _gym_logger_quiet(quiet: bool = True):
    """gymnasium's logger silenced for the ``with`` block (where ``quiet``): AsyncVectorEnv logs a
    worker's traceback before it raises the worker's error again, which is reported in one line."""
    level = gym.logger.min_level
    if quiet:
        gym.logger.min_level = gym.logger.ERROR + 1
    try:
        yield
    finally:
        gym.logger.min_level = level


def close_probe(env: gym.Env, env_id: str) -> None:
    """Close an env built to read its spaces; one whose close raises is a warning, as at a run's end."""
    try:
        env.close()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the env's own code (a sys.exit() would end the program)
        CLOSE_LOG.warning(f"{_env_raised(env_id, error, 'in close')}; it was left open")


class RemoteEnvError(Exception):
    """An env's exception in a ``subproc`` worker, as its type's name and its text: it crosses to
    the trainer by pickle, which cannot rebuild every class (one whose ``__init__`` takes other
    arguments than its message)."""

    def __init__(self, type_name, text: str = ""):
        if isinstance(type_name, RemoteEnvError):  # gymnasium raises exctype(value) with the value it got
            type_name, text = type_name.type_name, type_name.text
        super().__init__(type_name, text)
        self.type_name, self.text = type_name, text


def _crossing(error: BaseException) -> BaseException:
    """What a worker sends for ``error``: this package's own errors as they are (their message is
    their one argument), any other as a :class:`RemoteEnvError`. gymnasium rebuilds a worker's
    error as ``type(error)(error)``, which many classes refuse (``JSONDecodeError``,
    ``CalledProcessError``, an SDK's error of two arguments): "raised TypeError" was reported."""
    if isinstance(error, (EnvFailed, UserError)):
        return error
    return RemoteEnvError(type(error).__name__, _remote_text(error))


class _PicklableErrors(gym.Wrapper):
    """A ``subproc`` worker's env whose step and reset raise what crosses to the trainer as it was (:func:`_crossing`)."""

    def reset(self, **kwargs):
        try:
            return self.env.reset(**kwargs)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - the env's own; its sys.exit() ended the worker
            raise _crossing(error) from None

    def step(self, action):
        try:
            return self.env.step(action)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - the env's own; its sys.exit() ended the worker
            raise _crossing(error) from None


def _remote_text(error: BaseException) -> str:
    return f"exit code {error.code!r}" if isinstance(error, SystemExit) else str(error).strip()


def _env_raised(env_id: str, error: BaseException, when: str) -> EnvFailed:
    """An env's own exception as this module's error, in one line: "ENV raised TYPE WHEN: its first line"."""
    if isinstance(error, RemoteEnvError):
        name, text = error.type_name, error.text
    else:
        name, text = type(error).__name__, _remote_text(error)
    return EnvFailed(f"{env_id} raised {name} {when}" + (f": {text.splitlines()[0]}" if text else ""))


class VecEnv:
    """A uniform face over the backends.

    ``reset() -> frames`` and ``step(actions) -> (frames, raw_rewards, terminated, truncated,
    lives)``, all numpy arrays with the env on the first axis. ``lives`` is 0 for games without
    lives and for non-Atari envs. ``noop_max`` 0 makes Atari resets deterministic (for tests).
    ``num_threads`` caps the ALE backend's threads (0: one per env, up to the core count).

    On the ALE backend the envs may form ``groups`` of equal size, each an ALE vector env of its
    own (its threads a share of ``num_threads``) whose step is sent (:meth:`send`) and received
    (:meth:`recv`) apart, so that one group steps while another's actions are chosen (the Runner's
    ``--env-groups``). Env i is seeded as in one group; :meth:`step` sends every group's actions,
    then receives them in order.

    After each step, ``final_frames[i]`` is the last frame of the episode env i just ended (the
    frame returned is already the next episode's first, as autoreset is SAME_STEP), for the envs
    where ``final_mask[i]``; a truncated episode bootstraps from it.

    Faults are exceptions of their own, each with a one-line message naming the env: an exception
    raised in an env (any backend) is an :class:`EnvFailed`, as is a non-finite observation or
    reward; a worker process that died is an :class:`EnvWorkerDied`; a step or reset that takes
    longer than ``timeout`` seconds (0: no limit) is an :class:`EnvTimedOut`. The timeout is a
    ``SIGALRM`` timer, armed around each call made in the main thread, whose handler is this
    module's while a VecEnv made there is open (in other threads, as a Ray trial's, there is none).
    It ends a hang in Python code or in a wait on a ``subproc`` worker, not one inside a C
    extension that never returns to Python (ale-py's own threads). Time the process spends stopped
    (Ctrl-Z, ``kill -STOP``) is not the env's: after the ``SIGCONT`` the call's timeout starts
    again (an expiry waits :data:`CONFIRM_SECONDS` for that signal).
    """

    def __init__(
        self, info: EnvInfo, num_envs: int, backend: str, render_mode: str | None = None, noop_max: int = NOOP_MAX,
        num_threads: int = 0, timeout: float = 0.0, groups: int = 1,
    ):
        self.info = info
        self.num_envs = num_envs
        if groups < 1 or num_envs % groups:
            raise UserError(f"--env-groups {groups} must divide --num-envs {num_envs} into groups of equal size")
        check_groups_backend(groups, backend)
        #: How many groups the envs step in (:meth:`send`, :meth:`recv`), and each one's envs.
        self.groups, self.group_size = groups, num_envs // groups
        #: Each group's envs as rows of the run's arrays (``slice(None)``, all of them, for one group).
        self.group_rows = [slice(None)] if groups == 1 else [
            slice(group * self.group_size, (group + 1) * self.group_size) for group in range(groups)]
        self.backend = backend
        self.timeout = timeout
        self.steps = 0  # vector steps taken, for the messages
        self.broken = False  # a call failed part-way: close() terminates instead of asking the envs
        self.expiry_reason = ""
        #: The timeout armed for the call running now, whether its expiry awaits confirmation, and
        #: the SIGCONTs seen when it was armed (:func:`_on_alarm`).
        self.armed_seconds, self.confirming, self.continues_seen = 0.0, False, 0
        self._calling = ""
        #: The call running now for :meth:`current_call`, one tuple set in one assignment (another
        #: thread reads it whole, never one call's start with another's name).
        self._current_call: tuple[str, float, int] | None = None
        self._alarm = False  # whether this VecEnv holds the SIGALRM handler (made in the main thread)
        layout = info.frame_layout
        layouts = layout.values() if isinstance(layout, dict) else [layout]
        self._float_frames = any(dtype.kind == "f" for _, dtype in layouts)  # only these can be NaN
        if backend == "ale":
            if not info.atari:
                raise UserError(f"--vec-env ale runs Atari games only; use subproc or sync for {info.env_id}")
            from ale_py.vector_env import AtariVectorEnv

            unsupported = [key for key in info.env_kwargs if key not in ALE_VECTOR_KWARGS]
            if unsupported:
                raise UserError(
                    f"--vec-env ale takes the env kwargs {', '.join(ALE_VECTOR_KWARGS)} only, not "
                    f"{unsupported[0]}; use --vec-env subproc for it"
                )
            kwargs = {**resolve_spec(info.env_id).kwargs, **info.env_kwargs}
            size, threads = self.group_size, max(1, min(num_envs, num_threads or os.cpu_count() or 1) // groups)
            self.group_envs = [AtariVectorEnv(
                kwargs["game"],
                size,
                num_threads=min(size, threads),
                max_num_frames_per_episode=kwargs.get("max_num_frames_per_episode", 108_000),
                repeat_action_probability=kwargs.get("repeat_action_probability", 0.0),
                full_action_space=kwargs.get("full_action_space", False),
                autoreset_mode="SameStep",
                img_height=ATARI_FRAME[0],
                img_width=ATARI_FRAME[1],
                stack_num=1,
                frameskip=FRAME_SKIP,
                noop_max=noop_max,
                episodic_life=False,
                reward_clipping=False,
                use_fire_reset=True,
            ) for _ in range(groups)]
            self.env = self.group_envs[0]  # its spaces; with groups, calls go through each group's
        elif backend in ("subproc", "sync"):
            same_step = gym.vector.AutoresetMode.SAME_STEP
            fns = [lambda: make_gym_env(info.env_id, render_mode, noop_max, info.env_kwargs, info.legacy_images)] * num_envs
            try:
                with _gym_logger_quiet():
                    if backend == "subproc":
                        with _workers_forking():
                            self.env = gym.vector.AsyncVectorEnv(fns, autoreset_mode=same_step, worker=_subproc_worker)
                    else:
                        self.env = gym.vector.SyncVectorEnv(fns, autoreset_mode=same_step)
            except UserError:
                raise
            except (Exception, SystemExit) as error:  # noqa: BLE001 - an env that env_info made fails when made again (in a worker)
                raise _env_raised(info.env_id, error, "when made for the run") from None
            self.group_envs = [self.env]
        else:
            raise UserError(f"unknown vector backend {backend!r}; choose from {', '.join(BACKENDS)}")
        # a Box's own float dtype (float16, float64): gymnasium checks the action is in the space
        self.action_dtype = self.env.single_action_space.dtype if info.continuous else np.dtype(np.int64)
        self.final_frames = parts.zeros(info.frame_layout, (num_envs,))
        self.final_mask = np.zeros(num_envs, dtype=bool)
        self._alarm = _hold_alarm()

    def _frames(self, obs):
        if self.backend == "ale":
            obs = obs[:, 0]  # drop the stack axis of size 1
        if self.info.frame_parts:
            return {key: self._cast(obs[key], dtype) for key, (_, dtype) in self.info.frame_layout.items()}
        return self._cast(obs, self.info.frame_dtype)

    def _cast(self, observations, dtype: np.dtype) -> np.ndarray:
        """``observations`` in the frames' ``dtype``; an :class:`EnvFailed` for a finite float
        beyond float32's range, which the cast would make infinite (and report as the env's inf)."""
        observations = np.asarray(observations)
        if np.dtype(dtype) == np.float32 and observations.dtype.kind == "f" and observations.dtype.itemsize > 4:
            beyond = np.isfinite(observations) & (np.abs(observations) > np.finfo(np.float32).max)
            if beyond.any():
                index = int(np.flatnonzero(beyond.reshape(len(observations), -1).any(axis=1))[0])
                value = observations[index][beyond[index]].flat[0]
                raise EnvFailed(f"env {index} of {self.info.env_id} returned an observation of {value:g} at its vector step "
                                f"{self.steps}, beyond float32's range (±3.4e38): scale the env's observations")
        return observations.astype(dtype, copy=False)

    def _lives(self, info: dict, size: int | None = None) -> np.ndarray:
        """The lives of an Atari game (life loss ends training's episodes there); another env's
        ``info["lives"]``, only logged (play.py --actions), is read where it is a whole number per env."""
        lives = info.get("lives", None)
        if lives is None:
            return np.zeros(size or self.num_envs, dtype=np.int64)
        if self.info.atari:
            return np.asarray(lives, dtype=np.int64)
        try:
            lives = np.asarray(lives, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            return np.zeros(self.num_envs, dtype=np.int64)
        return lives if lives.shape == (self.num_envs,) else np.zeros(self.num_envs, dtype=np.int64)

    def _dead_worker(self) -> EnvWorkerDied:
        processes = getattr(self.env, "processes", [])
        deadline = time.monotonic() + 2.0  # the broken pipe can be seen before the exit is reaped
        while not any(p.exitcode is not None for p in processes) and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = [(i, p) for i, p in enumerate(processes) if p.exitcode is not None]
        if not dead:
            return EnvWorkerDied("the connection to an env worker broke, but every worker is still running")
        index, process = dead[0]
        how = (
            f"was killed by {signal.Signals(-process.exitcode).name}"
            if process.exitcode < 0 and -process.exitcode in signal.Signals._value2member_map_
            else f"exited with code {process.exitcode}"
        )
        return EnvWorkerDied(f"env {index} of {self.num_envs} (worker pid {process.pid}) {how}")

    def _call(self, what: str, method, *args, **kwargs):
        """``method(*args, **kwargs)`` under the timeout, its faults turned into this module's errors.

        gymnasium's AsyncVectorEnv logs a worker's traceback before raising its error again here:
        on that backend its logger is silenced for the call (the error's own message is reported
        instead; the workers' warnings are printed by the workers themselves)."""
        main = self._alarm and threading.current_thread() is threading.main_thread()
        if main:
            _CALLING.append(self)
            self.continues_seen, self.confirming = _CONTINUES[0], False
            if self.timeout > 0:
                self.expiry_reason = past_env_timeout(self.timeout)
                self.armed_seconds = self.timeout
                signal.setitimer(signal.ITIMER_REAL, self.timeout)
        self._calling = what
        self._current_call = (what, time.monotonic(), _CONTINUES[0])
        try:
            with _gym_logger_quiet(self.backend == "subproc"):
                if not main and self.timeout > 0 and self.backend == "subproc" and what in ("step", "reset"):
                    # No SIGALRM off the main thread (a sweep trial's): the workers' answer is waited
                    # for with the timeout instead.
                    getattr(self.env, f"{what}_async")(*args, **kwargs)
                    return getattr(self.env, f"{what}_wait")(timeout=self.timeout)
                return method(*args, **kwargs)
        except multiprocessing.TimeoutError:
            self.broken = True  # the workers are still in the call: closing ends them
            raise EnvTimedOut(f"{self.info.env_id}'s {what} {past_env_timeout(self.timeout)}") from None
        except (BrokenPipeError, EOFError, ConnectionResetError):
            self.broken = True
            raise self._dead_worker() from None
        except (EnvFailed, UserError, KeyboardInterrupt):  # a Ctrl-C cut the call short: no worker will answer it
            self.broken = True
            raise
        except (Exception, SystemExit) as error:  # an env's sys.exit() would end the run, or the user's program, in silence
            self.broken = True
            raise _env_raised(self.info.env_id, error, f"in {what}") from error
        finally:
            self._calling = ""
            self._current_call = None
            if main:
                _CALLING.pop()
                signal.setitimer(signal.ITIMER_REAL, 0)

    def current_call(self) -> tuple[str, float, int] | None:
        """The env call running now, in any thread: ``("step" or "reset", its time.monotonic() start,
        the process's SIGCONTs then (:func:`process_continues`))``, or None. A collecting thread has
        no SIGALRM timer: its waiter times the call with this."""
        return self._current_call

    def expire(self) -> None:
        """End the call running now with :class:`EnvTimedOut` (from the SIGALRM handler)."""
        if self._calling:
            raise EnvTimedOut(f"{self.info.env_id}'s {self._calling} {self.expiry_reason}")

    def _rewards_in_range(self, rewards: np.ndarray, first: int = 0) -> np.ndarray:
        """The rewards as float32; an :class:`EnvFailed` for a finite one beyond float32's range,
        which the cast would make infinite (and report as the env's inf, with numpy's warning).
        ``rewards`` are those of the envs from ``first`` on (a group's)."""
        beyond = np.isfinite(rewards) & (np.abs(rewards) > np.finfo(np.float32).max)
        if beyond.any():
            index = int(np.flatnonzero(beyond)[0])
            raise EnvFailed(f"env {first + index} of {self.info.env_id} returned a reward of {rewards[index]:g} at its vector step "
                            f"{self.steps}, beyond float32's range (±3.4e38): scale the env's rewards")
        return rewards.astype(np.float32)

    def _check_finite(self, frames, rewards: np.ndarray | None, rows: np.ndarray | None = None,
                      what: str = "observation", first: int = 0) -> None:
        """An :class:`EnvFailed` naming the env and the step of a NaN or infinite reward or
        observation (``what``), of the envs where ``rows`` (all where None); the arrays are those
        of the envs from ``first`` on (a group's)."""
        observations = [part.reshape(len(part), -1) for part in parts.parts_of(frames) if part.dtype.kind == "f"]
        if rows is not None:
            observations = [np.where(rows[:, None], part, 0) for part in observations]
        if (rewards is None or np.isfinite(rewards).all()) and all(np.isfinite(part).all() for part in observations):
            return
        checks = [("reward", rewards)] if rewards is not None else []
        checks += [(what, part) for part in observations]
        for what, values in checks:
            finite = np.isfinite(values)
            if not finite.all():
                index = int(np.flatnonzero(~finite.reshape(len(finite), -1).all(axis=1))[0])
                value = values[index] if values.ndim == 1 else values[index][~finite[index]][0]
                raise EnvFailed(
                    f"env {first + index} of {self.info.env_id} returned a non-finite {what} ({value}) at its vector step {self.steps}"
                )

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Reset every env; returns ``(frames, lives)``. ale-py's vector env seeds env i with seed + i,
        each below 2**31 - 1: a larger seed (a run's, plus the offsets of its evaluations and
        resumes) is taken modulo 2**31 - 1 - N, the same seed always to the same."""
        if seed is not None and self.backend == "ale":
            seed %= ALE_SEED_SPAN - self.num_envs  # it seeds env i with seed + i
        if self.groups == 1:
            obs, info = self._call("reset", self.env.reset, seed=seed)
            frames = self._frames(obs)
            self._check_finite(frames, None)
            return frames, self._lives(info)
        done = []  # group g's env i is env g * group_size + i, seeded as in one group
        for group, env in enumerate(self.group_envs):
            obs, info = self._call("reset", env.reset, seed=None if seed is None else seed + group * self.group_size)
            done.append((self._frames(obs), self._lives(info, self.group_size)))
        return _concatenated([frames for frames, _ in done]), np.concatenate([lives for _, lives in done])

    def _record_final(self, info: dict, ended: np.ndarray, first: int = 0) -> None:
        """Keep the final frames: gymnasium masks them with ``_final_obs``; ale-py's vector env
        returns ``final_obs`` for every env, meaningful where the episode ended. ``info`` and
        ``ended`` are those of the envs from ``first`` on (a group's)."""
        self.final_mask[first:first + len(ended)] = False
        if "final_obs" not in info:
            return
        # only where an episode ended: a key final_obs of the env's own info shows on its other steps
        mask = np.asarray(info.get("_final_obs", ended), dtype=bool) & ended
        for row in np.flatnonzero(mask):
            final, index = info["final_obs"][row], first + row
            try:
                parts.assign(self.final_frames, index, np.asarray(final)[0] if self.backend == "ale" else final)
            except (ValueError, TypeError, KeyError, IndexError):
                raise EnvFailed(f"env {index} of {self.info.env_id} ended an episode with an info['final_obs'] that is not "
                                f"an observation ({type(final).__name__}) at its vector step {self.steps}; gymnasium's vector "
                                "envs keep that key for the final observation: give it another name") from None
            self.final_mask[index] = True

    def step(self, actions: np.ndarray):
        if self.groups > 1:  # every group's actions sent, then each group's step received, in order
            for group, rows in enumerate(self.group_rows):
                self.send(group, actions[rows])
            stepped = [self.recv(group) for group in range(self.groups)]
            return (_concatenated([step[0] for step in stepped]), *(np.concatenate(values) for values in list(zip(*stepped))[1:]))
        obs, rewards, terminated, truncated, info = self._call("step", self.env.step, np.asarray(actions, dtype=self.action_dtype))
        self.steps += 1
        return self._stepped(obs, rewards, terminated, truncated, info)

    def send(self, group: int, actions: np.ndarray) -> None:
        """Start group ``group``'s step with its envs' ``actions`` (``[group_size, ...]``); :meth:`recv` ends it."""
        self._call("step", self.group_envs[group].send, np.asarray(actions, dtype=self.action_dtype))

    def recv(self, group: int):
        """Group ``group``'s step, sent before: :meth:`step`'s arrays for its envs (``final_frames``
        and ``final_mask`` are updated in their rows)."""
        obs, rewards, terminated, truncated, info = self._call("step", self.group_envs[group].recv)
        if group == 0:  # a vector step: each group's faults name the same one
            self.steps += 1
        return self._stepped(obs, rewards, terminated, truncated, info, group * self.group_size)

    def _stepped(self, obs, rewards, terminated, truncated, info, first: int = 0):
        """A step's arrays for the envs from ``first`` on, checked, their final frames kept."""
        frames = self._frames(obs)
        rewards = self._rewards_in_range(np.asarray(rewards, dtype=np.float64), first)
        self._check_finite(frames, rewards, first=first)
        terminated, truncated = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
        self._record_final(info, terminated | truncated, first)
        # Only a cut episode's final observation is read (its V bootstraps Q^ret); a terminal one
        # never is, and an env may end an episode because its state diverged (MuJoCo's is_healthy).
        rows = slice(first, first + len(rewards))
        cut = self.final_mask[rows] & truncated & ~terminated
        if self._float_frames and cut.any():
            final = parts.map_parts(lambda part: part[rows], self.final_frames)
            self._check_finite(final, None, cut, "final observation at a time-limit cut", first)
        return frames, rewards, terminated, truncated, self._lives(info, len(rewards))

    def first_env(self) -> gym.Env:
        """Env 0 itself, wrappers included (the ``sync`` backend only: the others hold no env here)."""
        envs = getattr(self.env, "envs", None)
        if envs is None:
            raise UserError(f"env 0 lives in another process or library on the {self.backend} backend; only sync reaches it")
        return envs[0]

    def render(self) -> np.ndarray:
        """The RGB frame of env 0 (needs ``render_mode='rgb_array'`` and the ``sync`` backend), a
        call like a step: under the timeout, its faults this module's errors."""
        return self._call("render", self.first_env().render)

    def abort(self) -> None:
        """Close the envs without waiting on a call that may never be answered (a run that could not start)."""
        self.broken = True
        self.close()

    def close(self) -> None:
        """Close the envs; after a call failed part-way (a worker died, an env raised or hung),
        terminate the workers instead of waiting on them, and ignore what a broken env raises.
        A close is best effort, called once the run's work is saved: one that raises or passes
        the timeout is a warning (logger ``acer_sync.envs``), and the workers are terminated."""
        processes = getattr(self.env, "processes", [])
        try:
            healthy = not (self.broken or any(p.exitcode is not None for p in processes))
            if healthy or not processes:
                try:
                    self._close_each()
                    if processes and not self.env.error_queue.empty():  # a worker's env raised in its close, then exited
                        CLOSE_LOG.warning(f"{self.info.env_id} {self.env.error_queue.get()[2]}; its worker process ended")
                    return
                except EnvFailed as failure:
                    if healthy:  # a broken env's close may fail too: its first failure is the one reported
                        CLOSE_LOG.warning(f"{failure}; " + ("its worker processes were terminated" if processes else "it was left open"))
                    if not processes:
                        return  # calling a sync env's close again could hang again
            self._terminate(processes)
        finally:
            if self._alarm:
                self._alarm = False
                _release_alarm()

    def _close_each(self) -> None:
        """Close every group's envs (the one set without groups), each tried; the first failure is raised after."""
        failure = None
        for env in self.group_envs:
            try:
                self._call("close", env.close)
            except EnvFailed as error:
                failure = failure or error
        if failure is not None:
            raise failure

    def _terminate(self, processes: list) -> None:
        """End the worker processes without waiting on a call that may never be answered."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gymnasium warns about the step a dead worker never answered
            try:
                # The call that failed will never be answered: not waiting for it is what
                # gymnasium itself does after a worker's error (AsyncState.DEFAULT), and
                # closing would otherwise read the dead worker's pipe and raise again.
                self.env._state = AsyncState.DEFAULT
                self.env.close(terminate=True)
            except Exception:  # noqa: BLE001 - the env already failed, and that failure is being reported
                pass


def _concatenated(frames: list):
    """Groups' frames (arrays, or dicts of them) as the frames of all their envs, in order."""
    return parts.map_parts(lambda *group_parts: np.concatenate(group_parts), *frames)


def check_groups_backend(groups: int, backend: str) -> None:
    """A :class:`UserError` where envs in ``groups`` (``--env-groups``) would step on another
    backend than ``ale``, the one whose vector env sends and receives its steps apart."""
    if groups > 1 and backend != "ale":
        raise UserError(f"--env-groups {groups} steps ALE's vector envs apart: it needs --vec-env ale (an Atari game)")


def choose_backend(info: EnvInfo, requested: str = "") -> str:
    """The backend asked for, or the default: ``ale`` for Atari, ``subproc`` otherwise (the
    classic-control preset asks for ``sync``)."""
    return requested or ("ale" if info.atari else "subproc")

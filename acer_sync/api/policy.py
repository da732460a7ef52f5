"""A trained policy in your own code: ``acer_sync.load(run).predict(obs)``, as Stable-Baselines3 does it.

[`load`][] reads a run directory's latest checkpoint (or a checkpoint file) without running code
(``weights_only=True``), and [`Policy.predict`][] acts on observations as the env returns them. For
Atari, [`make_env`][] gives the env whose observations the policy was trained on: DeepMind
preprocessing and a 4-frame stack, zero before an episode's first frame, exactly as the training
and evaluation Actor (``acer_sync.rollout.actor.Actor``) stacks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space, iterate

from acer_sync.api.env_callables import callable_is_shared
from acer_sync.base.config import PRECISIONS, Config, setting_defaults
from acer_sync.base.errors import UserError
from acer_sync.base.log import log
from acer_sync.nets.build import (
    image_rule_hint,
    in_saved_form,
    model_spec,
    reads_images_as_before,
    saved_env_info,
    select_device,
)
from acer_sync.nets.distributions import Categorical, DiagGaussian, Distribution
from acer_sync.nets.networks import Network, network_from_spec
from acer_sync.nets.precision import NetworkPasses, native_bf16, runs_in_bf16
from acer_sync.nets.torsos import TorsoError, observation_space_of, parts_space_of
from acer_sync.rollout.actor import choose_actions, policy_not_finite
from acer_sync.training.checkpoint import load_run_checkpoint
from atari import parts
from atari.envs import (
    ATARI_ENTRY_POINT,
    ATARI_STACK,
    NOOP_MAX,
    EnvInfo,
    adapt_observation,
    adapt_observations,
    baselines_life_loss_actions,
    legacy_image_space,
    make_gym_env,
    resolve_spec,
)
from atari.episodes import LifeLossActionsWrapper
from atari.space_data import space_from_data
from atari.stacking import LifeFrameStack

#: A recurrent policy's state, as ``Policy.predict`` takes and returns it: ``(h, c)``, ``[n, size]`` each.
PolicyState = tuple[np.ndarray, ...]


class Policy:
    """A trained network that chooses actions (SB3's ``model.predict``).

    :param model: the network (put in eval mode here).
    :param distribution: its action distribution, with the Box's bounds for continuous actions.
    :param env_id: the env it was trained on.
    :param device: where ``model`` lives.
    :param env_kwargs: the keyword arguments the run made its envs with (``--env-kwargs``).
    :param precision: what the network's passes compute in (``acer_sync.nets.precision``): the run's,
        unless :func:`load` was asked for another.
    :param observation_space: the env's own observation space, where training turned its
        observations into frames of another shape (an int of a Discrete space, a Dict, a Tuple, an
        HWC image: ``atari.envs.adapt_observations``); ``predict`` turns them the same way.
    :param vec_env: the vector backend the run's envs stepped in (``--vec-env``; "" for the default).
    """

    def __init__(
        self, model: Network, distribution: Distribution, env_id: str, device: torch.device,
        env_kwargs: dict | None = None, precision: str = "fp32", observation_space: gym.Space | None = None,
        vec_env: str = "", legacy_images: bool = False,
    ):
        self.model = model.eval()
        #: The run read its images as the versions before SB3's image rule did (:class:`atari.envs.LegacyImages`).
        self.legacy_images = legacy_images
        self.precision = precision
        self.net = NetworkPasses(self.model, precision, device)
        self.distribution = distribution
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.vec_env = vec_env
        self.device = device
        stacked = tuple(model.obs_shape)
        #: The shape of one observation as the env returns it: the frame stack ``[4, 84, 84]``
        #: of ``make_env`` for Atari, the env's own vector otherwise; for an observation of
        #: several parts, a dict of them, as ``make_env`` gives them (images channels first).
        self.observation_shape = stacked if stacked[0] > 1 else stacked[1:]
        parts_spec = model.spec().get("obs_parts", [])
        if parts_spec:
            self.observation_shape = {key: tuple(shape) for key, shape, _ in parts_spec}
        #: Whether the network carries a state from step to step (``--network lstm`` or ``cnn_lstm``).
        self.recurrent = bool(model.state_shapes)
        #: The env's own observation space, where its observations are not the network's frames (None where they are).
        self.own_space = observation_space

    @property
    def observation_space(self) -> gym.Space:
        """One observation as :meth:`predict` takes it, as a gymnasium space (as SB3's
        ``model.observation_space`` is one): the env's own where training turned its observations into
        frames of another shape (a Dict, an int, an HWC image); else the Box of the frames, the env's
        own in the network's dtype (``make_env``'s: Atari's uint8 stack ``[4, 84, 84]``; a vector in
        float32, unbounded: predict takes a float64 or int vector too, which this Box's ``contains``
        refuses), or for several parts a Dict of them."""
        if self.own_space is not None:
            return self.own_space
        spec = self.model.spec()
        if "obs_parts" in spec:
            return parts_space_of(spec["obs_parts"], 1)
        return observation_space_of(tuple(self.model.obs_shape), spec["obs_dtype"])

    @property
    def action_space(self) -> gym.Space:
        """What :meth:`predict` returns, as a gymnasium space (SB3's ``model.action_space``): the
        env's ``Discrete(n, start)``, or a float32 Box of its bounds for continuous actions."""
        if isinstance(self.distribution, Categorical):
            return gym.spaces.Discrete(self.distribution.n, start=self.distribution.start)
        return gym.spaces.Box(self.distribution.low, self.distribution.high, dtype=np.float32)

    @torch.inference_mode()
    def predict(
        self, observation, state: PolicyState | None = None, episode_start=None, deterministic: bool = False,
    ) -> tuple[np.ndarray, PolicyState | None]:
        """The actions for ``observation``, and the state to pass back in with the next one.

        :param observation: one observation as the env returns it (an int for a Discrete space, a
            dict for a Dict, a tuple for a Tuple, an HWC image, a vector; Atari: the stacked frames
            of [`make_env`][]), or a batch of them as a gymnasium vector env returns it (a dict of
            arrays ``[n, ...]`` for a Dict), or frames as training stores them
            (``policy.observation_shape``, ``[n, *observation_shape]``).
        :param state: what the previous call returned (None at the start; always None for a
            feed-forward policy).
        :param episode_start: per observation, whether an episode starts at it (its state is reset
            to the start state first); None: no episode starts, besides the start of ``state`` None.
        :param deterministic: take the distribution's mode (argmax, or the Gaussian's mean)
            instead of sampling from it.
        :return: ``(action, state)``: one action for one observation, ``[n, ...]`` for a batch
            (Box actions clipped to the bounds); the next state, None for a feed-forward policy.
        """
        batch, single = self._frames(observation)
        n = len(parts.parts_of(batch)[0])
        if n == 0:
            raise UserError("predict got an empty batch: give at least one observation")
        for part in parts.parts_of(batch):
            if np.issubdtype(part.dtype, np.floating) and not np.isfinite(part).all():
                raise UserError("the observation holds NaN or infinity; the policy cannot act on it")

        def to_tensor(frames: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(frames).reshape(n, *shape), device=self.device)

        if isinstance(batch, dict):  # parts are never stacked: (stack of 1, *part)
            obs_tensor = {key: to_tensor(part, (1, *part.shape[1:])) for key, part in batch.items()}
        else:
            obs_tensor = to_tensor(batch, self.model.obs_shape)
        first = np.zeros(n, dtype=bool) if episode_start is None else _starts(episode_start)
        if len(first) != n:
            raise UserError(f"episode_start has {len(first)} entries for {n} observations")
        actions, stats, next_state = choose_actions(
            self.net, self.distribution, obs_tensor, self._state(state, n), torch.as_tensor(first, device=self.device),
            greedy=deterministic,
        )
        stats = stats.float().cpu().numpy()
        if not np.isfinite(stats).all():
            raise policy_not_finite(stats)
        actions = self.distribution.env_actions(actions.cpu().numpy())
        returned = tuple(s.cpu().numpy() for s in next_state) if self.recurrent else None
        return (actions[0] if single else actions), returned

    def _frames(self, observation) -> tuple[np.ndarray, bool]:
        """The network's frames ``[n, ...]`` of one observation or a batch, and whether it was one.

        Taken as the env's own (its space's structure decides one or a batch: a gymnasium vector
        env's batch of a Dict is a dict of arrays ``[n, ...]``), or as frames already."""
        space = self.own_space
        if space is not None:
            n = _batch_size(space, observation)
            if n == 0:
                raise UserError("predict got an empty batch: give at least one observation")
            if n is not None:
                if _outside_discrete(space, observation):  # gymnasium's flatten would encode it as another value
                    raise UserError(f"predict takes an observation of {space}; this one has a discrete part outside its range")
                items = [observation] if n == SINGLE else iterate(batch_space(space, n), observation)
                try:
                    adapted = [adapt_observation(space, item) for item in items]
                    frames = {key: np.stack([a[key] for a in adapted]) for key in adapted[0]} \
                        if isinstance(adapted[0], dict) else np.stack(adapted)
                except (ValueError, TypeError, KeyError, IndexError, AssertionError) as error:
                    raise UserError(f"predict takes an observation of {space} or a batch of them; this one does not fit it "
                                    f"({type(error).__name__}: {error})") from None
                return frames, n == SINGLE
        shape = self.observation_shape
        if isinstance(shape, dict):
            return self._part_frames(observation)
        obs = np.asarray(observation) if not isinstance(observation, (dict, tuple)) else None
        if obs is not None and obs.dtype != object and (obs.shape == shape or obs.shape[1:] == shape):
            return (obs[None] if obs.shape == shape else obs), obs.shape == shape
        got = f"shape {obs.shape}" if obs is not None and obs.dtype != object else type(observation).__name__
        expected = f"{space} (or a batch of them) as the env returns it, or frames of shape {shape}" if space is not None \
            else f"shape {shape} or a batch [n, {', '.join(map(str, shape))}]"
        raise UserError(f"predict takes an observation of {expected}, got {got}" + self._stack_hint())

    def _part_frames(self, observation) -> tuple[dict[str, np.ndarray], bool]:
        """A multi-part observation (or a batch) given as ``make_env``'s frames: a dict of parts."""
        shapes = self.observation_shape
        if isinstance(observation, dict) and set(observation) == set(shapes):
            arrays = {key: np.asarray(observation[key]) for key in shapes}
            if all(arrays[key].shape == shape for key, shape in shapes.items()):
                return {key: array[None] for key, array in arrays.items()}, True
            sizes = {len(array) for key, array in arrays.items() if array.ndim and array.shape[1:] == shapes[key]}
            if len(sizes) == 1 and all(array.ndim and array.shape[1:] == shapes[key] for key, array in arrays.items()):
                return arrays, False
        expected = f"{self.own_space} (or a batch of them) as the env returns it, or" if self.own_space else ""
        got = {key: np.shape(value) for key, value in observation.items()} if isinstance(observation, dict) else type(observation).__name__
        raise UserError(f"predict takes an observation of {expected} a dict of frames of shapes {shapes} "
                        f"(or a batch of them), got {got}".replace("of  a", "of a"))

    def _state(self, state: PolicyState | None, n: int) -> tuple[torch.Tensor, ...]:
        """The network's state of ``n`` observations: the start state, or ``state`` checked."""
        if state is None:
            return self.model.initial_state(n)
        expected = [(n, *shape) for shape in self.model.state_shapes.values()]
        got = [tuple(np.shape(s)) for s in state]
        if got != expected:
            what = "a feed-forward policy has no state; pass None" if not expected else f"expected {expected}"
            raise UserError(f"state holds arrays of shapes {got}; {what} (the state that predict returned)")
        arrays = [np.asarray(s, dtype=np.float32) for s in state]
        if not all(np.isfinite(array).all() for array in arrays):
            raise UserError("state holds NaN or infinity; pass the state that predict returned, or None to start afresh")
        return tuple(torch.as_tensor(array, device=self.device) for array in arrays)

    def _stack_hint(self) -> str:
        if len(self.observation_shape) == 3 and self.observation_shape[0] == ATARI_STACK:
            return f"; acer_sync.make_env({self.env_id!r}) returns the stacked frames it takes"
        return ""


def load(path: str | Path, device: str | torch.device = "cpu", precision: str | None = None) -> Policy:
    """The policy of a run directory's latest checkpoint, or of a checkpoint file.

    :param path: a run directory or a ``.pt`` checkpoint.
    :param device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (cuda if available), or a torch device.
    :param precision: what the network computes in, ``"fp32"`` or ``"bf16"``; None: the run's, as
        it acted in training (a bf16 run's policy in fp32 differs from it by bf16's rounding).
        bf16 on a device without native bf16 is emulated, slower than fp32: it is said in a warning.
    :raises UserError: for a missing, corrupt or foreign checkpoint, or an unknown precision (one line).
    """
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    payload = load_run_checkpoint(path)
    # a setting its config lacks (a file written by hand, or cut down) is read at its default, as format 1's are
    payload["config"] = config = {**setting_defaults(), **payload["config"]}
    spec, env_id = payload["model_spec"], str(payload["env_id"])
    saved_precision = str(config["precision"])
    if saved_precision not in PRECISIONS:
        raise UserError(f"{path} was saved with precision {saved_precision!r}; this version knows {', '.join(PRECISIONS)}")
    precision = precision or saved_precision
    try:
        with torch.random.fork_rng(devices=[]):  # its initial weights, replaced by the saved ones, draw from the caller's generator
            model = network_from_spec(spec)
        model.load_state_dict(payload["model"])
    except TorsoError as error:  # its module does not import here, lacks the class, or the class refuses
        raise UserError(error.of_run(path)) from None
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        changed = f"; has {spec['torso']} changed since the run saved it?" if isinstance(spec, dict) and spec.get("torso") else ""
        raise UserError(f"{path} does not hold a usable model ({type(error).__name__}: {_in_one_line(error)}){changed}") from None
    info = check_env_fits(path, payload)
    device = select_device(str(device))  # a torch.device too: checked as a name is
    n, start = int(spec["n_actions"]), payload["action_start"]
    if not isinstance(start, int) or isinstance(start, bool):
        raise UserError(f"{path} is not a usable acer_sync checkpoint: its action_start is {start!r}, not a whole number")
    distribution = DiagGaussian(n, payload["action_low"], payload["action_high"]) if spec["policy"] == "gaussian" else Categorical(n, start)
    legacy_images = info is not None and info.legacy_images
    if info is not None:
        observation_space = info.observation_space
    else:  # an env that cannot be made here (a callable of another process): the space it had in training
        try:
            observation_space = space_from_data(payload["observation_space"])
        except ValueError as error:
            raise UserError(f"{path} is not a usable acer_sync checkpoint: its observation_space is {error}") from None
        if observation_space is not None and reads_images_as_before(spec, observation_space):
            observation_space, legacy_images = legacy_image_space(observation_space), True
    if runs_in_bf16(model, precision) and native_bf16(device) is False:  # None: it cannot tell (no /proc/cpuinfo)
        log.warning(f"warning: {path}'s policy runs in bf16, which {device.type} here emulates, slower than fp32; "
                    "acer_sync.load(..., precision='fp32') or play.py --precision fp32 runs it in fp32")
    return Policy(model.to(device), distribution, env_id, device, dict(config["env_kwargs"]), precision,
                  observation_space=observation_space, vec_env=str(config.get("vec_env", "")),
                  legacy_images=legacy_images)


def _in_one_line(error: BaseException, limit: int = 300) -> str:
    """``error``'s text on one line, at most ``limit`` characters: a state dict's mismatch names
    its first keys (torch's first line only says that there were errors)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        lines = lines[1:]
    text = " ".join(lines) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _starts(episode_start) -> np.ndarray:
    """``episode_start`` as a flat bool array; a UserError unless it holds booleans (or 0 and 1)."""
    starts = np.asarray(episode_start)
    numbers = np.issubdtype(starts.dtype, np.integer) or np.issubdtype(starts.dtype, np.floating)
    if not (starts.dtype == bool or numbers and np.isin(starts, (0, 1)).all()):
        raise UserError(f"episode_start holds booleans, one per observation (True where an episode starts), got {episode_start!r}")
    return starts.astype(bool).reshape(-1)


def _outside_discrete(space: gym.Space, observation) -> bool:
    """Whether a Discrete, MultiDiscrete or MultiBinary part of ``observation`` (one, or a batch)
    holds a value its space does not: gymnasium's ``flatten`` one-hot encodes a Discrete below its
    start from the end, and a MultiDiscrete's entry outside its range as part of its neighbour's."""
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        values = np.asarray(observation)
        return bool(np.any(values < space.start) or np.any(values >= space.start + (space.n if isinstance(space, gym.spaces.Discrete) else space.nvec)))
    if isinstance(space, gym.spaces.MultiBinary):
        return bool(np.any((np.asarray(observation) != 0) & (np.asarray(observation) != 1)))
    if isinstance(space, gym.spaces.Dict):
        return any(_outside_discrete(part, observation[key]) for key, part in space.spaces.items())
    if isinstance(space, gym.spaces.Tuple):
        return any(_outside_discrete(part, item) for part, item in zip(space.spaces, observation))
    return False


#: :func:`_batch_size` of one observation (not a batch).
SINGLE = -1


def _batch_size(space: gym.Space, observation) -> int | None:
    """:data:`SINGLE` where ``observation`` is one observation of ``space``, n where it is a batch of
    n (as a gymnasium vector env returns it: a dict of arrays ``[n, ...]`` for a Dict), None where
    its structure is neither. A Dict's or a Tuple's parts must all agree: ``make_env``'s frames of a
    Dict whose first part is a vector match the env's space in that part, not in its image."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(observation, dict) or set(observation) != set(space.spaces):
            return None
        sizes = {_batch_size(part, observation[key]) for key, part in space.spaces.items()}
        return sizes.pop() if len(sizes) == 1 else None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(observation, tuple) or len(observation) != len(space.spaces):
            return None
        sizes = {_batch_size(part, item) for part, item in zip(space.spaces, observation)}
        return sizes.pop() if len(sizes) == 1 else None
    array = np.asarray(observation)
    if array.dtype == object:
        return None
    shape = tuple(space.shape or ())
    if isinstance(space, gym.spaces.Discrete) and not np.issubdtype(array.dtype, np.integer):
        return None
    if array.shape == shape or (array.ndim == 0 and shape == (1,) and isinstance(space, gym.spaces.Box)):
        return SINGLE  # a number for a Box (1,): training flattens it so
    return len(array) if array.ndim and array.shape[1:] == shape else None


def check_env_fits(path, payload: dict) -> EnvInfo | None:
    """The env a checkpoint names, or a UserError where it is not the one its network was built for
    (its observations, actions or settings give another network). None for an env that cannot be
    made here (a callable of another process, a module not importable here), or that names one of
    several callables this process registered under one name: it is not checked."""
    if callable_is_shared(str(payload["env_id"])):
        return None
    try:
        config = Config(**payload["config"])
        info = saved_env_info(payload["model_spec"], str(payload["env_id"]), dict(payload["config"]["env_kwargs"]), config)
        expected = in_saved_form(payload["model_spec"], model_spec(info, config))
    except (UserError, TypeError, ValueError):
        return None
    if payload["model_spec"] != expected:
        differing = sorted(key for key in set(expected) | set(payload["model_spec"])
                           if expected.get(key) != payload["model_spec"].get(key))
        shown = "; ".join(f"{key} {payload['model_spec'].get(key)} (the env gives {expected.get(key)})" for key in differing[:3])
        raise UserError(f"{path} holds a network that does not fit its env {payload['env_id']}: {shown}"
                        f"{image_rule_hint(payload['model_spec'], expected)}")
    return info


def make_env(
    env_id: str | Callable[[], gym.Env], render_mode: str | None = None, noop_max: int = NOOP_MAX,
    env_kwargs: dict | None = None,
) -> gym.Env:
    """A gymnasium env whose observations [`Policy.predict`][] takes as they come.

    For Atari ids: the DeepMind preprocessing of training (no-op starts, 4-frame skip with max-pool,
    FIRE at reset, 84×84 grayscale), a stack of the last 4 frames ``[4, 84, 84]`` with zeros before
    the first frame of the game or of a new life (as training's episodes start, and evaluation's
    stack; ``info["episode_start"]`` marks such an observation, for a recurrent policy's
    ``episode_start``), and, in games that need FIRE, the actions Baselines plays after each
    lost life (no-op, FIRE, action 2) played inside ``step`` (rewards summed), as evaluation and
    ``play.py`` play them. Episodes are full games, as in evaluation; rewards are raw. Any other
    id is ``gym.make(env_id)``, its observations flattened as training flattens them.

    :param env_id: a registered gymnasium env id, or the zero-argument callable a run was trained
        with (``acer_sync.train(make_my_env)``): its env, observations as training turns them.
    :param render_mode: gymnasium's ``render_mode`` (``"human"``, ``"rgb_array"``).
    :param noop_max: the most no-ops at reset (0: deterministic resets).
    :param env_kwargs: keyword arguments for ``gym.make`` (a run's ``--env-kwargs``: ``policy.env_kwargs``).
    """
    if callable(env_id):
        name = getattr(env_id, "__qualname__", type(env_id).__name__)
        if render_mode is not None or env_kwargs:
            raise UserError(f"make_env of the callable {name} takes no render_mode or env_kwargs: the callable makes the env")
        return adapt_observations(env_id(), name)
    env = make_gym_env(env_id, render_mode, noop_max, env_kwargs)
    if resolve_spec(env_id).entry_point != ATARI_ENTRY_POINT:
        return env
    forced = baselines_life_loss_actions(env.unwrapped.get_action_meanings())
    env = LifeFrameStack(env, ATARI_STACK)
    return LifeLossActionsWrapper(env, forced) if forced else env

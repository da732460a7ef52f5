"""The Actor: the one way of acting with a network, for training, evaluation and play.py."""

from __future__ import annotations

import numpy as np
import torch

from acer_sync.base.errors import PolicyNotFinite
from acer_sync.base.transfer import torch_dtype, upload
from acer_sync.nets.distributions import Distribution, distribution_for
from acer_sync.nets.networks import Network, State
from acer_sync.nets.precision import NetworkPasses
from acer_sync.rollout.acting_graph import ActingGraph, pack
from atari import parts
from atari.envs import EnvInfo
from atari.episodes import LifeLossActions
from atari.stacking import FrameStacker


def policy_not_finite(values: np.ndarray, envs_name: str = "env", what: str = "policy",
                      consequence: str = "no action could be drawn") -> PolicyNotFinite:
    """The error for the network's outputs ``values`` ``[N, ...]`` (μ, or V) of which some are not
    finite, naming the envs (``envs_name``: "env", "evaluation env") whose rows they are; the
    outputs ride on it as ``values``."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    envs = np.flatnonzero(bad).tolist()
    shown = ", ".join(map(str, envs[:5])) + (f" and {len(envs) - 5} more" if len(envs) > 5 else "")
    error = PolicyNotFinite(
        f"the network's {what} was not finite (NaN or inf) for the observation of {envs_name}{'s' if len(envs) > 1 else ''} "
        f"{shown}, which was finite, so {consequence}: a torso that divides by zero or takes a log of 0, or weights that overflow"
    )
    error.values = values
    return error


def choose_actions(
    model: Network | NetworkPasses, distribution: Distribution, obs: torch.Tensor, state: State, first: torch.Tensor, greedy: bool,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, State]:
    """One step of acting: ``(actions [N, ...], stats [N, stat_size], next state)``.

    The network steps from ``state`` through the observations ``obs [N, ...]`` (resetting the
    state where ``first``), and the actions are the distribution's mode with ``greedy``, else a
    sample (with ``generator``). The :class:`Actor` and :meth:`acer_sync.api.policy.Policy.predict`
    both act through this. Sampling takes statistics with NaN in them (it gives an action, checks
    nothing and waits for nothing on the device); the callers check μ on the host
    (:class:`PolicyNotFinite`).
    """
    features, state = model.step(obs, state, first)
    stats = model.policy_of(features)
    actions = distribution.greedy(stats) if greedy else distribution.sample(stats, generator=generator)
    return actions, stats, state


class DeviceFrameStack:
    """The frame stack on the network's device (CUDA): each step uploads only the newest frames
    and the episode starts, through pinned host memory, and shifts and clears the stack there.
    It holds exactly what :class:`atari.stacking.FrameStacker` holds (tested on the CPU)."""

    def __init__(self, num_envs: int, stack: int, layout, device: torch.device):
        self.stack, self.device = stack, device

        def zeros(shape_dtype):
            shape, dtype = shape_dtype
            return torch.zeros((num_envs, stack, *shape), dtype=torch_dtype(dtype), device=device)

        self.stacked = {key: zeros(part) for key, part in layout.items()} if isinstance(layout, dict) else zeros(layout)

    def reset(self, frames) -> None:
        def start(stacked: torch.Tensor, new: np.ndarray) -> torch.Tensor:
            return torch.cat([torch.zeros_like(stacked[:, 1:]), upload(new, self.device).unsqueeze(1)], dim=1)

        self.stacked = parts.map_parts(start, self.stacked, frames)

    def push(self, frames, episode_start: np.ndarray) -> None:
        starts = upload(np.asarray(episode_start, dtype=bool), self.device) if self.stack > 1 else None

        def shift(stacked: torch.Tensor, new: np.ndarray) -> torch.Tensor:
            older = stacked[:, 1:]
            if starts is not None:
                cleared = starts.reshape(-1, *([1] * (older.dim() - 1)))
                older = torch.where(cleared, torch.zeros((), dtype=older.dtype, device=older.device), older)
            return torch.cat([older, upload(new, self.device).unsqueeze(1)], dim=1)

        self.stacked = parts.map_parts(shift, self.stacked, frames)


class Actor:
    """Chooses the actions of N envs and keeps what acting carries from step to step.

    Per env it keeps the frame stack (:class:`FrameStacker`), the network's recurrent state, whether
    the next observation starts an episode, and the actions Baselines plays after a lost life in a
    FIRE game (:class:`LifeLossActions`), which override the sampled ones with a one-hot μ. The
    recurrent state is reset to the network's initial state before an observation that starts an
    episode, inside the network (``step``), exactly as ``unroll`` resets it when replaying. Frame
    stacks are cleared at the same episode starts, so they equal what the buffer rebuilds.

    Call :meth:`reset` with the first frames, then per step :meth:`act`, step the envs, and
    :meth:`observe` the next frames.

    :param model: the network (read only here).
    :param info: the env's description.
    :param num_envs: N.
    :param device: where ``model`` lives; observations are sent there.
    :param greedy: act with the distribution's mode (argmax, or the Gaussian's mean) instead of sampling.
    :param generator: the random generator to sample with (None: torch's global one).
    :param update_normalizer: update the network's running observation normalizer, if it has
        one, with each observation before acting on it (training does; evaluation does not).
    :param precision: what the network's passes compute in (:mod:`acer_sync.nets.precision`); the
        statistics μ it returns are float32 either way.
    :param device_stack: keep the frame stack on ``device`` (:class:`DeviceFrameStack`) and bring
        the actions and μ back in one pinned copy a step; None: on CUDA. On the CPU the numpy
        stack is the network's input as it is, with no copy at all.
    :param graph: act through :class:`~acer_sync.rollout.acting_graph.ActingGraph` (with the
        device stack): on CUDA one CUDA graph replay a step (``--compile graph``); elsewhere its
        static-tensor step runs eagerly, the same values as the plain path.
    """

    def __init__(
        self, model: Network, info: EnvInfo, num_envs: int, device: torch.device, greedy: bool = False,
        generator: torch.Generator | None = None, update_normalizer: bool = False, precision: str = "fp32",
        device_stack: bool | None = None, graph: bool = False, envs_name: str = "env",
    ):
        self.model = model
        #: What the envs are called in errors: "env" (training's), "evaluation env".
        self.envs_name = envs_name
        self.net = NetworkPasses(model, precision, device)
        self.device = device
        self.distribution = distribution_for(info)
        self.greedy = greedy
        self.generator = generator
        self.normalizer = getattr(model, "normalizer", None) if update_normalizer else None
        self.device_stack = device.type == "cuda" if device_stack is None else device_stack
        if self.device_stack:
            self.stacker = DeviceFrameStack(num_envs, info.stack, info.frame_layout, device)
        else:
            self.stacker = FrameStacker(num_envs, info.stack, info.frame_layout)
        self.life_loss_actions = LifeLossActions(num_envs, info.life_loss_actions)
        self.num_envs = num_envs
        self.state: State = model.initial_state(num_envs)
        self.first = np.ones(num_envs, dtype=bool)
        self.graph: ActingGraph | None = None
        if graph:
            if not self.device_stack:
                raise ValueError("acting through a graph needs the frame stack on the device (device_stack)")
            restore = tuple(self.normalizer.buffers()) if self.normalizer is not None else ()
            self.graph = ActingGraph(self._choose, generator, restore, module=model)

    def _choose(self, obs, first: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """The acting step on device tensors: the normalizer's update, then :func:`choose_actions`."""
        if self.normalizer is not None:
            self.normalizer.update(obs)
        return choose_actions(self.net, self.distribution, obs, state, first, self.greedy, self.generator)

    def reset(self, frames) -> None:
        """Start every env's episode at ``frames`` (acting through a graph: its capture, the first time)."""
        self.stacker.reset(frames)
        self.life_loss_actions.reset()
        self.state = self.model.initial_state(self.num_envs)
        self.first = np.ones(self.num_envs, dtype=bool)
        if self.graph is not None:
            self.graph.prepare(self.stacker.stacked, upload(self.first, self.device), self.state)

    @property
    def observation(self):
        """The current stacked observations ``[N, stack, ...]`` (a dict of them for a multi-part observation)."""
        return self.stacker.stacked

    @torch.inference_mode()
    def act(self) -> tuple[np.ndarray, np.ndarray]:
        """One action per env and the statistics μ it was chosen from: ``(actions [N, ...], mu [N, stat_size])``.

        Advances the recurrent state through the current observations.
        """
        dist = self.distribution
        if self.device_stack:
            obs, first = self.stacker.stacked, upload(self.first, self.device)
        else:
            obs = parts.map_parts(lambda stacked: torch.from_numpy(stacked).to(self.device), self.stacker.stacked)
            first = torch.from_numpy(self.first).to(self.device)
        if self.graph is not None:
            packed, self.state = self.graph(obs, first, self.state)
            actions, stats = self._packed_to_host(packed)
        else:
            actions, stats, self.state = self._choose(obs, first, self.state)
            if self.device_stack:
                actions, stats = self._packed_to_host(pack(actions, stats))
            else:
                actions, stats = actions.cpu().numpy(), stats.float().cpu().numpy()
        forced_envs, forced_actions = self.life_loss_actions.forced()
        if len(forced_envs):
            actions[forced_envs] = forced_actions
            stats[forced_envs] = dist.forced_stats(forced_actions)
        if not np.isfinite(stats).all():  # on the host already: no wait for the device
            raise policy_not_finite(stats, self.envs_name)
        return actions, stats

    def _packed_to_host(self, packed: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Actions and μ, packed (:func:`~acer_sync.rollout.acting_graph.pack`), in one copy to the
        host (pinned on CUDA)."""
        action_shape = self.distribution.action_shape
        width = int(np.prod(action_shape))
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=packed.is_cuda)
        host.copy_(packed, non_blocking=packed.is_cuda)
        if packed.is_cuda:
            torch.cuda.current_stream(packed.device).synchronize()
        values = host.numpy()
        action_values = values[:, :width].reshape(len(values), *action_shape)
        return action_values.astype(self.distribution.action_dtype), values[:, width:].copy()

    @torch.inference_mode()
    def final_values(self, final_frames, cut: np.ndarray) -> np.ndarray:
        """V of the final observations of the envs in ``cut`` (0 elsewhere), ``[N]``.

        Call it after the env step and before :meth:`observe`: the final observation drops the
        oldest frame of the current stack and appends the env's final frame, and it continues the
        episode from the state :meth:`act` left.
        """
        values = np.zeros(self.num_envs, dtype=np.float32)
        envs = np.flatnonzero(cut)
        if len(envs):
            def final_stack(stacked, final: np.ndarray) -> torch.Tensor:
                if self.device_stack:
                    index = torch.from_numpy(envs).to(self.device)
                    return torch.cat([stacked[index, 1:], upload(final[envs], self.device).unsqueeze(1)], dim=1)
                return torch.from_numpy(np.concatenate([stacked[envs, 1:], final[envs, None]], axis=1)).to(self.device)

            final = parts.map_parts(final_stack, self.stacker.stacked, final_frames)
            state = tuple(s[torch.from_numpy(envs).to(s.device)] for s in self.state)
            not_first = torch.zeros(len(envs), dtype=torch.bool, device=self.device)
            features, _ = self.net.step(final, state, not_first)
            values[envs] = self.net.value_of(features).float().cpu().numpy()
            if not np.isfinite(values).all():  # it would go into the buffer, and every update that replays it be skipped
                raise policy_not_finite(values, self.envs_name, "value V", "the episode cut by a time limit has no value to bootstrap from")
        return values

    def observe(self, frames, episode_start: np.ndarray, life_lost: np.ndarray, game_over: np.ndarray) -> None:
        """Take the envs' next frames; ``episode_start`` marks the envs whose next observation
        starts an episode (stack cleared, state reset at the next :meth:`act`)."""
        self.life_loss_actions.step(life_lost, game_over)
        self.stacker.push(frames, episode_start)
        self.first = np.array(episode_start, dtype=bool)

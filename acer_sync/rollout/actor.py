"""The Actor: the one way of acting with a network, for training, evaluation and play.py."""

from __future__ import annotations

import contextlib

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
                      consequence: str = "no action could be drawn", first_env: int = 0) -> PolicyNotFinite:
    """The error for the network's outputs ``values`` ``[N, ...]`` (μ, or V) of which some are not
    finite, naming the envs (``envs_name``: "env", "evaluation env") whose rows they are; the
    outputs ride on it as ``values``."""
    bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    envs = (np.flatnonzero(bad) + first_env).tolist()  # a group's rows are its envs from first_env on
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
    """The frame stack on the network's device (CUDA), holding what :class:`atari.stacking.FrameStacker`
    holds on the host (tested on the CPU), in tensors at fixed addresses (acting's CUDA graph reads them).

    A step's newest frames reach it in three calls, so that acting costs the host one copy each way
    (issue 35: the newest frames' upload and the stack took a fifth of the collecting thread at 16
    envs in the third GPU report; a step of acting through the graph and its observe made 25 torch
    calls besides the step's own, counted on the CPU, and make 4 now; on CUDA four reach the
    device: the upload, the replay, the copy back and the wait for it):

    - :meth:`stage` writes the frames and the episode starts into one host buffer, pinned on CUDA,
      with numpy alone (no torch call), and marks them staged;
    - :meth:`upload` sends that buffer to the device in one copy (on the CPU the device's buffer is
      the host's: nothing to copy);
    - :meth:`push` shifts the staged frames onto the stack, clearing the older frames at episode
      starts, in device operations only, which acting's graph replays with its step. Frames are
      pushed once: with nothing staged a push leaves the stack as it is (the staged flag travels in
      the buffer, read on the device by the graph's push, ``graphed``, and by an eager one on the host).

    The host buffer may be written again only after the copy that read it has finished: the
    Actor's :meth:`Actor.act` waits for its actions, copied back after the push, before
    :meth:`pushed`; :meth:`current` waits itself.
    """

    #: Where each field of the staging buffer starts: a multiple of this many bytes.
    ALIGN = 64

    def __init__(self, num_envs: int, stack: int, layout, device: torch.device):
        self.stack, self.device, self.num_envs = stack, device, num_envs
        self.cuda = device.type == "cuda"
        fields = [((num_envs, *shape), np.dtype(dtype)) for shape, dtype in parts.parts_of(layout)]
        fields += [((num_envs,), np.dtype(bool)), ((1,), np.dtype(bool))]  # the episode starts, the staged flag
        spans, size = [], 0  # each field's bytes in the buffer
        for shape, dtype in fields:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            spans.append(slice(size, size + nbytes))
            size += -(-nbytes // self.ALIGN) * self.ALIGN
        with torch.inference_mode(False):  # written in place inside and outside inference mode (acting's capture)
            def zeros(shape_dtype):
                shape, dtype = shape_dtype
                return torch.zeros((num_envs, stack, *shape), dtype=torch_dtype(dtype), device=device)

            self.stacked = parts.map_parts(zeros, layout) if isinstance(layout, dict) else zeros(layout)
            self.host_buffer = torch.zeros(size, dtype=torch.uint8, pin_memory=self.cuda)
            self.device_buffer = self.host_buffer if device.type == "cpu" else torch.zeros(size, dtype=torch.uint8, device=device)
        if self.cuda:  # zeroed on this stream: done before acting's stream writes them
            torch.cuda.current_stream(device).synchronize()
        host_bytes = self.host_buffer.numpy()
        host_views = [host_bytes[span].view(dtype).reshape(shape) for (shape, dtype), span in zip(fields, spans, strict=True)]
        device_views = [self.device_buffer[span].view(torch_dtype(dtype)).view(shape)
                        for (shape, dtype), span in zip(fields, spans, strict=True)]
        keys = list(layout) if isinstance(layout, dict) else None

        def as_frames(views: list):
            return dict(zip(keys, views, strict=True)) if keys is not None else views[0]

        #: The staged newest frames ``[N, *frame_shape]`` on the host (numpy) and on the device.
        self.new_on_host, self.new = as_frames(host_views[:-2]), as_frames(device_views[:-2])
        #: The staged episode starts ``[N]`` (bool): the next acting step's ``first``.
        self.starts_on_host, self.starts = host_views[-2], device_views[-2]
        self.staged_on_host, self.staged = host_views[-1], device_views[-1]

    @property
    def pending(self) -> bool:
        """Frames are staged that no push has taken yet."""
        return bool(self.staged_on_host[0])

    def stage(self, frames, episode_start: np.ndarray, replace: bool = False) -> None:
        """The newest frames ``[N, ...]`` (a dict of them) and which envs they start an episode of.
        Frames staged before and not yet pushed are pushed first (waiting for the device), unless
        ``replace`` (a reset, which clears them anyway)."""
        if self.pending and not replace:
            self.current()
        parts.map_parts(np.copyto, self.new_on_host, frames)
        self.starts_on_host[:] = episode_start
        self.staged_on_host[0] = True

    def reset(self, frames) -> None:
        """Every env starts an episode at ``frames`` (staged: the stack holds them after the next push)."""
        self.stage(frames, np.ones(self.num_envs, dtype=bool), replace=True)

    def upload(self) -> None:
        """The staging buffer to the device, in one copy that does not wait for the host."""
        if self.device_buffer is not self.host_buffer:
            self.device_buffer.copy_(self.host_buffer, non_blocking=self.cuda)

    def push(self, graphed: bool = False):
        """Push the uploaded frames onto the stack, if staged, and return the stack: device operations
        only, the staged flag read on the device if ``graphed`` (a graph replays them whatever the
        flag), else on the host."""
        if not graphed and not self.pending:
            return self.stacked

        def shift(stacked: torch.Tensor, new: torch.Tensor) -> None:
            older = stacked[:, 1:]
            if self.stack > 1:
                older = older.masked_fill(self.starts.reshape(-1, *([1] * (older.dim() - 1))), 0)
            shifted = torch.cat([older, new.unsqueeze(1)], dim=1)
            if graphed:
                shifted = torch.where(self.staged.reshape(*([1] * shifted.dim())), shifted, stacked)
            stacked.copy_(shifted)

        parts.map_parts(shift, self.stacked, self.new)
        return self.stacked

    def pushed(self) -> None:
        """The staged frames are on the stack (call it once the upload's copy has finished)."""
        self.staged_on_host[0] = False

    def current(self):
        """The stack with any staged frames pushed (waits for the device)."""
        if self.pending:
            self.upload()
            self.push()
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()
            self.pushed()
        return self.stacked


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
    :param envs_name: what the envs are called in errors ("env", "evaluation env").
    :param first_env: the number of the Actor's first env among the run's (a group's), for errors.
    """

    def __init__(
        self, model: Network, info: EnvInfo, num_envs: int, device: torch.device, greedy: bool = False,
        generator: torch.Generator | None = None, update_normalizer: bool = False, precision: str = "fp32",
        device_stack: bool | None = None, graph: bool = False, envs_name: str = "env", first_env: int = 0,
    ):
        self.model = model
        #: What the envs are called in errors: "env" (training's), "evaluation env".
        self.envs_name = envs_name
        #: The number of the Actor's first env among the run's (a group's, ``--env-groups``), for errors.
        self.first_env = first_env
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
            restore = (*(self.normalizer.buffers() if self.normalizer is not None else ()), *parts.parts_of(self.stacker.stacked))
            self.graph = ActingGraph(self._push_and_choose, generator, restore, module=model, adopt_inputs=True)
        self._host_packed: torch.Tensor | None = None

    def _choose(self, obs, first: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """The acting step on device tensors: the normalizer's update, then :func:`choose_actions`."""
        if self.normalizer is not None:
            self.normalizer.update(obs)
        return choose_actions(self.net, self.distribution, obs, state, first, self.greedy, self.generator)

    def _push_and_choose(self, new, starts: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Acting's graph step: the staged frames (``new``, the device stack's own) pushed onto the
        device stack, then :meth:`_choose` on it with ``first`` the staged episode starts."""
        return self._choose(self.stacker.push(graphed=True), starts, state)

    def reset(self, frames) -> None:
        """Start every env's episode at ``frames`` (acting through a graph: its capture, the first time)."""
        self.stacker.reset(frames)
        self.life_loss_actions.reset()
        self.state = self.model.initial_state(self.num_envs)
        self.first = np.ones(self.num_envs, dtype=bool)
        if self.graph is not None:
            self.graph.prepare(self.stacker.new, self.stacker.starts, self.state)

    @property
    def observation(self):
        """The current stacked observations ``[N, stack, ...]`` (a dict of them for a multi-part
        observation). With the device stack it pushes staged frames first: read it only from the
        thread that acts."""
        return self.stacker.current() if self.device_stack else self.stacker.stacked

    @torch.inference_mode()
    def act(self) -> tuple[np.ndarray, np.ndarray]:
        """One action per env and the statistics μ it was chosen from: ``(actions [N, ...], mu [N, stat_size])``.

        Advances the recurrent state through the current observations.
        """
        dist = self.distribution
        if self.device_stack:  # one upload, the push and the step (one replay), one copy back
            stacker = self.stacker
            stacker.upload()
            try:
                if self.graph is not None:
                    packed, self.state = self.graph(stacker.new, stacker.starts, self.state)
                else:
                    actions, stats, self.state = self._choose(stacker.push(), stacker.starts, self.state)
                    packed = pack(actions, stats)
                actions, stats = self._packed_to_host(packed)  # waits: the upload has finished
            except BaseException:
                if stacker.cuda:  # the upload may still read the staging buffer
                    with contextlib.suppress(Exception):
                        torch.cuda.current_stream(self.device).synchronize()
                raise
            finally:  # the push comes first in the step: the frames are on the stack
                stacker.pushed()
        else:
            obs = parts.map_parts(lambda stacked: torch.from_numpy(stacked).to(self.device), self.stacker.stacked)
            first = torch.from_numpy(self.first).to(self.device)
            actions, stats, self.state = self._choose(obs, first, self.state)
            actions, stats = actions.cpu().numpy(), stats.float().cpu().numpy()
        forced_envs, forced_actions = self.life_loss_actions.forced()
        if len(forced_envs):
            actions[forced_envs] = forced_actions
            stats[forced_envs] = dist.forced_stats(forced_actions)
        if not np.isfinite(stats).all():  # on the host already: no wait for the device
            raise policy_not_finite(stats, self.envs_name, first_env=self.first_env)
        return actions, stats

    def _packed_to_host(self, packed: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Actions and μ, packed (:func:`~acer_sync.rollout.acting_graph.pack`), in one copy to the
        host (pinned on CUDA, into the same memory each step), waiting for it."""
        action_shape = self.distribution.action_shape
        width = int(np.prod(action_shape))
        cuda = self.device.type == "cuda"
        if self._host_packed is None:  # [N, width + stat size], float32, whatever the step
            self._host_packed = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=cuda)
            self._host_values = self._host_packed.numpy()
        self._host_packed.copy_(packed, non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        values = self._host_values
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
                raise policy_not_finite(values, self.envs_name, "value V", "the episode cut by a time limit has no value to bootstrap from",
                                        self.first_env)
        return values

    def observe(self, frames, episode_start: np.ndarray, life_lost: np.ndarray, game_over: np.ndarray) -> None:
        """Take the envs' next frames; ``episode_start`` marks the envs whose next observation
        starts an episode (stack cleared, state reset at the next :meth:`act`)."""
        self.life_loss_actions.step(life_lost, game_over)
        if self.device_stack:
            self.stacker.stage(frames, episode_start)  # pushed by the next act()
        else:
            self.stacker.push(frames, episode_start)
        self.first = np.array(episode_start, dtype=bool)

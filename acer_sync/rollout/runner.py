"""The Runner: steps the vector env for ``nsteps`` with the current policy and returns a Segment."""

from __future__ import annotations

import threading
from typing import Iterable

import numpy as np
import torch

from acer_sync.base.timing import PhaseTimer
from acer_sync.nets.networks import Network
from acer_sync.replay.buffer import Field, Segment, empty_segment
from acer_sync.rollout.actor import Actor
from atari import parts
from atari.envs import VecEnv
from atari.episodes import EpisodeTracker


class Runner:
    """Acts in N envs with π (through an :class:`Actor`) and records what the buffer stores.

    The behaviour policy μ recorded for each step is the statistics of the distribution the
    action was sampled from (:mod:`acer_sync.nets.distributions`): the full probability vector
    π(·|x_t), or the Gaussian's mean and log σ. After a lost life in a FIRE game, the actions
    Baselines plays without the agent are stored with a one-hot μ on that action. A Gaussian
    action is stored as sampled; the env gets it clipped to the Box. The recurrent state the Actor
    carries into a segment's first step is stored with the segment, so replay starts from it.

    A step the env cut by a time limit (truncated, not terminated) is stored as done, with
    ``timeout_values[t]`` = V(final observation) under the current network, so that Q^ret
    bootstraps from it (:func:`acer_sync.math.losses.q_retrace`). Observations update the network's
    running normalizer, if it has one, before it acts on them.

    :param env: the vector env.
    :param model: the online network (read only here).
    :param device: where ``model`` lives; stacked uint8 frames are sent there to act.
    :param nsteps: T.
    :param tracker: the training view of episodes (life loss, reward clipping, raw scores).
    :param fields: what a segment holds (:func:`acer_sync.replay.buffer.buffer_fields`).
    :param timer: charges time to the ``acting``, ``env`` (the env's step and the episode
        bookkeeping) and ``observe`` (the frame stack's update: on CUDA, the newest frames staged
        in pinned memory, which acting uploads and pushes) phases (bench.py).
    :param reward_scale: training rewards are multiplied by this (logged returns stay raw).
    :param precision: what the network's passes compute in (:mod:`acer_sync.nets.precision`).
    :param generator: the torch generator actions are sampled with (None: torch's global one).
    :param stream: the CUDA stream to act on (``--pipeline overlap``'s acting stream); None: the
        caller's current stream.
    :param graph: act through a CUDA graph (``--compile graph`` on CUDA; :class:`Actor`'s ``graph``).

    Where the envs step in groups (``env.groups`` > 1, ``--env-groups``), each group has an Actor
    of its own (its frame stack, recurrent state, acting graph and generator: the first group
    ``generator``, group g one seeded from its initial seed and g, :func:`group_seed`; or torch's
    global one, as the first, where ``generator`` is None), and the steps go round the groups in
    a fixed order: receive group g's step, record it, act for g and send g's actions, then the
    next group; so each group's acting runs while the other groups' envs step, and a seed still
    gives one run. A group's envs are the
    columns ``g·size … (g+1)·size`` of the segment; a segment ends once every group's last step is
    received.
    """

    def __init__(
        self, env: VecEnv, model: Network, device: torch.device, nsteps: int, tracker: EpisodeTracker,
        fields: Iterable[Field], timer: PhaseTimer | None = None, reward_scale: float = 1.0, precision: str = "fp32",
        generator: torch.Generator | None = None, stream: torch.cuda.Stream | None = None, graph: bool = False,
    ):
        self.timer = timer or PhaseTimer()
        self.stream = stream
        self.env = env
        self.nsteps = nsteps
        self.tracker = tracker
        self.fields = tuple(fields)
        self.reward_scale = reward_scale
        generators = [generator] + [
            None if generator is None else torch.Generator(generator.device).manual_seed(group_seed(generator.initial_seed(), group))
            for group in range(1, env.groups)]
        size = env.group_size
        #: One Actor per group of envs (one in all without groups); :attr:`actor` is the first.
        self.actors = [Actor(model, env.info, size, device, generator=group_generator, update_normalizer=True,
                             precision=precision, graph=graph, first_env=group * size)
                       for group, group_generator in enumerate(generators)]
        self.actor = self.actors[0]
        self.frames: np.ndarray | dict[str, np.ndarray] | None = None
        #: Held by a collection between its env calls: :meth:`abandon` waits for it.
        self._between_calls = threading.Lock()
        self._abandoned = False

    def abandon(self) -> None:
        """Give up a collection running in another thread (``--pipeline overlap``) whose env call
        timed out: from now on it changes nothing (the games it counts, the statistics acting
        gathers, the frames it holds), for the caller to put them back. A call that hung may return
        later; the thread then stops at once. A collection between its env calls is waited for."""
        with self._between_calls:
            self._abandoned = True

    def _raise_if_abandoned(self) -> None:
        """Called holding ``_between_calls`` (a plain ``with`` of the lock: a generator's context
        manager cost 3.6 µs a vector step, a tenth of a small classic-control step)."""
        if self._abandoned:
            raise CollectionAbandoned("the collection was given up after its env call timed out")

    def reset(self, seed: int | None) -> None:
        with torch.cuda.stream(self.stream):  # a no-op for None
            self._reset(seed)

    def run(self) -> Segment:
        with torch.cuda.stream(self.stream):
            return self._run()

    def _reset(self, seed: int | None) -> None:
        frames, lives = self.env.reset(seed=seed)
        self.tracker.reset(lives)
        for rows, actor in zip(self.env.group_rows, self.actors, strict=True):
            actor.reset(parts.map_parts(lambda part: part[rows], frames))
        self.frames = frames

    def _run(self) -> Segment:
        if self.frames is None:
            raise RuntimeError("call reset() before run()")
        T, env = self.nsteps, self.env
        segment = empty_segment(self.fields, T, env.num_envs)
        groups = list(zip(env.group_rows, self.actors, strict=True))
        for rows, actor in groups:
            for array, tensor in zip(segment.state, actor.state, strict=True):
                array[rows] = tensor.float().cpu().numpy()
        segment.timeout_values[...] = 0.0
        if env.groups == 1:
            ((rows, actor),) = groups
            for t in range(T):
                actions = self._act(segment, t, rows, actor)
                with self.timer("env"):
                    stepped = env.step(actions)
                self._record(segment, t, rows, actor, stepped)
        else:  # round the groups: group g's step t-1 received and recorded, then its step t sent
            for t in range(T + 1):
                for group, (rows, actor) in enumerate(groups):
                    if t > 0:
                        with self.timer("env"):
                            stepped = env.recv(group)
                        self._record(segment, t - 1, rows, actor, stepped)
                    if t < T:
                        actions = self._act(segment, t, rows, actor)
                        with self.timer("env"):
                            env.send(group, actions)
        parts.assign(segment.frames, T, self.frames)
        segment.firsts[T] = np.concatenate([actor.first for actor in self.actors])
        return segment

    def _act(self, segment: Segment, t: int, rows: slice, actor: Actor) -> np.ndarray:
        """Step ``t``'s observation of the envs in ``rows`` and ``actor``'s choice, recorded; the
        actions as the env takes them."""
        with self._between_calls:
            self._raise_if_abandoned()
            parts.assign(segment.frames, (t, rows), parts.map_parts(lambda frames: frames[rows], self.frames))
            segment.firsts[t, rows] = actor.first
            with self.timer("acting"):
                segment.actions[t, rows], segment.mu[t, rows] = actor.act()
        return actor.distribution.env_actions(segment.actions[t, rows])

    def _record(self, segment: Segment, t: int, rows: slice, actor: Actor, stepped: tuple) -> None:
        """The env's step ``t`` of the envs in ``rows`` (``stepped``: what it returned): the episode
        bookkeeping (the ``env`` phase's too), a time limit's bootstrap value, and the next frames."""
        next_frames, raw_rewards, terminated, truncated, lives = stepped
        with self.timer("env"), self._between_calls:
            self._raise_if_abandoned()
            segment.rewards[t, rows], segment.dones[t, rows], game_over = self.tracker.step(
                raw_rewards, terminated, truncated, lives, rows)
            if self.reward_scale != 1.0:
                segment.rewards[t, rows] *= self.reward_scale
        with self._between_calls:
            self._raise_if_abandoned()
            cut = truncated & ~terminated & self.env.final_mask[rows]
            if cut.any():
                with self.timer("acting"):
                    final = parts.map_parts(lambda part: part[rows], self.env.final_frames)
                    segment.timeout_values[t, rows] = actor.final_values(final, cut)
            with self.timer("observe"):
                actor.observe(next_frames, segment.dones[t, rows], self.tracker.life_lost[rows], game_over)
            if self.env.groups == 1:
                self.frames = next_frames  # as the env gave them, no copy
            else:
                parts.assign(self.frames, rows, next_frames)


def group_seed(seed: int, group: int) -> int:
    """The seed of env group ``group``'s acting generator, from the first group's ``seed``: drawn
    apart (numpy's SeedSequence), so that it meets none of the run's other seeds (``seed + 1`` is
    the evaluation's, ``seed + 2`` the video's, ``seed + k`` a resume's k iterations on)."""
    return int(np.random.SeedSequence([seed, group]).generate_state(1, np.uint64)[0] >> np.uint64(1))


class CollectionAbandoned(Exception):
    """Raised in a collecting thread that :meth:`Runner.abandon` gave up (nobody reads it)."""

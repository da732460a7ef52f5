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
        self.actor = Actor(model, env.info, env.num_envs, device, generator=generator, update_normalizer=True, precision=precision,
                           graph=graph)
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
        self.actor.reset(frames)
        self.frames = frames

    def _run(self) -> Segment:
        if self.frames is None:
            raise RuntimeError("call reset() before run()")
        T, N = self.nsteps, self.env.num_envs
        actor, dist = self.actor, self.actor.distribution
        segment = empty_segment(self.fields, T, N)
        for array, tensor in zip(segment.state, actor.state, strict=True):
            array[...] = tensor.float().cpu().numpy()
        segment.timeout_values[...] = 0.0
        between_calls = self._between_calls
        for t in range(T):
            with between_calls:
                self._raise_if_abandoned()
                parts.assign(segment.frames, t, self.frames)
                segment.firsts[t] = actor.first
                with self.timer("acting"):
                    segment.actions[t], segment.mu[t] = actor.act()
            with self.timer("env"):
                next_frames, raw_rewards, terminated, truncated, lives = self.env.step(dist.env_actions(segment.actions[t]))
                with between_calls:
                    self._raise_if_abandoned()
                    segment.rewards[t], segment.dones[t], game_over = self.tracker.step(raw_rewards, terminated, truncated, lives)
                    if self.reward_scale != 1.0:
                        segment.rewards[t] *= self.reward_scale
            with between_calls:
                self._raise_if_abandoned()
                cut = truncated & ~terminated & self.env.final_mask
                if cut.any():
                    with self.timer("acting"):
                        segment.timeout_values[t] = actor.final_values(self.env.final_frames, cut)
                with self.timer("observe"):
                    actor.observe(next_frames, segment.dones[t], self.tracker.life_lost, game_over)
                self.frames = next_frames
        parts.assign(segment.frames, T, self.frames)
        segment.firsts[T] = actor.first
        return segment


class CollectionAbandoned(Exception):
    """Raised in a collecting thread that :meth:`Runner.abandon` gave up (nobody reads it)."""

"""One acting step as a CUDA graph (``--compile graph`` on CUDA): the network's step through the
stacked observations, the policy's statistics μ and the sampled (or greedy) actions, replayed as one
launch per env step instead of the ~50 kernels and their Python that an eager step costs.

The second GPU report (docs/performance.md) found the overlapped loop bound by collection, with
acting a fixed ~1.6 ms of host time per step whether 16 or 64 envs acted: launches, not arithmetic.

A graph replays fixed addresses, so the step reads and writes static tensors: its inputs and the
recurrent state are copied in before a replay unless they are the static tensors themselves (the
Actor's: its staged newest frames and episode starts, uploaded in one copy, which its step pushes
onto the device frame stack, see :class:`~acer_sync.rollout.actor.DeviceFrameStack`; and the state
the last replay left), and the actions with μ come out packed in one tensor ``[N, action width +
stat size]`` (the Actor brings it to the host in one pinned copy). The network's parameters and
the running normalizer's statistics are read in place, so the weights an update or
:class:`ActingCopy` writes into them are the weights the next replay acts with. The sample draws from the Actor's generator, registered
with the graph, so a seed gives one run.

Off CUDA the same static-tensor step runs eagerly: tests on the CPU check it against the Actor's
own eager path, bit for bit.

The capture happens once, at the Actor's first reset (the Trainer's setup, in the main thread,
before any update): first three eager warm-up steps, with the device's sync-debug mode set to
raise, whose changes to the state, the normalizer and the generator are undone; then the
recording. A step that cannot run without a host sync (a user's torso that reads a value back)
fails its warm-up, and acting goes on eagerly, with one warning line. A recording that fails
leaves the device's capture state broken for the process (its generators and allocator still
mark a capture), so it is a :class:`~atari.errors.UserError` that names ``--compile update``.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager, nullcontext

import torch

from acer_sync.nets.torsos import evaluation_mode
from atari import parts
from atari.errors import UserError

log = logging.getLogger(__name__)

#: Eager steps before the capture (cuDNN's algorithm choice and lazy initialisation happen there).
WARMUP_STEPS = 3


def _set_sync_debug_mode(mode) -> None:
    """torch's CUDA sync debug mode, without its "prototype feature" warning (a line above every
    run's start)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype feature")
        torch.cuda.set_sync_debug_mode(mode)


class ActingGraph:
    """``__call__(obs, first, state) -> (packed [N, width + stat size], next state)``.

    :param step: ``step(obs, first, state) -> (actions, stats, next_state)``, the Actor's acting
        step (:func:`acer_sync.rollout.actor.choose_actions` with its network, distribution,
        greedy flag and generator).
    :param generator: the generator ``step`` samples from (registered with the graph), or None
        (the device's default generator).
    :param restore: tensors ``step`` changes in place besides its outputs (the normalizer's
        statistics, the Actor's device frame stack): the warm-up's changes to them are undone.
    :param adopt_inputs: the ``obs`` and ``first`` of the first call are tensors at fixed
        addresses, written before each call (the Actor's staged frames and episode starts): the
        graph reads them where they are instead of copying them in.

    The graph is captured at :meth:`prepare` or the first call, on CUDA; elsewhere ``step`` runs
    eagerly on the static tensors.
    """

    def __init__(self, step, generator: torch.Generator | None = None, restore: tuple[torch.Tensor, ...] = (),
                 module: torch.nn.Module | None = None, adopt_inputs: bool = False):
        self._step = step
        self.adopt_inputs = adopt_inputs
        self.module = module  # the network ``step`` runs: recorded in evaluation mode, as it acts
        self.generator = generator
        self.restore = restore
        self._capture_pending = True
        self.obs = self.first = None
        self.state: tuple = ()
        self.packed: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _copy_in(self, obs, first: torch.Tensor, state: tuple) -> None:
        if self.obs is None:  # the static tensors, made at the first call, as plain tensors (see _capture)
            with torch.inference_mode(False):
                if self.adopt_inputs:
                    self.obs, self.first = obs, first
                else:
                    self.obs, self.first = parts.map_parts(torch.empty_like, obs), torch.empty_like(first)
                self.state = tuple(torch.empty_like(s) for s in state)
        if obs is not self.obs:
            parts.map_parts(lambda static, new: static.copy_(new), self.obs, obs)
        if first is not self.first:
            self.first.copy_(first)
        if state is not self.state:
            for static, new in zip(self.state, state, strict=True):
                static.copy_(new)

    def _run_step(self) -> torch.Tensor:
        actions, stats, next_state = self._step(self.obs, self.first, self.state)
        for static, new in zip(self.state, next_state, strict=True):
            static.copy_(new)
        return pack(actions, stats)

    def _warm_up(self) -> None:
        """Eager steps on a side stream, raising at a host sync; everything they changed restored."""
        device = self.first.device
        saved = [t.clone() for t in (*self.restore, *self.state)]
        generator_state = self.generator.get_state() if self.generator is not None else torch.cuda.get_rng_state(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        debug_mode = torch.cuda.get_sync_debug_mode()
        _set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._run_step()
        finally:  # as before the warm-up, whether or not it ran
            _set_sync_debug_mode(debug_mode)
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.current_stream(device).synchronize()
            for tensor, value in zip((*self.restore, *self.state), saved, strict=True):
                tensor.copy_(value)
            if self.generator is not None:
                self.generator.set_state(generator_state)
            else:
                torch.cuda.set_rng_state(generator_state, device)

    def _record(self) -> None:
        """The capture; a failure is a :class:`UserError` naming the step's own error (ending a
        capture that the step invalidated raises an error of its own in place of the step's)."""
        step_error: Exception | None = None
        try:
            graph = torch.cuda.CUDAGraph()
            if self.generator is not None:
                graph.register_generator_state(self.generator)
            with default_generator_set_aside(self.first.device, self.generator is not None), \
                    torch.cuda.graph(graph, capture_error_mode="thread_local"):
                try:
                    self.packed = self._run_step()
                except Exception as error:
                    step_error = error
                    raise
        except Exception as error:
            cause = step_error or error
            raise UserError(f"--compile graph: capturing acting's CUDA graph failed ({_reason(cause)}); "
                            "run with --compile update") from cause
        self.graph = graph

    @torch.no_grad()
    def prepare(self, obs, first: torch.Tensor, state: tuple) -> None:
        """Take the step's inputs and, the first time on CUDA, capture its graph (see the module)."""
        self._copy_in(obs, first, state)
        if self._capture_pending:
            self._capture()

    def _capture(self) -> None:
        """The warm-up and the recording, outside inference mode (whatever the caller's): the first
        capture in a process makes the device generator's seed and offset tensors, and made in
        inference mode they are inference tensors that every later capture (the update's CUDA
        graphs) writes outside it, which raises (pytorch#166792)."""
        self._capture_pending = False
        if not self.first.is_cuda:
            return
        acting = evaluation_mode(self.module) if self.module is not None else nullcontext()
        with torch.inference_mode(False), torch.no_grad(), acting:
            try:
                self._warm_up()
            except Exception as error:  # noqa: BLE001 - a step that cannot be captured acts eagerly, said once
                log.warning(f"--compile graph: acting runs eagerly, its step cannot be captured as a CUDA graph "
                            f"({_reason(error)})")
                return
            self._record()

    def __call__(self, obs, first: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        """One step (the Actor's ``act`` calls it in inference mode)."""
        self.prepare(obs, first, state)
        if self.graph is not None:
            self.graph.replay()
            return self.packed, self.state
        return self._run_step(), self.state


@contextmanager
def default_generator_set_aside(device: torch.device, enabled: bool):
    """During acting's capture, the device's default generator holds a private state of its own.

    In torch 2.11 (the lent GPU machine's), a capture registers the default generator with its
    graph whether or not the graph draws from it; every replay then refills that generator's seed
    and offset tensors and adds 0 to its offset, a check that fails while another thread captures
    ("Offset increment outside graph capture encountered unexpectedly"). With ``--pipeline overlap
    --compile graph``, acting replays in the collecting thread while the update's CUDA graphs
    record in the learner's, so the run would stop at its start; and the refill, on the acting
    stream, races with the update's graphs that draw from the default generator (the Gaussian
    head's samples), so that two updates could draw the same numbers. Acting that samples from a
    generator of its own (``enabled``: the collecting thread's) never draws from the default one:
    its graph registers a private state instead, and the default generator keeps its own. torch
    2.13 keeps a generator's state per capture (pytorch#176752), where this changes nothing.
    """
    if not enabled:
        yield
        return
    default = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    try:
        saved = default.graphsafe_get_state()
        default.graphsafe_set_state(torch.Generator(device))
    except RuntimeError as error:  # a torch release where this API differs: capture as before, and say so
        log.warning(f"--compile graph: acting's capture keeps the default CUDA generator ({_reason(error)})")
        yield
        return
    try:
        yield
    finally:
        default.graphsafe_set_state(saved)


def pack(actions: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """Actions ``[N, ...]`` and statistics ``[N, stat size]`` as one float32 tensor ``[N, action
    width + stat size]``, for one copy to the host (actions exact as float32 below 2**24)."""
    return torch.cat([actions.reshape(len(actions), -1).float(), stats.float()], dim=1)


def _reason(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__

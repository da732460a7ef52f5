"""One acting step as a CUDA graph (``--compile graph`` on CUDA): the network's step through the
stacked observations, the policy's statistics μ and the sampled (or greedy) actions, replayed as one
launch per env step instead of the ~50 kernels and their Python that an eager step costs.

The second GPU report (docs/performance.md) found the overlapped loop bound by collection, with
acting a fixed ~1.6 ms of host time per step whether 16 or 64 envs acted: launches, not arithmetic.

A graph replays fixed addresses, so the step reads and writes static tensors: the observations,
the episode starts and the recurrent state are copied in before each replay (one copy each), and
the actions with μ come out packed in one tensor ``[N, action width + stat size]`` (the Actor
brings it to the host in one pinned copy). The network's parameters and the running normalizer's
statistics are read in place, so the weights an update or :class:`ActingCopy` writes into them
are the weights the next replay acts with. The sample draws from the Actor's generator, registered
with the graph, so a seed gives one run.

Off CUDA (and where ``capture`` is off) the same static-buffer step runs eagerly: tests on the CPU
check it against the Actor's own eager path, bit for bit. A capture that fails falls back to the
eager step with one warning line.
"""

from __future__ import annotations

import logging

import torch

from atari import parts

log = logging.getLogger(__name__)

#: Eager steps before the capture (cuDNN's algorithm choice and lazy initialisation happen there).
WARMUP_STEPS = 3


class ActingGraph:
    """``__call__(obs, first, state) -> (packed [N, width + stat size], next state)``.

    :param step: ``step(obs, first, state) -> (actions, stats, next_state)``, the Actor's acting
        step (:func:`acer_sync.rollout.actor.choose_actions` with its network, distribution,
        greedy flag and generator).
    :param generator: the generator ``step`` samples from (registered with the graph), or None.
    :param restore: tensors ``step`` changes in place besides its outputs (the normalizer's
        statistics): the warm-up's changes to them are undone before the first real step.
    :param capture: capture a CUDA graph at the first call (on CUDA); else run ``step`` eagerly
        on the static tensors.
    """

    def __init__(self, step, generator: torch.Generator | None = None, restore: tuple[torch.Tensor, ...] = (),
                 capture: bool = True):
        self._step = step
        self.generator = generator
        self.restore = restore
        self._capture_pending = capture
        self.obs = self.first = None
        self.state: tuple = ()
        self.packed: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _copy_in(self, obs, first: torch.Tensor, state: tuple) -> None:
        if self.obs is None:  # the static tensors, made at the first call
            self.obs = parts.map_parts(torch.empty_like, obs)
            self.first = torch.empty_like(first)
            self.state = tuple(torch.empty_like(s) for s in state)
        parts.map_parts(lambda static, new: static.copy_(new), self.obs, obs)
        self.first.copy_(first)
        if state is not self.state:
            for static, new in zip(self.state, state, strict=True):
                static.copy_(new)

    def _run_step(self) -> torch.Tensor:
        actions, stats, next_state = self._step(self.obs, self.first, self.state)
        for static, new in zip(self.state, next_state, strict=True):
            static.copy_(new)
        return torch.cat([actions.reshape(len(actions), -1).float(), stats.float()], dim=1)

    def _capture(self) -> None:
        device = self.first.device
        saved = [t.clone() for t in (*self.restore, *self.state)]
        generator_state = self.generator.get_state() if self.generator is not None else None
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._run_step()
        finally:  # as before the warm-up, whether or not it ran
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.current_stream(device).synchronize()
            for tensor, value in zip((*self.restore, *self.state), saved, strict=True):
                tensor.copy_(value)
            if self.generator is not None:
                self.generator.set_state(generator_state)
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        # thread_local: the learner's thread (--pipeline overlap) may allocate and sync meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.packed = self._run_step()
        self.graph = graph

    def __call__(self, obs, first: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        self._copy_in(obs, first, state)
        if self._capture_pending:
            self._capture_pending = False
            if self.first.is_cuda:
                try:
                    self._capture()
                except Exception as error:  # noqa: BLE001 - any capture failure: the eager step, said once
                    self.graph = None
                    message = str(error).splitlines()[0] if str(error) else ""
                    log.warning(f"--compile graph: acting runs eagerly, capturing its CUDA graph failed "
                                f"({type(error).__name__}: {message})")
        if self.graph is not None:
            self.graph.replay()
            return self.packed, self.state
        return self._run_step(), self.state

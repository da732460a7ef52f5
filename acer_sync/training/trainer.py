"""The Trainer: the iteration, and nothing else. Collect one segment, learn from it and from replay.

Everything around the iteration is a callback (:mod:`acer_sync.training.callbacks`): evaluation,
progress rows, checkpoints, the progress bar and the user's own. The parts the Trainer drives are
built by :func:`acer_sync.training.setup.build_trainer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from acer_sync.base.config import Config
from acer_sync.base.errors import PolicyNotFinite, WriteFailed, env_stop
from acer_sync.base.log import log
from acer_sync.base.outcome import Outcome, Stop
from acer_sync.base.timing import PhaseTimer
from acer_sync.base.transfer import SideStream, upload
from acer_sync.math.schedules import learning_rate
from acer_sync.nets.networks import Network
from acer_sync.nets.torsos import evaluation_mode
from acer_sync.replay.buffer import Batch, Field, ReplayBuffer, Sample, to_batch
from acer_sync.rollout.actor import policy_not_finite
from acer_sync.rollout.background import ActingCopy, BackgroundCollector
from acer_sync.rollout.runner import Runner
from acer_sync.training.acer import ACER
from acer_sync.training.callbacks import CallbackFailed, CallbackList
from acer_sync.training.checkpoint import new_run_key
from acer_sync.training.progress import UpdateStats
from acer_sync.training.signals import STOP_GRACE_SECONDS, GracefulStop
from atari import parts
from atari.envs import EnvInfo, VecEnv
from atari.episodes import EpisodeTracker
from atari.errors import EnvFailed, EnvTimedOut, EnvWorkerDied


@dataclass
class Parts:
    """What one run drives, built by :func:`acer_sync.training.setup.build_trainer`."""

    device: torch.device
    model: Network
    agent: ACER
    fields: tuple[Field, ...]
    buffer: ReplayBuffer
    env: VecEnv
    runner: Runner
    tracker: EpisodeTracker
    sampler: np.random.Generator
    timer: PhaseTimer
    #: ``--pipeline overlap``: the acting copy the Runner acts with, and the thread it collects in.
    acting: ActingCopy | None = None
    collector: BackgroundCollector | None = None


class Trainer:
    """Runs the iteration until ``total_timesteps``, a signal, a callback's stop, an env that
    failed or hung, a write that failed, or too many non-finite updates, and says which
    (:class:`~acer_sync.base.outcome.Outcome`).

    :param config: the run's settings.
    :param info: what the env looks like (:func:`atari.envs.env_info`).
    :param run_dir: the run directory (the outcome names it).
    :param parts: the networks, the update, the buffer, the envs and their Runner.
    :param callbacks: what runs around each iteration.
    :param counters: where a resumed run stands (``timesteps``, ``iterations``, ``updates``,
        ``time_elapsed``); zeros for a new one.
    :param on_close: called once the envs are closed (gives the process its thread count back).
    """

    def __init__(self, config: Config, info: EnvInfo, run_dir: Path, parts: Parts, callbacks: CallbackList,
                 counters: dict | None = None, run_key: str | None = None, on_close: Callable[[], None] | None = None):
        self.config, self.info, self.run_dir, self.callbacks = config, info, Path(run_dir), callbacks
        #: The run's name in its checkpoints and saved buffers, kept through its resumes (a fresh one by default).
        self.run_key = run_key if run_key is not None else new_run_key()
        self.device, self.model, self.agent, self.fields = parts.device, parts.model, parts.agent, parts.fields
        self.buffer, self.env, self.runner, self.tracker = parts.buffer, parts.env, parts.runner, parts.tracker
        self.sampler, self.timer = parts.sampler, parts.timer
        self.acting, self.collector = parts.acting, parts.collector
        #: On CUDA with the buffer in host memory, batches upload on a side stream beside the updates.
        self.side_stream = SideStream(self.device, enabled=self.buffer.device.type == "cpu")
        #: The buffer's newest segment awaits its on-policy update (overlapped, until the next
        #: iteration's; serial, while learn() runs: a checkpoint after a failed update counts it unlearned).
        self.pending_update = False
        counters = counters or {}
        #: Segments that got no on-policy update (overlapped, the newest one of each earlier session;
        #: one whose update failed).
        self.unlearned_segments = int(counters.get("unlearned_segments", 0))
        self.timesteps = int(counters.get("timesteps", 0))
        self.iterations = int(counters.get("iterations", 0))
        self.updates = int(counters.get("updates", 0))
        self.time_before = float(counters.get("time_elapsed", 0.0))  # earlier sessions of this run
        if self.buffer.restart_cut.any():
            self._bootstrap_restart()
        self.started = time.perf_counter()
        #: When the loop of iterations began, after the callbacks' starts (the first progress row's fps counts from it).
        self.loop_started = self.started
        #: The learning rate of the last update (the ``lr`` a progress row shows); None before the first.
        self.learned_lr: float | None = None
        self.steps_per_iteration = config.num_envs * config.nsteps
        self.lr = learning_rate(config.lr_schedule, config.lr, self.timesteps, config.total_timesteps)
        self.update_stats = UpdateStats()
        self.stop = GracefulStop()
        #: The step ``checkpoints/latest.pt`` holds (set by the checkpoint callback); None before the first.
        self.checkpoint_step: int | None = self.timesteps if counters else None
        self.on_close = on_close
        #: The exception that stopped the run, once its end is done (:meth:`train` lets it through).
        self.crashed: BaseException | None = None

    def iterate(self) -> None:
        """One iteration. Serial: :meth:`collect`, then :meth:`learn` from that segment.

        Overlapped (``--pipeline overlap``, :mod:`acer_sync.rollout.background`): learn from the
        buffer's newest segment k while the envs collect k+1 in their thread with the acting copy,
        then hand the new weights to the acting copy and store k+1. A session's first iteration
        only collects (there is nothing to learn from yet); after a resume that is the segment
        after the checkpoint's, whose newest stored segment keeps only its replays.
        """
        if self.collector is None:
            self.collect()
            self.pending_update = True
            self.learn()
            return
        if not self.pending_update:
            self.collect()
            self.acting.exchange()
            self.pending_update = True
            return
        with self._dropped_if_broken():
            self.collector.start()
            try:
                self.learn()  # k learned (pending_update False) until k+1 is stored: a checkpoint after an env fault in k+1 counts it so
                with self.timer("collect_wait"):  # the learner done, waiting for the envs' thread
                    segment = self.collector.wait(self.config.env_timeout, self.stop.stopped, STOP_GRACE_SECONDS)
            except BaseException as error:
                if self.collector.running:  # an update failed, or the envs' step hung
                    self._give_up_collection(wait=not isinstance(error, EnvTimedOut))
                raise
        self.acting.exchange()
        self._store(segment)
        self.pending_update = True

    def _give_up_collection(self, wait: bool) -> None:
        """The run is ending while the envs' thread collects: from now on the thread changes
        nothing (the games it counts, the normalizer's statistics: they are put back next), and it is
        given up to :data:`STOP_GRACE_SECONDS` (``wait``; 1 s after a second signal) to return from
        the env call it is in; a thread still in it (an env step that hung) is left behind, and
        closing ends the envs' workers instead of waiting on them."""
        self.runner.abandon()
        seconds = 1.0 if self.stop.interrupted_twice else STOP_GRACE_SECONDS
        if not (wait and self.collector.join(seconds)):
            self.env.broken = True

    def collect(self) -> None:
        """Act for one segment of ``nsteps`` in every env (in evaluation mode: :func:`evaluation_mode`) and store it."""
        with self._dropped_if_broken(), evaluation_mode(self.runner.actor.model):
            segment = self.runner.run()
        self._store(segment)

    @contextlib.contextmanager
    def _dropped_if_broken(self) -> Iterator[None]:
        """Around a collection: what it changes besides the segment it stores, the games it
        finishes and the observation normalizer's statistics (which acting moves), put back where
        it breaks (an env fault, a policy not finite, a torso's exception, a memory error). The
        collection is dropped, and the checkpoint written then holds neither games nor statistics
        of its steps."""
        normalizer = self.runner.actor.model.normalizer
        statistics = None if normalizer is None else {name: value.clone() for name, value in normalizer.state_dict().items()}
        counted = self.tracker.counted()
        try:
            yield
        except BaseException:
            self.tracker.uncount_since(counted)
            if statistics is not None:
                normalizer.load_state_dict(statistics)
            raise

    def _store(self, segment) -> None:
        with self.timer("buffer_put"):
            self.buffer.put(segment)
        self.lr = learning_rate(self.config.lr_schedule, self.config.lr, self.timesteps, self.config.total_timesteps)
        self.timesteps += self.steps_per_iteration
        self.iterations += 1

    def learn(self) -> None:
        """One on-policy update on the segment just collected, then Poisson(``replay_ratio``)
        off-policy updates on replayed ones, once ``replay_start`` steps per env are stored."""
        cfg, timer = self.config, self.timer
        with timer("buffer_get"):
            batch = self._with_replay_state(self._load(self.buffer.latest))
        with timer("on_policy_update"):
            self.update_stats.add(self.agent.update(batch, self.lr), off_policy=False)
        self.updates += 1
        self.pending_update = False
        self.learned_lr = self.lr  # overlapped, self.lr moves on to the next segment's before the row is written
        if cfg.replay_ratio > 0 and self.buffer.num_steps_stored >= cfg.replay_start:
            for _ in range(self.sampler.poisson(cfg.replay_ratio)):
                with timer("buffer_get"):
                    batch = self._replay_batch()
                with timer("off_policy_updates"):
                    self.update_stats.add(self.agent.update(batch, self.lr), off_policy=True)
                self.updates += 1

    @torch.no_grad()
    def _bootstrap_restart(self) -> None:
        """A resumed buffer's newest segment ends where the restart cut its episodes, a cut like a
        time limit's: its last step bootstraps from V of the segment's bootstrap frame, computed as
        the update computes it (the network unrolled over the segment from its replay state)."""
        batch = self._with_replay_state(self._load(self.buffer.latest))
        features, _ = self.agent.net.unroll(batch.obs, batch.firsts, batch.state)
        values = self.agent.net.value_of(features).float().reshape(self.config.nsteps + 1, self.config.num_envs)[-1].cpu().numpy()
        if not np.isfinite(values).all():  # it would go into the buffer, and every update that replays it be skipped
            raise policy_not_finite(values, "env", "value V", "the episode the restart cut has no value to bootstrap from")
        self.buffer.bootstrap_restart(values)

    def _load(self, sample: Callable[[], Sample]) -> Batch:
        """A buffer sample (``sample()``) as a batch on the device, loaded on the side stream."""
        return self.side_stream(lambda: to_batch(sample(), self.fields, self.info.stack, self.device))

    def _with_replay_state(self, batch: Batch) -> Batch:
        """``replay_state`` zero: replay a recurrent network from the zero state (Baselines' way)."""
        if self.config.replay_state == "zero" and batch.state:
            return batch._replace(state=self.model.initial_state(self.config.num_envs))
        return batch

    def _replay_batch(self) -> Batch:
        """One replayed segment per env; with ``replay_state`` burn_in, a recurrent network starts
        it from the state the current weights reach over the previous segment (R2D2's burn-in,
        here T steps from that segment's stored state), where that segment is still stored."""
        index = self.buffer.sample_indices(self.sampler)
        batch = self._load(lambda: self.buffer.gather(index))
        if self.config.replay_state != "burn_in" or not batch.state:
            return self._with_replay_state(batch)
        previous, available = self.buffer.previous(index)
        previous = self._load(lambda: previous)
        with torch.no_grad():
            observations = parts.map_parts(lambda obs: obs[:-1], previous.obs)  # a dict of them for a multi-part observation
            _, burned = self.agent.net.unroll(observations, previous.firsts[:-1], previous.state)
        use = upload(available, self.device).unsqueeze(-1)
        return batch._replace(state=tuple(torch.where(use, new, stored) for new, stored in zip(burned, batch.state)))

    def train(self) -> Outcome:
        """Iterate until done or stopped; the callbacks save, log and evaluate around it."""
        with self.stop as stop:
            try:
                return self._run(stop)
            except BaseException as error:
                # A second signal may land anywhere: in an update, in the final save (whose atomic
                # write leaves the previous checkpoint in place) or while the envs close, and what
                # it interrupts may re-raise it as another error. Exit at once without cleaning up;
                # the vector envs' finalizers terminate their workers. (A KeyboardInterrupt that no
                # signal sent, raised in the iterations, ended the run as any exception does, and
                # propagates; one raised while the run ended is taken for a second signal.)
                if error is self.crashed or not (stop.interrupted_twice or isinstance(error, KeyboardInterrupt)):
                    raise
                self.buffer.cancel_save(1.0)  # a buffer written in a thread: its temporary file removed, not left behind
                return self._outcome(Stop.INTERRUPTED, f"{self._second_stop()}: exiting at once; {self._checkpoint_kept()}")

    def _run(self, stop: GracefulStop) -> Outcome:
        cfg = self.config
        nonfinite = None
        try:
            stopper = self.callbacks.on_training_start(self)
            self.loop_started = time.perf_counter()  # the callbacks' starts (W&B's init, an owed evaluation) are not training
            while stopper is None and self.timesteps < cfg.total_timesteps and stop.signal_name is None:
                self.iterate()
                stopper = self.callbacks.on_rollout_end(self)
                streak = self.agent.recent_nonfinite_streak()  # on CUDA, without waiting for the updates
                if streak >= cfg.max_nonfinite:
                    nonfinite = self._outcome(
                        Stop.NONFINITE, f"{streak} non-finite updates in a row at step "
                        f"{self.timesteps}; stopped, keeping the last good checkpoint ({self._checkpoint_kept()})",
                    )
                    break
        except EnvFailed as error:
            # The iteration it broke is dropped: the checkpoint holds the last one completed. After
            # a stop signal, an env that hung past the grace period, or workers that the signal
            # ended too (a SIGTERM to the process group), are part of that stop. Workers the
            # signal ended are no error to report (a batch system's cancel signals every process
            # of the job): the stop's own summary says it all.
            if stop.signal_name is not None and isinstance(error, EnvWorkerDied):
                log.info(f"{error}: the signal reached the env workers too; the iteration under way is dropped")
                return self._end(self._outcome(Stop.INTERRUPTED))
            stop_kind = Stop.INTERRUPTED if stop.signal_name is not None else env_stop(error)
            return self._end(self._outcome(stop_kind, str(error)), say_saved=True)
        except WriteFailed as error:
            if stop.interrupted_twice:  # the second signal broke the write: train() exits at once
                raise
            return self._end(self._outcome(Stop.WRITE_FAILED, f"{error}; {self._checkpoint_kept()}"))
        except PolicyNotFinite as error:  # in collection or an evaluation: no action could be drawn
            return self._end(self._outcome(Stop.NONFINITE, f"{error}; stopped after step {self.timesteps}, {self._checkpoint_kept()}"))
        except CallbackFailed as failure:
            log.info(f"a callback raised {type(failure.error).__name__}: saving a checkpoint at step {self.timesteps}")
            self._end_despite(self._outcome(Stop.CALLBACK_FAILED, f"{type(failure.error).__name__}: {failure.error}"))
            raise failure.error from None
        except BaseException as error:
            if stop.interrupted_twice:  # train() exits at once
                raise
            memory = out_of_memory(error)
            # Raised while an update changed the weights, it left them partly stepped: the
            # checkpoint callback keeps the last one written instead of saving them.
            torn = " while an update changed the weights, which were not saved" if self.agent.weights_torn else ""
            if memory is not None:
                said = f"out of memory at step {self.timesteps} ({memory}){torn}"
                if torn:
                    return self._end_despite(self._outcome(Stop.OUT_OF_MEMORY, f"{said}; {self._checkpoint_kept()}"))
                return self._end_despite(self._outcome(Stop.OUT_OF_MEMORY, said), say_saved=True)
            # A bug (a torso of yours, or acer_sync's), or a KeyboardInterrupt that no signal sent:
            # the run ends as after a failed callback, with a checkpoint of where it stood, the
            # envs closed and the process's settings given back, and the exception goes on.
            log.info(f"{type(error).__name__} raised at step {self.timesteps}{torn or ': saving a checkpoint'}")
            self._end_despite(self._outcome(Stop.CRASHED, f"{type(error).__name__}: {error}"))
            error.add_note(f"acer_sync: the run in {self.run_dir} stopped at step {self.timesteps}{torn}; {self._checkpoint_kept()}")
            self.crashed = error
            raise
        if nonfinite is not None:
            return self._end(nonfinite)
        if stopper is not None:
            message = stopper.stop_message or f"{type(stopper).__name__} stopped the run at step {self.timesteps}"
            log.info(f"{message}: saving a checkpoint")
            return self._end(self._outcome(Stop.CALLBACK, message=message))
        return self._end(self._outcome(Stop.INTERRUPTED if stop.signal_name is not None else Stop.FINISHED))

    def _end(self, outcome: Outcome, say_saved: bool = False) -> Outcome:
        """The callbacks' ``on_training_end`` (the checkpoint is saved there), then :meth:`close`.
        A write that fails there (the final checkpoint on a full disk) becomes the outcome.
        ``say_saved``: the error line then says the step of the checkpoint written."""
        try:
            self.callbacks.on_training_end(self, outcome)
            if say_saved and self.checkpoint_step == self.timesteps:
                outcome = dataclasses.replace(outcome, error=f"{outcome.error}; saved a checkpoint at step {self.timesteps}")
        except WriteFailed as error:
            # A second signal inside torch.save leaves its zip writer mid-record, and the writer's
            # close then fails ("unexpected pos"): not a full disk, the second signal's exit.
            if self.stop.interrupted_twice:
                raise
            before = f"{outcome.error}; then " if outcome.error else ""
            outcome = self._outcome(Stop.WRITE_FAILED, f"{before}{error}; {self._checkpoint_kept()}")
        finally:
            self.close()
        return dataclasses.replace(outcome, checkpoint_step=self.checkpoint_step)

    def _end_despite(self, outcome: Outcome, say_saved: bool = False) -> Outcome:
        """:meth:`_end` after a failure (``outcome``): an exception while the run ends (the final
        save after a memory error, a user callback's ``on_training_end``) does not replace the
        failure; it is said in the outcome. Where the outcome is not returned (the failure's
        exception propagates), what went wrong while ending (a full disk) is a warning line."""
        raised = outcome.stop in (Stop.CRASHED, Stop.CALLBACK_FAILED)
        try:
            ended = self._end(outcome, say_saved)
        except Exception as error:  # noqa: BLE001 - the failure that ended the run is the one to report
            if self.stop.interrupted_twice:
                raise
            said = f"{type(error).__name__} while the run ended: {error}; {self._checkpoint_kept()}"
            if raised:
                log.warning(f"warning: {said}")
            return self._outcome(outcome.stop, f"{outcome.error}; then {said}")
        if raised and ended.stop is not outcome.stop:  # the final checkpoint's write failed
            log.warning(f"warning: {ended.error.removeprefix(outcome.error + '; then ')}")
        return ended

    def _second_stop(self) -> str:
        """What cut the run short, in words: "second SIGINT", "SIGTERM after SIGINT", or a
        KeyboardInterrupt that no signal sent (raised by a callback's code: GracefulStop names
        every signal it raises one for)."""
        first, second = self.stop.signal_name, self.stop.second_signal
        if second is None:
            return "a KeyboardInterrupt raised in the run" + (f" after {first}" if first else "")
        return f"{second} after {first}" if first not in (None, second) else f"second {second}"

    def _checkpoint_kept(self) -> str:
        """What the run directory holds to resume from, in words."""
        if self.checkpoint_step is None:
            return "no checkpoint was written"
        return f"checkpoints/latest.pt holds step {self.checkpoint_step}"

    def _outcome(self, stop: Stop, error: str = "", message: str = "") -> Outcome:
        if stop is Stop.INTERRUPTED and not message and self.stop.signal_name is not None:
            message = f"stopped by {self.stop.signal_name}"  # which signal (or a sweep's stop) it was
        return Outcome(stop, self.run_dir, self.timesteps, error, message, self.checkpoint_step)

    def request_stop(self, reason: str) -> None:
        """Finish the current iteration, save a checkpoint and return an INTERRUPTED outcome from
        :meth:`train`, as after SIGINT; ``reason`` names why in the "received: saving" line."""
        self.stop.request(reason)

    def stop_requested(self) -> bool:
        return self.stop.signal_name is not None

    def time_elapsed(self) -> float:
        """Wall-clock seconds of this run, earlier sessions included."""
        return self.time_before + time.perf_counter() - self.started

    def how_it_runs(self) -> dict:
        """What this session's settings resolved to, as ``config.json`` records it (``ran``): the
        device, ``--compile``'s and ``--pipeline``'s modes (``auto`` decides by the device and the
        run) and where the replay buffer lives."""
        return {"device": str(self.device), "compile": self.agent.compile_mode,
                "pipeline": "serial" if self.acting is None else "overlap", "replay_device": self.buffer.device.type}

    def close(self) -> None:
        self.env.close()
        if self.on_close is not None:
            self.on_close()


#: What torch's CPU allocator says where it cannot allocate (a RuntimeError, not a MemoryError),
#: and CUDA's libraries where they could not (a RuntimeError: a kernel's, cuBLAS's or cuDNN's workspace).
OUT_OF_MEMORY_TEXTS = ("DefaultCPUAllocator: can't allocate memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                       "CUDNN_STATUS_ALLOC_FAILED")


def out_of_memory(error: BaseException) -> str | None:
    """What ``error`` says, in one line, where it is the device or the host out of memory (torch's
    ``OutOfMemoryError``, Python's or numpy's ``MemoryError``, torch's CPU allocator); None where
    it is another error."""
    text = str(error).strip()
    said = next((said for said in OUT_OF_MEMORY_TEXTS if said in text), None) if isinstance(error, RuntimeError) else None
    if not isinstance(error, (torch.OutOfMemoryError, MemoryError)) and said is None:
        return None
    if said is not None:
        text = text[text.index(said):]
    # CUDA's says "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of
    # ... of which ... is free. Including non-PyTorch memory, ...": its first three sentences.
    sentences = [part.strip() for part in text.splitlines()[0].split(". ") if part.strip()] if text else []
    return ". ".join(sentences[:3]).rstrip(".") or type(error).__name__

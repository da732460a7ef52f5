"""Callbacks: what happens around the iteration, the built-in parts and the user's alike.

Stable-Baselines3's semantics, on one interface ([`Callback`][]): ``on_training_start`` once before
the first iteration, ``on_rollout_end`` once an iteration (after its segment was collected and
learned from), ``on_training_end`` once with the run's ``Outcome`` (``acer_sync.base.outcome``).
A hook that returns a false value but None (``False``, numpy's ``False``, as SB3's ``if not
callback.on_step()`` reads it) stops the run cleanly: the iteration ends, a checkpoint is saved,
and the outcome says which callback stopped it (``Callback.stop_message``). There is no hook per
env step: a callback that defines SB3's (``_on_step``, ``on_step``, ...) is refused in one line.

``on_rollout_end`` gets the iteration's progress row as a dict, empty when no row is written this
iteration. The built-ins run first, in this order, so that the user's callbacks see a full row,
but for the checkpoints' ``on_rollout_end``, which comes after the user's callbacks (a periodic
checkpoint holds their state of that iteration); at the end the checkpoint is written before a
user's ``on_training_end`` runs:

* [`EvalCallback`][] plays ``eval_episodes`` full games every ``eval_every`` steps, puts the
  ``eval_*`` columns in the row and keeps ``checkpoints/best.pt`` at the best evaluation mean;
* [`ProgressCallback`][] fills and writes the row (``progress.csv``, TensorBoard) every
  ``log_interval`` iterations, after ``log_seconds``, at the end and with every evaluation;
* ``WandbCallback`` (``acer_sync.training.tracking``) with ``track``: the row, the config and the
  evaluation's videos to Weights & Biases;
* [`ProgressBar`][] (tqdm);
* [`CheckpointCallback`][] writes a checkpoint every ``checkpoint_every`` steps (after the
  user's callbacks in an iteration) and at the end.

An exception raised in a user's callback saves a checkpoint, then propagates.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from tqdm import tqdm

from acer_sync.base.config import Config
from acer_sync.base.errors import UserError, WriteFailed
from acer_sync.base.log import log
from acer_sync.base.outcome import Outcome, Stop
from acer_sync.rollout.evaluation import evaluate
from acer_sync.rollout.video import VideoRecorder, video_env
from acer_sync.training.checkpoint import (
    BEST,
    BUFFER_FILE,
    LATEST,
    BufferWriter,
    load_checkpoint,
    save_buffer,
    save_checkpoint,
    saved_buffer_step,
    trainer_payload,
)
from acer_sync.training.logger import Logger
from acer_sync.training.progress import progress_row
from atari.envs import VecEnv


class Callback:
    """A hook into the run; override what you need. Each hook gets the
    Trainer (``acer_sync.training.trainer.Trainer``: ``trainer.timesteps``, ``trainer.model``,
    ``trainer.tracker``, ...). Return ``False`` from ``on_training_start`` or ``on_rollout_end``
    to stop the run (after saving a checkpoint); set ``stop_message`` to say why."""

    #: Whether its ``on_rollout_end`` runs after the user's callbacks' (the checkpoints': their state
    #: of the iteration goes in); its place in the list stands for the other hooks and the state's key.
    after_the_users = False

    #: Why this callback stopped the run, for the outcome and the log (default: its class name).
    stop_message: str = ""

    def on_training_start(self, trainer) -> bool | None:
        """Once, before the first iteration (of this process: a resumed run starts again here)."""
        return None

    def on_rollout_end(self, trainer, row: dict) -> bool | None:
        """Once an iteration; ``row`` is this iteration's progress row, empty when none is written."""
        return None

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        """Once, however the run ended, with its ``outcome`` (``outcome.stop`` says why), after the
        built-ins' (the final checkpoint among them)."""
        return None

    def state(self) -> dict:
        """What the checkpoint keeps of this callback: numbers, strings, None, tensors, lists, tuples
        and dicts (numpy numbers come back as Python numbers, numpy arrays as lists)."""
        return {}

    def load_state(self, state: dict) -> None:
        """Take back what [`state`][] returned, on resume."""


#: Stable-Baselines3's hooks, which acer_sync does not call: a callback defining one is refused.
SB3_HOOKS = ("_on_step", "on_step", "_on_rollout_start", "on_rollout_start", "_on_rollout_end",
             "_on_training_start", "_on_training_end", "_init_callback", "init_callback")


class CallbackFailed(Exception):
    """A user's callback raised ``error``; the Trainer saves a checkpoint, then raises ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def check_callbacks(callbacks: Iterable) -> list[Callback]:
    """``callbacks`` as a list; a one-line UserError where one is not a [`Callback`][]."""
    try:
        callbacks = list(callbacks)
    except TypeError:
        raise UserError(f"callbacks must be a list of acer_sync.Callback instances, got {callbacks!r}") from None
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise UserError(f"callbacks must be acer_sync.Callback instances, got {callback!r}")
        defined = [name for name in SB3_HOOKS
                   if any(name in vars(cls) for cls in type(callback).__mro__ if cls not in (Callback, object))]
        if defined:
            raise UserError(
                f"callback {type(callback).__name__} defines {', '.join(defined)}, Stable-Baselines3's, which acer_sync does not "
                "call: its hooks are on_training_start(trainer), on_rollout_end(trainer, row) (once an iteration of num_envs x "
                "nsteps steps; return False to stop) and on_training_end(trainer, outcome)"
            )
    return callbacks


class CallbackList:
    """The run's callbacks, in the order they run. Exceptions from those in ``user`` (the user's own,
    and the ``on_progress`` shorthand) are wrapped in [`CallbackFailed`][]; a built-in one's
    propagate as they are. A hook returns the first callback that asked to stop, or None."""

    def __init__(self, callbacks: Iterable[Callback] = (), user: Iterable[Callback] = ()):
        self.callbacks = check_callbacks(callbacks)
        self.user = list(user)
        #: The order of ``on_rollout_end``: the list's, with those that run after the users' last.
        self.iteration_order = sorted(self.callbacks, key=lambda callback: callback.after_the_users)
        self._warned: set[str] = set()  # the callbacks whose state was left out, warned once
        # States a checkpoint held for callbacks this session has not (W&B's run id while --track is
        # off for a resume): kept in the next checkpoints, for a later session that has them again.
        self._absent: dict = {}

    def _each(self, hook: str, *args, order: list[Callback] | None = None) -> Callback | None:
        stopper = None
        for callback in self.callbacks if order is None else order:
            try:
                result = getattr(callback, hook)(*args)
                stops = result is not None and not result  # SB3's "if not callback.on_step()", None going on
            except Exception as error:
                if not self._is_user(callback):
                    raise
                raise CallbackFailed(error) from error
            if stops and stopper is None:
                stopper = callback
        return stopper

    def _is_user(self, callback: Callback) -> bool:
        return any(callback is user for user in self.user)

    def on_training_start(self, trainer) -> Callback | None:
        return self._each("on_training_start", trainer)

    def on_rollout_end(self, trainer) -> Callback | None:
        return self._each("on_rollout_end", trainer, {}, order=self.iteration_order)

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        """Every callback's ``on_training_end``, in order (the built-ins first: the checkpoint is
        saved before a user's callback runs), each given ``outcome`` with the step the checkpoint
        holds then; the first exception is raised after all have run."""
        failure = None
        for callback in self.callbacks:
            try:
                callback.on_training_end(trainer, dataclasses.replace(outcome, checkpoint_step=trainer.checkpoint_step))
            except Exception as error:
                failure = failure or error
        if failure is not None:
            raise failure

    def _keys(self) -> list[str]:
        """Each callback's key in the checkpoint: its class name, and ``Name#2``, ``Name#3``, ... for
        further instances of a class. (Before 2026-11 a class had one key, holding its last
        instance's state, which every instance took back; now the first instance takes it.)"""
        keys, seen = [], {}
        for callback in self.callbacks:
            name = type(callback).__name__
            seen[name] = seen.get(name, 0) + 1
            keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
        return keys

    def state(self) -> dict:
        """Each callback's ``state()`` as plain data (:func:`plain_state`), by key. A state that
        cannot be plain data is left out with a warning: a checkpoint holding it would not load."""
        states = dict(self._absent)
        for key, callback in zip(self._keys(), self.callbacks):
            try:
                state = plain_state(callback.state(), key)
            except UserError as error:
                if key not in self._warned:
                    log.warning(f"{error}; checkpoints leave it out")
                    self._warned.add(key)
                continue
            if state:
                states[key] = state
        return states

    def check_state(self) -> None:
        """A one-line UserError where a callback's ``state()`` is not plain data now (before a run
        starts, rather than at its first checkpoint). A ``state()`` that cannot answer yet (it reads
        what ``on_training_start`` sets) is asked again at each checkpoint."""
        for key, callback in zip(self._keys(), self.callbacks):
            try:
                state = callback.state()
            except Exception:  # noqa: BLE001 - a state that needs the run: the checkpoints check it
                continue
            plain_state(state, key)

    def load_state(self, states: dict) -> None:
        keys = self._keys()
        for key, callback in zip(keys, self.callbacks):
            if key in states:
                callback.load_state(states[key])
        self._absent = {key: state for key, state in states.items() if key not in keys}


#: What a checkpoint keeps of a callback's state as it is (``torch.load(weights_only=True)`` reads them).
PLAIN_TYPES = (str, int, float, bool, type(None), torch.Tensor)


def plain_state(value, key: str, where: str = ""):
    """``value`` (a callback's ``state()``) as data a checkpoint loads without running code: numpy
    numbers become Python numbers and numpy arrays lists (``np.mean`` returns ``np.float64``, which
    ``weights_only`` refuses, so a checkpoint holding one would not load); dicts, lists, tuples,
    numbers, strings, None and tensors stay. Anything else is a one-line UserError naming ``key``
    (the callback) and where in its state the value is."""
    if isinstance(value, np.generic):
        return plain_state(value.item(), key, where)  # a datetime64 gives a date: refused below
    if isinstance(value, np.ndarray):
        return plain_state(value.tolist(), key, where)  # an object array's items are checked one by one
    if type(value) in PLAIN_TYPES or isinstance(value, torch.Tensor):
        return value
    for plain in (bool, int, float, str):  # a subclass (an IntEnum, a StrEnum) would be pickled as its class
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, dict):
        return {plain_state(name, key, f"{where} key {name!r}"): plain_state(item, key, f"{where}[{name!r}]")
                for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [plain_state(item, key, f"{where}[{index}]") for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise UserError(
        f"callback {key}'s state(){where} is a {type(value).__name__}: a checkpoint keeps only numbers, "
        "strings, None, tensors, numpy values, lists, tuples and dicts"
    )


def step_of_copy(path: Path) -> int:
    """The step of a ``step_<N>.pt`` checkpoint copy (-1 for a name not of that form)."""
    digits = path.stem.removeprefix("step_")
    return int(digits) if digits.isdigit() else -1


def next_multiple(value: int, every: int) -> int:
    """The first multiple of ``every`` above ``value``."""
    return (value // every + 1) * every


def saved_next_eval(state) -> int | None:
    """The step of the next evaluation an :class:`EvalCallback`'s saved ``state`` holds (None:
    absent, from checkpoints before it was saved, or not a step)."""
    step = state.get("next_eval") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def evaluation_owed(next_eval: int | None, step: int, steps_per_iteration: int) -> bool:
    """Whether a checkpoint at ``step`` whose next evaluation was due at ``next_eval`` owes it: due in
    the checkpoint's last iteration, which a stop ended before it played. One due earlier is a
    session's without evaluation (--eval-every 0 on a resume), not owed."""
    return next_eval is not None and 0 <= step - next_eval < steps_per_iteration


class CheckpointCallback(Callback):
    """``checkpoints/latest.pt`` every ``checkpoint_every`` steps (with a ``step_*.pt`` copy, the
    newest ``keep_checkpoints`` kept) and at the end, unless non-finite updates stopped the run (the
    last good one stays, as after a failed write); the replay buffer beside it with ``save_buffer``,
    marked with the checkpoint's step (a periodic one's written in a thread while the run goes on).
    ``on_checkpoint`` is called with the path of ``latest.pt`` after each, once its buffer is
    written too. In an iteration it runs after the user's
    callbacks, so that a periodic checkpoint holds their state of that iteration."""

    after_the_users = True

    def __init__(self, run_dir: Path, config: Config, on_checkpoint: Callable[[Path], None] | None = None):
        self.directory = Path(run_dir) / "checkpoints"
        self.config = config
        self.on_checkpoint = on_checkpoint
        #: The step of the buffer file beside the checkpoints, where it is the resumed checkpoint's (None
        #: otherwise: one of a history rolled back from may carry a step the new history reaches later);
        #: read at the start, or at a save before it (an evaluation owed at the total that failed).
        self.buffer_step: int | None = None
        self.buffer_step_read = False
        #: A periodic checkpoint's buffer, written in a thread while the run goes on.
        self.buffer_writer: BufferWriter | None = None
        try:
            self.directory.mkdir(exist_ok=True)
        except OSError as error:  # a full disk, say: the start fails in one line (WRITE_FAILED)
            raise WriteFailed(self.directory, error) from None
        self.next_checkpoint = 0

    def on_training_start(self, trainer) -> None:
        self.next_checkpoint = next_multiple(trainer.timesteps, self.config.checkpoint_every)
        self._set_aside_a_rolled_back_history(trainer.timesteps)
        self._read_buffer_step(trainer)

    def _read_buffer_step(self, trainer) -> None:
        if not self.buffer_step_read:
            saved = saved_buffer_step(self.directory) if self.config.save_buffer else None
            self.buffer_step = saved if saved == trainer.timesteps else None
            self.buffer_step_read = True

    def on_rollout_end(self, trainer, row: dict) -> None:
        if self.buffer_writer is not None and self.buffer_writer.done:
            self._finish_buffer()  # a write that failed (a full disk) stops the run here
        if trainer.timesteps >= self.next_checkpoint and trainer.agent.nonfinite_streak == 0:
            # While updates are non-finite no checkpoint is written: the last good one stays.
            self.save(trainer, periodic=True)
            self.next_checkpoint += self.config.checkpoint_every

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        try:
            if outcome.stop in (Stop.NONFINITE, Stop.WRITE_FAILED) or trainer.agent.weights_torn:
                # The last good checkpoint stays (a broken update's weights are partly stepped), its
                # buffer finished where it is under way.
                self._finish_buffer()
                return
            if outcome.stop is Stop.INTERRUPTED:
                log.info(f"{trainer.stop.signal_name} received: saving a checkpoint at step {trainer.timesteps} and stopping")
            self.save(trainer, periodic=False)
        except CallbackFailed as failure:  # raised as it is, after the other callbacks' ends, as theirs
            raise failure.error from None

    def save(self, trainer, periodic: bool) -> None:
        """Write ``latest.pt`` (and a periodic copy), prune old periodic ones, and the buffer if
        asked; ``trainer.checkpoint_step`` says the step ``latest.pt`` holds once it is written.
        A periodic save's buffer is written in a thread while the run goes on, and
        ``on_checkpoint`` is called once it is (:meth:`_finish_buffer`)."""
        self._read_buffer_step(trainer)  # an end before this callback's start (an earlier one's failed)
        self._finish_buffer(superseded=True)  # the previous checkpoint's, if still under way
        payload = trainer_payload(trainer)
        save_checkpoint(self.directory / LATEST, payload)
        trainer.checkpoint_step = trainer.timesteps
        if periodic:
            save_checkpoint(self.directory / f"step_{trainer.timesteps:010d}.pt", payload)
            periodic_files = sorted(self.directory.glob("step_*.pt"))
            for old in periodic_files[: max(0, len(periodic_files) - self.config.keep_checkpoints)]:
                try:
                    old.unlink(missing_ok=True)  # the user may have removed it, to free the disk
                except OSError as error:  # a file the run may not remove: it stays, and the run goes on
                    log.warning(f"cannot remove {old} (--keep-checkpoints {self.config.keep_checkpoints}): "
                                f"{error.strerror or error}; it stays")
        if self.config.save_buffer and self.buffer_step != trainer.timesteps:  # a run ending on a checkpoint's step wrote it then
            self._remove_stale_buffer()
            if periodic:  # written while the run goes on (the buffer as it was at this step)
                self.buffer_writer = BufferWriter(self.directory, trainer.buffer, trainer.timesteps, trainer.run_key)
                return
            save_buffer(self.directory, trainer.buffer, trainer.timesteps, trainer.run_key)  # the run's end waits for it
            self.buffer_step = trainer.timesteps
        self._checkpoint_written()

    def _finish_buffer(self, superseded: bool = False) -> None:
        """Wait for the buffer's write under way, if any; the step of the file is then its step,
        and its checkpoint is whole (``on_checkpoint``, unless ``superseded``: a newer checkpoint
        is being written, whose call comes once it is). What stopped it (a :class:`WriteFailed`:
        a full disk) is raised."""
        writer, self.buffer_writer = self.buffer_writer, None
        if writer is not None:
            writer.finish()
            self.buffer_step = writer.step
            if not superseded:
                self._checkpoint_written()

    def _checkpoint_written(self) -> None:
        if self.on_checkpoint is not None:
            try:
                self.on_checkpoint(self.directory / LATEST)
            except Exception as error:  # the user's code: the run ends as after a user callback's error
                raise CallbackFailed(error) from error

    def _set_aside_a_rolled_back_history(self, step: int) -> None:
        """A run resumed from a step copy put back as ``latest.pt`` (docs/checkpoints.md): the
        copies past its step belong to the history it left. They go to a folder of their own, where
        no hint names them and the pruning of ``--keep-checkpoints`` does not keep them over the new
        history's (both sort by name)."""
        later = sorted(path for path in self.directory.glob("step_*.pt") if step_of_copy(path) > step)
        if not later:
            return
        aside = self.directory / f"rolled_back_from_step_{step_of_copy(later[-1])}"
        try:
            aside.mkdir(exist_ok=True)
            for path in later:
                path.rename(aside / path.name)
        except OSError as error:
            log.warning(f"cannot move the step copies past step {step} to {aside}: {error.strerror or error}")
            return
        log.info(f"resumed at step {step}: the {len(later)} step copies past it, of the history rolled back "
                 f"from, are now in {aside}")

    def _remove_stale_buffer(self) -> None:
        """Remove the buffer file of an earlier step before writing this one's: ``latest.pt`` has
        moved past it, so no resume can use it, and it would double the disk the write needs."""
        stale = self.directory / BUFFER_FILE
        try:
            stale.unlink(missing_ok=True)
        except OSError as error:
            log.warning(f"cannot remove the stale {stale}: {error.strerror or error}; it stays until the new one replaces it")

    def save_best(self, trainer) -> None:
        save_checkpoint(self.directory / BEST, trainer_payload(trainer))

    def saved_best_mean(self, key: str, best_mean: float) -> float:
        """The best mean to go on from: ``best_mean`` (``latest.pt``'s), or the higher one that
        ``best.pt`` records under the evaluation callback's ``key``; nan where ``best.pt`` cannot be
        read, so that the next evaluation replaces it. ``best.pt`` is written at the evaluation, the
        best mean reaches ``latest.pt`` at the next checkpoint: a run killed between the two resumes
        with an older, lower best mean, and without this replaced ``best.pt`` with a worse policy."""
        path = self.directory / BEST
        if not path.exists():
            return best_mean
        try:
            states = load_checkpoint(path).get("callbacks", {})
        except UserError as error:
            log.warning(f"{error}; the next evaluation replaces it")
            return math.nan
        saved = states.get(key, {}).get("best_mean") if isinstance(states, dict) else None
        if not isinstance(saved, (int, float)) or isinstance(saved, bool) or math.isnan(saved):
            return best_mean
        return float(saved) if math.isnan(best_mean) or saved > best_mean else best_mean


class EvalCallback(Callback):
    """Every ``eval_every`` steps, ``eval_episodes`` full games in envs of their own, with the
    evaluation preprocessing (no life-loss ends, raw scores) and a generator of their own (the
    training's random numbers are untouched); the ``eval_*`` columns of that iteration's row. At a
    new best mean, ``checkpoints/best.pt`` through ``checkpoints`` (the best mean survives a resume).

    With ``capture_video``, each evaluation also plays one game in an env of its own that renders,
    with a generator of its own (the evaluation's scores are those of a run without videos), and
    records it to ``videos/step_<N>.mp4`` (``acer_sync.rollout.video``); ``new_videos`` lists
    ``(step, path)`` of those not yet taken (by ``--track``)."""

    def __init__(self, config: Config, checkpoints: CheckpointCallback | None = None, run_dir: Path | None = None):
        self.config = config
        self.checkpoints = checkpoints
        self.videos_dir = Path(run_dir) / "videos" if config.capture_video and run_dir is not None else None
        self.env: VecEnv | None = None
        self.video_env: VecEnv | None = None
        self.generator = None
        self.video_generator = None
        self.new_videos: list[tuple[int, Path]] = []
        self.next_eval = 0
        self.owed_eval: int | None = None  # the step of an evaluation a stop skipped, from the checkpoint
        self.final_results: dict[str, float] = {}  # the columns of one played at the start, for the final row
        self.cancelled_seconds = 0.0  # how long the last evaluation a stop cut short had played
        self.best_mean = math.nan

    def on_training_start(self, trainer) -> None:
        self.generator = torch.Generator(device=trainer.device).manual_seed(self.config.seed + 1)
        self.video_generator = torch.Generator(device=trainer.device).manual_seed(self.config.seed + 2)
        self.next_eval = next_multiple(trainer.timesteps, self.config.eval_every)
        if evaluation_owed(self.owed_eval, trainer.timesteps, trainer.steps_per_iteration):
            self.next_eval = self.owed_eval  # a stop skipped it: it plays in this session's first iteration
        if self.checkpoints is not None:
            self.best_mean = self.checkpoints.saved_best_mean(type(self).__name__, self.best_mean)
        if self.next_eval <= trainer.timesteps >= self.config.total_timesteps:
            # Owed by a checkpoint whose last iteration a stop ended: the resume at the total runs
            # no iteration to play it in, so it plays now, into the final row (ProgressCallback's).
            # A stop during its games, or an env that fails, ends the run as in an iteration.
            self.final_results = self.play(trainer) or {}

    def on_rollout_end(self, trainer, row: dict) -> None:
        # An evaluation due in the iteration a stop signal came in is skipped: it would hold the
        # stop, and the checkpoint, for a whole evaluation (a minute of Pong's games on a GPU).
        # ``next_eval`` stays, so the checkpoint owes it and a resume plays it first.
        if trainer.timesteps < self.next_eval or trainer.stop_requested():
            return
        results = self.play(trainer)
        # a stop during its games: none reported, but their time is not training's (fps)
        row.update(results if results is not None else {"eval_seconds": self.cancelled_seconds})

    def play(self, trainer) -> dict[str, float] | None:
        """The evaluation due, its columns; at a new best mean, ``best.pt``."""
        results = self.evaluate(trainer)
        if results is None:
            return None
        self.next_eval = next_multiple(trainer.timesteps, self.config.eval_every)
        if self.checkpoints is not None and not results["eval_mean"] <= self.best_mean:
            self.best_mean = results["eval_mean"]
            self.checkpoints.save_best(trainer)
        return results

    def evaluate(self, trainer) -> dict[str, float] | None:
        """The evaluation's columns; None where a stop came during its games, which end then (a
        SIGTERM's grace is short, and Pong's 100 games take minutes on a CPU) and are not reported."""
        cfg = self.config
        start = time.perf_counter()
        if self.env is None:
            self.env = VecEnv(
                trainer.info, min(cfg.eval_episodes, cfg.num_envs), trainer.env.backend, num_threads=cfg.threads,
                timeout=cfg.env_timeout,
            )
        seed = cfg.seed + 1_000_003 * (1 + trainer.timesteps // max(cfg.eval_every, 1))
        scores = evaluate(
            trainer.model, self.env, cfg.eval_episodes, trainer.device, greedy=cfg.eval_greedy, seed=seed,
            generator=self.generator, precision=cfg.precision, cancelled=trainer.stop_requested, envs_name="evaluation env",
        )
        if trainer.stop_requested():
            self.cancelled_seconds = round(time.perf_counter() - start, 2)
            return None
        if self.videos_dir is not None and (video := self.record(trainer, seed)) is not None:
            self.new_videos.append((trainer.timesteps, video))
        return {
            "eval_mean": float(np.mean(scores)),
            "eval_std": float(np.std(scores)),
            "eval_episodes": len(scores),
            "eval_seconds": round(time.perf_counter() - start, 2),
        }

    def record(self, trainer, seed: int) -> Path | None:
        """One game played as the evaluation plays them, recorded to ``videos/step_<N>.mp4``; None
        where a stop came during it (the game ends there, and no video is kept)."""
        if self.video_env is None:
            self.video_env = video_env(trainer.info, self.config.env_timeout)
        try:
            self.videos_dir.mkdir(exist_ok=True)
        except OSError as error:
            raise WriteFailed(self.videos_dir, error) from None
        recorder = VideoRecorder(self.video_env, self.videos_dir / f"step_{trainer.timesteps:010d}.mp4")
        try:
            evaluate(
                trainer.model, self.video_env, 1, trainer.device, greedy=self.config.eval_greedy, seed=seed,
                generator=self.video_generator, on_step=recorder, precision=self.config.precision,
                cancelled=trainer.stop_requested, envs_name="evaluation env",
            )
            return None if trainer.stop_requested() else recorder.finish()
        except OSError as error:
            raise WriteFailed(recorder.path, error) from None
        finally:
            recorder.discard()

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        for env in (self.env, self.video_env):
            if env is not None:
                env.close()

    def state(self) -> dict:
        """The best mean, and the step of the next evaluation: at or below the checkpoint's step
        where a stop skipped one (it is played after the resume, not lost)."""
        return {"next_eval": self.next_eval, **({} if math.isnan(self.best_mean) else {"best_mean": self.best_mean})}

    def load_state(self, state: dict) -> None:
        self.best_mean = float(state.get("best_mean", math.nan))
        self.owed_eval = saved_next_eval(state)


class ProgressCallback(Callback):
    """Writes the progress row to ``progress.csv`` and TensorBoard (``acer_sync.training.logger.Logger``)
    every ``log_interval`` iterations, once ``log_seconds`` of wall time passed since the last row
    (so a slow run's first row comes after ``log_seconds``), with every evaluation, and at the end,
    however the run ends (a callback's stop, a signal, a failure): the steps since the last row
    are in it, so the row where ``--stop-at-reward`` was reached is there. Not after a failed
    write (the disk that refused the checkpoint). ``fps`` counts training only: evaluation time
    is left out."""

    def __init__(self, run_dir: Path, config: Config, resume_step: int | None = None,
                 evaluation: EvalCallback | None = None):
        self.run_dir = run_dir
        self.config = config
        self.resume_step = resume_step
        self.evaluation = evaluation
        self.logger: Logger | None = None
        self.interval_start, self.interval_from = time.perf_counter(), 0
        #: The row written at the end of the run (:meth:`on_training_end`), for the callbacks after
        #: this one that pass rows on (``on_progress``, W&B); None where none was written.
        self.final_row: dict | None = None

    def on_training_start(self, trainer) -> None:
        self.logger = Logger(self.run_dir, resume_step=self.resume_step)
        self._reset(trainer)
        self.interval_start = None  # the first interval starts with the loop (trainer.loop_started), after every callback's start

    def _reset(self, trainer) -> None:
        trainer.update_stats.reset()
        self.interval_start, self.interval_from = time.perf_counter(), trainer.timesteps

    def _interval_steps(self, trainer) -> int:
        """The steps since the last row: those of a collection stored before an update failed too."""
        return trainer.timesteps - self.interval_from

    def _interval_seconds(self, trainer) -> float:
        return time.perf_counter() - (trainer.loop_started if self.interval_start is None else self.interval_start)

    def on_rollout_end(self, trainer, row: dict) -> None:
        if not (row or self._due(trainer)):
            return
        full = self._write(trainer, row)
        row.clear()
        row.update(full)

    def _write(self, trainer, evaluation: dict) -> dict:
        """Log the row of the steps since the last one, ``evaluation``'s columns added (their
        time left out of ``fps``), start the next interval, and return the row."""
        elapsed = self._interval_seconds(trainer) - evaluation.get("eval_seconds", 0.0)
        # no steps (a resume at the total that played an owed evaluation): no training to measure
        steps = self._interval_steps(trainer)
        fps = steps / max(elapsed, 1e-9) if steps else math.nan
        row = progress_row(trainer, fps)
        row.update(evaluation)  # the evaluation's columns, in the row's order
        self.logger.log(row)
        self._reset(trainer)
        return row

    def _due(self, trainer) -> bool:
        cfg = self.config
        if trainer.iterations % cfg.log_interval == 0 or trainer.timesteps >= cfg.total_timesteps:
            return True
        return cfg.log_seconds > 0 and self._interval_seconds(trainer) >= cfg.log_seconds

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        if self.logger is None:
            return
        try:
            evaluation = self.evaluation.final_results if self.evaluation is not None else {}
            if (self._interval_steps(trainer) > 0 or evaluation) and outcome.stop is not Stop.WRITE_FAILED:
                self.final_row = self._write(trainer, evaluation)
        finally:
            self.logger.close()


def last_step(trainer, total: int) -> int:
    """The step a run at ``trainer.timesteps`` ends at: after the iteration that reaches ``total``,
    which may go past it."""
    per_iteration = trainer.steps_per_iteration
    return trainer.timesteps + max(0, -(-(total - trainer.timesteps) // per_iteration)) * per_iteration


class ProgressBar(Callback):
    """A tqdm bar of the steps, with the 100-episode mean and the episode count at each row. Its
    total is the step the run ends at, ``total`` rounded up to whole iterations (a bar past its
    total drops it, and its percentage); it ends at the run's last step, however the run ended.

    Where standard error is no terminal (``nohup``, a batch job's log file), a bar would be one
    endless line of carriage returns: it says a line of progress instead, with a progress row, at
    most every :attr:`PLAIN_SECONDS`."""

    #: Seconds between two lines of progress where standard error is no terminal.
    PLAIN_SECONDS = 60.0

    def __init__(self, total: int):
        self.total = total
        self.end = total
        #: The bar; None where standard error is no terminal, and a line says the progress instead.
        self.bar: tqdm | None = None
        self.said_at = 0.0

    def on_training_start(self, trainer) -> None:
        self.end = last_step(trainer, self.total)
        if not _is_terminal(sys.stderr):
            self.said_at = time.monotonic()
            return
        self.bar = tqdm(total=self.end, initial=trainer.timesteps, unit="step", dynamic_ncols=True)

    def on_rollout_end(self, trainer, row: dict) -> None:
        if self.bar is None:
            if row and (row.get("eval_episodes") or time.monotonic() - self.said_at >= self.PLAIN_SECONDS):
                self._say(trainer, row)
            return
        self.bar.update(trainer.timesteps - self.bar.n)
        if row:
            self.bar.set_postfix(mean_return=f"{row['mean_episode_reward']:.2f}", episodes=row["episodes"])

    def _say(self, trainer, row: dict) -> None:
        self.said_at = time.monotonic()
        line = (f"step {trainer.timesteps:,} of {self.end:,} ({100 * trainer.timesteps / max(self.end, 1):.0f}%), "
                f"{row['fps']:,.0f} steps/s, mean return {row['mean_episode_reward']:.2f} over {row['episodes']:,} episodes")
        if row.get("eval_episodes"):
            line += f", evaluation {row['eval_mean']:.2f} over {row['eval_episodes']} games"
        log.info(line)

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        if self.bar is not None:
            self.bar.update(trainer.timesteps - self.bar.n)  # a collection stored before an update failed
            self.bar.close()


def _is_terminal(stream) -> bool:
    """Whether ``stream`` draws a bar: a terminal, or a Jupyter notebook's output (which is none,
    and draws tqdm's carriage returns as a terminal does)."""
    if type(stream).__module__.startswith("ipykernel"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a stream without one, or closed
        return False


class ProgressRows(Callback):
    """Calls ``on_progress`` with each progress row, after it is written (``acer_sync.train``'s
    shorthand), the final one at the run's end (``progress``'s) too."""

    def __init__(self, on_progress: Callable[[dict], None], progress: ProgressCallback | None = None):
        self.on_progress = on_progress
        self.progress = progress

    def on_rollout_end(self, trainer, row: dict) -> None:
        if row:
            self.on_progress(row)

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        if self.progress is not None and self.progress.final_row is not None:
            self.on_progress(self.progress.final_row)


class StopTrainingOnReward(Callback):
    """Stops the run once the mean return reaches ``threshold``: the evaluation mean where the run
    evaluates (``eval_every`` > 0), else the training mean of the last 100 episodes (raw scores of
    full games), once 100 have ended. Reaching it is a success: a checkpoint is saved and the
    scripts exit 0."""

    def __init__(self, threshold: float):
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
            raise UserError(f"StopTrainingOnReward: the reward to stop at must be a finite number, got {threshold!r}")
        self.threshold = float(threshold)

    def on_training_start(self, trainer) -> None:
        config = trainer.config
        if config.eval_every and next_multiple(trainer.timesteps, config.eval_every) > last_step(trainer, config.total_timesteps):
            log.warning(
                f"--stop-at-reward {self.threshold:g} follows the evaluation's mean, and no evaluation is due before "
                f"--total-timesteps {config.total_timesteps} (--eval-every {config.eval_every}): it will not stop this "
                "run; lower --eval-every, or set it to 0 to follow the training mean"
            )

    def on_rollout_end(self, trainer, row: dict) -> bool | None:
        if trainer.config.eval_every:
            if not row.get("eval_episodes"):
                return None
            mean, which = row["eval_mean"], f"evaluation mean over {row['eval_episodes']} games"
        else:
            if len(trainer.tracker.recent_returns) < trainer.tracker.recent_returns.maxlen:
                return None
            mean, which = trainer.tracker.mean_return(), "mean of the last 100 episodes"
        if mean >= self.threshold:
            self.stop_message = f"reached the reward {self.threshold:g} ({which}: {mean:.2f}) at step {trainer.timesteps}"
            return False
        return None

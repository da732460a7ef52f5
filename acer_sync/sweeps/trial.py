"""One sweep trial: the Ray Tune function trainable that runs one training (:func:`acer_sync.api.runs.run`)
in its own process.

The trial is a normal run in its run directory (``config.json``, ``progress.csv``, ``tb/``,
``checkpoints/``), as ``train.py`` would write it. Each progress row goes to Tune through the
Trainer's ``on_progress`` hook, and each checkpoint, through ``on_checkpoint``, as the step it
saved (``checkpoint_timesteps``, a column of Tune's status table: what a lost node would cost).

The checkpoint has one copy, in the run directory, which every node sees (sweep.py checks that
before any trial starts). A trial that starts again, after its process or its node died or after
the sweep was interrupted, resumes from the run directory's ``latest.pt`` on whichever node Tune
gives it.

When sweep.py is interrupted it sets the sweep's :class:`StopRequest`. Each trial waits on it in a
thread and then asks its Trainer to stop: the Trainer finishes its iteration and saves a checkpoint,
as ``train.py`` does on SIGINT. The trial tells the StopRequest it saved, and waits for Tune to end
its process, since a trial that returned would count as finished; sweep.py lets Tune stop the
trials only once every training trial has saved.

What the trial prints (one line per event: the process and node it runs on, the replay buffer's
size, "resuming at step N", saving at a stop) goes out with a ``[trial NAME]`` prefix, which
sweep.py prints on its terminal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import tune

from acer_sync.api import runs as api
from acer_sync.api.run_metadata import CONFIG_FILE
from acer_sync.base.config import RESUMABLE_CHANGES, Config, saved_config
from acer_sync.base.errors import EXIT_CODES, UserError
from acer_sync.base.outcome import Stop
from acer_sync.base.run_lock import RunLock
from acer_sync.training.checkpoint import LATEST, copy_hint, has_checkpoint, latest_checkpoint
from acer_sync.training.trainer import Trainer

#: The start of each line a trial prints for sweep.py's terminal; the trial's name and "] " follow.
LINE_PREFIX = "[trial "
#: Why a trial's Trainer stops when sweep.py was interrupted (its "... received: saving" line).
STOP_REASON = "sweep.py's SIGINT"


class TrialFailed(RuntimeError):
    """The Trainer stopped before the end of the run, or raised: what crosses to sweep.py is this
    error's text (an exception of the run's own may not unpickle there, and Ray names a
    ``KeyboardInterrupt`` or ``SystemExit`` of a task as its own cancellation or exit)."""


def failure_text(error: BaseException) -> str:
    """``error`` in one line, with the notes the run put on it (its checkpoint's step)."""
    notes = "; ".join(note.removeprefix("acer_sync: ") for note in getattr(error, "__notes__", ()))
    return f"{type(error).__name__}: {error}" + (f" ({notes})" if notes else "")


@dataclass(frozen=True)
class DriverContext:
    """What sweep.py gives every trial besides its settings (``tune.with_parameters``).

    :param git_commit: the commit of the code sweep.py runs; the code shipped to a cluster's
        nodes has no ``.git`` to ask.
    :param stop_request: the name of the sweep's :class:`StopRequest` actor.
    """

    git_commit: str
    stop_request: str


@ray.remote(num_cpus=0)
class StopRequest:
    """Set once by sweep.py when it is interrupted; every trial waits on it (an async actor, so a
    wait does not hold up the others or the ``set``).

    Trials register while they train and say when they have saved at the stop, so that sweep.py
    lets Tune stop them only then (:func:`acer_sync.sweeps.launch.request_stop`): a trial that reported a row
    to Tune before it heard of the stop would otherwise be ended before it saved.
    """

    def __init__(self):
        self.requested = asyncio.Event()
        self.unsaved: set[str] = set()

    async def wait(self) -> None:
        await self.requested.wait()

    async def set(self) -> None:
        self.requested.set()

    async def training(self, trial: str) -> None:
        self.unsaved.add(trial)

    async def done(self, trial: str) -> None:
        """The trial saved at the stop, or stopped training for another reason."""
        self.unsaved.discard(trial)

    async def waiting_for(self) -> list[str]:
        return sorted(self.unsaved)


def wait_for_stop(stop_request: str, trainer: Trainer) -> None:
    """Wait for the sweep's stop request (in a daemon thread), then ask the Trainer to stop."""
    try:
        ray.get(ray.get_actor(stop_request).wait.remote())
    except (ray.exceptions.RayError, ValueError):
        return  # sweep.py is gone without asking: Ray ends this process with it
    trainer.request_stop(STOP_REASON)


def discard_unsaved_start(run_dir: Path) -> None:
    """Remove what an earlier start that died before its first checkpoint left: the trial starts
    again from step 0, and its curve must not hold two runs (and its config.json, which the run
    writes again, must not be taken for someone else's)."""
    (run_dir / "progress.csv").unlink(missing_ok=True)
    (run_dir / CONFIG_FILE).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # empty: it holds no checkpoint


class PrefixedLines(io.TextIOBase):
    """A text stream that writes each complete line to ``stream`` with ``prefix`` in front."""

    def __init__(self, stream, prefix: str):
        self.stream = stream
        self.prefix = prefix
        self.pending = ""
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self.stream.write(f"{self.prefix}{line}\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class TuneReporter:
    """The Trainer's hooks: each progress row goes to Tune, and each checkpoint as the step it saved.

    Once the trial is asked to stop, rows are no longer reported: Tune, which is stopping the
    trial, may end the process as soon as it hears from it, and the save must come first.
    """

    def __init__(self):
        self.last_row: dict = {}
        self.trainer: Trainer | None = None
        #: Tune stopped the trial: its report raised the SystemExit that unwinds the trial.
        self.tune_stopped = False

    def on_progress(self, row: dict) -> None:
        self.last_row = dict(row)
        if not self.stopping():
            self._report(self.last_row)

    def on_checkpoint(self, path: Path) -> None:
        # The step latest.pt holds: a buffer written in a thread has its checkpoint reported later.
        self._report({**self.last_row, "checkpoint_timesteps": self.trainer.checkpoint_step})

    def _report(self, row: dict) -> None:
        try:
            tune.report(row)
        except SystemExit:
            self.tune_stopped = True
            raise

    def stopping(self) -> bool:
        return self.trainer is not None and self.trainer.stop_requested()


def on_reserved_devices(config: Config, gpu_ids: list) -> Config:
    """``config`` on the devices the trial reserved (``gpu_ids``, Ray's ``get_gpu_ids()``): where
    it reserved no GPU, ``device: auto`` is the CPU. Ray (2.60) no longer hides the GPUs from a
    task that asked for none, so ``auto`` would take one that other trials reserved."""
    if config.device == "auto" and not gpu_ids:
        return dataclasses.replace(config, device="cpu")
    return config


def start_run(trial: dict, gpu_ids: list) -> tuple[Config, Path]:
    """The trial's Config (:func:`on_reserved_devices`) and run directory, made ready: what a start
    that died before its first checkpoint left is removed, so that the trial starts again from step
    0 (and :func:`run_trial`'s ``api.run`` writes its ``config.json`` with sweep.py's git commit)."""
    # Tune's saved trial of a sweep from before --pipeline lacks it: it ran serial (FORMER_DEFAULTS)
    config = on_reserved_devices(saved_config(trial["config"]), gpu_ids)
    run_dir = Path(trial["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    if not has_checkpoint(run_dir):
        hint = copy_hint(latest_checkpoint(run_dir))
        if hint:  # its checkpoint was lost, not never written: starting afresh would delete the step copies
            raise TrialFailed(f"{run_dir} holds no {LATEST}{hint}")
        try:  # not while another process trains it (a second sweep.py, or the trial's old process)
            lock = RunLock.acquire(run_dir)
        except UserError as error:
            raise TrialFailed(str(error)) from None
        try:
            discard_unsaved_start(run_dir)
        finally:
            lock.release()
    return config, run_dir


def run_trial(tune_config: dict, driver: DriverContext) -> None:
    """Tune's entry point: ``tune_config["trial"]`` holds the trial's ``name``, ``run_dir`` (absolute),
    ``config`` (a Config as a dict) and ``sweep_file``."""
    trial = tune_config["trial"]
    sys.stdout = PrefixedLines(sys.__stdout__, f"{LINE_PREFIX}{trial['name']}] ")
    node_id = ray.get_runtime_context().get_node_id()
    print(f"running in process {os.getpid()} on node {ray.util.get_node_ip_address()} (node id {node_id[:12]})", flush=True)
    config, run_dir = start_run(trial, ray.get_gpu_ids())
    reporter = TuneReporter()
    stop_request = ray.get_actor(driver.stop_request)

    def on_start(trainer: Trainer) -> None:
        reporter.trainer = trainer
        ray.get(stop_request.training.remote(trial["name"]))
        threading.Thread(target=wait_for_stop, args=(driver.stop_request, trainer), daemon=True).start()

    hooks = dict(progress_bar=False, on_progress=reporter.on_progress, on_checkpoint=reporter.on_checkpoint, on_start=on_start)
    command = ["sweep.py", trial["sweep_file"], f"(trial {trial['name']})"]
    try:
        if has_checkpoint(run_dir):
            # The saved run, with what a resume may change (run length, device, evaluations, checkpoints, ...) from the sweep.
            outcome = api.run(resume=run_dir, command=command, commit=driver.git_commit, **hooks,
                              **{name: getattr(config, name) for name in RESUMABLE_CHANGES})
        else:
            settings = dataclasses.asdict(config)
            outcome = api.run(settings.pop("env"), run_dir=run_dir, command=command, commit=driver.git_commit, **hooks, **settings)
    except TrialFailed:
        raise
    except BaseException as error:  # the run's own (a torso's bug, a KeyboardInterrupt in its code), as text
        if isinstance(error, SystemExit) and reporter.tune_stopped:
            raise  # Tune's way to end a trial it stops
        raise TrialFailed(failure_text(error)) from None
    finally:
        ray.get(stop_request.done.remote(trial["name"]))  # saved at a stop, or not training any more
    if outcome.stop is Stop.INTERRUPTED and reporter.stopping():
        threading.Event().wait()  # saved; Tune ends this process, as it stops every trial
    if not outcome.finished:
        reason = outcome.error or outcome.stop.value
        raise TrialFailed(f"the trainer stopped with exit code {EXIT_CODES[outcome.stop]} ({reason})")

"""One sweep trial: the Ray Tune function trainable that runs one training (:func:`acer_sync.api.run`)
in its own process.

The trial is a normal run in its run directory (``config.json``, ``progress.csv``, ``tb/``,
``checkpoints/``), as ``train.py`` would write it. Each progress row goes to Tune through the
Trainer's ``on_progress`` hook, and each checkpoint, through ``on_checkpoint``, becomes the
trial's Tune checkpoint. A trial that starts again after its process died, or after the sweep was
interrupted, resumes from the run directory's ``latest.pt``; where the run directory does not
hold one (a trial moved to another machine of a cluster) it resumes from the Tune checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from ray import tune

from acer_sync import api
from acer_sync.checkpoint import LATEST
from acer_sync.config import Config
from acer_sync.errors import EXIT_CODES
from acer_sync.learn import RESUMABLE_CHANGES


class TrialFailed(RuntimeError):
    """The Trainer stopped before the end of the run."""


def has_checkpoint(run_dir: Path) -> bool:
    """Whether there is a checkpoint to continue from: the run directory's own, else Tune's
    (copied into the run directory)."""
    latest = run_dir / "checkpoints" / LATEST
    if not latest.is_file():
        tune_checkpoint = tune.get_checkpoint()
        if tune_checkpoint is None:
            return False
        latest.parent.mkdir(parents=True, exist_ok=True)
        with tune_checkpoint.as_directory() as directory:
            shutil.copyfile(Path(directory) / LATEST, latest)
    return True


def discard_unsaved_start(run_dir: Path) -> None:
    """Remove what an earlier start that died before its first checkpoint left: the trial starts
    again from step 0, and its curve must not hold two runs."""
    (run_dir / "progress.csv").unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # empty: it holds no checkpoint


class TuneReporter:
    """The Trainer's hooks: each progress row, and each checkpoint with the last row, go to Tune."""

    def __init__(self):
        self.last_row: dict = {}

    def on_progress(self, row: dict) -> None:
        self.last_row = dict(row)
        tune.report(self.last_row)

    def on_checkpoint(self, path: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="acer-checkpoint-") as directory:
            try:
                os.link(path, Path(directory) / LATEST)
            except OSError:
                shutil.copyfile(path, Path(directory) / LATEST)
            tune.report(self.last_row, checkpoint=tune.Checkpoint.from_directory(directory))


def run_trial(tune_config: dict) -> None:
    """Tune's entry point: ``tune_config["trial"]`` holds the trial's ``name``, ``run_dir`` (absolute),
    ``config`` (a Config as a dict) and ``sweep_file``."""
    trial = tune_config["trial"]
    config = Config(**trial["config"])
    run_dir = Path(trial["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    reporter = TuneReporter()
    hooks = dict(progress_bar=False, on_progress=reporter.on_progress, on_checkpoint=reporter.on_checkpoint)
    if has_checkpoint(run_dir):
        # The saved run, with what a resume may change (run length, device, threads) from the sweep.
        outcome = api.run(resume=run_dir, **hooks, **{name: getattr(config, name) for name in RESUMABLE_CHANGES})
    else:
        discard_unsaved_start(run_dir)
        settings = dataclasses.asdict(config)
        command = ["sweep.py", trial["sweep_file"], f"(trial {trial['name']})"]
        outcome = api.run(settings.pop("env"), run_dir=run_dir, command=command, **hooks, **settings)
    if not outcome.finished:
        reason = outcome.error or outcome.stop.value
        raise TrialFailed(f"the trainer stopped with exit code {EXIT_CODES[outcome.stop]} ({reason})")

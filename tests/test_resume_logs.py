"""Resuming after a crash: the logs past the checkpoint are the dead process's, and they go.

A process killed after its last checkpoint has logged rows (and TensorBoard events) that the
resumed run logs again from the checkpoint's step. The crash is reproduced exactly: a run of
200 steps keeps its periodic checkpoints, then its ``latest.pt`` is replaced by the one from step
120, as if it had died at step 200 before its final save, in the middle of writing a row.
"""

from __future__ import annotations

import shutil
import time

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from acer_sync.base.config import build_config
from acer_sync.training.checkpoint import LATEST, load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import read_progress

CHECKPOINT_STEP = 120


def tensorboard_steps(run_dir, tag: str) -> list[int]:
    """The steps of ``tag`` as TensorBoard shows them (it honours ``purge_step``'s restart marker)."""
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_resume_after_a_crash_drops_the_rows_and_events_past_the_checkpoint(tmp_path):
    config = build_config(False, dict(env="CartPole-v1", num_envs=2, nsteps=5, total_timesteps=200, vec_env="sync",
                                      log_interval=2, checkpoint_every=60, keep_checkpoints=10, eval_every=0, threads=1))
    info = env_info(config.env)
    threads_before = torch.get_num_threads()
    try:
        assert build_trainer(config, info, tmp_path, progress_bar=False).train().finished
        first_rows = read_progress(tmp_path)
        checkpoints = tmp_path / "checkpoints"
        shutil.copyfile(checkpoints / f"step_{CHECKPOINT_STEP:010d}.pt", checkpoints / LATEST)
        with open(tmp_path / "progress.csv", "a") as handle:
            handle.write("220,22,22,1.")  # the row the kill cut short
        payload = load_checkpoint(tmp_path)
        # TensorBoard reads event files in name order: time in whole seconds, host, pid, then a
        # counter of the writers this process made, compared as text ("10" < "9"). A real resume
        # is a later process; here, a later second puts the resumed writer's file after the first.
        time.sleep(1.05)
        assert build_trainer(config, info, tmp_path, resume=payload, progress_bar=False).train().finished
    finally:
        torch.set_num_threads(threads_before)

    rows = read_progress(tmp_path)
    steps = [int(row["total_timesteps"]) for row in rows]
    assert steps == list(range(20, 201, 20)), steps
    assert rows[: CHECKPOINT_STEP // 20] == first_rows[: CHECKPOINT_STEP // 20]  # the rows before it are kept as they were
    for column in ("episodes", "updates", "time_elapsed"):
        values = [float(row[column]) for row in rows]
        assert values == sorted(values), (column, values)
    for tag in ("episodes", "updates", "lr"):
        assert tensorboard_steps(tmp_path, tag) == steps, tag

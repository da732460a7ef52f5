"""A user's bad day (issue 34): full disks on every write, a buffer that is not its checkpoint's,
envs that raise, return NaN or hang, signals while an env hangs, and damaged or foreign files on
resume. Each ends in one line, an exit code of its own, and nothing lost or changed."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import multiprocessing
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import faulty_envs
import numpy as np
import pytest
import torch

import acer_sync
import acer_sync.api.runs
from acer_sync.base.config import build_config
from acer_sync.base.errors import EXIT_CODES, WriteFailed, exit_code
from acer_sync.base.outcome import Stop
from acer_sync.training import checkpoint as checkpoint_module
from acer_sync.training.callbacks import CheckpointCallback, ProgressCallback
from acer_sync.training.checkpoint import BUFFER_FILE, LATEST, load_checkpoint, save_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import ROOT, one_line_error, read_progress

TRAIN = [sys.executable, str(ROOT / "train.py")]
FAULTY = f"faulty_envs:{faulty_envs.ENV_ID}"
#: A small CartPole run: 2 envs x 20 steps an iteration, a checkpoint every 6 iterations.
SMALL = dict(num_envs=2, vec_env="sync", device="cpu", eval_every=0, log_interval=1, hidden="16", threads=1)


def run_train(*args: str, timeout: float = 120, preexec_fn=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run([*TRAIN, *args, "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=preexec_fn)


def error_line(result: subprocess.CompletedProcess, code: int) -> str:
    """The run's one ``error:`` line, after checking its exit code and that no traceback came."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr and lines[0].startswith("train.py: error: "), result.stderr
    return lines[0]


def snapshot(run_dir: Path) -> dict:
    """Every file of a run directory with a digest of its bytes."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A CartPole run of 480 steps with its buffer saved at 240 and 480 (buffer_240.npz kept aside)."""
    run_dir = tmp_path_factory.mktemp("bad_day") / "run"
    aside = run_dir.parent / "buffer_240.npz"

    def keep_first_buffer(path: Path) -> None:
        if not aside.exists():
            shutil.copyfile(path.parent / BUFFER_FILE, aside)

    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=480, checkpoint_every=240, save_buffer=True,
                    buffer_size=400, replay_start=40, verbose=0, on_checkpoint=keep_first_buffer, **SMALL)
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


# --- Full disks --------------------------------------------------------------------------------


def file_size_limit(size: int):
    """A child's preexec_fn: writes past ``size`` bytes fail with EFBIG (File too large), as a
    full disk makes them fail with ENOSPC, for every file the process writes."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


@pytest.mark.parametrize("limit, failing, kept", [
    (60_000, "checkpoints/latest.pt", "no checkpoint was written"),  # torch's zip writer raises RuntimeError
    (200_000, f"checkpoints/{BUFFER_FILE}", "checkpoints/latest.pt holds step 400"),
])
def test_a_full_disk_during_a_checkpoint_or_the_buffer_stops_in_one_line_with_exit_5(tmp_path, limit, failing, kept):
    run_dir = tmp_path / "run"
    result = run_train("--env", "CartPole-v1", "--num-envs", "2", "--total-timesteps", "2000", "--checkpoint-every",
                       "400", "--save-buffer", "--eval-every", "0", "--hidden", "64,64", "--run-dir", str(run_dir),
                       preexec_fn=file_size_limit(limit))
    line = error_line(result, 5)
    assert f"cannot write {run_dir / failing}: File too large; {kept}" in line
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))
    if "holds step" in kept:
        assert load_checkpoint(run_dir)["counters"]["timesteps"] == 400


class FullDisk(io.RawIOBase):
    """A file on a disk that fills after ``room`` bytes."""

    def __init__(self, room: int):
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)


def cartpole_trainer(run_dir: Path, **overrides):
    config = build_config(False, {"env": "CartPole-v1", **SMALL, "total_timesteps": 400, **overrides})
    run_dir.mkdir(parents=True, exist_ok=True)
    return build_trainer(config, env_info(config.env, config.env_kwargs), run_dir, progress_bar=False)


def test_a_full_disk_under_torch_save_is_a_write_failure_and_the_old_checkpoint_stays(tmp_path, monkeypatch):
    path = tmp_path / LATEST
    save_checkpoint(path, {"step": 1})
    before = path.read_bytes()
    real_fdopen = os.fdopen
    monkeypatch.setattr(checkpoint_module.os, "fdopen", lambda fd, mode: (real_fdopen(fd, mode).close(), FullDisk(100))[1])
    with pytest.raises(WriteFailed, match=f"cannot write {path}: No space left on device$"):
        save_checkpoint(path, {"step": 2, "weights": torch.zeros(10_000)})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [LATEST]


def test_a_full_disk_under_progress_csv_stops_the_run_with_its_checkpoint_kept(tmp_path):
    trainer = cartpole_trainer(tmp_path, checkpoint_every=120)
    progress = next(c for c in trainer.callbacks.callbacks if isinstance(c, ProgressCallback))
    start = progress.on_training_start

    def start_then_fill_the_disk(trainer_) -> None:
        start(trainer_)
        log = progress.logger.log

        def log_until_full(row) -> None:
            if row["total_timesteps"] > 200:
                progress.logger.csv_file = io.TextIOWrapper(io.BufferedWriter(FullDisk(0)), newline="")
            log(row)

        progress.logger.log = log_until_full

    progress.on_training_start = start_then_fill_the_disk
    outcome = trainer.train()
    assert outcome.stop is Stop.WRITE_FAILED and EXIT_CODES[outcome.stop] == 5
    assert outcome.error == f"cannot write {tmp_path / 'progress.csv'}: No space left on device; checkpoints/latest.pt holds step 120"
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == 120  # no save after the failure


def test_a_real_full_disk_under_progress_csv_is_reported_by_the_logger(tmp_path):
    from acer_sync.training.logger import Logger

    logger = Logger(tmp_path)
    logger.csv_file = io.TextIOWrapper(io.BufferedWriter(FullDisk(10)), newline="")
    with pytest.raises(WriteFailed, match=r"progress.csv: No space left on device$"):
        logger.log({"total_timesteps": 40, "mean_episode_reward": 1.0})
    logger.writer.close()


def test_a_full_disk_under_tensorboard_is_one_line_not_the_writer_threads_traceback(tmp_path, capfd, monkeypatch):
    from tensorboard.summary.writer import record_writer

    from acer_sync.training.logger import Logger

    logger = Logger(tmp_path)
    logger.log({"total_timesteps": 40, "mean_episode_reward": 1.0})

    def no_space(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "write", no_space)
    with pytest.raises(WriteFailed, match=r"/tb: No space left on device$"):
        for step in range(80, 4000, 40):  # the writer thread fails; a later flush raises it here
            logger.log({"total_timesteps": step, "mean_episode_reward": 1.0})
    logger.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_full_disk_under_config_json_leaves_no_half_file(tmp_path, monkeypatch):
    real_fdopen = os.fdopen
    monkeypatch.setattr(checkpoint_module.os, "fdopen", lambda fd, mode: (real_fdopen(fd, mode).close(), FullDisk(10))[1])
    with pytest.raises(acer_sync.TrainingStopped, match=r"config.json: No space left on device; the run did not start") as stopped:
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, verbose=0, **SMALL)
    assert stopped.value.outcome.stop is Stop.WRITE_FAILED
    assert not (tmp_path / "run").exists()  # nothing left behind: the directory can hold a run later


# --- Checkpoint and buffer agree ---------------------------------------------------------------


def test_a_buffer_from_another_step_is_not_used_and_leftovers_are_removed(run_copy, finished_run, capsys):
    from acer_sync.api.runs import run

    # As a kill, a second signal or a full disk leaves it: latest.pt at 480, buffer.npz at 240.
    shutil.copyfile(finished_run.parent / "buffer_240.npz", run_copy / "checkpoints" / BUFFER_FILE)
    leftover = run_copy / "checkpoints" / f".{BUFFER_FILE}.abc123.tmp"
    leftover.write_bytes(b"\0" * 1000)
    trainers = []
    assert run(resume=run_copy, total_timesteps=520, progress_bar=False, on_start=trainers.append).finished
    said = capsys.readouterr().out
    assert "the saved replay buffer is from step 240, not the checkpoint's 480, so it is not used: replay starts empty" in said
    assert trainers[0].buffer.num_steps_stored == 20  # only the segment collected since
    assert not leftover.exists() and f"removed {leftover}" in said


@pytest.mark.parametrize("first, second, named", [
    (None, "SIGTERM", "second SIGTERM"), ("SIGTERM", "SIGTERM", "second SIGTERM"), ("SIGINT", "SIGTERM", "SIGTERM after SIGINT"),
    (None, None, "a KeyboardInterrupt raised in the run"),  # by a callback's code, say: no signal came
    ("SIGINT", None, "a KeyboardInterrupt raised in the run after SIGINT"),
])
def test_the_second_signal_is_named_and_the_message_says_what_latest_holds(tmp_path, first, second, named):
    trainer = cartpole_trainer(tmp_path, total_timesteps=80)
    checkpoints = next(c for c in trainer.callbacks.callbacks if isinstance(c, CheckpointCallback))

    def interrupted_save(*args, **kwargs):
        trainer.stop.signal_name, trainer.stop.second_signal = first, second
        if second is None:
            raise KeyboardInterrupt
        raise RuntimeError("torch's zip writer, interrupted")

    checkpoints.save = interrupted_save
    outcome = trainer.train()
    assert outcome.stop is Stop.INTERRUPTED
    assert outcome.error == f"{named}: exiting at once; no checkpoint was written"
    trainer.env.close()


def test_the_summary_of_a_run_that_exited_at_once_names_the_step_its_checkpoint_holds(tmp_path):
    # "stopped by SIGINT or SIGTERM: 1,600 steps; ...; checkpoint .../latest.pt" where latest.pt held 800.
    from acer_sync.base.outcome import Outcome
    from acer_sync.cli.train import summary_line

    (tmp_path / "checkpoints").mkdir()
    save_checkpoint(tmp_path / "checkpoints" / LATEST, {"step": 800})
    line = summary_line(Outcome(Stop.INTERRUPTED, tmp_path, 1600, "second SIGINT: exiting at once", checkpoint_step=800), "train.py")
    assert f"1,600 steps; no episode ended; checkpoint {tmp_path / 'checkpoints' / LATEST}, of step 800 (continue it" in line
    assert ", of step" not in summary_line(Outcome(Stop.INTERRUPTED, tmp_path, 800, checkpoint_step=800), "train.py")
    spaced = tmp_path / "my run"  # the command to paste quotes it
    (spaced / "checkpoints").mkdir(parents=True)
    save_checkpoint(spaced / "checkpoints" / LATEST, {"step": 800})
    assert summary_line(Outcome(Stop.FINISHED, spaced, 800), "train.py").endswith(f"(play it: play.py '{spaced}')")


# --- Env faults --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault, said", [("unpicklable", "ConnectionLost in step: port 7 lost"),
                                         ("json", "JSONDecodeError in step: Expecting value: line 1 column 1 (char 0)"),
                                         ("exit", "SystemExit in step: exit code 0")])
@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_an_env_error_that_pickle_cannot_rebuild_is_named_as_it_is_from_a_worker(tmp_path, backend, fault, said):
    # From a subproc worker, a ConnectionLost (an __init__ of two arguments) failed to unpickle in
    # the trainer, and a JSONDecodeError to be rebuilt as gymnasium rebuilds errors, type(error)(error):
    # "raised TypeError in step: ...__init__() missing ... argument"; a sys.exit() was a dead worker.
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "at_step": 130},
                               total_timesteps=100_000, vec_env=backend)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED
    assert outcome.error == f"{faulty_envs.ENV_ID} raised {said}; saved a checkpoint at step 240"


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_an_env_that_raises_stops_with_a_checkpoint_one_line_and_exit_3(tmp_path, backend):
    run_dir = tmp_path / "run"
    result = run_train("--env", FAULTY, "--env-kwargs", "fault=raise", "at_step=130", "--vec-env", backend,
                       "--num-envs", "2", "--total-timesteps", "100000", "--eval-every", "0", "--run-dir", str(run_dir))
    line = error_line(result, 3)
    # Each env's step 130 falls in iteration 7 (20 steps each): the checkpoint holds the 6 completed.
    assert line == f"train.py: error: {FAULTY} raised RuntimeError in step: sensor cable unplugged; saved a checkpoint at step 240"
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 240


@pytest.mark.parametrize("fault, what", [("nan_obs", "observation"), ("nan_reward", "reward")])
def test_a_non_finite_observation_or_reward_stops_with_a_checkpoint_naming_env_and_step(tmp_path, fault, what):
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "at_step": 130},
                               total_timesteps=100_000)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED and EXIT_CODES[outcome.stop] == 3
    assert outcome.error == (
        f"env 0 of {faulty_envs.ENV_ID} returned a non-finite {what} (nan) at its vector step 130; saved a checkpoint at step 240"
    )
    payload = load_checkpoint(tmp_path)
    assert payload["counters"]["timesteps"] == 240
    assert all(torch.isfinite(t).all() for t in payload["model"].values())


@pytest.mark.parametrize("fault", ["nan_terminal", "nan_at_cut"])
def test_a_non_finite_final_observation_stops_the_run_only_where_it_would_be_bootstrapped(tmp_path, fault):
    # An env may end an episode because its state diverged (as MuJoCo's is_healthy does), its
    # terminal observation NaN: nothing reads it, but the run stopped as if the env had failed.
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "at_step": 7}, total_timesteps=200)
    outcome = trainer.train()
    if fault == "nan_terminal":
        assert outcome.stop is Stop.FINISHED and trainer.tracker.episodes > 0
    else:  # a cut: its V(final observation) would bootstrap Q^ret
        assert outcome.stop is Stop.ENV_FAILED
        assert outcome.error == (f"env 0 of {faulty_envs.ENV_ID} returned a non-finite final observation at a time-limit cut "
                                 "(nan) at its vector step 7; saved a checkpoint at step 0")


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_the_checkpoint_after_an_env_fault_holds_no_games_or_statistics_of_the_steps_it_drops(tmp_path, pipeline):
    # The checkpoint of the last completed iteration kept the games that ended in the broken one
    # (11 against 6) and the normalizer's statistics of its steps (380 observations at step 200),
    # which the resume plays again.
    from acer_sync.training.callbacks import Callback

    class Completed(Callback):
        def on_rollout_end(self, trainer, row):
            self.seen = (trainer.tracker.episodes, list(trainer.tracker.recent_returns),
                         trainer.model.normalizer.count.item())

    completed = Completed()
    config = build_config(False, {**SMALL, "env": faulty_envs.ENV_ID, "env_kwargs": {"fault": "raise", "at_step": 190},
                                  "nsteps": 100, "total_timesteps": 100_000, "normalize_obs": True, "pipeline": pipeline})
    trainer = build_trainer(config, env_info(config.env, config.env_kwargs), tmp_path, callbacks=[completed])
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED
    payload = load_checkpoint(tmp_path)
    episodes, returns, count = completed.seen
    assert payload["counters"]["episodes"] == episodes and payload["recent_returns"] == returns
    assert payload["model"]["normalizer.count"].item() == count
    assert trainer.tracker.episodes == episodes and returns  # the tracker itself is put back; games had ended before


def test_a_finite_reward_beyond_float32_is_named_as_it_is_not_as_an_infinity(tmp_path, recwarn):
    # The cast to float32 made 1e39 infinite, with numpy's overflow warning, and the env was said
    # to have returned a non-finite reward (inf).
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": "big_reward", "at_step": 130},
                               total_timesteps=100_000)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED
    assert outcome.error == (f"env 0 of {faulty_envs.ENV_ID} returned a reward of 1e+39 at its vector step 130, beyond "
                             "float32's range (±3.4e38): scale the env's rewards; saved a checkpoint at step 240")
    assert not [warning for warning in recwarn if "overflow" in str(warning.message)]


def test_an_evaluation_env_that_raises_stops_the_run_the_same_way(tmp_path):
    # env_info reads the spaces from instance 0, and the sync backend makes the 2 training envs
    # next: the instances from 3 on are the evaluation's.
    faulty_envs._instances = iter(range(10**6))
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": "raise", "at_step": 5, "from_instance": 3},
                               total_timesteps=100_000, eval_every=80, eval_episodes=2)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED
    assert outcome.error == f"{faulty_envs.ENV_ID} raised RuntimeError in step: sensor cable unplugged; saved a checkpoint at step 80"
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == 80


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_an_env_that_calls_sys_exit_stops_with_a_checkpoint_as_one_that_raises(tmp_path, pipeline):
    # Its SystemExit passed every handler: the run ended with exit 0, no line and no checkpoint,
    # and through the API it ended the user's program.
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": "exit", "at_step": 130},
                               total_timesteps=100_000, pipeline=pipeline)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED
    assert outcome.error == f"{faulty_envs.ENV_ID} raised SystemExit in step: exit code 0; saved a checkpoint at step 240"
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == 240


def test_a_subproc_worker_that_exits_with_a_code_is_named_with_it_and_the_run_checkpointed(tmp_path):
    # The killed worker's case (test_robustness.py) with a process that ends itself: its exit code,
    # not a signal, is what the line names.
    # Through the library: TrainingStopped, its outcome ENV_DIED.
    with pytest.raises(acer_sync.TrainingStopped) as stopped:
        acer_sync.train(faulty_envs.ENV_ID, run_dir=tmp_path / "run", env_kwargs={"fault": "os_exit", "at_step": 130},
                        total_timesteps=100_000, verbose=0, **{**SMALL, "vec_env": "subproc"})
    outcome = stopped.value.outcome
    assert outcome.stop is Stop.ENV_DIED and EXIT_CODES[outcome.stop] == 3
    assert re.fullmatch(r"env \d of 2 \(worker pid \d+\) exited with code 5; saved a checkpoint at step 240", outcome.error), outcome.error
    assert load_checkpoint(tmp_path / "run")["counters"]["timesteps"] == 240


@pytest.mark.parametrize("fault, stop, message", [
    ("render_raise", Stop.ENV_FAILED, " raised RuntimeError in render: GL context lost"),
    ("render_hang", Stop.ENV_TIMEOUT, "'s render did not return within --env-timeout 1 s"),
])
def test_a_video_env_whose_render_fails_or_hangs_stops_the_run_as_a_step_would(tmp_path, fault, stop, message):
    # A render that raised was a UserError (exit 2, "install an EGL driver", the env's own words
    # dropped) with no final checkpoint; one that hung was under no --env-timeout, and no signal ended it.
    faulty_envs._instances = iter(range(10**6))
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "at_step": 3},
                               total_timesteps=100_000, eval_every=80, eval_episodes=2, capture_video=True, env_timeout=1)
    started = time.monotonic()
    outcome = trainer.train()
    assert time.monotonic() - started < 60
    assert outcome.stop is stop and outcome.error == f"{faulty_envs.ENV_ID}{message}; saved a checkpoint at step 80"
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == 80
    assert not list((tmp_path / "videos").iterdir())  # no half video


@pytest.mark.parametrize("fault, said", [("close_raise", " raised RuntimeError in close: port busy"),
                                         ("close_hang", "'s close did not return within --env-timeout 1 s"),
                                         ("close_exit", " raised SystemExit in close: exit code 3"),
                                         ("close_unpicklable", " raised ConnectionLost in close: port 7 lost")])
@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_an_env_whose_close_fails_or_hangs_leaves_a_finished_run_finished_with_a_warning(tmp_path, caplog, backend, fault, said):
    # A close that raised turned a finished run into a traceback and exit 1; one that hung kept
    # the finished run alive for ever.
    # Instance 0, env_info's probe of the spaces, closes well, and so does subproc's 1, which
    # gymnasium makes and closes in this process to read them again (the workers fork after it).
    faulty_envs._instances = iter(range(10**6))
    first_faulty = {"sync": 1, "subproc": 2}[backend]
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "from_instance": first_faulty},
                               vec_env=backend, total_timesteps=80, env_timeout=1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="acer_sync"):
        outcome = trainer.train()
    assert time.monotonic() - started < 30
    assert outcome.stop is Stop.FINISHED and load_checkpoint(tmp_path)["counters"]["timesteps"] == 80
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert f"{faulty_envs.ENV_ID}{said}" in warnings[-1], warnings


def test_the_probe_of_an_envs_spaces_warns_of_a_close_that_raises_or_exits(caplog):
    # A sys.exit() in its close ended the program in silence before anything was written.
    with caplog.at_level(logging.WARNING, logger="acer_sync"):
        info = env_info(faulty_envs.ENV_ID, {"fault": "close_exit"})
    assert info.n_actions == 2
    assert [record.getMessage() for record in caplog.records] == [
        f"{faulty_envs.ENV_ID} raised SystemExit in close: exit code 3; it was left open"]


@pytest.mark.parametrize("fault, code, line", [
    ("fault=raise_at_reset", 3, f"{FAULTY} raised RuntimeError in reset: sensor cable unplugged"),
    ("fault=render_hang", 6, f"{FAULTY}'s render did not return within --env-timeout 1 s"),
])
def test_the_start_of_capture_video_blames_what_failed_and_ends_a_render_that_hangs(tmp_path, fault, code, line):
    # The check that the env renders, before the run, blamed headless OpenGL for an env whose reset
    # failed (exit 2, "install an EGL driver"), and waited for ever on a render that hung.
    result = run_train("--env", FAULTY, "--env-kwargs", fault, "at_step=0", "from_instance=1", "--capture-video",
                       "--eval-every", "80", "--total-timesteps", "160", "--env-timeout", "1", "--run-dir",
                       str(tmp_path / "run"), timeout=60)
    assert error_line(result, code).startswith(f"train.py: error: {line}")


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_a_hung_env_stops_at_env_timeout_with_a_checkpoint_and_exit_6(tmp_path, backend):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = run_train("--env", FAULTY, "--env-kwargs", "fault=hang", "at_step=130", "--vec-env", backend, "--num-envs",
                       "2", "--total-timesteps", "100000", "--eval-every", "0", "--env-timeout", "1", "--run-dir",
                       str(run_dir), timeout=60)
    assert time.monotonic() - started < 40
    line = error_line(result, 6)
    assert line == f"train.py: error: {FAULTY}'s step did not return within --env-timeout 1 s; saved a checkpoint at step 240"
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 240


@pytest.mark.parametrize("fault, said", [("raise_at_init", "OSError: no such device"),
                                         ("exit_at_init", "SystemExit: exit code 2")])  # it exited with the env's code, silent
def test_an_env_whose_constructor_raises_is_one_line_and_exit_2(fault, said):
    result = run_train("--env", FAULTY, "--env-kwargs", f"fault={fault}", "--total-timesteps", "100")
    assert error_line(result, 2) == f"train.py: error: cannot build {FAULTY} with --env-kwargs fault={fault}: {said}"


@pytest.mark.parametrize("fault, said", [("raise_at_init", "raised OSError when made for the run: no such device"),
                                         ("exit_at_init", "raised SystemExit when made for the run: exit code 2")])
@pytest.mark.parametrize("backend, first_faulty", [("sync", 1), ("subproc", 2)])
def test_an_env_that_fails_only_when_made_for_the_run_is_one_line_exit_3_and_leaves_no_worker(tmp_path, backend, first_faulty,
                                                                                              fault, said):
    # env_info's env (instance 0) is well, as is subproc's in-process one for the spaces (1); the
    # run's own fail. A subproc worker's failure was a traceback from each worker and one from the pipe;
    # its sys.exit() was a BrokenPipeError.
    process = subprocess.Popen(
        [*TRAIN, "--env", FAULTY, "--env-kwargs", f"fault={fault}", f"from_instance={first_faulty}", "--vec-env",
         backend, "--num-envs", "2", "--total-timesteps", "100", "--run-dir", str(tmp_path / "run"), "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )
    stdout, stderr = process.communicate(timeout=120)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert error_line(result, 3) == f"train.py: error: {FAULTY} {said}; the run did not start"
    assert not group_alive(process.pid) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("fault, stop, message", [
    ("raise_at_reset", Stop.ENV_FAILED, f"{faulty_envs.ENV_ID} raised RuntimeError in reset: sensor cable unplugged"),
    ("hang_at_reset", Stop.ENV_TIMEOUT, f"{faulty_envs.ENV_ID}'s reset did not return within --env-timeout 2 s"),
])
def test_an_env_that_fails_its_first_reset_is_a_training_stopped_leaving_no_worker_or_handler(tmp_path, fault, stop, message):
    # It raised the env's own error, and its workers lived on for as long as the caller held it.
    alarm_handler, threads = signal.getsignal(signal.SIGALRM), torch.get_num_threads()
    with pytest.raises(acer_sync.TrainingStopped) as stopped:
        acer_sync.train(faulty_envs.ENV_ID, run_dir=tmp_path / "run", env_kwargs={"fault": fault}, total_timesteps=100,
                        verbose=0, env_timeout=2, **{**SMALL, "vec_env": "subproc"})
    assert stopped.value.outcome.stop is stop and str(stopped.value) == f"{message}; the run did not start"
    assert multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGALRM) is alarm_handler
    assert torch.get_num_threads() == threads  # the run's threads=1 is given back
    assert not (tmp_path / "run").exists()


def test_sigterm_while_the_envs_start_is_one_line_exit_130_and_leaves_no_process(tmp_path):
    # Before the run's own handler was in, a SIGTERM ended train.py by default: exit 143, no line,
    # and the subproc workers hanging in their first reset orphaned.
    process = subprocess.Popen(
        [*TRAIN, "--env", FAULTY, "--env-kwargs", "fault=hang_at_reset", "--vec-env", "subproc", "--num-envs", "2",
         "--total-timesteps", "1000", "--env-timeout", "0", "--run-dir", str(tmp_path / "run"), "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(children_of(process.pid)) < 2:  # the workers, in their reset
            time.sleep(0.2)
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=40)
    finally:
        process.kill()
    assert process.returncode == 130 and stderr.strip() == "train.py: interrupted by SIGTERM", stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and group_alive(process.pid):
        time.sleep(0.2)
    assert not group_alive(process.pid)
    assert not (tmp_path / "run").exists()


def children_of(pid: int) -> list[str]:
    """The ids of ``pid``'s child processes (Linux)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return path.read_text().split() if path.exists() else []


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is alive (not a zombie)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_run_whose_env_hangs_within_20_s_with_a_checkpoint(tmp_path, stop_signal):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [*TRAIN, "--env", FAULTY, "--env-kwargs", "fault=hang", "at_step=130", "--vec-env", "subproc", "--num-envs", "2",
         "--total-timesteps", "100000", "--eval-every", "0", "--env-timeout", "0", "--log-interval", "1",
         "--run-dir", str(run_dir), "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(int(r["total_timesteps"]) >= 240 for r in
                                                      (read_progress(run_dir) if (run_dir / "progress.csv").exists() else [])):
            time.sleep(0.2)
        time.sleep(1.0)  # the envs now hang in their step 130
        signalled = time.monotonic()
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=40)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 130 and took < 20, (took, stderr)
    assert stderr.strip() == f"train.py: error: {FAULTY}'s step had not returned 10 s after {stop_signal.name}; saved a checkpoint at step 240"
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 240


def test_an_overlapped_run_stopped_inside_an_env_step_during_an_update_is_not_timed_out(tmp_path):
    # The collecting thread's env call is timed by the main thread's polls, which run only between
    # updates: a stop (Ctrl-Z, kill -STOP) that came and went during an update was counted as the
    # env's time at the next poll, and the run ended with exit 6 ("did not return within
    # --env-timeout 2 s": 2.8 s or more at that poll) where serial mode went on.
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": "stop_process", "at_step": 11},
                               num_envs=1, nsteps=5, total_timesteps=25, pipeline="overlap", env_timeout=2.0,
                               replay_start=10**6, buffer_size=100)
    update = trainer.agent.update

    def slow_update(*args, **kwargs):  # the stop lands in an update: the step began as it did
        time.sleep(1.0)
        return update(*args, **kwargs)

    trainer.agent.update = slow_update
    outcome = trainer.train()
    assert (outcome.stop, outcome.error, outcome.timesteps) == (Stop.FINISHED, "", 25)


def test_env_workers_that_a_stop_signal_ended_too_are_no_error_line(tmp_path, capsys):
    # A SIGTERM to the process group (Slurm's scancel, a scheduler's stop) ends the subproc workers
    # too: the run stopped with exit 130 and its summary, then "error: env 0 of 8 (worker pid ...)
    # was killed by SIGTERM", which reads as an env's failure (exit 3). An env that hangs past the
    # stop's grace period still says so (test_a_stop_signal_ends_a_run_whose_env_hangs_within_20_s...).
    from atari.errors import EnvWorkerDied

    trainer = cartpole_trainer(tmp_path, total_timesteps=10_000, checkpoint_every=10**6)
    iterate = trainer.iterate

    def iterate_then_lose_the_workers_to_the_signal():
        iterate()
        if trainer.iterations == 3:
            trainer.request_stop("SIGTERM")
            raise EnvWorkerDied("env 0 of 2 (worker pid 1234) was killed by SIGTERM")

    trainer.iterate = iterate_then_lose_the_workers_to_the_signal
    outcome = trainer.train()
    assert (outcome.stop, outcome.error, outcome.message) == (Stop.INTERRUPTED, "", "stopped by SIGTERM")
    assert exit_code(outcome, "train.py") == 130 and capsys.readouterr().err == ""
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == outcome.timesteps == trainer.timesteps


def test_a_run_stopped_inside_an_env_step_and_continued_is_not_timed_out(tmp_path):
    # kill -STOP (or Ctrl-Z) for longer than --env-timeout, landing in a step: the stop is not the
    # env's time (a Pong run paused for benchmarks once ended with exit 6 at its SIGCONT).
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [*TRAIN, "--env", FAULTY, "--env-kwargs", "fault=slow", "at_step=1", "--vec-env", "sync", "--num-envs", "2",
         "--nsteps", "5", "--total-timesteps", "100000", "--eval-every", "0", "--env-timeout", "2", "--log-interval", "1",
         "--run-dir", str(run_dir), "--no-progress"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )

    def rows() -> int:
        return len(read_progress(run_dir)) if (run_dir / "progress.csv").exists() else 0

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rows() < 1:
            time.sleep(0.1)
        process.send_signal(signal.SIGSTOP)  # a step takes 0.2 s of each 0.2 s here: the stop lands in one
        time.sleep(5)
        process.send_signal(signal.SIGCONT)
        before = rows()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rows() < before + 2 and process.poll() is None:
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=40)
    finally:
        process.kill()
    assert process.returncode == 130 and "did not return" not in stderr, (process.returncode, stderr)


def test_subproc_env_errors_print_no_worker_traceback(tmp_path, capfd):
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": "raise", "at_step": 30},
                               vec_env="subproc", total_timesteps=100_000)
    outcome = trainer.train()
    assert outcome.stop is Stop.ENV_FAILED and "sensor cable unplugged" in outcome.error
    assert exit_code(outcome, "train.py") == 3
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err


# --- Resume checks before it changes anything -----------------------------------------------------


def refused_resume(run_dir: Path, match: str, totals=(960,)) -> None:
    """A resume of ``run_dir`` to each of ``totals`` (None: the run's own, which it has reached) is one
    UserError matching ``match``, and leaves every file as it was."""
    before = snapshot(run_dir)
    for total in totals:
        with pytest.raises(acer_sync.UserError, match=match) as error:
            acer_sync.train(resume=run_dir, verbose=0, **({} if total is None else {"total_timesteps": total}))
        assert "\n" not in str(error.value)
        assert snapshot(run_dir) == before


def edit_checkpoint(run_dir: Path, edit) -> None:
    payload = torch.load(run_dir / "checkpoints" / LATEST, weights_only=True)
    edit(payload)
    torch.save(payload, run_dir / "checkpoints" / LATEST)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a run saved on the GPU, resumed where there is none")
def test_a_run_trained_on_the_gpu_continues_on_a_cpu_with_the_cuda_only_settings_changed(run_copy):
    # As the H200's Pong run did on the 2-core CPU: its saved settings (device cuda, --compile graph) are refused
    # here one at a time, in one line each, with nothing changed, until the resume names settings the CPU has.
    def on_the_gpu(config: dict) -> None:
        config.update(device="cuda", compile="graph", pipeline="overlap", replay_device="cuda")

    edit_checkpoint(run_copy, lambda payload: on_the_gpu(payload["config"]))
    saved = json.loads((run_copy / "config.json").read_text())
    on_the_gpu(saved["config"])
    (run_copy / "config.json").write_text(json.dumps(saved))
    refused_resume(run_copy, "--device cuda was asked for, but torch sees no CUDA device")
    before = snapshot(run_copy)
    for changed, refusal in [({}, "--replay-device cuda keeps the replay buffer on the GPU the run trains on, and this run's device is cpu"),
                             ({"replay_device": "auto"}, "--compile graph runs the update as a CUDA graph, and this run's device is cpu")]:
        with pytest.raises(acer_sync.UserError, match=refusal) as error:
            acer_sync.train(resume=run_copy, total_timesteps=960, device="cpu", verbose=0, **changed)
        assert "\n" not in str(error.value) and snapshot(run_copy) == before
    acer_sync.train(resume=run_copy, total_timesteps=960, device="cpu", replay_device="auto", compile="off", verbose=0)
    assert load_checkpoint(run_copy)["counters"]["timesteps"] == 960
    ran = json.loads((run_copy / "config.json").read_text())["ran"]
    assert ran == {"device": "cpu", "compile": "off", "pipeline": "overlap", "replay_device": "cpu"}


def test_another_runs_checkpoint_copied_in_is_refused(run_copy, tmp_path):
    other = tmp_path / "other"
    acer_sync.train("Acrobot-v1", run_dir=other, total_timesteps=40, verbose=0, **SMALL)
    shutil.copyfile(other / "checkpoints" / LATEST, run_copy / "checkpoints" / LATEST)
    refused_resume(run_copy, r"is not this run's: it has env Acrobot-v1 \(config.json: CartPole-v1\)")


def test_another_runs_buffer_copied_in_is_refused_and_a_run_keeps_its_key_through_resumes(run_copy, tmp_path):
    # It was used without a word: another seed's run of the same settings reaches the same checkpoint
    # steps with arrays of the same shapes, and replay trained on its frames and μ.
    other = tmp_path / "other"
    acer_sync.train("CartPole-v1", run_dir=other, total_timesteps=480, checkpoint_every=240, save_buffer=True,
                    buffer_size=400, replay_start=40, verbose=0, **{**SMALL, "seed": 7})
    key = load_checkpoint(run_copy)["run_key"]
    other_key = load_checkpoint(other)["run_key"]
    assert re.fullmatch("[0-9a-f]{16}", key) and other_key != key
    own = (run_copy / "checkpoints" / BUFFER_FILE).read_bytes()
    shutil.copyfile(other / "checkpoints" / BUFFER_FILE, run_copy / "checkpoints" / BUFFER_FILE)
    refused_resume(run_copy, rf"the replay buffer .*buffer.npz was saved by another run \(its run key is {other_key}, "
                             rf"this run's {key}\); put this run's own back, or move it away to resume with an empty replay")
    (run_copy / "checkpoints" / BUFFER_FILE).write_bytes(own)
    acer_sync.train(resume=run_copy, total_timesteps=720, verbose=0)
    assert load_checkpoint(run_copy)["run_key"] == key
    with np.load(run_copy / "checkpoints" / BUFFER_FILE) as arrays:
        assert str(arrays["run_key"]) == key and int(arrays["checkpoint_step"]) == 720


def test_a_resume_without_save_buffer_says_that_the_saved_buffer_goes_stale(run_copy, caplog):
    # It was used, then left at its step for good (5.7 GB on Atari) without a word.
    with caplog.at_level(logging.INFO, logger="acer_sync"):
        acer_sync.train(resume=run_copy, total_timesteps=720, save_buffer=False, verbose=1, progress_bar=False)
    path = run_copy / "checkpoints" / BUFFER_FILE
    assert (f"replay resumes with the saved buffer (240 steps per env); --save-buffer is off, so {path} "
            f"({path.stat().st_size / 1e9:.2f} GB) is not kept up to date: remove it to free the disk") in caplog.text
    with np.load(path) as arrays:
        assert int(arrays["checkpoint_step"]) == 480


def test_a_run_from_before_run_keys_resumes_with_its_buffer_and_gets_a_key(run_copy, caplog):
    def forget(payload):
        del payload["run_key"]

    edit_checkpoint(run_copy, forget)
    path = run_copy / "checkpoints" / BUFFER_FILE
    with np.load(path) as saved:
        arrays = {name: saved[name] for name in saved.files if name != "run_key"}
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    with caplog.at_level(logging.INFO, logger="acer_sync"):
        acer_sync.train(resume=run_copy, total_timesteps=720, verbose=1, progress_bar=False)
    assert "replay resumes with the saved buffer" in caplog.text
    key = load_checkpoint(run_copy)["run_key"]
    assert re.fullmatch("[0-9a-f]{16}", key)
    with np.load(path) as arrays:
        assert str(arrays["run_key"]) == key


def test_a_checkpoint_with_a_wrong_tensor_shape_is_refused(run_copy):
    def wrong(payload):
        payload["model"]["head.pi.weight"] = torch.zeros(3, 16)

    edit_checkpoint(run_copy, wrong)
    refused_resume(run_copy, r"model has head.pi.weight of shape \(3, 16\); this network's is \(2, 16\)")


def test_a_checkpoint_with_a_wrong_optimizer_shape_is_refused(run_copy):
    def wrong(payload):
        state = payload["optimizer"]["state"]
        state[0] = {**state[0], "square_avg": torch.ones(5)}

    edit_checkpoint(run_copy, wrong)
    refused_resume(run_copy, r"optimizer state square_avg of parameter 0 is \(5,\)")


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.pop("updates"), "counter updates is missing"),
    (lambda c: c.update(timesteps=-40), "counter timesteps is -40"),
    (lambda c: c.update(timesteps=10**9), "1000000000 steps is not 12 iterations of 40 steps"),
    (lambda c: c.update(nonfinite_streak=3), "counter nonfinite_streak is 3, not a number from 0 to its non-finite updates"),
    # read before the Trainer checked them (a resume with nothing to train), they were tracebacks
    (lambda c: c.pop("timesteps"), "counter timesteps is missing"),
    (lambda c: c.update(timesteps="480"), "counter timesteps is '480', not a number >= 0"),
])
def test_missing_or_nonsense_counters_are_refused(run_copy, edit, match):
    # to a larger total, and to the run's own, which it has reached: nothing to train, but a damaged checkpoint all the same
    edit_checkpoint(run_copy, lambda payload: edit(payload["counters"]))
    refused_resume(run_copy, match, totals=(960, None))


def test_a_damaged_buffer_is_refused(run_copy):
    path = run_copy / "checkpoints" / BUFFER_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    refused_resume(run_copy, r"cannot restore the replay buffer from .*buffer.npz: .*; move it away")


def test_a_buffer_file_that_holds_one_array_or_a_damaged_zip_header_is_refused_in_one_line(run_copy):
    # np.load of a .npy gave "'numpy.ndarray' object does not support the context manager protocol";
    # a damaged zip header a NotImplementedError traceback ("That compression method is not supported")
    path = run_copy / "checkpoints" / BUFFER_FILE
    saved = path.read_bytes()
    np.save(run_copy / "one.npy", np.zeros(3))
    path.write_bytes((run_copy / "one.npy").read_bytes())
    refused_resume(run_copy, r"buffer.npz: it holds one array, not the npz archive")
    entry = saved.index(b"PK\x01\x02")  # the central directory's first entry
    while saved[entry + 46:entry + 56] != b"frames.npy":
        entry = saved.index(b"PK\x01\x02", entry + 4)
    damaged = bytearray(saved)
    damaged[entry + 10] = 0x63  # its compression method: 99, which zipfile does not have
    path.write_bytes(bytes(damaged))
    refused_resume(run_copy, r"cannot restore the replay buffer from .*buffer.npz: .*compression.*; move it away")


def test_buffer_counters_that_no_run_could_write_are_refused(run_copy):
    path = run_copy / "checkpoints" / BUFFER_FILE
    with np.load(path) as saved:
        arrays = dict(saved)
    arrays["counters"] = np.array([10**10, 10**9], dtype=np.int64)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    refused_resume(run_copy, r"its counters \(10000000000 steps written, 1000000000 segments stored\) do not fit")


def test_buffer_segment_starts_that_do_not_fit_its_counters_are_refused(run_copy):
    # A segment_start of 10**9 loaded, and replay read frames at the wrong places of the ring.
    path = run_copy / "checkpoints" / BUFFER_FILE
    with np.load(path) as saved:
        arrays = dict(saved)
    arrays["segment_start"][0] = 10**9
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    refused_resume(run_copy, r"its segment_start does not fit its counters \(240 steps written, 12 segments stored\)")


def test_a_damaged_progress_header_is_refused_never_filled_with_nan(run_copy):
    path = run_copy / "progress.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0][:40] + "\n" + "".join(lines[1:]))
    refused_resume(run_copy, r"progress.csv has a damaged header")


def test_a_damaged_progress_row_is_named_by_its_line(run_copy):
    path = run_copy / "progress.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "1,2,3\n"
    path.write_text("".join(lines))
    refused_resume(run_copy, r"progress.csv has a damaged row at line 3 \(3 columns, its header \d+\): restore that line")


def test_a_progress_file_cut_inside_its_header_is_written_again_whole_on_resume(run_copy):
    # A kill as the run wrote its header: no row to keep. Appending to it ran the rows into the
    # cut header ("...,time_520,13,62,nan"), with its columns.
    path = run_copy / "progress.csv"
    header = path.read_text().splitlines()[0]
    path.write_text(header[:40])
    acer_sync.train(resume=run_copy, total_timesteps=960, verbose=0)
    lines = path.read_text().splitlines()
    assert lines[0] == header and len(lines) > 1
    assert all(len(line.split(",")) == len(header.split(",")) for line in lines)
    path.write_text("my notes, not a header")  # one line, but not a cut header: refused, kept
    refused_resume(run_copy, r"progress.csv has a damaged header")


def test_the_cli_refuses_a_foreign_checkpoint_with_exit_2_and_changes_nothing(run_copy):
    edit_checkpoint(run_copy, lambda payload: payload["config"].update(seed=7))
    before = snapshot(run_copy)
    line = one_line_error(run_train("--resume", str(run_copy)))
    assert "is not this run's: it has seed 7 (config.json: 0)" in line
    assert snapshot(run_copy) == before


def test_load_refuses_a_checkpoint_whose_env_does_not_fit_its_network(run_copy):
    edit_checkpoint(run_copy, lambda payload: payload.update(env_id="Acrobot-v1"))
    with pytest.raises(acer_sync.UserError, match=r"does not fit its env Acrobot-v1: n_actions 2 \(the env gives 3\); obs_shape"):
        acer_sync.load(run_copy)


# --- Files that are not what they are named, and damaged parts ------------------------------


def test_files_that_are_not_checkpoints_are_refused_in_one_line(run_copy, tmp_path):
    """torch's reader fails on them with KeyError, IndexError or RuntimeError, and warns first on
    a pickle of another protocol: each is one line, through play.py, load and resume."""
    pickled = tmp_path / "number.pt"
    pickled.write_bytes(pickle.dumps(5, protocol=4))
    for path in (run_copy / "progress.csv", run_copy / "config.json", pickled):
        line = one_line_error(subprocess.run([sys.executable, str(ROOT / "play.py"), str(path), "--episodes", "1"],
                                             cwd=ROOT, capture_output=True, text=True, timeout=120))
        assert "is corrupt or truncated, or not a checkpoint" in line or "not an acer_sync checkpoint" in line, line
        with pytest.raises(acer_sync.UserError):
            acer_sync.load(path)
    (run_copy / "checkpoints" / LATEST).write_text("hello")
    refused_resume(run_copy, r"is corrupt or truncated, or not a checkpoint \(KeyError\)")


@pytest.mark.parametrize("edit, match", [
    (lambda payload: payload.pop("model_spec"), "its model_spec is missing, not a dict"),
    (lambda payload: payload.pop("config"), "its config is missing, not a dict"),
    (lambda payload: payload.pop("model"), "its model is missing, not a dict"),
    (lambda payload: payload["model"].update({"head.policy.weight": payload["model"].pop("head.pi.weight")}),
     r"the checkpoint's model has other tensors than this network: missing \['head.pi.weight'\], unexpected \['head.policy.weight'\]"),
    (lambda payload: payload["average_model"].update({"head.pi.weight": torch.zeros(3, 16)}),
     r"the checkpoint's average_model has head.pi.weight of shape \(3, 16\); this network's is \(2, 16\)"),
    (lambda payload: payload.pop("average_model"), "the checkpoint's average_model is missing"),
    (lambda payload: payload.update(env_id=5), "its env_id is a int, not a str"),
    (lambda payload: payload.update(recent_returns="x"), "recent_returns is damaged, not a list of numbers"),
    (lambda payload: payload.update(recent_lengths=[1, float("nan")]), "recent_lengths is damaged"),
    (lambda payload: payload.update(callbacks=5), "callbacks state is missing or damaged"),
    (lambda payload: payload.pop("callbacks"), "callbacks state is missing or damaged"),
    (lambda payload: payload.pop("counters"), "the checkpoint holds no counters"),
    # settings of the wrong type were tracebacks where they were used (validate, the schedule, the early end)
    (lambda payload: payload["config"].update(total_timesteps="480"), r"total_timesteps must be .*, got '480'"),
    (lambda payload: payload["config"].update(eval_every=None), r"eval_every must be .*, got None"),
    (lambda payload: payload.update(rng={"python": [3]}), r"generator states are damaged \(IndexError\)"),
])
def test_damaged_parts_of_a_checkpoint_are_refused_in_one_line(run_copy, edit, match):
    edit_checkpoint(run_copy, edit)
    # the network's tensors and the generators' states are checked as they are loaded, by a resume that trains; to
    # the run's own total, which it has reached, the resume loads neither (it trains nothing and changes nothing)
    loaded = match.startswith(("the checkpoint's model", "the checkpoint's average_model", "generator states"))
    refused_resume(run_copy, match, totals=(960,) if loaded else (960, None))


def test_a_progress_csv_that_is_not_text_is_refused_on_resume(run_copy):
    (run_copy / "progress.csv").write_bytes(bytes(range(128, 256)) * 4)
    refused_resume(run_copy, r"progress.csv is not a text file: restore it, or move the file away")


def test_a_run_dir_holding_a_config_json_is_not_written_over(tmp_path):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"mine": true}')
    line = one_line_error(run_train("--env", "CartPole-v1", "--run-dir", str(run_dir)))
    assert "already holds a config.json, which a run would overwrite" in line
    assert (run_dir / "config.json").read_text() == '{"mine": true}' and sorted(run_dir.iterdir()) == [run_dir / "config.json"]


def test_a_network_too_large_for_memory_is_a_one_line_error(tmp_path):
    # 10^7 x 10^7 weights: 400 TB, more than any address space, so no allocator gives it
    line = one_line_error(run_train("--env", "CartPole-v1", "--net-arch", "10000000,10000000", "--run-dir", str(tmp_path / "run"),
                                    "--device", "cpu"))
    assert "the network does not fit in the host's memory (RuntimeError); lower --net-arch" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("call, match", [
    (lambda run_dir: acer_sync.load(None), "a checkpoint is a run directory or a .pt file, got None"),
    (lambda run_dir: acer_sync.load(run_dir, device="tpu"), "device must be auto, cpu, cuda or another torch device, got 'tpu'"),
    (lambda run_dir: acer_sync.load(run_dir).predict(np.full(4, np.nan, dtype=np.float32)), "holds NaN or infinity"),
    (lambda run_dir: acer_sync.train("CartPole-v1", run_dir=5, **SMALL), "--run-dir must name a directory, got 5"),
    (lambda run_dir: acer_sync.train("CartPole-v1", callbacks=5, **SMALL), "callbacks must be a list of acer_sync.Callback"),
    (lambda run_dir: acer_sync.train("CartPole-v1", verbose="x", **SMALL), "verbose must be a whole number"),
])
def test_the_apis_wrong_arguments_are_one_line_user_errors(finished_run, call, match):
    with pytest.raises(acer_sync.UserError, match=match) as error:
        call(finished_run)
    assert "\n" not in str(error.value)


def test_a_damaged_latest_pt_names_the_newest_step_copy_and_that_copy_resumes(run_copy):
    latest = run_copy / "checkpoints" / LATEST
    newest = sorted((run_copy / "checkpoints").glob("step_*.pt"))[-1]
    step = int(newest.stem.removeprefix("step_"))
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    refused_resume(run_copy, rf"corrupt or truncated.*; {newest.name} beside it holds step {step}: copy it to latest.pt to go back there$")
    shutil.copyfile(newest, latest)
    acer_sync.train(resume=run_copy, total_timesteps=step + 40, verbose=0)
    assert load_checkpoint(run_copy)["counters"]["timesteps"] == step + 40


def test_a_run_directory_without_a_checkpoint_says_there_is_nothing_to_resume(run_copy):
    # A run that died before its first checkpoint (a kill -9, a full disk): a fresh run was told to
    # --resume it, and the resume that there was no checkpoint, with no way out named.
    (run_copy / "checkpoints" / LATEST).unlink()
    newest = sorted((run_copy / "checkpoints").glob("step_*.pt"))[-1]
    with pytest.raises(acer_sync.UserError, match=rf"holds a run without a checkpoint \(latest.pt is missing.*\); {newest.name} beside it holds"):
        acer_sync.train("CartPole-v1", run_dir=run_copy, total_timesteps=40, verbose=0, **SMALL)  # not "remove it": copies
    refused_resume(run_copy, rf"holds no checkpoint \(.*latest.pt is missing\); {newest.name} beside it holds")
    shutil.rmtree(run_copy / "checkpoints")
    with pytest.raises(acer_sync.UserError, match=r"holds a run without a checkpoint \(latest.pt is missing.*nothing to resume: remove the directory to start there again"):
        acer_sync.train("CartPole-v1", run_dir=run_copy, total_timesteps=40, verbose=0, **SMALL)
    refused_resume(run_copy, r"holds no checkpoint \(.*latest.pt is missing\)$")


def test_a_resume_of_a_finished_run_says_there_is_nothing_to_train_and_leaves_the_run_as_it_was(run_copy, capsys):
    # It said only "resuming at step 480: ..." and then the finished run's summary, as if it had trained; it
    # had loaded the saved buffer, started the envs, and written latest.pt, config.json and a TensorBoard file again.
    before = {path: path.read_bytes() for path in run_copy.rglob("*") if path.is_file()}
    assert acer_sync.train(resume=run_copy, progress_bar=False) == run_copy
    assert ("resuming at step 480: the run has reached its --total-timesteps 480, so there is nothing to train (a "
            "larger --total-timesteps continues it); the run is left as it was") in capsys.readouterr().out
    outcome = acer_sync.api.runs.run(resume=run_copy, total_timesteps=480, verbose=0)  # the total given again: the same
    assert (outcome.stop, outcome.timesteps, outcome.checkpoint_step) == (Stop.FINISHED, 480, 480)
    assert {path: path.read_bytes() for path in run_copy.rglob("*") if path.is_file()} == before
    ends = []

    class Ends(acer_sync.Callback):
        def on_training_end(self, trainer, outcome):
            ends.append(outcome.stop)

    assert acer_sync.train(resume=run_copy, callbacks=[Ends()], verbose=0) == run_copy  # its callbacks still end
    assert ends == [Stop.FINISHED]
    # what a resume mends it still mends: a temporary file a kill left (a buffer's: GBs), a removed config.json
    leftover = run_copy / "checkpoints" / ".buffer.npz.k3j2.tmp"
    leftover.write_bytes(b"cut short")
    (run_copy / "config.json").unlink()
    assert acer_sync.train(resume=run_copy, verbose=0) == run_copy
    assert not leftover.exists() and json.loads((run_copy / "config.json").read_text())["config"]["total_timesteps"] == 480
    assert acer_sync.train(resume=run_copy, total_timesteps=520, verbose=0) == run_copy  # a larger total trains on
    assert load_checkpoint(run_copy)["counters"]["timesteps"] == 520


def test_a_resume_writes_a_missing_config_json_again(run_copy):
    (run_copy / "config.json").unlink()
    acer_sync.train(resume=run_copy, total_timesteps=520, verbose=0)
    recorded = json.loads((run_copy / "config.json").read_text())
    assert recorded["config"]["total_timesteps"] == 520 and recorded["config"]["num_envs"] == SMALL["num_envs"]


def test_after_a_roll_back_the_new_history_writes_its_own_buffer_at_a_step_the_old_one_reached(run_copy):
    # The old history's buffer.npz (step 480) was taken for the new history's at step 480 and kept;
    # the next resume replayed the old history's segments.
    checkpoints = run_copy / "checkpoints"
    with np.load(checkpoints / BUFFER_FILE) as old:
        assert int(old["checkpoint_step"]) == 480
        old_frames = old["frames"].copy()
    shutil.copyfile(checkpoints / "step_0000000240.pt", checkpoints / LATEST)
    acer_sync.train(resume=run_copy, total_timesteps=480, verbose=0)  # the new history (its envs restarted), to 480 again
    with np.load(checkpoints / BUFFER_FILE) as new:
        assert int(new["checkpoint_step"]) == 480 and not np.array_equal(new["frames"], old_frames)


def test_a_resume_from_an_older_step_copy_sets_the_later_copies_aside(run_copy):
    # After a roll-back the copies past its step stayed: a damaged latest.pt later named one of the
    # left history ("go back there"), and --keep-checkpoints, sorting by name, kept them over the new ones.
    copies = sorted((run_copy / "checkpoints").glob("step_*.pt"))
    assert len(copies) >= 2
    oldest, newest = copies[0], copies[-1]
    back_to, left_at = int(oldest.stem.removeprefix("step_")), int(newest.stem.removeprefix("step_"))
    shutil.copyfile(oldest, run_copy / "checkpoints" / LATEST)
    acer_sync.train(resume=run_copy, total_timesteps=back_to + 40, verbose=0)
    aside = run_copy / "checkpoints" / f"rolled_back_from_step_{left_at}"
    assert sorted(path.name for path in aside.iterdir()) == [path.name for path in copies[1:]]
    assert [path.name for path in (run_copy / "checkpoints").glob("step_*.pt")] == [oldest.name]
    latest = run_copy / "checkpoints" / LATEST
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    refused_resume(run_copy, rf"corrupt or truncated.*; {oldest.name} beside it holds step {back_to}: copy it")


def test_a_run_whose_tensorboard_folder_cannot_be_made_leaves_its_directory_to_start_again(tmp_path):
    # A file named tb in a run directory made beforehand: exit 5 after config.json and checkpoints/
    # were written, and the same command was then refused ("holds a run without a checkpoint").
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tb").write_text("not a folder")
    failed = run_train("--env", "CartPole-v1", "--total-timesteps", "80", "--run-dir", str(run_dir), "--num-envs", "2")
    assert failed.returncode == EXIT_CODES[Stop.WRITE_FAILED]
    assert failed.stderr.strip().splitlines()[-1] == f"train.py: error: cannot write {run_dir / 'tb'}: File exists; no checkpoint was written"
    assert sorted(path.name for path in run_dir.iterdir()) == [".lock", "tb"]
    (run_dir / "tb").unlink()
    started = run_train("--env", "CartPole-v1", "--total-timesteps", "80", "--run-dir", str(run_dir), "--num-envs", "2")
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_a_policy_that_turns_nan_stops_the_run_before_an_action_is_drawn_from_it(tmp_path, env, pipeline):
    # torch.multinomial raised on π with NaN in it, a traceback that lost the run's steps since its
    # checkpoint; a Gaussian's NaN mean drew NaN actions, and the env that got them was blamed.
    import user_torsos

    trainer = build_trainer(
        build_config(env == "Pendulum-v1", dict(SMALL, env=env, total_timesteps=10_000, checkpoint_every=120, pipeline=pipeline,
                                                torso="user_torsos:NanWhenActing", torso_kwargs={"finite_acts": 130})),
        env_info(env), tmp_path, progress_bar=False)
    assert isinstance(trainer.model.torso.module, user_torsos.NanWhenActing)
    outcome = trainer.train()
    assert outcome.stop is Stop.NONFINITE and EXIT_CODES[outcome.stop] == 4
    step = outcome.timesteps
    assert step < 10_000
    if pipeline == "serial":  # act 131 is in iteration 7 (the start-up check is act 1); the overlap pipeline's acting copy counts its own
        assert step == 240
    assert outcome.error == (
        "the network's policy was not finite (NaN or inf) for the observation of envs 0, 1, which was finite, so no action "
        "could be drawn: a torso that divides by zero or takes a log of 0, or weights that overflow; stopped after step "
        f"{step}, checkpoints/latest.pt holds step {step // 120 * 120}"
    )
    assert load_checkpoint(tmp_path)["counters"]["timesteps"] == step // 120 * 120


def test_a_policy_that_is_nan_at_the_first_action_is_one_line_and_exit_4(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("--env", "CartPole-v1", "--torso", "user_torsos:NanWhenActing", "--num-envs", "2", "--total-timesteps",
                       "400", "--eval-every", "0", "--run-dir", str(run_dir))
    line = error_line(result, 4)
    assert line.startswith("train.py: error: the network's policy was not finite (NaN or inf) for the observation of envs 0, 1")
    assert line.endswith("; stopped after step 0, no checkpoint was written")
    assert not (run_dir / "config.json").exists()  # a run that wrote nothing


def test_predict_with_a_policy_that_is_nan_is_a_one_line_user_error(tmp_path):
    import user_torsos

    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=80, torso=user_torsos.NanWhenActing,
                              torso_kwargs={"finite_acts": 10**9}, progress_bar=False, verbose=0, **SMALL)
    policy = acer_sync.load(run_dir)
    policy.model.torso.module.finite_acts = 0
    for deterministic in (False, True):
        with pytest.raises(acer_sync.UserError, match=r"^the network's policy was not finite \(NaN or inf\) for the observation of env 0,"):
            policy.predict(np.zeros(4, np.float32), deterministic=deterministic)


@pytest.mark.parametrize("fault, evaluation", [("seven_at_cut", False), ("seven_obs", True)])
def test_a_value_or_policy_that_is_nan_at_a_time_limit_cut_or_in_an_evaluation_names_it(tmp_path, fault, evaluation):
    # A NaN V of a cut's final observation went into the buffer in silence, and every update that
    # replayed it was skipped until --max-nonfinite stopped the run, blaming the updates; in an
    # evaluation, the envs named were taken for training's.
    faulty_envs._instances = iter(range(10**6))
    trainer = cartpole_trainer(tmp_path, env=faulty_envs.ENV_ID, env_kwargs={"fault": fault, "at_step": 5, "from_instance": 3 if evaluation else 2},
                               total_timesteps=10_000, torso="user_torsos:NanAtSeven", eval_every=80 if evaluation else 0, eval_episodes=2)
    outcome = trainer.train()
    assert outcome.stop is Stop.NONFINITE
    if evaluation:  # instances 3 and 4 are the evaluation's 2 envs (0 reads the spaces, 1 and 2 train)
        assert outcome.error.startswith("the network's policy was not finite (NaN or inf) for the observation of evaluation envs 0, 1, "
                                        "which was finite, so no action could be drawn")
    else:  # instance 2 is training's env 1, cut at its step 5 on a final observation of 7
        assert outcome.error.startswith("the network's value V was not finite (NaN or inf) for the observation of env 1, which was "
                                        "finite, so the episode cut by a time limit has no value to bootstrap from")
    assert outcome.timesteps == (80 if evaluation else 0)


# --- Exceptions that are not the env's: a torso's bug, memory, a KeyboardInterrupt in code -----


def collecting_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "acer-collect" and thread.is_alive()]


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
@pytest.mark.parametrize("where, at", [("learn", 1), ("learn", 40), ("act", 150)])
def test_a_torso_that_raises_mid_run_saves_where_the_run_stood_and_gives_the_process_back(tmp_path, pipeline, where, at):
    # It wrote no checkpoint (a run at 1M steps lost up to --checkpoint-every of them), no last
    # row, closed no envs, and left the process with the run's thread count and its SIGALRM handler;
    # overlapped, an update's exception left the collecting thread running (exit 134, at times).
    threads, alarm, collecting = torch.get_num_threads(), signal.getsignal(signal.SIGALRM), len(collecting_threads())
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="^torso bug\n") as raised:
        acer_sync.train("CartPole-v1", run_dir=run_dir, torso="user_torsos:FailsAt", torso_kwargs={"where": where, "at": at},
                        pipeline=pipeline, total_timesteps=4000, progress_bar=False, verbose=0, **SMALL)
    saved = load_checkpoint(run_dir)
    step = saved["counters"]["timesteps"]
    assert 0 < step < 4000
    assert raised.value.__notes__ == [f"acer_sync: the run in {run_dir} stopped at step {step}; checkpoints/latest.pt holds step {step}"]
    last = read_progress(run_dir)[-1]
    assert int(last["total_timesteps"]) == step and int(last["episodes"]) == saved["counters"]["episodes"]
    assert torch.get_num_threads() == threads and signal.getsignal(signal.SIGALRM) == alarm
    assert len(collecting_threads()) == collecting
    if at == 1:  # the first update failed: its segment is unlearned, and the resume's checks take the checkpoint
        # ("the checkpoint's counters disagree: 0 updates for 1 iterations"), then its torso fails again
        assert saved["counters"]["unlearned_segments"] == 1
        with pytest.raises(RuntimeError, match="^torso bug"):  # overlapped, in its second iteration's update
            acer_sync.api.runs.run(resume=run_dir, total_timesteps=step + 80, progress_bar=False, verbose=0)
        return
    resumed = acer_sync.api.runs.run(resume=run_dir, total_timesteps=step + 40, progress_bar=False, verbose=0)
    assert resumed.finished and resumed.timesteps == step + 40


def test_a_keyboard_interrupt_that_no_signal_sent_saves_and_goes_on(tmp_path):
    # A callback's own KeyboardInterrupt was taken for a second Ctrl-C: "exiting at once", no
    # checkpoint, and TrainingStopped in its place.
    class Interrupts(acer_sync.Callback):
        def on_rollout_end(self, trainer, row):
            if trainer.timesteps >= 200:
                raise KeyboardInterrupt

    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        acer_sync.train("CartPole-v1", run_dir=run_dir, callbacks=[Interrupts()], total_timesteps=4000, progress_bar=False,
                        verbose=0, **SMALL)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 200
    with pytest.raises(KeyboardInterrupt):  # in an update
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "torso", torso="user_torsos:FailsAt",
                        torso_kwargs={"error": "keyboard", "at": 30}, total_timesteps=4000, progress_bar=False, verbose=0, **SMALL)
    assert 0 < load_checkpoint(tmp_path / "torso")["counters"]["timesteps"] < 4000


#: What the run says of user_torsos.FAILURES["oom"], the part of torch's message up to the free memory.
CUDA_OUT_OF_MEMORY_SAID = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.20 GiB is free"


@pytest.mark.parametrize("error, said", [
    ("oom", CUDA_OUT_OF_MEMORY_SAID),
    ("allocator", "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456789 bytes. Error code 12 (Cannot allocate memory)"),
])
@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_out_of_memory_mid_run_is_one_line_exit_7_with_a_checkpoint(tmp_path, error, said, pipeline):
    run_dir = tmp_path / "run"
    result = run_train("--env", "CartPole-v1", "--torso", "user_torsos:FailsAt", "--torso-kwargs", f"error={error}", "at=40",
                       "--num-envs", "2", "--vec-env", "sync", "--total-timesteps", "4000", "--eval-every", "0",
                       "--pipeline", pipeline, "--run-dir", str(run_dir))
    line = error_line(result, 7)
    step = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert line == f"train.py: error: out of memory at step {step} ({said}); saved a checkpoint at step {step}"


@pytest.mark.parametrize("error, said", [
    ("oom", CUDA_OUT_OF_MEMORY_SAID),
    ("memory", "MemoryError"),
])
@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_out_of_memory_while_acting_stops_with_the_checkpoint_of_where_the_run_stood(tmp_path, error, said, pipeline):
    # The run's end-to-end memory tests struck in an update; acting's passes (the collecting
    # thread's own copy of the network, overlapped) end the run the same way, the collection dropped.
    run_dir = tmp_path / "run"
    with pytest.raises(acer_sync.TrainingStopped) as stopped:  # through the library
        acer_sync.train("CartPole-v1", run_dir=run_dir, torso="user_torsos:FailsAt", pipeline=pipeline,
                        torso_kwargs={"error": error, "where": "act", "at": 130}, total_timesteps=4000, verbose=0, **SMALL)
    outcome = stopped.value.outcome
    step = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert outcome.stop is Stop.OUT_OF_MEMORY and EXIT_CODES[outcome.stop] == 7
    assert outcome.error == f"out of memory at step {step} ({said}); saved a checkpoint at step {step}"
    assert 0 < step == outcome.timesteps < 4000 and outcome.checkpoint_step == step


@pytest.mark.parametrize("error", ["oom", "runtime"])
def test_a_failure_whose_final_checkpoint_cannot_be_written_says_both(tmp_path, monkeypatch, caplog, error):
    # "out of memory at step 400 (...); saved a checkpoint at step 400; then cannot write ...": the
    # save had failed; and after a torso's exception the full disk was said nowhere.
    def full_disk(path, payload):
        raise WriteFailed(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))

    monkeypatch.setattr(acer_sync.training.callbacks, "save_checkpoint", full_disk)
    run_dir = tmp_path / "run"
    settings = dict(run_dir=run_dir, torso="user_torsos:FailsAt", torso_kwargs={"error": error, "at": 40}, total_timesteps=4000,
                    progress_bar=False, **SMALL)
    latest = run_dir / "checkpoints" / LATEST
    if error == "oom":
        outcome = acer_sync.api.runs.run("CartPole-v1", **settings)
        assert outcome.stop is Stop.WRITE_FAILED
        assert outcome.error == (f"out of memory at step {outcome.timesteps} (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
                                 f"a total capacity of 79.11 GiB of which 1.20 GiB is free); then cannot write {latest}: No space "
                                 "left on device; no checkpoint was written")
        return
    with caplog.at_level(logging.WARNING, logger="acer_sync"), pytest.raises(RuntimeError, match="^torso bug") as raised:
        acer_sync.train("CartPole-v1", **settings)
    assert raised.value.__notes__[0].endswith("; no checkpoint was written")
    assert f"warning: cannot write {latest}: No space left on device; no checkpoint was written" in caplog.messages


def test_a_keyboard_interrupt_that_no_signal_sent_is_interrupted_130_naming_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train("--env", "CartPole-v1", "--torso", "user_torsos:FailsAt", "--torso-kwargs", "error=keyboard", "at=40",
                       "--num-envs", "2", "--vec-env", "sync", "--total-timesteps", "4000", "--eval-every", "0", "--run-dir", str(run_dir))
    step = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines() == [
        "train.py: interrupted", f"acer_sync: the run in {run_dir} stopped at step {step}; checkpoints/latest.pt holds step {step}"]


def fail_in_the_step(monkeypatch, owner, name: str, error: str, at: int) -> None:
    """Replaces ``owner.name`` (``RMSpropTF.step``, ``PolyakAverage.update``): its ``at``-th call
    does its work, then raises ``error`` (a name in ``user_torsos.FAILURES``), as an allocation
    that fails half way through the writes would."""
    import user_torsos

    real, calls = getattr(owner, name), []

    def failing(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(None)
        if len(calls) == at:
            raise user_torsos.FAILURES[error]()

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize("where, pipeline", [("optimizer", "serial"), ("average", "serial"), ("optimizer", "overlap")])
def test_a_memory_error_while_an_update_changes_the_weights_keeps_the_last_checkpoint(tmp_path, monkeypatch, where, pipeline):
    # The final save wrote the weights as the failure left them: θ stepped and θa not, or v and
    # half of θ (an OOM in the optimizer's step), under "saved a checkpoint at step ...".
    from acer_sync.math.optim import RMSpropTF
    from acer_sync.nets.networks import PolyakAverage

    fail_in_the_step(monkeypatch, *((RMSpropTF, "step") if where == "optimizer" else (PolyakAverage, "update")), "oom", at=40)
    run_dir = tmp_path / "run"
    outcome = acer_sync.api.runs.run("CartPole-v1", run_dir=run_dir, total_timesteps=4000, checkpoint_every=200, pipeline=pipeline,
                                     progress_bar=False, verbose=0, **SMALL)
    kept = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert outcome.stop is Stop.OUT_OF_MEMORY and 0 < kept < outcome.timesteps and outcome.checkpoint_step == kept
    assert outcome.error == (f"out of memory at step {outcome.timesteps} (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
                             "total capacity of 79.11 GiB of which 1.20 GiB is free) while an update changed the weights, which "
                             f"were not saved; checkpoints/latest.pt holds step {kept}")
    monkeypatch.undo()
    resumed = acer_sync.api.runs.run(resume=run_dir, total_timesteps=kept + 80, progress_bar=False, verbose=0)
    assert resumed.finished and resumed.timesteps == kept + 80


def test_an_exception_while_an_update_changes_the_weights_names_the_checkpoint_kept(tmp_path, monkeypatch):
    from acer_sync.math.optim import RMSpropTF

    fail_in_the_step(monkeypatch, RMSpropTF, "step", "runtime", at=40)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="^torso bug") as raised:
        acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=4000, checkpoint_every=200, progress_bar=False, verbose=0,
                        **SMALL)
    kept = load_checkpoint(run_dir)["counters"]["timesteps"]
    note = raised.value.__notes__[0]
    step = int(re.search(r"stopped at step (\d+)", note).group(1))
    assert 0 < kept < step
    assert note == (f"acer_sync: the run in {run_dir} stopped at step {step} while an update changed the weights, which were not "
                    f"saved; checkpoints/latest.pt holds step {kept}")


def test_the_out_of_memory_errors_of_cuda_and_its_libraries_are_named_as_they_are():
    from acer_sync.training.trainer import out_of_memory

    assert out_of_memory(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported asynchronously")) == \
        "CUDA error: out of memory"
    assert out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")) == \
        "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    assert out_of_memory(MemoryError()) == "MemoryError"
    assert out_of_memory(RuntimeError("torso bug")) is None and out_of_memory(ValueError("out of memory")) is None


def test_an_exception_in_an_update_while_the_envs_collect_exits_1_with_its_traceback(tmp_path):
    # Overlapped, the process aborted at exit ("terminate called without an active exception",
    # exit 134) in 3 of 6 tries, with the collecting thread inside torch.
    for attempt in range(3):
        run_dir = tmp_path / f"run{attempt}"
        result = run_train("--env", "CartPole-v1", "--torso", "user_torsos:FailsAt", "--torso-kwargs", "at=40", "--num-envs", "2",
                           "--vec-env", "sync", "--total-timesteps", "4000", "--eval-every", "0", "--pipeline", "overlap",
                           "--run-dir", str(run_dir))
        step = load_checkpoint(run_dir)["counters"]["timesteps"]
        assert result.returncode == 1, result.stderr
        assert result.stderr.rstrip().endswith(
            f"RuntimeError: torso bug\nacer_sync: the run in {run_dir} stopped at step {step}; checkpoints/latest.pt holds step {step}")


def test_a_hung_subproc_env_times_out_off_the_main_thread_as_in_a_sweep_trial():
    # A sweep trial trains in a thread of Ray's, where no SIGALRM timer is armed: a hung env hung
    # its trial for ever, --env-timeout or not.
    from atari.envs import VecEnv
    from atari.errors import EnvTimedOut

    info = env_info(FAULTY, {"fault": "hang", "at_step": 5})
    said = {}

    def trial():
        env = VecEnv(info, 2, "subproc", timeout=1.0)
        env.reset(seed=0)
        started = time.monotonic()
        try:
            for _ in range(10):
                env.step(np.zeros(2, dtype=np.int64))
        except EnvTimedOut as error:
            said["error"], said["seconds"] = str(error), time.monotonic() - started
        finally:
            env.close()

    thread = threading.Thread(target=trial)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert said["error"] == f"{FAULTY}'s step did not return within --env-timeout 1 s" and said["seconds"] < 5

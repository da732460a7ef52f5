"""One writer per run directory: a second training or resume of a run in use is refused in one line
and writes nothing; the lock dies with its process; readers never wait for it."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import acer_sync
from acer_sync.api.runs import run
from acer_sync.base import run_lock as run_lock_module
from acer_sync.base.errors import EXIT_CODES
from acer_sync.base.outcome import Stop
from acer_sync.base.run_lock import LOCK_FILE, RunLock
from acer_sync.training.checkpoint import load_checkpoint
from helpers import ROOT, one_line_error, read_progress, start_long_cartpole_run

TRAIN = [sys.executable, str(ROOT / "train.py")]


def steps_once_each(run_dir) -> bool:
    """progress.csv has one header and strictly increasing steps: one writer wrote it."""
    lines = (run_dir / "progress.csv").read_text().splitlines()
    steps = [int(row["total_timesteps"]) for row in read_progress(run_dir)]
    return sum(line.startswith("total_timesteps") for line in lines) == 1 and steps == sorted(set(steps))


def test_the_lock_names_its_holder_and_is_free_again_once_released(tmp_path):
    lock = RunLock.acquire(tmp_path)
    with pytest.raises(acer_sync.UserError, match=f"is in use by process {os.getpid()} on "):
        RunLock.acquire(tmp_path)
    lock.release()
    RunLock.acquire(tmp_path).release(remove=True)
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_resume_of_a_run_in_use_is_refused_at_once_and_writes_nothing_and_readers_go_on(tmp_path):
    run_dir = tmp_path / "run"
    first = start_long_cartpole_run(run_dir, 2, "--checkpoint-every", "200")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run_dir / "checkpoints" / "latest.pt").exists():
            time.sleep(0.2)
        started = time.time()
        second = subprocess.run([*TRAIN, "--resume", str(run_dir), "--no-progress"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
        line = one_line_error(second)
        assert time.time() - started < 30
        assert f"is in use by process {first.pid} on " in line and second.stdout == ""
        again = subprocess.run([*TRAIN, "--env", "CartPole-v1", "--run-dir", str(run_dir), "--no-progress"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        # Named as the resume's refusal names it (it was "already holds a run; continue it with --resume").
        assert f"is in use by process {first.pid} on " in one_line_error(again) and "pick another --run-dir" in one_line_error(again)
        policy = acer_sync.load(run_dir)  # a reader does not take the lock
        policy.predict(np.zeros(4, np.float32))
        assert first.poll() is None and steps_once_each(run_dir)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    # The kernel dropped the dead process's lock: the run resumes.
    saved = load_checkpoint(run_dir)["counters"]["timesteps"]
    resumed = subprocess.run([*TRAIN, "--resume", str(run_dir), "--total-timesteps", str(saved + 200), "--no-progress"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert steps_once_each(run_dir) and int(read_progress(run_dir)[-1]["total_timesteps"]) == saved + 200
    again = subprocess.run([*TRAIN, "--env", "CartPole-v1", "--run-dir", str(run_dir), "--no-progress"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert "already holds a run; continue it with --resume" in one_line_error(again)  # no one holds it now


def test_two_runs_started_at_once_on_one_directory_leave_one_run(tmp_path):
    run_dir = tmp_path / "run"
    command = [*TRAIN, "--env", "CartPole-v1", "--vec-env", "sync", "--num-envs", "2", "--total-timesteps", "2000",
               "--log-interval", "1", "--run-dir", str(run_dir), "--no-progress"]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    results = [(process.wait(timeout=180), *process.communicate()) for process in processes]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(stderr for code, _, stderr in results if code == 2)
    assert len(refused.strip().splitlines()) == 1 and ("is in use by" in refused or "already holds a run" in refused)
    assert steps_once_each(run_dir)
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) == 2000


def test_a_process_forked_while_the_lock_is_held_does_not_keep_it_after_its_parent_dies(tmp_path):
    # A subproc env worker is forked with the lock held; a flock is the open file's, shared with the
    # child, so a hung worker kept a killed trainer's directory locked for good.
    script = (
        "import os, sys, time\n"
        "from acer_sync.base.run_lock import RunLock\n"
        f"RunLock.acquire({str(tmp_path)!r})\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    devnull = os.open(os.devnull, os.O_WRONLY)\n"
        "    os.dup2(devnull, 1)\n"  # let go of the test's pipes: it reads them to their end
        "    os.dup2(devnull, 2)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "os._exit(0)\n"  # the trainer dies (as by kill -9): no release
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    child = int(result.stdout)
    try:
        os.kill(child, 0)  # the child lives on, holding its copy of everything the parent had open
        assert RunLock.holder(tmp_path) is None
        RunLock.acquire(tmp_path).release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_filesystem_without_file_locks_trains_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock_module.fcntl, "flock", no_locks)
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, num_envs=2, vec_env="sync", device="cpu",
                    eval_every=0, hidden="16", threads=1, verbose=1)
    assert "cannot lock run directory" in caplog.text and "No locks available" in caplog.text
    assert RunLock.holder(tmp_path / "run") is None


def test_a_full_disk_under_the_lock_file_is_a_write_failure_and_the_start_leaves_nothing(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock_module.os, "pwrite", full)
    run_dir = tmp_path / "new" / "run"
    outcome = run("CartPole-v1", run_dir=run_dir, total_timesteps=40, num_envs=2, vec_env="sync", device="cpu",
                  eval_every=0, hidden="16", threads=1, verbose=0)
    assert outcome.stop is Stop.WRITE_FAILED and EXIT_CODES[outcome.stop] == 5
    assert outcome.error == f"cannot write {run_dir / LOCK_FILE}: No space left on device; the run did not start"
    assert not (tmp_path / "new").exists()


def test_a_full_disk_under_the_checkpoints_folder_is_a_write_failure_and_the_start_leaves_nothing(tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def mkdir(path, *args, **kwargs):
        if path.name == "checkpoints":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    run_dir = tmp_path / "run"
    outcome = run("CartPole-v1", run_dir=run_dir, total_timesteps=40, num_envs=2, vec_env="sync", device="cpu",
                  eval_every=0, hidden="16", threads=1, verbose=0)
    assert outcome.stop is Stop.WRITE_FAILED
    assert outcome.error == f"cannot write {run_dir / 'checkpoints'}: No space left on device; the run did not start"
    assert not run_dir.exists()


def test_a_resume_of_a_directory_that_holds_no_run_writes_nothing_in_it(tmp_path):
    with pytest.raises(acer_sync.UserError, match="holds no checkpoint"):
        acer_sync.train(resume=tmp_path)
    assert list(tmp_path.iterdir()) == []  # a .lock was left

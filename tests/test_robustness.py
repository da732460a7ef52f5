"""Nothing lost: atomic checkpoints under kill -9, pruning, saved buffers, NaN updates, dead workers."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import acer_sync
from acer_sync.base.config import build_config
from acer_sync.base.errors import EXIT_CODES, REPEAT_SECONDS, WriteFailed, exit_code
from acer_sync.base.outcome import Stop
from acer_sync.replay.buffer import to_batch
from acer_sync.training.callbacks import CheckpointCallback
from acer_sync.training.checkpoint import FORMAT_VERSION, load_checkpoint, migrate, trainer_payload
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import ROOT, OverflowingRewardsAfter, one_line_error, read_progress, start_long_cartpole_run


def cartpole_config(**overrides):
    values = dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, log_interval=5, eval_every=0)
    values.update(overrides)
    return build_config(False, values)


WRITER = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {root!r})
    from acer_sync.training.checkpoint import save_checkpoint
    torch.set_num_threads(1)  # on a busy CPU, two threads filling the tensor take longer than the save
    path = sys.argv[1]
    for i in range(10**6):
        save_checkpoint(path, {{"step": i, "weights": torch.full((1_000_000,), float(i))}})
        print(i, flush=True)
    """
)


def test_kill_9_during_saves_always_leaves_a_loadable_checkpoint(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    path = tmp_path / "latest.pt"
    rng = np.random.default_rng(0)
    interrupted_saves = 0
    for attempt in range(30):
        if attempt >= 6 and interrupted_saves >= 3:
            break
        leftovers_before = len(list(tmp_path.glob(".latest.pt.*")))
        process = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
        first_line = process.stdout.readline().strip()
        assert first_line.isdigit()  # at least one save finished
        time.sleep(rng.uniform(0.0, 0.15))  # land somewhere inside a later save
        process.send_signal(signal.SIGKILL)
        process.wait()
        last_finished = int((first_line.split() + process.stdout.read().split())[-1])  # the writer prints after each save
        payload = load_checkpoint(path)
        assert float(payload["weights"][0]) == payload["step"] and float(payload["weights"][-1]) == payload["step"]
        # The checkpoint is the last save that finished, or the one killed between its rename
        # and its print: a finished save is never lost.
        assert payload["step"] in (last_finished, last_finished + 1), (payload["step"], last_finished)
        # A kill inside a save leaves its temporary file (SIGKILL runs no clean-up). Some kills land
        # between two saves; kill again until at least 3 have landed inside one.
        interrupted_saves += len(list(tmp_path.glob(".latest.pt.*"))) - leftovers_before
    assert interrupted_saves >= 3
    # Temporary files of interrupted saves may remain; they never replace the checkpoint itself.
    assert all(p.name.startswith(".latest.pt.") for p in tmp_path.iterdir() if p.name not in ("latest.pt", "writer.py"))


def test_periodic_checkpoints_are_pruned_to_keep_checkpoints(tmp_path):
    config = cartpole_config(total_timesteps=400, checkpoint_every=40, keep_checkpoints=2)
    assert build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False).train().finished
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest.pt", "step_0000000360.pt", "step_0000000400.pt"]


def test_an_old_checkpoint_that_cannot_be_removed_stays_with_a_warning(tmp_path, monkeypatch, caplog):
    # An immutable file, a read-only mount of old copies: the run goes on (it printed a traceback).
    unlink = Path.unlink

    def refuses_step_40(path, missing_ok=False):
        if path.name == "step_0000000040.pt":
            raise PermissionError(1, "Operation not permitted")
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuses_step_40)
    config = cartpole_config(total_timesteps=160, checkpoint_every=40, keep_checkpoints=1)
    with caplog.at_level(logging.WARNING):
        assert build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False).train().finished
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest.pt", "step_0000000040.pt", "step_0000000160.pt"]
    assert "step_0000000040.pt (--keep-checkpoints 1): Operation not permitted; it stays" in caplog.text


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_saved_buffer_is_replayed_after_resume(tmp_path, caplog, network):
    caplog.set_level(logging.INFO, logger="acer_sync")  # the library logs what it says
    config = cartpole_config(total_timesteps=800, buffer_size=200, replay_start=20, save_buffer=True, network=network,
                             lstm_size=8, hidden="16")
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)
    trainer.train()
    saved = trainer.buffer.state()
    payload = load_checkpoint(tmp_path)
    resumed = build_trainer(config, env_info("CartPole-v1"), tmp_path, resume=payload, progress_bar=False)
    try:
        assert "replay resumes with the saved buffer (200 steps per env)" in caplog.text
        for name in ("frames", "actions", "mu", "rewards"):
            np.testing.assert_array_equal(resumed.buffer.state()[name], saved[name])
        last = (resumed.buffer.steps_written - 1) % resumed.buffer.step_capacity
        assert resumed.buffer.dones[last].all()  # the restart cut the newest segment's episodes
        # ... as a time limit cuts one: where an episode went on, its last step bootstraps from V of the
        # segment's bootstrap frame, here stepped through from the segment's stored state
        batch = to_batch(resumed.buffer.latest(), resumed.fields, 1, torch.device("cpu"))
        state = batch.state
        with torch.no_grad():
            for t in range(config.nsteps + 1):
                features, state = resumed.model.step(batch.obs[t], state, batch.firsts[t])
            bootstrap_values = resumed.model.value_of(features).numpy()
        cut = ~saved["dones"][last]
        assert cut.any()
        np.testing.assert_allclose(resumed.buffer.timeout_values[last][cut], bootstrap_values[cut], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(resumed.buffer.timeout_values[last][~cut], saved["timeout_values"][last][~cut])
        assert resumed.buffer.num_steps_stored >= config.replay_start  # replay goes on at once
    finally:
        resumed.close()


def test_resume_without_saved_buffer_says_it_starts_empty(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="acer_sync")
    config = cartpole_config(total_timesteps=200)
    build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False).train()
    resumed = build_trainer(config, env_info("CartPole-v1"), tmp_path, resume=load_checkpoint(tmp_path), progress_bar=False)
    resumed.close()
    assert "no saved replay buffer, so it starts empty on resume" in caplog.text


class HugeRewardCartPole(OverflowingRewardsAfter):
    """CartPole whose rewards overflow float32 returns after 150 steps of this env instance."""

    first_huge_step = 151


gym.register("HugeRewardCartPole-v0", entry_point=HugeRewardCartPole)


def test_nonfinite_updates_are_skipped_counted_and_stop_the_run(tmp_path, capsys):
    config = cartpole_config(env="HugeRewardCartPole-v0", total_timesteps=5_000, checkpoint_every=40,
                             replay_ratio=0.0, max_nonfinite=3, log_interval=1)
    trainer = build_trainer(config, env_info("HugeRewardCartPole-v0"), tmp_path, progress_bar=False)
    good = [p.clone() for p in trainer.model.parameters()]
    outcome = trainer.train()
    assert outcome.stop is Stop.NONFINITE and EXIT_CODES[outcome.stop] == 4
    assert "3 non-finite updates in a row" in outcome.error
    assert capsys.readouterr().err == ""  # the Trainer prints no error line: the script does
    rows = read_progress(tmp_path)
    assert int(rows[-1]["nonfinite_updates"]) == 3
    # Huge rewards start at each env's step 151, i.e. in iteration 8 (40 steps each); iteration 7 wrote the
    # last good checkpoint and none was written after it.
    payload = load_checkpoint(tmp_path)
    assert payload["counters"]["timesteps"] == 280 and payload["counters"]["nonfinite_updates"] == 0
    assert all(np.isfinite(t.numpy()).all() for t in payload["model"].values())
    assert any(not (a == b).all() for a, b in zip(good, trainer.model.parameters()))  # it did learn first


def test_a_resume_goes_on_counting_the_nonfinite_streak_where_the_checkpoint_left_it(tmp_path):
    # A stop during a streak of non-finite updates saves the checkpoint (the updates were skipped:
    # its weights are the last good ones) with the streak, so that --max-nonfinite counts across
    # the resume rather than allowing each session a whole new streak.
    config = cartpole_config(total_timesteps=200, max_nonfinite=3)
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)
    assert trainer.train().finished
    trainer.agent.nonfinite_updates, trainer.agent.nonfinite_streak = 5, 2
    payload = trainer_payload(trainer)
    assert payload["counters"]["nonfinite_streak"] == 2
    resumed = build_trainer(config, env_info("CartPole-v1"), tmp_path, resume=payload, progress_bar=False)
    assert resumed.agent.nonfinite_streak == 2 and resumed.agent.nonfinite_updates == 5
    resumed.close()
    del payload["counters"]["nonfinite_streak"]  # a checkpoint written before the streak was kept
    resumed = build_trainer(config, env_info("CartPole-v1"), tmp_path, resume=migrate({**payload, "format": FORMAT_VERSION}),
                            progress_bar=False)
    assert resumed.agent.nonfinite_streak == 0
    resumed.close()


def child_pids(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children += [int(c) for c in text]
    return children


def test_a_killed_env_worker_is_reported_checkpointed_and_exits_nonzero(tmp_path):
    run_dir = tmp_path / "run"
    process = start_long_cartpole_run(run_dir, num_envs=3)
    try:
        workers = child_pids(process.pid)
        assert len(workers) >= 3
        os.kill(workers[1], signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, stderr
    assert "was killed by SIGKILL" in stderr and "env " in stderr and "Traceback" not in stderr
    assert load_checkpoint(run_dir)["counters"]["timesteps"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--seed", "4294967296"], "--seed must be <= 4294967295"),
        (["--threads", "100000"], "--threads must be <= 1024"),  # OpenMP crashed without a word
        (["--lr", "0"], "--lr must be finite and > 0"),
        (["--lr", "inf"], "invalid finite number"),
        (["--gamma", "nan"], "invalid finite number"),
        (["--c", "nan"], "invalid number"),
        (["--total-timesteps", "0"], "--total-timesteps must be >= 1"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints must be >= 0"),
        (["--eval-episodes", "0"], "--eval-episodes must be >= 1"),
        (["--max-grad-norm", "0"], "--max-grad-norm must be > 0"),
        (["--alpha", "1"], "--alpha must be in [0, 1)"),
        (["--run-dir", "runs/../../escape"], "contains '..'"),
        (["--resume", "runs/../x"], "contains '..'"),
    ],
)
def test_hostile_flags_are_refused_in_one_line(args, message):
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert message in one_line_error(result)


@pytest.mark.parametrize("flag", ["--run-dir", "--resume"])
def test_an_empty_run_dir_is_refused_not_taken_as_the_current_directory(tmp_path, flag):
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", flag, ""],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert f"{flag} must name a directory, got ''" in one_line_error(result)
    assert list(tmp_path.iterdir()) == []


def test_corrupt_config_json_is_reported_by_plot(tmp_path):
    (tmp_path / "config.json").write_text('{"config": {"env": "Pong')
    (tmp_path / "progress.csv").write_text("total_timesteps,mean_episode_reward\n100,1\n")
    result = subprocess.run([sys.executable, str(ROOT / "plot.py"), str(tmp_path), "--out", str(tmp_path / "c.png")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "config.json" in one_line_error(result)


def test_a_full_disk_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    from acer_sync.base.errors import WriteFailed
    from acer_sync.training import checkpoint

    path = tmp_path / "latest.pt"
    checkpoint.save_checkpoint(path, {"step": 1})
    before = path.read_bytes()

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", no_space)
    with pytest.raises(WriteFailed, match="cannot write .*latest.pt: No space left on device"):
        checkpoint.save_checkpoint(path, {"step": 2})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_checkpoints_and_config_json_get_the_mode_the_umask_gives(tmp_path, umask):
    # mkstemp creates its files 0600: config.json and every checkpoint were unreadable to a
    # teammate's play.py in a shared folder, where progress.csv and tb/ (written by open) were not.
    before = os.umask(umask)
    try:
        run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, num_envs=2, vec_env="sync",
                                  device="cpu", eval_every=0, threads=1, verbose=0, checkpoint_every=20)
    finally:
        os.umask(before)
    expected = 0o666 & ~umask
    written = [run_dir / "config.json", *sorted((run_dir / "checkpoints").glob("*.pt"))]
    assert len(written) >= 3 and {path.name: path.stat().st_mode & 0o777 for path in written} == {path.name: expected for path in written}
    assert (run_dir / "progress.csv").stat().st_mode & 0o777 == expected


def test_graceful_stop_turns_the_first_signal_into_a_flag_and_the_second_sigint_into_an_exit():
    from acer_sync.training.signals import GracefulStop

    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is not stop._handle  # handlers restored


def test_the_first_signal_delivered_twice_is_one_stop_and_a_later_one_a_second():
    # GNU timeout sends its signal to the command and again to the command's process group; Python
    # ran the handler for each in 2 tries of 20, and the copy exited at once without the checkpoint
    # (the project's CI lost gpu_pong.sh's checkpoint so). Here the handler surely runs twice: each
    # os.kill to this process runs it before the next line.
    from acer_sync.training.signals import GracefulStop

    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT" and not stop.interrupted_twice
        stop.last_signal = (signal.SIGINT, stop.signal_time - REPEAT_SECONDS)  # a second later: a second Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # which, delivered twice, is one KeyboardInterrupt
    assert stop.second_signal == "SIGINT"


def test_a_ctrl_c_while_the_script_imports_torch_is_one_line(tmp_path):
    # The scripts' handler is in place before their heavy imports: a SIGINT in them (here, as the
    # command's module starts to load) printed a KeyboardInterrupt traceback.
    script = tmp_path / "early.py"
    script.write_text(
        "import importlib, os, signal, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from acer_sync import __main__ as entry\n"
        "load = importlib.import_module\n"
        "def interrupted(name, *args):\n"
        "    if name.startswith('acer_sync.cli.'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return load(name, *args)\n"
        "importlib.import_module = interrupted\n"
        "entry.run_command('train', ['--env', 'CartPole-v1'], 'train.py')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (130, "train.py: interrupted\n")


def test_a_ctrl_c_delivered_twice_outside_a_run_unwinds_once(tmp_path):
    # run_cli's handler: the copy of a first Ctrl-C (its KeyboardInterrupt is unwinding main) is not
    # the second Ctrl-C that exits at once, skipping main's clean-up.
    script = tmp_path / "twice.py"
    script.write_text(
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from acer_sync.base.errors import run_cli\n"
        "def main():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    finally:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        print('cleaned up', flush=True)\n"
        "run_cli(main, 'twice.py')\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (130, "cleaned up\n", "twice.py: interrupted\n")


@pytest.mark.parametrize("where", ["save", "save broken", "close"])
def test_a_second_sigint_during_the_final_save_or_the_env_close_exits_130_in_one_line(tmp_path, capsys, where):
    # The races CI hit: the second SIGINT landed while the env workers were being closed, and
    # inside torch.save, whose zip writer, left mid-record, then failed to close ("unexpected
    # pos"), a RuntimeError that save_checkpoint reports as a failed write.
    config = cartpole_config(total_timesteps=80)
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)

    def second_sigint(*args, **kwargs):
        trainer.stop.second_signal = "SIGINT"  # what GracefulStop's handler records before it raises
        if where == "save broken":
            raise WriteFailed(tmp_path / "checkpoints" / "latest.pt", RuntimeError("[enforce fail at "
                              "inline_container.cc:672] . unexpected pos 12864 vs 12816"))
        raise KeyboardInterrupt

    checkpoints = next(c for c in trainer.callbacks.callbacks if isinstance(c, CheckpointCallback))
    setattr(checkpoints if where.startswith("save") else trainer, where.split()[0], second_sigint)
    outcome = trainer.train()
    assert capsys.readouterr().err == ""  # the Trainer prints no error line: the script does
    assert exit_code(outcome, "train.py") == 130
    # The message says truthfully what the run directory holds: the interrupted final save wrote
    # nothing (and this run had written no periodic checkpoint); an interrupted close comes after it.
    kept = "no checkpoint was written" if where.startswith("save") else "checkpoints/latest.pt holds step 80"
    assert capsys.readouterr().err == f"train.py: error: second SIGINT: exiting at once; {kept}\n"
    trainer.env.close()


@pytest.fixture
def sigint_handler_kept():
    """Give back this process's SIGINT handler, and the stop flag and the stop's time, that run_cli changes."""
    from acer_sync.base import errors

    handler, was_set, last_stop = signal.getsignal(signal.SIGINT), errors.STOP_SIGNALLED.is_set(), errors._last_stop
    errors._last_stop = None  # a stop signal of an earlier test less than a second ago is no concern of this one
    yield
    signal.signal(signal.SIGINT, handler)
    errors._last_stop = last_stop
    if not was_set:
        errors.STOP_SIGNALLED.clear()


def test_run_cli_turns_an_unhandled_ctrl_c_into_one_line_and_exit_130(capsys, sigint_handler_kept):
    from acer_sync.base.errors import run_cli

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        run_cli(interrupted, "play.py")
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "play.py: interrupted\n"


def test_a_second_signal_exits_130_and_keeps_a_loadable_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    process = start_long_cartpole_run(run_dir, 2, "--checkpoint-every", "40")
    try:
        while not (run_dir / "checkpoints" / "latest.pt").exists():
            time.sleep(0.1)
        # SIGINT 20 ms after SIGTERM: a second signal (the same one so soon would be the first
        # delivered twice), landing in the clean shutdown or after it
        process.send_signal(signal.SIGTERM)
        time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    # Whether the SIGINT lands before or after the clean shutdown finished, the process
    # exits 130 without a traceback and the checkpoint on disk loads.
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert load_checkpoint(run_dir)["counters"]["timesteps"] > 0


def assert_ctrl_c_during_slow_clean_up_exits_130_at_once(script: Path, started_line: str) -> None:
    """Run ``script``; once it prints ``started_line`` (its clean-up, 5 s long, has begun), send
    SIGINT: it must exit 130 within 4 s, with no traceback and no KeyboardInterrupt."""
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == started_line + "\n"
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert time.monotonic() - started < 4  # at once, not after the finalizer


def test_ctrl_c_during_teardown_after_an_interrupted_run_exits_130_in_silence(tmp_path):
    # The run has stopped for a first SIGINT and returns 130; a finalizer is still running (here
    # an atexit callback standing in for the env pipes' finalizers) when the second one lands.
    script = tmp_path / "teardown.py"
    script.write_text(
        "import atexit, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from acer_sync.base.errors import EXIT_INTERRUPTED, run_cli\n"
        "atexit.register(lambda: (print('tearing down', flush=True), time.sleep(5)))\n"
        "run_cli(lambda: EXIT_INTERRUPTED, 'teardown.py')\n"
    )
    assert_ctrl_c_during_slow_clean_up_exits_130_at_once(script, "tearing down")


def test_ctrl_c_while_the_stopped_trainer_is_freed_exits_130_in_silence(tmp_path):
    # The race CI hit: the Trainer had stopped for the first SIGINT and given the handler back, and
    # the second one landed in a finalizer of its env workers (multiprocessing's Finalize), run as
    # api.run returned and freed the Trainer, before run_cli had main's exit code.
    script = tmp_path / "freed.py"
    script.write_text(
        "import multiprocessing.util, os, signal, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from acer_sync.base.errors import EXIT_INTERRUPTED, REPEAT_SECONDS, run_cli\n"
        "from acer_sync.training.signals import GracefulStop\n"
        "class Workers: pass\n"
        "def main():\n"
        "    workers = Workers()\n"
        "    multiprocessing.util.Finalize(workers, lambda: (print('freeing', flush=True), time.sleep(5)))\n"
        "    with GracefulStop() as stop:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        while stop.signal_name is None:\n"
        "            time.sleep(0.01)\n"
        "    time.sleep(REPEAT_SECONDS)  # a second Ctrl-C, not the first one delivered again\n"
        "    del workers\n"
        "    return EXIT_INTERRUPTED\n"
        "run_cli(main, 'freed.py')\n"
    )
    assert_ctrl_c_during_slow_clean_up_exits_130_at_once(script, "freeing")


def test_a_periodic_buffer_written_while_the_run_goes_on_holds_its_checkpoints_step(tmp_path, monkeypatch):
    # A periodic checkpoint's buffer is written in a thread while the run stores on (here the
    # first reads wait, up to 0.5 s a write, for a segment stored over them): the file is the
    # buffer of the checkpoint's step, and on_checkpoint sees it written.
    import shutil

    from acer_sync.replay.frozen import FrozenArray
    from acer_sync.training.checkpoint import BUFFER_FILE

    read, overwritten, deadlines = FrozenArray.read, [], {}

    def read_after_a_store(frozen, start, stop):
        deadline = deadlines.setdefault(threading.get_ident(), time.monotonic() + 0.5)  # a thread a write
        while start == 0 and not frozen.kept and time.monotonic() < deadline:
            time.sleep(0.002)
        overwritten.append(bool(frozen.kept))
        return read(frozen, start, stop)

    monkeypatch.setattr(FrozenArray, "read", read_after_a_store)
    states, copies = {}, {}

    class AtEachStep(acer_sync.Callback):  # the users' callbacks run before the checkpoint's
        def on_rollout_end(self, trainer, row):
            states[trainer.timesteps] = {name: np.array(array, copy=True) for name, array in trainer.buffer.state().items()}

    def copy_buffer(latest):
        step = load_checkpoint(latest.parent.parent)["counters"]["timesteps"]
        shutil.copyfile(latest.parent / BUFFER_FILE, tmp_path / f"buffer_{step}.npz")
        copies[step] = tmp_path / f"buffer_{step}.npz"

    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=480, checkpoint_every=160, save_buffer=True,
                    num_envs=2, nsteps=20, buffer_size=200, replay_start=40, vec_env="sync", device="cpu", eval_every=0, progress_bar=False,
                    verbose=0, callbacks=[AtEachStep()], on_checkpoint=copy_buffer)
    assert sorted(copies) == [160, 320, 480] and any(overwritten)
    for step, path in copies.items():
        with np.load(path) as saved:
            assert int(saved["checkpoint_step"]) == step
            for name, array in states[step].items():
                assert np.array_equal(saved[name], array), (step, name)


def test_an_on_checkpoint_that_raises_does_not_keep_the_final_checkpoint_from_being_written(tmp_path, monkeypatch):
    # The run ends while a periodic checkpoint's buffer (step 480's, its reads slowed here) is still
    # written: the final save waits for it, and the on_checkpoint call it owed came before the final
    # latest.pt (520), whose write an exception there skipped. It is made for the final one only.
    from acer_sync.replay.frozen import FrozenArray

    read, writers, calls = FrozenArray.read, [], []

    def read_slowly_in_the_second_write(frozen, start, stop):
        if threading.current_thread() not in writers:
            writers.append(threading.current_thread())
        if len(writers) > 1 and threading.current_thread() is writers[1]:
            time.sleep(0.05)
        return read(frozen, start, stop)

    def fails(latest):
        calls.append(load_checkpoint(latest.parent.parent)["counters"]["timesteps"])
        if calls[-1] >= 480:
            raise RuntimeError("upload failed")

    monkeypatch.setattr(FrozenArray, "read", read_slowly_in_the_second_write)
    settings = dict(total_timesteps=500, checkpoint_every=240, save_buffer=True, num_envs=2, nsteps=20, buffer_size=200,
                    replay_start=40, vec_env="sync", device="cpu", eval_every=0, progress_bar=False, verbose=0)
    with pytest.raises(RuntimeError, match="^upload failed"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", on_checkpoint=fails, **settings)
    assert calls == [240, 520] and load_checkpoint(tmp_path / "run")["counters"]["timesteps"] == 520


def test_a_buffer_save_removes_the_stale_one_first_and_a_run_ending_on_a_checkpoint_writes_it_once(tmp_path, monkeypatch):
    # latest.pt is written first, so the old buffer.npz was already unusable, yet it stayed on disk
    # while the new one was written (twice the buffer's disk); and a run whose last step was a
    # checkpoint's wrote the buffer twice there.
    import acer_sync.training.callbacks as callbacks_module
    from acer_sync.training.checkpoint import BUFFER_FILE

    writes, save_buffer = [], callbacks_module.save_buffer

    def watched(directory, buffer, timesteps, run_key):  # the run's final save
        writes.append((timesteps, (directory / BUFFER_FILE).exists()))
        save_buffer(directory, buffer, timesteps, run_key)

    class Watched(callbacks_module.BufferWriter):  # a periodic one's, in a thread
        def __init__(self, directory, buffer, timesteps, run_key):
            writes.append((timesteps, (directory / BUFFER_FILE).exists()))
            super().__init__(directory, buffer, timesteps, run_key)

    monkeypatch.setattr(callbacks_module, "save_buffer", watched)
    monkeypatch.setattr(callbacks_module, "BufferWriter", Watched)
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=480, checkpoint_every=160,
                              save_buffer=True, num_envs=2, nsteps=20, vec_env="sync", device="cpu", eval_every=0,
                              progress_bar=False)
    assert writes == [(160, False), (320, False), (480, False)]
    writes.clear()
    acer_sync.train(resume=run_dir, total_timesteps=480, progress_bar=False)  # nothing left to do: the buffer stays
    assert writes == []
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False)
    assert writes == [(520, False)]

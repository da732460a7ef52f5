"""Ctrl-C and SIGTERM reach the trainer at every point of a run, on the subproc backend too.

gymnasium's AsyncVectorEnv builds one env in the trainer's own process to read the spaces, so
anything env creation does to signal handlers would happen to the trainer; these tests signal after
every phase that builds or uses envs (env creation, the first evaluation, replay start, a checkpoint).
"""

import ast
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from acer_sync.base.config import build_config
from acer_sync.base.errors import EXIT_CODES, REPEAT_SECONDS
from acer_sync.base.outcome import Stop
from acer_sync.training.callbacks import CheckpointCallback, EvalCallback
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from acer_sync.training.signals import GracefulStop
from atari.envs import env_info
from helpers import ROOT, read_progress


def callback_of(trainer, kind):
    """The trainer's built-in callback of class ``kind``."""
    return next(callback for callback in trainer.callbacks.callbacks if isinstance(callback, kind))


def handler_owner(handler) -> object:
    """The object a bound-method handler belongs to (None for SIG_IGN, SIG_DFL and plain functions)."""
    return getattr(handler, "__self__", None)


def test_the_trainers_sigint_handler_is_its_own_after_every_phase(tmp_path):
    config = build_config(False, dict(
        env="CartPole-v1", vec_env="subproc", device="cpu", num_envs=2, nsteps=5, total_timesteps=120,
        buffer_size=100, replay_start=20, eval_every=30, eval_episodes=2, checkpoint_every=50, log_interval=1,
    ))
    before = signal.getsignal(signal.SIGINT)
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)
    assert signal.getsignal(signal.SIGINT) is before, "building the subproc envs changed the SIGINT handler"
    seen: dict[str, object] = {}

    def record_after(name: str, method):
        def wrapped(*args, **kwargs):
            result = method(*args, **kwargs)
            seen.setdefault(name, signal.getsignal(signal.SIGINT))
            return result
        return wrapped

    evaluation = callback_of(trainer, EvalCallback)
    evaluation.evaluate = record_after("first evaluation", evaluation.evaluate)
    checkpoints = callback_of(trainer, CheckpointCallback)
    checkpoints.save = record_after("checkpoint", checkpoints.save)
    learn = trainer.learn

    def learn_then_note_replay():
        learn()
        if trainer.updates > trainer.iterations:  # an off-policy update ran: replay has started
            seen.setdefault("replay start", signal.getsignal(signal.SIGINT))

    trainer.learn = learn_then_note_replay
    assert trainer.train().finished
    assert set(seen) == {"first evaluation", "checkpoint", "replay start"}
    for phase, handler in seen.items():
        assert isinstance(handler_owner(handler), GracefulStop), f"after the {phase} SIGINT went to {handler!r}"
    assert signal.getsignal(signal.SIGINT) is before  # train() restores the handlers it replaced


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_an_evaluation_saves_exits_130_and_the_run_resumes(tmp_path, signum):
    run_dir = tmp_path / "run"
    train = [sys.executable, str(ROOT / "train.py")]
    process = subprocess.Popen(
        [*train, "--env", "CartPole-v1", "--vec-env", "subproc", "--num-envs", "2", "--total-timesteps", "10000000",
         "--eval-every", "400", "--eval-episodes", "2", "--log-interval", "1", "--run-dir", str(run_dir), "--no-progress",
         "--compile", "off"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 120
        evaluated = False
        while time.time() < deadline and not evaluated:
            time.sleep(0.2)
            evaluated = (run_dir / "progress.csv").exists() and any(
                int(row["eval_episodes"]) > 0 for row in read_progress(run_dir)
            )
        assert evaluated, "no evaluation was logged within 120 s"
        sent = time.time()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert time.time() - sent < 15
    assert f"{signal.Signals(signum).name} received" in stdout and "Traceback" not in stderr
    saved_steps = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert saved_steps >= 400
    # the summary names the signal (it said "stopped by SIGINT or SIGTERM" for either)
    assert stdout.splitlines()[-1].startswith(f"train.py: stopped by {signal.Signals(signum).name}: {saved_steps:,} steps in ")

    resumed = subprocess.run(
        [*train, "--resume", str(run_dir), "--total-timesteps", str(saved_steps + 160), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {saved_steps}" in resumed.stdout
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) == saved_steps + 160


def small_cartpole_trainer(run_dir):
    """A short in-process CartPole run on the sync backend, for tests that patch the loop."""
    config = build_config(False, dict(
        env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5, total_timesteps=10_000,
        buffer_size=100, replay_start=20, eval_every=0, checkpoint_every=10_000, log_interval=1,
    ))
    return build_trainer(config, env_info("CartPole-v1"), run_dir, progress_bar=False)


def test_a_second_sigint_that_the_final_save_turns_into_another_error_still_exits_130(tmp_path, capsys):
    # torch.save's zip writer re-raises a KeyboardInterrupt that lands in it as a RuntimeError from
    # its __exit__; the trainer must still take it for the second Ctrl-C, not crash with a traceback.
    trainer = small_cartpole_trainer(tmp_path)
    learn = trainer.learn

    def first_sigint_after_an_iteration():
        learn()
        os.kill(os.getpid(), signal.SIGINT)
        trainer.stop.last_signal = (signal.SIGINT, trainer.stop.signal_time - REPEAT_SECONDS)  # the next: a second later

    def save_interrupted_by_a_second_sigint(trainer, periodic):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos 64 vs 0") from interrupt

    trainer.learn = first_sigint_after_an_iteration
    callback_of(trainer, CheckpointCallback).save = save_interrupted_by_a_second_sigint
    outcome = trainer.train()
    assert outcome.stop is Stop.INTERRUPTED and EXIT_CODES[outcome.stop] == 130
    assert "second SIGINT: exiting at once" in outcome.error
    trainer.env.close()


def test_an_error_without_a_second_signal_is_not_taken_for_one(tmp_path):
    trainer = small_cartpole_trainer(tmp_path)

    def failing_iteration():
        raise RuntimeError("a real bug")

    trainer.collect = failing_iteration
    with pytest.raises(RuntimeError, match="a real bug"):
        trainer.train()
    trainer.env.close()


def test_the_atari_package_never_imports_the_trainer_package():
    for path in (ROOT / "atari").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            assert not any(name.split(".")[0] == "acer_sync" for name in names), f"{path.name} imports {names}"


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the workers are forked only where fork is the start method")
def test_a_subproc_worker_is_born_with_sigint_and_sigterm_blocked_until_its_own_handlers_are_in(tmp_path, monkeypatch):
    # A forked worker inherits the trainer's handlers until _subproc_worker replaces them: a SIGTERM
    # in between ran run_cli's handler in the worker and printed its traceback. The fork now blocks
    # both signals (a signal sent then waits), and the worker unblocks them once its own are set.
    import atari.envs as envs

    record, parent, real_signal, real_worker = tmp_path / "masks", os.getpid(), signal.signal, envs._async_worker

    def blocked() -> str:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        return " ".join(sorted(sig.name for sig in envs.WORKER_SIGNALS if sig in held)) or "none"

    def note(moment: str) -> None:
        if os.getpid() != parent:
            with record.open("a") as handle:
                handle.write(f"{os.getpid()} {moment}: {blocked()}\n")

    def recording_signal(signum, handler):
        if signum == signal.SIGINT:
            note("before its handlers")
        return real_signal(signum, handler)

    def recording_worker(*args):
        note("in gymnasium's worker")
        return real_worker(*args)

    monkeypatch.setattr(signal, "signal", recording_signal)
    monkeypatch.setattr(envs, "_async_worker", recording_worker)
    mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    vec = envs.VecEnv(env_info("CartPole-v1"), 2, "subproc")
    try:
        vec.reset(seed=0)
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before  # the trainer's own mask is back
    finally:
        vec.close()
    lines = sorted(record.read_text().splitlines())
    assert [line.split(" ", 1)[1] for line in lines] == ["before its handlers: SIGINT SIGTERM", "in gymnasium's worker: none"] * 2

    def forked_blocked() -> str:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, blocked().encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            return pipe.read()

    assert forked_blocked() == "none"  # outside the construction, a fork is untouched
    with envs._workers_forking():
        assert forked_blocked() == "SIGINT SIGTERM" and blocked() == "none"
        seen = []  # another thread's fork, while this thread builds its workers, is that thread's own
        thread = threading.Thread(target=lambda: seen.append(forked_blocked()))
        thread.start()
        thread.join()
        assert seen == ["none"]
        signal.pthread_sigmask(signal.SIG_BLOCK, envs.WORKER_SIGNALS)  # as if a fork's restore had been cut short
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before  # the end of the block restores it anyway

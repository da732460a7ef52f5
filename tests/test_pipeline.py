"""``--pipeline overlap`` (issue 35): the learner trains on segment k while the envs collect k+1 in
a thread, with the weights of the last finished update; deterministic for a seed, and signals,
checkpoints, resume, evaluation and env faults behave as in serial mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import faulty_envs
import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config, pipeline_mode
from acer_sync.rollout.background import ActingCopy, BackgroundCollector
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info, process_continues
from atari.errors import EnvFailed, EnvTimedOut
from helpers import ROOT, gaussian_net, read_progress, requires_cuda

FAULTY = f"faulty_envs:{faulty_envs.ENV_ID}"


def overlap_run(run_dir, seed=0, **settings):
    config = build_config(False, {**dict(
        env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5, total_timesteps=600, buffer_size=100,
        replay_start=20, eval_every=0, log_interval=1, threads=1, seed=seed, hidden="16", pipeline="overlap"), **settings,
    })
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    trainer = build_trainer(config, env_info("CartPole-v1"), run_dir, on_progress=rows.append)
    assert trainer.train().finished
    return trainer, rows


def test_overlap_is_the_same_run_for_a_seed_and_acts_one_update_behind(tmp_path):
    first, first_rows = overlap_run(tmp_path / "a")
    second, second_rows = overlap_run(tmp_path / "b")
    timing = ("fps", "time_elapsed", "rss_mb", "eval_seconds")

    def values(rows):
        return np.array([[value for key, value in row.items() if key not in timing] for row in rows], dtype=float)

    assert len(first_rows) == len(second_rows) == 60
    assert np.array_equal(values(first_rows), values(second_rows), equal_nan=True)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    # 60 segments collected; the first of the session had nothing to learn from before it.
    assert first.iterations == 60 and first_rows[-1]["updates"] > 0
    assert first.runner.actor.model is first.acting.model is not first.model
    for acting, online in zip(first.acting.model.parameters(), first.model.parameters()):
        assert torch.equal(acting, online)  # handed over after the last update
    serial, _ = overlap_run(tmp_path / "c", pipeline="serial")
    assert serial.acting is None and serial.runner.actor.model is serial.model
    assert not all(torch.equal(a, b) for a, b in zip(first.model.parameters(), serial.model.parameters()))


def test_pipeline_auto_overlaps_atari_on_cuda_only():
    # Where it was measured faster: Atari's envs (ale) on CUDA (an H200, 1.42x at the Pong
    # defaults). On a CPU the learner and the envs share the cores; sync envs step in the
    # trainer's own Python; subproc's was not measured on a GPU.
    auto = build_config(True, {"env": "PongNoFrameskip-v4"})
    assert auto.pipeline == "auto"
    assert pipeline_mode(auto, "cuda", "ale") == "overlap"
    for device_type, backend in (("cpu", "ale"), ("cuda", "sync"), ("cuda", "subproc"), ("cpu", "subproc"), ("mps", "ale")):
        assert pipeline_mode(auto, device_type, backend) == "serial", (device_type, backend)
    for mode in ("serial", "overlap"):  # a mode given is the mode taken, everywhere
        given = build_config(True, {"env": "PongNoFrameskip-v4", "pipeline": mode})
        assert {pipeline_mode(given, device_type, backend) for device_type in ("cpu", "cuda") for backend in ("ale", "sync")} == {mode}


def test_the_default_pipeline_on_a_cpu_is_serial(tmp_path):
    # --pipeline auto on a CPU is the serial loop, bit for bit: the run of the default is the run of serial.
    auto, _ = overlap_run(tmp_path / "auto", pipeline="auto")
    serial, _ = overlap_run(tmp_path / "serial", pipeline="serial")
    assert auto.acting is None and auto.collector is None
    for a, b in zip(auto.model.parameters(), serial.model.parameters()):
        assert torch.equal(a, b)


@requires_cuda
def test_cuda_pipeline_auto_overlaps_an_atari_run_and_says_so(tmp_path, caplog):
    config = build_config(True, dict(env="PongNoFrameskip-v4", device="cuda", num_envs=2, nsteps=5, total_timesteps=40,
                                     buffer_size=100, replay_start=20, eval_every=0, log_interval=1, threads=2))
    with caplog.at_level("INFO", logger="acer_sync"):
        trainer = build_trainer(config, env_info("PongNoFrameskip-v4"), tmp_path, builtin=False)
    trained = False
    try:
        assert trainer.acting is not None and trainer.collector is not None
        assert "--pipeline auto: the learner trains while the envs collect in a thread (Atari on CUDA" in caplog.text
        trained = True
        assert trainer.train().finished  # it closes the envs at its end
    finally:
        if not trained:
            trainer.close()


@requires_cuda
def test_cuda_overlap_acts_on_a_stream_of_its_own(tmp_path):
    # Acting's kernels and its per-step read of actions and μ do not queue behind the learner's
    # updates; the exchange still hands over the exact weights.
    trainer, rows = overlap_run(tmp_path, device="cuda")
    stream = trainer.acting.stream
    assert stream is not None and trainer.runner.stream is stream and stream != torch.cuda.default_stream()
    assert stream.priority < torch.cuda.current_stream().priority  # the scheduler starts acting's blocks first
    assert len(rows) == 60 and rows[-1]["updates"] > 0 and rows[-1]["nonfinite_updates"] == 0
    torch.cuda.synchronize()
    for acting, online in zip(trainer.acting.model.parameters(), trainer.model.parameters()):
        assert torch.equal(acting, online)


def test_the_acting_copy_takes_the_weights_and_gives_back_the_normalizers_statistics():
    online = gaussian_net((1, 3), 1, (8,), [0.5], normalize_obs=True)
    acting = ActingCopy(online)
    with torch.no_grad():
        next(online.parameters()).add_(1.0)
    acting.model.normalizer.update(torch.randn(16, 1, 3) * 5)
    acting.exchange()
    for a, b in zip(acting.model.parameters(), online.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(acting.model.buffers(), online.buffers(), strict=True):
        assert torch.equal(a, b)

    assert online.normalizer.count.item() > 1


class Calls:
    """An env's calls as a collecting thread makes them: ``call(seconds)`` is a step that takes that
    long (``hang`` one that returns when ``release`` is set), announced as VecEnv.current_call does."""

    def __init__(self):
        self.running: tuple[str, float, int] | None = None
        self.release = threading.Event()

    def call(self, seconds: float | None) -> None:
        self.running = ("step", time.monotonic(), process_continues())
        self.release.wait(seconds)
        self.running = None

    def collector(self, steps: list[float | None], env_id: str = "Hangs-v0") -> BackgroundCollector:
        def collect():
            for seconds in steps:
                self.call(seconds)
            return "segment"

        collector = BackgroundCollector(collect, env_id, lambda: self.running)
        collector.start()
        return collector


def test_a_collection_that_hangs_is_given_up_at_the_timeout_or_after_a_stop():
    calls = Calls()
    collector = calls.collector([None])
    started = time.monotonic()
    with pytest.raises(EnvTimedOut, match=r"^Hangs-v0's step did not return within --env-timeout 0.3 s$"):
        collector.wait(0.3, lambda: None, 10.0)
    assert time.monotonic() - started < 5
    signal_time = time.monotonic()  # the step hangs on: the stop's grace is the step's
    with pytest.raises(EnvTimedOut, match=r"^Hangs-v0's step had not returned 0.3 s after SIGTERM$"):
        collector.wait(0, lambda: ("SIGTERM", signal_time), 0.3)
    calls.release.set()

    def fails():
        raise EnvFailed("Breaks-v0 raised RuntimeError in step: no")

    failing = BackgroundCollector(fails, "Breaks-v0", lambda: None)
    failing.start()
    with pytest.raises(EnvFailed, match="^Breaks-v0 raised RuntimeError in step: no$"):
        failing.wait(0, lambda: None, 10.0)


def test_a_stop_of_the_whole_process_is_not_the_envs_time(monkeypatch):
    # Ctrl-Z, kill -STOP, a batch system's suspend: the clock jumps 3 s between two polls of the
    # waiter, in the middle of a call of healthy 10 ms steps, and --env-timeout is 1.5 s.
    real, offset = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real() + offset[0])
    calls = Calls()

    def collect():
        for step in range(100):
            if step == 50:
                calls.running = ("step", time.monotonic(), process_continues())
                offset[0] += 3.0  # stopped while this step ran
                time.sleep(0.2)
                calls.running = None
            calls.call(0.01)
        return "segment"

    collector = BackgroundCollector(collect, "Hangs-v0", lambda: calls.running)
    collector.start()
    assert collector.wait(1.5, lambda: None, 10.0) == "segment"


def test_the_timeout_and_the_stop_grace_are_each_env_calls_as_in_serial_mode():
    # --env-timeout is the time one env step may take, not a segment's collection: 8 healthy steps
    # of 0.15 s outlast a timeout of 0.5 s together.
    assert Calls().collector([0.15] * 8).wait(0.5, lambda: None, 10.0) == "segment"
    # After a stop, the step running then gets the grace; the segment's later steps get the timeout.
    signal_time = time.monotonic()
    collector = Calls().collector([0.15] * 8)
    assert collector.wait(0.5, lambda: ("SIGINT", signal_time), 0.3) == "segment"
    calls = Calls()
    collector = calls.collector([0.15, None])
    time.sleep(0.05)
    signal_time = time.monotonic()
    with pytest.raises(EnvTimedOut, match=r"^Hangs-v0's step did not return within --env-timeout 0.5 s$"):
        collector.wait(0.5, lambda: ("SIGINT", signal_time), 0.3)  # the hung step began after the signal
    calls.release.set()


def run_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "--no-progress"], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})


@pytest.mark.parametrize("fault, backend, code, message", [
    ("raise", "sync", 3, f"{FAULTY} raised RuntimeError in step: sensor cable unplugged"),
    ("hang", "sync", 6, f"{FAULTY}'s step did not return within --env-timeout 1 s"),
    # worker processes: the hung one is terminated at the close, not waited on (it waited forever)
    ("hang", "subproc", 6, f"{FAULTY}'s step did not return within --env-timeout 1 s"),
])
def test_an_env_fault_in_the_collecting_thread_stops_as_in_serial_mode(tmp_path, fault, backend, code, message):
    run_dir = tmp_path / "run"
    result = run_train("--env", FAULTY, "--env-kwargs", f"fault={fault}", "at_step=130", "--vec-env", backend,
                       "--num-envs", "2", "--total-timesteps", "100000", "--eval-every", "0", "--env-timeout", "1",
                       "--pipeline", "overlap", "--run-dir", str(run_dir), timeout=60)
    assert result.returncode == code, result.stderr
    # Each env's step 130 falls in the 7th segment, collected while the 6th was learned from.
    assert result.stderr.strip() == f"train.py: error: {message}; saved a checkpoint at step 240"
    counters = load_checkpoint(run_dir)["counters"]
    assert counters["timesteps"] == 240
    assert counters["unlearned_segments"] == 0  # the 6th had its update before the 7th failed (it counted 1)


def test_a_step_that_returns_after_its_timeout_changes_nothing_the_run_put_back(tmp_path):
    # The second env's step 30 takes 2 s, past --env-timeout 1 s, and ends its game: the run stops
    # there with the games of the segment it drops put back. When the step returns after all, the
    # collecting thread stops at once: it counted that game and went on acting.
    first = next(faulty_envs._instances) + 2  # the probe, then the training envs
    kwargs = {"fault": "stall", "at_step": 30, "from_instance": first + 1}
    info = env_info(FAULTY, kwargs)
    config = build_config(False, dict(
        env=FAULTY, env_kwargs=kwargs, vec_env="sync", device="cpu",
        num_envs=2, nsteps=5, total_timesteps=600, buffer_size=100, replay_start=20, eval_every=0, log_interval=1,
        threads=1, hidden="16", pipeline="overlap", env_timeout=1.0,
    ))
    (tmp_path / "run").mkdir()
    trainer = build_trainer(config, info, tmp_path / "run")
    outcome = trainer.train()
    assert not outcome.finished and "did not return within --env-timeout 1 s" in outcome.error
    counted, thread = trainer.tracker.counted(), trainer.collector._thread
    thread.join(5)
    assert not thread.is_alive()
    assert trainer.tracker.counted() == counted
    saved = load_checkpoint(tmp_path / "run")
    assert saved["counters"]["timesteps"] == trainer.timesteps


def test_sigint_saves_exits_130_and_the_run_resumes_overlapped_with_evaluations(tmp_path):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", "--vec-env", "sync", "--num-envs", "2",
         "--total-timesteps", "10000000", "--eval-every", "400", "--eval-episodes", "2", "--log-interval", "1",
         "--pipeline", "overlap", "--run-dir", str(run_dir), "--no-progress", "--compile", "off"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not ((run_dir / "progress.csv").exists() and any(
                int(row["eval_episodes"]) > 0 for row in read_progress(run_dir))):
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and "SIGINT received" in stdout and "Traceback" not in stderr, stderr
    saved = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert saved >= 400
    resumed = run_train("--resume", str(run_dir), "--total-timesteps", str(saved + 160))
    assert resumed.returncode == 0 and f"resuming at step {saved}" in resumed.stdout, resumed.stderr
    rows = read_progress(run_dir)
    assert int(rows[-1]["total_timesteps"]) == saved + 160
    assert np.isfinite([float(row["eval_mean"]) for row in rows if int(row["eval_episodes"]) > 0]).all()


@requires_cuda
@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_cuda_compile_graph_acts_through_a_cuda_graph_beside_the_graphed_update(tmp_path, pipeline):
    # --compile graph on CUDA replays acting as a CUDA graph of its own (overlapped: on the acting
    # stream, while the learner updates; serial: on the learner's stream, with the default
    # generator), reading the weights in place: the run trains and finishes.
    trainer, rows = overlap_run(tmp_path, device="cuda", compile="graph", pipeline=pipeline)
    assert trainer.runner.actor.graph is not None and trainer.runner.actor.graph.captured
    assert len(rows) == 60 and rows[-1]["updates"] > 0 and rows[-1]["nonfinite_updates"] == 0

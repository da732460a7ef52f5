"""Shared by the tests that drive train.py through a subprocess."""

import contextlib
import csv
import importlib
import io
import platform
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from acer_sync.replay.buffer import Batch, empty_segment

ROOT = Path(__file__).resolve().parents[1]
#: A test that needs a CUDA device: skipped here; tools/gpu_report.sh runs it on a GPU box (``-k cuda``).
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tools/gpu_report.sh runs it on a GPU box)")


def on_glibc() -> bool:
    """Whether this Python runs on glibc (whose malloc acer_sync.base.malloc tunes)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def read_progress(run_dir: Path) -> list[dict]:
    with open(run_dir / "progress.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def start_long_cartpole_run(run_dir: Path, num_envs: int, *extra: str) -> subprocess.Popen:
    """Start a long CartPole training on the subproc backend; return once it logged a row."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", "--vec-env", "subproc",
         "--num-envs", str(num_envs), "--total-timesteps", "10000000", "--log-interval", "1",
         "--run-dir", str(run_dir), "--no-progress", "--compile", "off", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not ((run_dir / "progress.csv").exists() and read_progress(run_dir)):
        time.sleep(0.2)
    return process


def stop_in_the_iteration_ending_at(trainer, step: int) -> None:
    """A SIGINT (``trainer.request_stop``) in the iteration whose segment ends at ``step``, after its
    update: the stop is honoured at that iteration's end, before its evaluation is played.
    Overlapped, the update runs while that segment is collected, one segment earlier."""
    learn = trainer.learn
    learning_at = step if trainer.collector is None else step - trainer.steps_per_iteration

    def learn_then_stop():
        learn()
        if trainer.timesteps == learning_at:
            trainer.request_stop("SIGINT")

    trainer.learn = learn_then_stop


def run_here(script: str, *args) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` (train.py, play.py, plot.py, sweep.py) run in this process, as the
    script runs its command (:func:`acer_sync.base.errors.run_cli`: its error lines and exit codes),
    its output captured: a subprocess's result without the 2 s of a Python that imports torch. For
    what fails before any env or training starts; the process's signal handlers and global random
    states (a run seeds them before some of its checks) are given back."""
    from acer_sync.base.errors import STOP_SIGNALS, run_cli

    command = script.removesuffix(".py")
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    python_random, numpy_random = random.getstate(), np.random.get_state()
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), torch.random.fork_rng():
            try:
                run_cli(lambda: importlib.import_module(f"acer_sync.cli.{command}").main(list(map(str, args)), script), script)
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        random.setstate(python_random)
        np.random.set_state(numpy_random)
    return subprocess.CompletedProcess([script, *map(str, args)], code, stdout.getvalue(), stderr.getvalue())


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """Assert a user error: exit code 2 and one stderr line without a traceback; return the line."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def breakout_with_an_lstm():
    """Breakout (frame stacks cleared at lost lives, the forced FIRE after them) and a small
    ``cnn_lstm`` for it, seeded: ``(info, model, the buffer's fields)``, for collections compared bit for bit."""
    from acer_sync.base.config import build_config
    from acer_sync.nets.build import build_model
    from acer_sync.nets.distributions import distribution_for
    from acer_sync.replay.buffer import buffer_fields
    from atari.envs import env_info

    info = env_info("BreakoutNoFrameskip-v4")
    torch.manual_seed(0)
    model = build_model(info, build_config(False, dict(env="BreakoutNoFrameskip-v4", network="cnn_lstm", lstm_size=16)))
    return info, model, buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info), model.state_shapes)


def assert_segments_equal(expected, got, rows: slice = slice(None), where: object = None) -> None:
    """Every field of Segment ``expected`` equals, bit for bit, the env columns ``rows`` of ``got``
    (its recurrent state's rows), ``where`` naming the pair in a failure."""
    for name, value in expected._asdict().items():
        if name == "state":
            assert all(np.array_equal(a, b[rows]) for a, b in zip(value, got.state, strict=True)), (where, name)
        else:
            assert np.array_equal(value, getattr(got, name)[:, rows]), (where, name)


def random_batch(T, N, obs_shape, n_actions, gaussian, seed, frames=False, timeout_values=None) -> dict:
    """The fields of a random update batch (obs [T+1, N, ...], actions, μ, rewards, dones), from ``seed``.

    Frames are uint8 with ``frames``, else standard normal; μ is a softmax for discrete actions, a
    Gaussian's [mean, log σ = −1] for ``gaussian`` ones (``n_actions`` then is the action's size).
    """
    g = torch.Generator().manual_seed(seed)
    if frames:
        obs = torch.randint(0, 256, (T + 1, N, *obs_shape), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn(T + 1, N, *obs_shape, generator=g)
    if gaussian:
        actions = torch.randn(T, N, n_actions, generator=g)
        mu = torch.cat([torch.randn(T, N, n_actions, generator=g) * 0.1, torch.full((T, N, n_actions), -1.0)], -1)
    else:
        actions = torch.randint(0, n_actions, (T, N), generator=g)
        mu = torch.softmax(torch.randn(T, N, n_actions, generator=g), -1)
    return dict(
        obs=obs, actions=actions, mu=mu, rewards=torch.randn(T, N, generator=g),
        dones=(torch.rand(T, N, generator=g) < 0.2).float(), timeout_values=timeout_values,
    )


def ff_batch(obs, actions, mu, rewards, dones, timeout_values=None) -> Batch:
    """An update batch for a feed-forward network: no episode starts inside, no recurrent state."""
    T, N = actions.shape[:2]
    return Batch(
        obs=obs, firsts=torch.zeros(T + 1, N, dtype=torch.bool), actions=actions, mu=mu, rewards=rewards, dones=dones,
        timeout_values=timeout_values, state=(),
    )


def features_of(model, obs: torch.Tensor) -> torch.Tensor:
    """A feed-forward network's features of observations ``[B, ...]``, for its heads."""
    return model.step(obs, model.initial_state(len(obs)), torch.zeros(len(obs), dtype=torch.bool))[0]


class NeverFire(torch.nn.Module):
    """A policy that always plays NOOP: on its own it would never serve again after a lost life."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.n_actions = n_actions

    def initial_state(self, n: int) -> tuple:
        return ()

    def step(self, obs: torch.Tensor, state: tuple, first: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return obs, state

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        pi = torch.zeros(len(features), self.n_actions)
        pi[:, 0] = 1.0
        return pi


#: A sweep trial's first line: the process and the node it runs on (acer_sync/sweeps/trial.py).
TRIAL_PROCESS = re.compile(r"^\[trial (?P<trial>[^\]]+)\] running in process (?P<pid>\d+) on node \S+ \(node id (?P<node>\w+)\)$", re.M)
#: A resumed trial's line from the Trainer.
TRIAL_RESUMES = re.compile(r"^\[trial (?P<trial>[^\]]+)\] resuming at step (?P<step>\d+):", re.M)


def trial_processes(sweep_output: str, trial: str) -> list[tuple[int, str]]:
    """(process id, node id) of each start of ``trial``, in order, from sweep.py's output."""
    return [(int(match["pid"]), match["node"]) for match in TRIAL_PROCESS.finditer(sweep_output) if match["trial"] == trial]


def trial_resume_steps(sweep_output: str, trial: str) -> list[int]:
    """The step of each resume of ``trial``, in order, from sweep.py's output."""
    return [int(match["step"]) for match in TRIAL_RESUMES.finditer(sweep_output) if match["trial"] == trial]


def wait_for(condition, what: str, process: subprocess.Popen, log: Path, seconds: float):
    """Poll ``condition()`` until it returns something truthy; fail if sweep.py exits first."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            pytest.fail(f"sweep.py exited ({process.returncode}) before {what}:\n{log.read_text()}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()}")


class OverflowingRewardsAfter(gym.Wrapper):
    """CartPole whose rewards are 3e38 from this env instance's step ``first_huge_step`` on: finite
    as the env returns them (so the env check lets them through), they overflow float32 in the
    returns, and every update from then on is non-finite."""

    first_huge_step = 30

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return obs, 3e38 if self.steps >= self.first_huge_step else reward, terminated, truncated, info


def categorical_net(obs_shape, n_actions, arch, hidden=(64, 64), normalize_obs=False):
    """A softmax actor-critic (feed-forward torso ``arch``: mlp or cnn), freshly initialised."""
    from acer_sync.nets.networks import network_from_spec

    return network_from_spec(dict(obs_shape=list(obs_shape), n_actions=n_actions, arch=arch,
                                  hidden=list(hidden) if arch == "mlp" else [], policy="categorical",
                                  normalize_obs=normalize_obs))


def recurrent_net(obs_shape, n_actions, arch, hidden=(64, 64), lstm_size=128, normalize_obs=False):
    """A softmax actor-critic with an LSTM (``arch``: lstm or cnn_lstm), freshly initialised."""
    from acer_sync.nets.networks import network_from_spec

    return network_from_spec(dict(obs_shape=list(obs_shape), n_actions=n_actions, arch=arch,
                                  hidden=list(hidden) if arch == "lstm" else [], policy="categorical",
                                  normalize_obs=normalize_obs, lstm_size=lstm_size))


def gaussian_net(obs_shape, action_dim, hidden, init_std, normalize_obs=False, arch="mlp", lstm_size=128):
    """A Gaussian policy with an SDN (``arch``: mlp, or lstm), freshly initialised."""
    from acer_sync.nets.networks import network_from_spec

    spec = dict(obs_shape=list(obs_shape), n_actions=action_dim, arch=arch, hidden=list(hidden), policy="gaussian",
                normalize_obs=normalize_obs, init_std=[float(s) for s in init_std])
    if arch == "lstm":
        spec["lstm_size"] = lstm_size
    return network_from_spec(spec)


def random_segments(fields, nsteps: int, num_envs: int, count: int, seed: int = 0):
    """``count`` segments with small random integers in every field (the buffer parity tests)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        segment = empty_segment(fields, nsteps, num_envs)
        for array in (*segment[:-1], *segment.state):
            array[...] = rng.integers(0, 5, array.shape).astype(array.dtype)
        yield segment

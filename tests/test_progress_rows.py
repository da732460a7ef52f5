"""When the Trainer writes a progress row: every log_interval iterations, or once log_seconds passed."""

import types

import gymnasium as gym
import pytest

import acer_sync.training.callbacks
from acer_sync.base.config import build_config, validate
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import read_progress

SECONDS_PER_ENV_STEP = 1.0
NUM_ENVS, NSTEPS = 2, 5  # 10 env steps, so 10 s of the fake clock, per iteration


class FakeClock:
    """Stands in for the ``time`` module in acer_sync.training.callbacks: its clock moves only when an env steps."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


CLOCK = FakeClock()


class SlowCartPole(gym.Wrapper):
    """CartPole whose every step takes SECONDS_PER_ENV_STEP on the fake clock."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action):
        CLOCK.now += SECONDS_PER_ENV_STEP
        return self.env.step(action)


gym.register("SlowCartPole-v0", entry_point=SlowCartPole)


def logged_iterations(tmp_path, monkeypatch, **settings) -> list[int]:
    monkeypatch.setattr(acer_sync.training.callbacks, "time", types.SimpleNamespace(perf_counter=CLOCK.perf_counter))
    config = build_config(False, dict(env="SlowCartPole-v0", vec_env="sync", device="cpu", num_envs=NUM_ENVS, nsteps=NSTEPS,
                                      total_timesteps=20 * NUM_ENVS * NSTEPS, eval_every=0, **settings))
    build_trainer(config, env_info("SlowCartPole-v0"), tmp_path, progress_bar=False).train()
    return [int(row["iterations"]) for row in read_progress(tmp_path)]


def test_a_row_comes_once_log_seconds_passed_even_before_log_interval(tmp_path, monkeypatch):
    assert logged_iterations(tmp_path, monkeypatch, log_interval=1000, log_seconds=25) == [3, 6, 9, 12, 15, 18, 20]


def test_rows_come_by_iterations_or_by_time_whichever_is_first(tmp_path, monkeypatch):
    # 25 s after the row at iteration 4 is iteration 7; iteration 8 is the next multiple of 4.
    assert logged_iterations(tmp_path, monkeypatch, log_interval=4, log_seconds=25) == [3, 4, 7, 8, 11, 12, 15, 16, 19, 20]


def test_log_seconds_0_logs_by_iterations_only(tmp_path, monkeypatch):
    assert logged_iterations(tmp_path, monkeypatch, log_interval=1000, log_seconds=0) == [20]


def test_the_default_writes_the_first_row_within_a_minute():
    config = build_config(True, {})
    assert 0 < config.log_seconds <= 60


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_bad_log_seconds_is_refused(value):
    problems = validate(build_config(False, dict(log_seconds=value)))
    assert any(problem.startswith("--log-seconds") for problem in problems), problems


def test_a_row_keeps_the_mean_and_the_largest_gradient_norm_of_its_updates():
    # One update's spike shows in grad_norm_max, where the row's mean would dilute it.
    import torch

    from acer_sync.training.acer import UPDATE_STATS
    from acer_sync.training.progress import UpdateStats

    def update(grad_norm: float) -> dict:
        return {name: torch.tensor(grad_norm if name == "grad_norm" else 1.0) for name in UPDATE_STATS}

    stats = UpdateStats()
    for grad_norm in (1.0, 5.0, 2.0):
        stats.add(update(grad_norm), off_policy=False)
    stats.add(update(3.0), off_policy=True)
    means = stats.means()
    assert means["grad_norm"] == pytest.approx(8.0 / 3.0) and means["grad_norm_max"] == 5.0
    assert means["off_grad_norm"] == 3.0 and means["off_grad_norm_max"] == 3.0
    names = list(means)
    assert names.index("grad_norm_max") == names.index("grad_norm") + 1
    assert names.index("off_grad_norm_max") == names.index("off_grad_norm") + 1
    stats.reset()
    stats.add(update(0.5), off_policy=False)
    means = stats.means()
    assert means["grad_norm_max"] == 0.5 and means["off_grad_norm_max"] != means["off_grad_norm_max"]  # NaN: none ran

"""Learning tests: the default classic-control preset solves CartPole-v1, and runs are reproducible."""

import csv

import pytest
from torch._dynamo.utils import counters

from acer_sync.base.config import build_config
from acer_sync.training.callbacks import Callback
from acer_sync.training.setup import build_trainer
from atari.envs import env_info

WALL_CLOCK_COLUMNS = {"fps", "time_elapsed", "rss_mb", "eval_seconds"}
SOLVED = 475  # CartPole-v1's reward threshold


class StopOnceSolved(Callback):
    """Ends the run at its first row solved (see :func:`solved_at`): the steps after it cannot change
    that row, and the preset's learning-rate schedule still runs to its ``total_timesteps``. Not
    ``StopTrainingOnReward``: it follows the evaluation's mean where the run evaluates, as the
    preset does, and the test reads the training rows."""

    def on_rollout_end(self, trainer, row: dict) -> bool | None:
        return False if row and row["mean_episode_reward"] >= SOLVED else None


def train_cartpole(tmp_path, seed: int, until_solved: bool = False, **overrides) -> list[dict]:
    # Rows by iterations only (log_seconds 0): rows written by wall time would differ between two runs.
    config = build_config(False, dict(env="CartPole-v1", seed=seed, vec_env="sync", device="cpu", log_seconds=0, **overrides))
    run_dir = tmp_path / f"cartpole_{seed}"
    run_dir.mkdir()
    callbacks = [StopOnceSolved()] if until_solved else []
    build_trainer(config, env_info("CartPole-v1"), run_dir, progress_bar=False, callbacks=callbacks).train()
    with open(run_dir / "progress.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def solved_at(rows: list[dict]) -> int | None:
    """First logged step whose 100-episode mean raw return is at least 475."""
    for row in rows:
        if float(row["mean_episode_reward"]) >= SOLVED:
            return int(row["total_timesteps"])
    return None


def test_cartpole_is_solved_within_200k_steps(tmp_path):
    rows = train_cartpole(tmp_path, seed=1, until_solved=True)
    step = solved_at(rows)
    assert step is not None and step <= 200_000, (step, max(float(r["mean_episode_reward"]) for r in rows))


@pytest.mark.slow
def test_cartpole_is_solved_on_at_least_two_of_three_seeds(tmp_path):
    solved = {seed: solved_at(train_cartpole(tmp_path, seed=seed, until_solved=True)) for seed in (1, 2, 3)}
    print("solved at:", solved)
    assert sum(step is not None for step in solved.values()) >= 2, solved


def test_two_seeded_runs_are_identical(tmp_path):
    runs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        rows = train_cartpole(tmp_path / name, seed=7, total_timesteps=8_000)
        runs.append([{k: v for k, v in row.items() if k not in WALL_CLOCK_COLUMNS} for row in rows])
    assert runs[0] == runs[1]
    assert any(float(row["off_policy_updates"]) > 0 for row in runs[0])  # replay was exercised


@pytest.mark.slow
def test_compiled_forward_trains(tmp_path):
    counters.clear()
    rows = train_cartpole(tmp_path, seed=1, total_timesteps=6_400, compile=True)
    # TorchDynamo captured and compiled the forward pass (an eager run leaves these counters at 0).
    assert counters["frames"]["ok"] >= 1 and counters["stats"]["unique_graphs"] >= 1, dict(counters)
    assert int(rows[-1]["total_timesteps"]) == 6_400 and int(rows[-1]["nonfinite_updates"]) == 0
    assert float(rows[-1]["off_loss_q"]) > 0  # replay starts at 4,000 steps: off-policy updates ran too

"""When the Trainer writes a progress row: every log_interval iterations, or once log_seconds passed."""

import types

import gymnasium as gym
import pytest

import acer_sync
import acer_sync.training.callbacks
import acer_sync.training.trainer
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
    fake_time = types.SimpleNamespace(perf_counter=CLOCK.perf_counter)
    monkeypatch.setattr(acer_sync.training.callbacks, "time", fake_time)
    monkeypatch.setattr(acer_sync.training.trainer, "time", fake_time)  # the loop's start, where the first row's interval begins
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

    def update(grad_norm: float) -> dict:  # an update that stepped: nonfinite 0
        return {name: torch.tensor(grad_norm if name == "grad_norm" else 0.0 if name == "nonfinite" else 1.0) for name in UPDATE_STATS}

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


def test_a_skipped_update_leaves_its_rows_means_to_the_updates_that_stepped():
    # A skipped update's inf loss and NaN gradient norm made its whole row's means inf and NaN
    # (and TensorBoard and W&B drop those points), hiding the hundreds of updates around it.
    import torch

    from acer_sync.training.acer import UPDATE_STATS
    from acer_sync.training.progress import UpdateStats

    def update(loss_q: float, grad_norm: float, skipped: bool) -> dict:
        values = {"loss_q": loss_q, "grad_norm": grad_norm, "nonfinite": float(skipped)}
        return {name: torch.tensor(values.get(name, 1.0)) for name in UPDATE_STATS}

    stats = UpdateStats()
    for loss_q, grad_norm, skipped in ((1.0, 2.0, False), (float("inf"), float("nan"), True), (3.0, 4.0, False)):
        stats.add(update(loss_q, grad_norm, skipped), off_policy=False)
    stats.add(update(float("inf"), float("inf"), True), off_policy=True)
    means = stats.means()
    assert stats.counts == {"on": 3, "off": 1}  # off_policy_updates counts every update
    assert means["loss_q"] == 2.0 and means["grad_norm"] == 3.0 and means["grad_norm_max"] == 4.0 and means["entropy"] == 1.0
    assert all(value != value for name, value in means.items() if name.startswith("off_"))  # NaN: none stepped


def test_explained_variance_of_a_constant_target_is_undefined_and_left_out_of_its_rows_mean():
    # A constant Q^ret has no variance to explain: Baselines gives NaN. The variance clamped at
    # 1e-12 gave about -1e8, which one such update carried into its whole row's mean.
    import torch

    from acer_sync.training.acer import UPDATE_STATS, explained_variance
    from acer_sync.training.progress import UpdateStats

    constant = torch.full((4, 2), 3.0)
    assert explained_variance(constant + 0.5, constant).isnan()
    tenths = torch.full((20, 1), 0.1)  # a variance that rounds to 6e-17 gave -1.95e12
    assert tenths.var() > 0 and explained_variance(tenths + 0.5, tenths).isnan()
    target = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    assert explained_variance(target, target) == 1.0
    assert explained_variance(torch.full_like(target, target.mean()), target) == 0.0
    # 1 − Var[(0, 0, 0, 1)] / Var[(1, 2, 3, 5)] = 1 − 0.25 / 2.9167 (unbiased variances: 1/4 and 35/12)
    assert explained_variance(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), target).item() == pytest.approx(1 - 3 / 35)

    def update(explained: float) -> dict:
        return {name: torch.tensor(explained if name == "explained_variance" else 0.0 if name == "nonfinite" else 1.0)
                for name in UPDATE_STATS}

    stats = UpdateStats()
    for explained in (0.5, float("nan"), 0.25):
        stats.add(update(explained), off_policy=False)
    stats.add(update(float("nan")), off_policy=True)
    means = stats.means()
    assert means["explained_variance"] == 0.375 and means["loss_q"] == 1.0
    assert means["off_explained_variance"] != means["off_explained_variance"] and means["off_loss_q"] == 1.0  # NaN: none defined it


def _cartpole(tmp_path, **overrides):
    from acer_sync.base.config import build_config
    from acer_sync.training.setup import build_trainer
    from atari.envs import env_info

    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=20, log_interval=1,
                                      eval_every=0, threads=1, hidden="16", **overrides))
    tmp_path.mkdir(parents=True, exist_ok=True)
    return config, lambda **kwargs: build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False, **kwargs)


def test_the_callbacks_starts_are_not_in_the_first_rows_training_time(tmp_path):
    # W&B's init (--track), a user's on_training_start: they ran after the first row's clock started,
    # so its fps read 184 against 10,400 in each session's first row.
    import time

    from acer_sync.training.callbacks import Callback

    class SlowStart(Callback):
        def on_training_start(self, trainer):
            time.sleep(1.0)

    rows = []
    _, build = _cartpole(tmp_path, total_timesteps=80)
    assert build(callbacks=[SlowStart()], on_progress=rows.append).train().finished
    assert rows[0]["fps"] > 40 / 0.5
    assert rows[0]["time_elapsed"] >= 1.0  # the session's wall time does count it


def test_the_lr_of_a_row_is_its_last_updates_in_either_pipeline(tmp_path):
    # Overlapped, the row showed the next segment's rate, one iteration ahead of its updates.
    for pipeline in ("serial", "overlap"):
        rows, rates = [], []
        _, build = _cartpole(tmp_path / pipeline, total_timesteps=400, lr_schedule="linear", replay_ratio=0, pipeline=pipeline)
        trainer = build(on_progress=lambda row: rows.append((row["lr"], rates[-1] if rates else None)))
        update = trainer.agent.update
        trainer.agent.update = lambda batch, lr: rates.append(lr) or update(batch, lr)
        assert trainer.train().finished
        assert len(rows) >= 9 and all(logged == used for logged, used in rows if used is not None), (pipeline, rows)


def test_the_trust_region_is_never_active_without_it(tmp_path):
    # tr_active_frac counted the samples with k.g > delta with --no-trust-region too (0.34 on Pendulum).
    import acer_sync
    from helpers import read_progress

    active = {}
    for trust_region in (True, False):
        run_dir = acer_sync.train("Pendulum-v1", run_dir=tmp_path / str(trust_region), total_timesteps=1600, trust_region=trust_region,
                                  replay_start=80, log_interval=2, eval_every=0, progress_bar=False, verbose=0)
        rows = read_progress(run_dir)
        active[trust_region] = max(float(row[name]) for row in rows for name in ("tr_active_frac", "off_tr_active_frac")
                                   if row[name] not in ("", "nan"))
    assert active[True] > 0 and active[False] == 0


def test_a_score_of_millions_keeps_every_digit_in_progress_csv(tmp_path):
    # `:.6g` wrote 3,703,701.75 as 3.7037e+06: the raw scores of Atlantis or Video Pinball lost digits.
    from acer_sync.training.logger import Logger

    logger = Logger(tmp_path)
    logger.log({"total_timesteps": 100, "mean_episode_reward": 3703701.75, "eval_mean": -20.214317, "loss_q": 0.000178449123,
                "grad_norm": 3.4e38})
    logger.close()
    row = read_progress(tmp_path)[0]
    assert (row["mean_episode_reward"], row["eval_mean"], row["loss_q"]) == ("3703701.75", "-20.2143", "0.000178449")
    assert row["grad_norm"] == "3.4e+38"  # not 39 digits, most of them float64's noise


def test_the_progress_bar_ends_at_the_step_the_run_ends_at(capsys, monkeypatch):
    # A total that is not a whole number of iterations: the run went past it, and tqdm dropped the
    # total and the percentage ("6080step [00:00, ...]"); a failed update's steps were not on it.
    from acer_sync.training.callbacks import ProgressBar

    monkeypatch.setattr(acer_sync.training.callbacks, "_is_terminal", lambda stream: True)
    trainer = types.SimpleNamespace(timesteps=160, steps_per_iteration=160)
    bar = ProgressBar(6000)
    bar.on_training_start(trainer)
    assert (bar.bar.n, bar.bar.total) == (160, 6080)
    trainer.timesteps = 4640  # the collection stored before an update failed is not followed by on_rollout_end
    bar.on_training_end(trainer, None)
    assert bar.bar.n == 4640
    trainer.timesteps = 6080
    resumed = ProgressBar(6000)
    resumed.on_training_start(trainer)  # a resume at its total: nothing to run
    assert (resumed.bar.n, resumed.bar.total) == (6080, 6080)
    resumed.on_training_end(trainer, None)


def test_where_standard_error_is_no_terminal_progress_is_a_line_a_minute_and_one_at_each_evaluation(tmp_path, capsys, monkeypatch):
    # nohup or a batch job: the bar was one endless line of carriage returns in the log file.
    monkeypatch.setattr(acer_sync.training.callbacks.ProgressBar, "PLAIN_SECONDS", 0.0)
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=400, num_envs=2, vec_env="sync", eval_every=200,
                    eval_episodes=2, log_interval=2, hidden="16", threads=1)
    said = capsys.readouterr()
    assert "\r" not in said.err
    lines = [line for line in said.out.splitlines() if line.startswith("step ")]
    rows = read_progress(tmp_path / "run")
    assert len(lines) == len(rows) >= 3
    for line, row in zip(lines, rows):
        assert line.startswith(f"step {int(row['total_timesteps']):,} of 400 (")
        assert f"mean return {float(row['mean_episode_reward']):.2f} over {int(row['episodes']):,} episodes" in line
        assert (", evaluation " in line) == (int(row["eval_episodes"]) > 0)

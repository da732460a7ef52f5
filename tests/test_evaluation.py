"""Evaluation plays a fixed number of full games, with each env playing its share, and is logged."""

import csv
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import acer_sync
import acer_sync.api.runs
import acer_sync.rollout.evaluation
import acer_sync.training.callbacks
from acer_sync.base.config import build_config
from acer_sync.base.outcome import Stop
from acer_sync.rollout.evaluation import evaluate
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import VecEnv, env_info
from atari.errors import EnvFailed
from helpers import NeverFire, categorical_net, read_progress, stop_in_the_iteration_ending_at


class CountingEnv:
    """Wraps a VecEnv and counts the games each env finishes."""

    def __init__(self, env: VecEnv):
        self.env, self.info, self.num_envs = env, env.info, env.num_envs
        self.finished = np.zeros(env.num_envs, dtype=int)

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def step(self, actions):
        out = self.env.step(actions)
        self.finished += out[2] | out[3]
        return out


def test_evaluate_plays_exactly_the_requested_games():
    info = env_info("CartPole-v1")
    env = CountingEnv(VecEnv(info, 3, "sync"))
    model = categorical_net(info.obs_shape, info.n_actions, "mlp", (8,))
    scores = evaluate(model, env, 5, torch.device("cpu"), seed=0, generator=torch.Generator().manual_seed(0))
    env.env.close()
    assert len(scores) == 5 and all(score >= 1 for score in scores)  # CartPole pays 1 per step
    assert env.finished.min() >= 1  # every env played its share: 2, 2 and 1 games
    again = evaluate(model, VecEnv(info, 3, "sync"), 5, torch.device("cpu"), seed=0, generator=torch.Generator().manual_seed(0))
    assert again == scores  # seeded evaluation is reproducible


def test_greedy_evaluation_is_deterministic_given_the_seed():
    info = env_info("CartPole-v1")
    model = categorical_net(info.obs_shape, info.n_actions, "mlp", (8,))
    runs = [evaluate(model, VecEnv(info, 2, "sync"), 2, torch.device("cpu"), greedy=True, seed=3) for _ in range(2)]
    assert runs[0] == runs[1]


EXTRA_EVAL_SECONDS = 0.3


def test_training_logs_evaluations(tmp_path, monkeypatch):
    def slower_evaluate(*args, **kwargs):
        time.sleep(EXTRA_EVAL_SECONDS)  # so that eval_seconds has a lower bound on any machine
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(acer_sync.training.callbacks, "evaluate", slower_evaluate)
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", total_timesteps=4_000,
                                      eval_every=1_500, eval_episodes=4, log_interval=100))
    build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False).train()
    with open(tmp_path / "progress.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    evaluated = [row for row in rows if int(row["eval_episodes"]) > 0]
    assert [int(row["total_timesteps"]) for row in evaluated] == [1600, 3040]  # the first iterations past 1500 and 3000
    assert all(int(row["eval_episodes"]) == 4 and float(row["eval_mean"]) > 0 for row in evaluated)
    # eval_seconds times the evaluation: at least its sleep, and a part of the run's wall time.
    assert all(EXTRA_EVAL_SECONDS <= float(row["eval_seconds"]) <= float(row["time_elapsed"]) for row in evaluated)
    assert float(rows[-1]["time_elapsed"]) > 0


def test_evaluation_plays_the_forced_actions_after_a_lost_life():
    """A policy that never presses FIRE still finishes a Breakout game: after each lost life the
    evaluation plays Baselines' NOOP, FIRE, action 2, as training does. Without them the ball
    would never be served again and the game would run to its 108k-frame limit."""
    info = env_info("BreakoutNoFrameskip-v4")
    env = VecEnv(info, 1, "ale", noop_max=0)
    steps = []
    scores = evaluate(NeverFire(info.n_actions), env, 1, torch.device("cpu"), seed=0, on_step=steps.append)
    env.close()
    assert steps[0] is None and len(scores) == 1 and len(steps) < 1000  # None: the reset
    steps = steps[1:]
    assert sum(float(step.raw_rewards[0]) for step in steps) == scores[0]
    lives = [int(step.lives[0]) for step in steps]
    assert bool(steps[-1].game_over[0]) and not any(step.game_over[0] for step in steps[:-1])
    # The 4 lives lost before the last: the next three steps play NOOP, FIRE, 2, flagged forced;
    # every other step is the policy's NOOP.
    losses = [index for index in range(1, len(steps) - 1) if lives[index] < lives[index - 1]]
    forced = [index for index, step in enumerate(steps) if step.forced[0]]
    assert len(losses) == 4 and forced == [index + k for index in losses for k in (1, 2, 3)]
    assert [int(steps[index].actions[0]) for index in forced] == [0, 1, 2] * 4
    assert all(int(step.actions[0]) == 0 for index, step in enumerate(steps) if index not in forced)


class RecordsStarts(NeverFire):
    """NeverFire that records, per act, whether the state was reset (``first``) and the frame stack."""

    def __init__(self, n_actions: int):
        super().__init__(n_actions)
        self.firsts: list[bool] = []
        self.stacks: list[torch.Tensor] = []

    def step(self, obs, state, first):
        self.firsts.append(bool(first[0]))
        self.stacks.append(obs[0].clone())
        return super().step(obs, state, first)


def test_evaluation_resets_the_frame_stack_and_the_state_where_training_does_at_a_lost_life():
    # Training's Atari episodes end at a lost life, so the policy (an LSTM's state, the frame stack)
    # starts again there; evaluation carried both over, so a cnn_lstm was evaluated on states it was
    # never trained on (a review measured its hidden state 38-56% away on 63% of a Breakout game's steps).
    info = env_info("BreakoutNoFrameskip-v4")
    env = VecEnv(info, 1, "ale", noop_max=0)
    model = RecordsStarts(info.n_actions)
    steps = []
    evaluate(model, env, 1, torch.device("cpu"), seed=0, on_step=steps.append)
    env.close()
    lives = [int(step.lives[0]) for step in steps[1:]]
    after_losses = [index + 1 for index in range(1, len(lives) - 1) if lives[index] < lives[index - 1]]
    assert len(after_losses) == 4 and len(model.firsts) == len(lives)
    assert [index for index, first in enumerate(model.firsts) if first] == [0, *after_losses]
    for index in [0, *after_losses]:  # the stack starts again: the new frame after three blank ones
        assert not model.stacks[index][:3].any() and model.stacks[index][3].any()
    assert all(model.stacks[index][:3].any() for index in range(4, len(lives)) if index not in after_losses and index - 1 not in after_losses
               and index - 2 not in after_losses and index - 3 not in after_losses)


@pytest.mark.parametrize("pipeline, stop_in", [
    ("serial", "segment"), ("overlap", "segment"), ("serial", "games"),
])
def test_an_evaluation_a_stop_skipped_is_played_first_after_the_resume(tmp_path, pipeline, stop_in):
    # A stop that comes in the iteration an evaluation falls due skips it (it would hold the
    # checkpoint for a whole evaluation), and one that comes during its games drops it. Either way
    # the checkpoint owes it: the resumed session plays it in its first iteration, then goes on
    # at the multiples of --eval-every.
    config = build_config(False, dict(
        env="CartPole-v1", network="lstm", hidden="16", lstm_size=8, vec_env="sync", device="cpu", num_envs=2,
        nsteps=5, total_timesteps=400, buffer_size=100, replay_start=20, eval_every=100, eval_episodes=2,
        log_interval=1, threads=1, pipeline=pipeline,
    ))
    info = env_info("CartPole-v1")
    trainer = build_trainer(config, info, tmp_path, progress_bar=False)
    if stop_in == "segment":  # a SIGINT while the segment that ends at step 200 is collected and learned from
        stop_in_the_iteration_ending_at(trainer, 200)
    else:  # a SIGINT during the games of the evaluation due at step 200
        evaluation = next(c for c in trainer.callbacks.callbacks if type(c).__name__ == "EvalCallback")
        evaluate_games = evaluation.evaluate

        def games_then_stop(trainer):
            if trainer.timesteps == 200:
                trainer.request_stop("SIGINT")
            return evaluate_games(trainer)

        evaluation.evaluate = games_then_stop
    outcome = trainer.train()
    assert outcome.stop is Stop.INTERRUPTED and outcome.timesteps == 200
    payload = load_checkpoint(tmp_path)
    assert payload["callbacks"]["EvalCallback"]["next_eval"] == 200
    assert build_trainer(config, info, tmp_path, progress_bar=False, resume=payload).train().finished
    with open(tmp_path / "progress.csv", newline="") as handle:
        evaluated = [int(row["total_timesteps"]) for row in csv.DictReader(handle) if int(row["eval_episodes"]) > 0]
    assert evaluated == [100, 210, 300, 400]
    assert load_checkpoint(tmp_path)["callbacks"]["EvalCallback"]["next_eval"] == 500


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_an_evaluation_a_stop_skipped_in_the_last_iteration_is_played_by_the_resume_at_the_total(tmp_path, pipeline):
    # The resume from a checkpoint at --total-timesteps runs no iteration: it plays the owed
    # evaluation at its end, writes it in the final row (on_progress gets that row too) and weighs
    # it for best.pt, as the uninterrupted run did at its last iteration.
    config = build_config(False, dict(
        env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5, total_timesteps=200, buffer_size=100,
        replay_start=20, eval_every=100, eval_episodes=2, log_interval=1, threads=1, hidden="16", pipeline=pipeline,
    ))
    info = env_info("CartPole-v1")
    trainer = build_trainer(config, info, tmp_path, progress_bar=False)
    stop_in_the_iteration_ending_at(trainer, 200)
    outcome = trainer.train()
    assert outcome.stop is Stop.INTERRUPTED and outcome.timesteps == 200
    rows = []
    # through the library's resume, as train.py --resume goes: it returned before the Trainer was built, as for a
    # run with nothing left to do, and the owed evaluation was never played
    resumed = acer_sync.api.runs.run(resume=tmp_path, on_progress=rows.append, verbose=0, progress_bar=False)
    assert resumed.finished and resumed.timesteps == 200
    assert [row["total_timesteps"] for row in rows] == [200] and rows[0]["eval_episodes"] == 2
    assert rows[0]["fps"] != rows[0]["fps"]  # NaN: the row trained no step (it read 0, a second row at 200 "stalled")
    with open(tmp_path / "progress.csv", newline="") as handle:
        evaluated = [(int(row["total_timesteps"]), float(row["eval_mean"]))
                     for row in csv.DictReader(handle) if int(row["eval_episodes"]) > 0]
    assert [step for step, _ in evaluated] == [100, 200]
    saved = load_checkpoint(tmp_path)["callbacks"]["EvalCallback"]
    assert saved["next_eval"] == 300 and saved["best_mean"] == max(mean for _, mean in evaluated)


def test_a_run_that_evaluates_every_iteration_evaluates_once_at_its_end_also_after_a_resume_there(tmp_path):
    # --eval-every below the steps of an iteration: one evaluation an iteration, none owed at the end.
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=30, eval_every=5, eval_episodes=2, log_interval=1, threads=1))
    info = env_info("CartPole-v1")
    assert build_trainer(config, info, tmp_path, progress_bar=False).train().finished
    assert load_checkpoint(tmp_path)["callbacks"]["EvalCallback"]["next_eval"] == 35
    assert build_trainer(config, info, tmp_path, progress_bar=False, resume=load_checkpoint(tmp_path)).train().finished
    with open(tmp_path / "progress.csv", newline="") as handle:
        evaluated = [int(row["total_timesteps"]) for row in csv.DictReader(handle) if int(row["eval_episodes"]) > 0]
    assert evaluated == [10, 20, 30]


def stopped_in_the_last_iteration(tmp_path, **settings):
    """A small CartPole run (of ``settings`` besides) stopped in its last iteration (ending at its
    total, 200), which skipped the evaluation due there; its config and env info, for the resume."""
    config = build_config(False, dict(
        env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5, total_timesteps=200, buffer_size=100,
        replay_start=20, eval_every=100, eval_episodes=2, log_interval=1, threads=1, hidden="16", **settings,
    ))
    info = env_info("CartPole-v1")
    trainer = build_trainer(config, info, tmp_path, progress_bar=False)
    stop_in_the_iteration_ending_at(trainer, 200)
    assert trainer.train().stop is Stop.INTERRUPTED
    return config, info


@pytest.mark.parametrize("trouble", ["stop", "env"])
def test_a_stop_or_an_env_failure_during_the_evaluation_owed_at_the_total_ends_the_resume_as_in_an_iteration(
        tmp_path, trouble):
    # ... and leaves the saved buffer as it was: the end's checkpoint rewrote it (removed, then
    # written again from memory, which a full disk would have lost), the evaluation having played
    # before the checkpoints' start had read the buffer's step.
    config, info = stopped_in_the_last_iteration(tmp_path, save_buffer=True)
    buffer_file = tmp_path / "checkpoints" / "buffer.npz"
    written = buffer_file.stat()
    resumed = build_trainer(config, info, tmp_path, progress_bar=False, resume=load_checkpoint(tmp_path))
    evaluation = next(c for c in resumed.callbacks.callbacks if type(c).__name__ == "EvalCallback")
    evaluate_games = evaluation.evaluate

    def troubled_games(trainer):
        if trouble == "env":
            raise EnvFailed("CartPole-v1 env 0 raised RuntimeError in step: broken")
        trainer.request_stop("SIGINT")
        return evaluate_games(trainer)

    evaluation.evaluate = troubled_games
    outcome = resumed.train()
    assert outcome.stop is (Stop.INTERRUPTED if trouble == "stop" else Stop.ENV_FAILED) and outcome.timesteps == 200
    assert load_checkpoint(tmp_path)["callbacks"]["EvalCallback"]["next_eval"] == 200  # still owed
    assert (buffer_file.stat().st_ino, buffer_file.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)


def test_an_evaluation_a_stop_cuts_short_is_not_counted_as_training_time(tmp_path, monkeypatch):
    # Its games are not reported, and their time went into the stop row's fps (145 against 13,644;
    # Pong's 100 games on a CPU would bring it near 0).
    def stopped_evaluation(*args, cancelled, **kwargs):
        time.sleep(0.6)
        trainer.request_stop("a test's stop")
        assert cancelled()
        return []

    monkeypatch.setattr(acer_sync.training.callbacks, "evaluate", stopped_evaluation)
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=20, total_timesteps=400,
                                      eval_every=80, log_interval=100, log_seconds=0, threads=1, hidden="16"))
    rows = []
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False, on_progress=rows.append)
    outcome = trainer.train()
    assert outcome.stop is Stop.INTERRUPTED and outcome.timesteps == 80
    assert [row["total_timesteps"] for row in rows] == [80]
    assert rows[0]["eval_episodes"] == 0 and rows[0]["eval_mean"] != rows[0]["eval_mean"] and rows[0]["eval_seconds"] >= 0.6
    assert rows[0]["fps"] > 80 / 0.5
    assert load_checkpoint(tmp_path)["callbacks"]["EvalCallback"]["next_eval"] == 80  # owed: a resume plays it first


def test_the_evaluation_a_resume_at_the_total_plays_counts_in_the_runs_time(tmp_path, monkeypatch):
    # It was left out of time_elapsed (the row even read less than its own eval_seconds), where an
    # uninterrupted run counts it.
    real_evaluate = acer_sync.training.callbacks.evaluate

    def slow_evaluate(*args, **kwargs):
        time.sleep(0.5)
        return real_evaluate(*args, **kwargs)

    config, info = stopped_in_the_last_iteration(tmp_path)
    before = load_checkpoint(tmp_path)["counters"]["time_elapsed"]
    monkeypatch.setattr(acer_sync.training.callbacks, "evaluate", slow_evaluate)
    rows = []
    resumed = build_trainer(config, info, tmp_path, progress_bar=False, resume=load_checkpoint(tmp_path), on_progress=rows.append)
    assert resumed.train().finished
    assert rows[0]["eval_seconds"] >= 0.5 and rows[0]["time_elapsed"] >= round(before + 0.5, 1)
    assert rows[0]["lr"] != rows[0]["lr"]  # NaN: no update in the row


def test_play_with_an_evaluations_seed_replays_its_greedy_games_score_for_score(tmp_path, capsys):
    # docs/training.md: an evaluation at step S seeds its envs with seed + 1_000_003 * (1 + S // eval_every).
    from acer_sync.cli import play

    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, seed=3, num_envs=2, vec_env="sync", device="cpu", hidden="16", threads=1,
                    total_timesteps=400, eval_every=200, eval_episodes=4, eval_greedy=True, progress_bar=False, verbose=0)
    with open(run_dir / "progress.csv", newline="") as handle:
        last = list(csv.DictReader(handle))[-1]
    step = int(last["total_timesteps"])
    assert step == 400 and int(last["eval_episodes"]) == 4
    capsys.readouterr()
    play.main([str(run_dir), "--seed", str(3 + 1_000_003 * (1 + step // 200)), "--num-envs", "2", "--episodes", "4", "--greedy"])
    said = capsys.readouterr().out.splitlines()[-1]
    assert said == f"mean score over 4 episodes: {last['eval_mean']} (std {last['eval_std']})"


class Endless(gym.Env):
    """A Discrete(2) env whose episodes never end (no time limit); each step rewards 1."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


def test_an_evaluation_game_that_never_ends_ends_the_evaluation_at_its_step_limit(tmp_path, monkeypatch, caplog):
    # the evaluation, and the run with it, waited for the game for ever
    monkeypatch.setattr(acer_sync.rollout.evaluation, "MAX_GAME_STEPS", 30)
    run_dir = acer_sync.train(Endless, run_dir=tmp_path / "run", total_timesteps=80, num_envs=2, vec_env="sync",
                              eval_every=40, eval_episodes=4, verbose=1, progress_bar=False)
    rows = [row for row in read_progress(run_dir) if row["eval_mean"] != ""]
    assert rows and all(float(row["eval_mean"]) == 30.0 and int(row["eval_episodes"]) == 2 for row in rows)
    assert "went on for 30 steps without ending; its score so far counts, and the evaluation ends with 2 of its 4 games" in caplog.text


def test_play_says_that_a_game_that_never_ended_ended_its_games(tmp_path, monkeypatch, capsys):
    from acer_sync.cli import play

    monkeypatch.setattr(acer_sync.rollout.evaluation, "MAX_GAME_STEPS", 25)
    gym.register("Endless-v0", entry_point=Endless)
    try:
        run_dir = acer_sync.train("Endless-v0", run_dir=tmp_path / "run", total_timesteps=40, num_envs=2, vec_env="sync",
                                  eval_every=0, verbose=0)
        capsys.readouterr()
        assert play.main([str(run_dir), "--episodes", "3"]) == 0
    finally:
        gym.registry.pop("Endless-v0")
    assert capsys.readouterr().out.splitlines()[-1] == (
        "mean score over 1 episode: 25 (std 0) (a game went on for 25 steps, its score so far counted, and ended the "
        "games; 3 asked for)")

"""The Python API: acer_sync.train / load / Policy.predict / make_env, and its errors."""

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import acer_sync
from acer_sync.base.config import PRESETS
from acer_sync.base.outcome import Stop
from acer_sync.cli import play, plot, train
from acer_sync.rollout.actor import Actor
from acer_sync.training.checkpoint import load_checkpoint
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker
from helpers import NeverFire, OverflowingRewardsAfter, read_progress

#: A few hundred CartPole steps in this process: 2 envs x 20 steps per iteration.
SMALL = dict(num_envs=2, total_timesteps=200, vec_env="sync", device="cpu", eval_every=0, log_interval=1, hidden="16")


def no_error_lines(capsys) -> None:
    """Nothing the library printed is a script's error line."""
    out, err = capsys.readouterr()
    assert "error:" not in out + err, out + err


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One feed-forward and one LSTM CartPole run through the API."""
    root = tmp_path_factory.mktemp("api")
    return {
        "mlp": acer_sync.train("CartPole-v1", run_dir=root / "mlp", progress_bar=False, **SMALL),
        "lstm": acer_sync.train("CartPole-v1", run_dir=root / "lstm", progress_bar=False, network="lstm", lstm_size=8, **SMALL),
    }


def test_train_returns_the_run_directory_that_train_py_writes_and_plot_draws(runs, tmp_path, capsys):
    run_dir = runs["mlp"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["env"] == "CartPole-v1" and config["config"]["total_timesteps"] == 200
    assert config["config"]["num_envs"] == 2 and config["config"]["lr"] == PRESETS["classic"]["lr"]  # the env's preset
    assert config["command"][0].startswith("acer_sync.train('CartPole-v1', ")
    # what auto became on this machine: the settings say auto, ran says what ran
    assert (config["config"]["compile"], config["config"]["pipeline"]) == ("auto", "auto")
    assert config["ran"] == {"device": "cpu", "compile": "off", "pipeline": "serial", "replay_device": "cpu"}
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) == 200
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 200
    assert plot.main([str(run_dir), "--out", str(tmp_path / "curve.png")]) in (0, None)
    assert (tmp_path / "curve.png").stat().st_size > 0
    no_error_lines(capsys)


def test_the_package_exports_the_library():
    for name in ("train", "load", "Policy", "make_env", "UserError", "Config", "__version__"):
        assert name in acer_sync.__all__ and getattr(acer_sync, name) is not None
    from atari.errors import UserError

    assert acer_sync.UserError is UserError  # the one exception type of atari/ and acer_sync/


class CountedCartPole:
    """A callable env: CartPole cut at 7 steps, counting the envs it made."""

    def __init__(self):
        self.made = 0

    def __call__(self) -> gym.Env:
        self.made += 1
        return gym.make("CartPole-v1", max_episode_steps=7)


class ShiftedActions(gym.Env):
    """Actions 1 to 3 (``Discrete(3, start=1)``), each checked: action a ends the episode after a steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(3, start=1)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is outside {self.action_space}")
        self.t += 1
        return np.full(2, self.t / 10, np.float32), 1.0, self.t >= int(action), False, {}


def test_a_discrete_space_that_starts_above_0_gets_its_own_actions_in_training_evaluation_and_predict(tmp_path):
    # Its actions went to the env as 0 to n-1 everywhere: an env that checks them raised, one that
    # does not trained on the wrong actions in silence.
    run_dir = acer_sync.train(ShiftedActions, run_dir=tmp_path / "run", progress_bar=False,
                              **{**SMALL, "total_timesteps": 120, "eval_every": 120, "eval_episodes": 2})
    assert load_checkpoint(run_dir)["action_start"] == 1
    policy = acer_sync.load(run_dir)
    actions, _ = policy.predict(np.zeros((50, 2), np.float32))
    assert set(actions.tolist()) <= {1, 2, 3} and len(set(actions.tolist())) > 1
    assert policy.predict(ShiftedActions().reset()[0], deterministic=True)[0] in (1, 2, 3)


def test_a_callable_env_makes_every_env_of_the_run(tmp_path, capsys):
    make = CountedCartPole()
    run_dir = acer_sync.train(make, run_dir=tmp_path / "run", progress_bar=False,
                              **{**SMALL, "eval_every": 200, "eval_episodes": 2, "num_envs": 3, "vec_env": ""})
    rows = read_progress(run_dir)
    # Every training episode and every evaluation game is the callable's 7 steps.
    assert {float(row["mean_episode_length"]) for row in rows} == {7.0}
    assert float(rows[-1]["eval_mean"]) == 7.0
    # One env to inspect it, 3 to train on and 2 to evaluate on, all in this process (sync by default).
    assert make.made == 1 + 3 + 2
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["env"].startswith("acer_sync-callable/") and config["env"].endswith("CountedCartPole")
    assert config["vec_env"] == "sync"
    no_error_lines(capsys)


def test_a_callable_env_reaches_the_subproc_workers(tmp_path):
    run_dir = acer_sync.train(lambda: gym.make("CartPole-v1", max_episode_steps=5), run_dir=tmp_path / "run",
                              progress_bar=False, **{**SMALL, "vec_env": "subproc"})
    assert {float(row["mean_episode_length"]) for row in read_progress(run_dir)} == {5.0}


def make_short_cartpole() -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=9)


def test_a_callable_run_resumes_from_python_and_the_scripts_say_how(tmp_path):
    run_dir = acer_sync.train(make_short_cartpole, run_dir=tmp_path / "run", progress_bar=False, **SMALL)
    # A later process: the callable is no longer registered.
    gym.registry.pop(json.loads((run_dir / "config.json").read_text())["config"]["env"])
    with pytest.raises(acer_sync.UserError, match=r"acer_sync.train\(make_short_cartpole, resume=") as error:
        train.main(["--resume", str(run_dir), "--total-timesteps", "400", "--no-progress"])
    assert "\n" not in str(error.value)
    with pytest.raises(acer_sync.UserError, match=r"play it from Python with acer_sync.load"):
        play.main([str(run_dir), "--episodes", "1"])
    assert acer_sync.train(make_short_cartpole, resume=run_dir, total_timesteps=400, progress_bar=False) == run_dir
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 400
    assert {float(row["mean_episode_length"]) for row in read_progress(run_dir)} == {9.0}
    with pytest.raises(acer_sync.UserError, match="--env acer_sync-callable/.*CountedCartPole"):
        acer_sync.train(CountedCartPole(), resume=run_dir, total_timesteps=600)


def make_cartpole_of(length: int) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=length)


def test_a_run_of_one_of_two_partials_resumes_only_with_its_own(tmp_path):
    # Partials share one id: after run B of partial(make, 11), a resume of run A without env
    # trained on B's env, and load(A) said A's network did not fit "its env" (B's).
    import functools

    short, long = functools.partial(make_cartpole_of, 5), functools.partial(make_cartpole_of, 11)
    run_a = acer_sync.train(short, run_dir=tmp_path / "a", progress_bar=False, **SMALL)
    acer_sync.train(long, run_dir=tmp_path / "b", progress_bar=False, **SMALL)
    with pytest.raises(acer_sync.UserError, match="registered several callables named .*functools.partial.* pass the run's own"):
        acer_sync.train(resume=run_a, total_timesteps=400, progress_bar=False)
    assert acer_sync.load(run_a).predict(np.zeros(4, np.float32))[0] in (0, 1)
    again = functools.partial(make_cartpole_of, 5)  # equal to run A's: its env
    assert acer_sync.train(again, resume=run_a, total_timesteps=400, progress_bar=False) == run_a
    assert {float(row["mean_episode_length"]) for row in read_progress(run_a)} == {5.0}
    gym.registry.pop("acer_sync-callable/functools.partial")  # marked shared: no later test's partial should be


def test_one_bound_method_registered_twice_is_one_callable():
    # factory.make is a new object at each access: the id was marked shared, and a resume without env refused
    from acer_sync.api.env_callables import callable_env_id, callable_is_shared, register_callable

    class Factory:
        def make(self):
            return gym.make("CartPole-v1")

    factory = Factory()
    gym.registry.pop(callable_env_id(factory.make), None)
    env_id = register_callable(factory.make)
    assert register_callable(factory.make) == env_id and not callable_is_shared(env_id)
    register_callable(Factory().make)  # another instance's: another env, maybe
    assert callable_is_shared(env_id)
    gym.registry.pop(env_id)
    import functools

    gym.registry.pop(callable_env_id(functools.partial(factory.make)), None)  # another test's partials marked it shared
    partial_id = register_callable(functools.partial(factory.make))
    assert register_callable(functools.partial(factory.make)) == partial_id and not callable_is_shared(partial_id)
    gym.registry.pop(partial_id)


def test_an_id_run_resumes_through_the_api(runs, tmp_path):
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(runs["mlp"], run_dir)
    assert acer_sync.train(resume=run_dir, total_timesteps=280, progress_bar=False) == run_dir
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 280
    with pytest.raises(acer_sync.UserError, match=r"--lr 0.5 \(the run used 0.001\)"):
        acer_sync.train(resume=run_dir, total_timesteps=400, lr=0.5)
    with pytest.raises(acer_sync.UserError, match=r"^--total-timesteps 240 is below the step the run has reached \(280\)"):
        acer_sync.train(resume=run_dir, total_timesteps=240)
    assert load_checkpoint(run_dir)["config"]["total_timesteps"] == 280


def test_a_finished_run_resumes_as_finished_and_a_total_below_its_step_is_refused(tmp_path):
    # 40 steps an iteration: asked for 60, the run ends at 80, past its own total, and a resume
    # without flags (a requeue script's, a sweep trial's) finishes at once, as it did.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False,
                              **{**SMALL, "total_timesteps": 60, "nsteps": 20})
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 80
    assert acer_sync.train(resume=run_dir, progress_bar=False) == run_dir
    with pytest.raises(acer_sync.UserError, match=r"^--total-timesteps 70 is below the step the run has reached \(80\)"):
        acer_sync.train(resume=run_dir, total_timesteps=70)
    assert load_checkpoint(run_dir)["config"]["total_timesteps"] == 60


def test_a_resume_that_moves_a_linear_schedules_end_says_how_the_rate_changes(tmp_path, caplog):
    run_dir = tmp_path / "run"
    settings = {**SMALL, "total_timesteps": 80, "lr": 0.001, "lr_schedule": "linear", "save_buffer": True}
    acer_sync.train("CartPole-v1", run_dir=run_dir, progress_bar=False, **settings)
    acer_sync.train(resume=run_dir, total_timesteps=160, progress_bar=False)
    assert ("--total-timesteps 160 moves the linear learning-rate schedule's end from step 80: at step 80 the rate goes "
            "from 0 to 0.0005") in caplog.text
    assert min(float(row["lr"]) for row in read_progress(run_dir) if int(row["total_timesteps"]) > 80) >= 0.00025
    caplog.clear()
    # the same end: nothing to say (a callback, so that the resume builds the run, where the schedule is read)
    acer_sync.train(resume=run_dir, total_timesteps=160, progress_bar=False, callbacks=[acer_sync.Callback()])
    assert "moves the linear" not in caplog.text and "there is nothing to train" in caplog.text
    buffer = run_dir / "checkpoints" / "buffer.npz"
    buffer.write_bytes(buffer.read_bytes()[:1000])  # a resume its buffer refuses: it said so of a resume that never was
    with pytest.raises(acer_sync.UserError, match="buffer"):
        acer_sync.train(resume=run_dir, total_timesteps=240, progress_bar=False)
    assert "moves the linear" not in caplog.text


@pytest.mark.parametrize(
    "env, settings, message",
    [
        ("CartPole-v1", dict(learning_rate=0.1), "unknown setting 'learning_rate'"),
        ("CartPole-v1", dict(stop_at_reward=30), "stop_at_reward is train.py's flag --stop-at-reward, not a setting "
                                                 "(from Python: acer_sync.train(callbacks=[acer_sync.StopTrainingOnReward(x)]))"),
        ("CartPole-v1", dict(num_envs=2.5), "num_envs must be an integer, got 2.5"),
        ("CartPole-v1", dict(lr=0.0, gamma=2.0), "--lr must be finite and > 0; --gamma must be in (0, 1]"),
        ("CartPole-v1", dict(network="cnn"), "--network cnn does not fit CartPole-v1"),
        ("CartPole-v1", dict(buffer_size=10**9), "lower --buffer-size"),
        ("PongNoFrameskip-v4", dict(normalize_obs=True), "--normalize-obs is for vector observations"),
        ("CartPol-v1", {}, "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
        (3, {}, "env must be an env id or a callable"),
        (lambda: "not an env", {}, "returned str, not a gymnasium env"),
        (None, {}, "acer_sync.train needs an env"),
    ],
)
def test_bad_input_is_one_user_error_line_and_leaves_no_directory(tmp_path, capsys, env, settings, message):
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.train(env, run_dir=tmp_path / "runs" / "run", progress_bar=False, **settings)
    assert message in str(error.value) and "\n" not in str(error.value) and "UserError" not in str(error.value)
    assert list(tmp_path.iterdir()) == []
    no_error_lines(capsys)


class HugeRewards(OverflowingRewardsAfter):
    """CartPole whose rewards overflow float32 returns from its 30th step."""

    first_huge_step = 30


def test_a_run_that_stops_raises_training_stopped_and_prints_no_error_line(tmp_path, capsys):
    with pytest.raises(acer_sync.TrainingStopped) as stopped:
        acer_sync.train(HugeRewards, run_dir=tmp_path / "run", progress_bar=False,
                        **{**SMALL, "total_timesteps": 4000, "max_nonfinite": 2})
    outcome = stopped.value.outcome
    assert outcome.stop is Stop.NONFINITE and outcome.run_dir == tmp_path / "run"
    assert "2 non-finite updates in a row" in str(stopped.value) and "\n" not in str(stopped.value)
    no_error_lines(capsys)


def play_episode(policy, env, deterministic: bool) -> tuple[list[np.ndarray], object]:
    """One episode with the policy, the state passed back in; the observations it acted on, and the last state."""
    obs, _ = env.reset(seed=0)
    state, start, seen = None, True, []
    for _ in range(500):
        seen.append(obs)
        action, state = policy.predict(obs, state, episode_start=np.array([start]), deterministic=deterministic)
        assert env.action_space.contains(action)
        obs, _, terminated, truncated, _ = env.step(action)
        start = False
        if terminated or truncated:
            break
    return seen, state


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_load_predict_plays_an_episode_passing_the_state_back(runs, network):
    policy = acer_sync.load(runs[network])
    assert policy.recurrent == (network == "lstm") and policy.observation_shape == (4,)
    seen, state = play_episode(policy, gym.make("CartPole-v1"), deterministic=True)
    assert len(seen) >= 8
    if network == "mlp":
        assert state is None
        return
    # The state that predict threaded through the episode is the network's own unroll of it.
    model = policy.model
    obs = torch.as_tensor(np.stack(seen)).reshape(len(seen), 1, 1, 4)
    firsts = torch.zeros(len(seen), 1, dtype=torch.bool)
    with torch.no_grad():
        _, (h, c) = model.unroll(obs, firsts, model.initial_state(1))
    np.testing.assert_allclose(state[0], h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[1], c.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_predict_takes_one_observation_or_a_batch(runs, network):
    policy = acer_sync.load(runs[network] / "checkpoints" / "latest.pt")
    batch = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions, state = policy.predict(batch, deterministic=True)
    assert actions.shape == (5,) and actions.dtype == np.int64
    for row, action in zip(batch, actions):
        single, _ = policy.predict(row, deterministic=True)
        assert np.ndim(single) == 0 and single == action
    if network == "lstm":
        assert [s.shape for s in state] == [(5, 8), (5, 8)]
        # episode_start resets the state of the envs it marks, and only theirs.
        _, carried = policy.predict(batch, state, deterministic=True)
        _, restarted = policy.predict(batch, state, episode_start=[True, False, False, False, True], deterministic=True)
        _, fresh = policy.predict(batch, deterministic=True)
        for s_restarted, s_carried, s_fresh in zip(restarted, carried, fresh):
            np.testing.assert_array_equal(s_restarted[[0, 4]], s_fresh[[0, 4]])
            np.testing.assert_array_equal(s_restarted[1:4], s_carried[1:4])
            assert not np.allclose(s_carried[0], s_fresh[0])
    with pytest.raises(acer_sync.UserError, match=r"predict takes an observation of shape \(4,\)"):
        policy.predict(np.zeros((2, 3)))


@pytest.mark.parametrize("game, games_to_play", [("BreakoutNoFrameskip-v4", 2), ("MsPacmanNoFrameskip-v4", 1)])
def test_make_env_observations_are_the_actors_stacks_on_atari(game, games_to_play):
    # Breakout: a FIRE game with lives, so the life-loss actions are played too. MsPacman: lives
    # without FIRE, where a stack carried over a lost life showed the policy frames of the life
    # before for 3 decisions, where training and evaluation clear it. The Actor's side plays the
    # same preprocessed env through a vector env, and starts its episodes where evaluation does.
    info = env_info(game)
    vector = VecEnv(info, 1, "sync", noop_max=0)
    actor = Actor(NeverFire(info.n_actions), info, 1, torch.device("cpu"))
    tracker = EpisodeTracker(1, life_loss_ends_episode=True, clip_rewards=False)
    lives_lost = 0

    def actor_step() -> tuple[float, bool, bool]:
        nonlocal lives_lost
        actions, _ = actor.act()
        frames, rewards, terminated, truncated, lives = vector.step(actions)
        _, starts, game_over = tracker.step(rewards, terminated, truncated, lives)
        actor.observe(frames, starts, tracker.life_lost, game_over)
        lives_lost += int(tracker.life_lost[0])
        return float(rewards[0]), bool(game_over[0]), bool(tracker.life_lost[0])

    frames, lives = vector.reset(seed=3)
    tracker.reset(lives)
    actor.reset(frames)
    env = acer_sync.make_env(game, noop_max=0)
    obs, reset_info = env.reset(seed=3)
    assert obs.shape == (4, 84, 84) == env.observation_space.shape and reset_info["episode_start"]
    np.testing.assert_array_equal(obs, actor.observation[0])
    games = 0
    while games < games_to_play:
        obs, reward, terminated, truncated, step_info = env.step(0)
        total, game_over, life_lost = actor_step()
        while not game_over and len(actor.life_loss_actions.forced()[0]):  # the Actor plays them step by step
            step_reward, game_over, _ = actor_step()
            total += step_reward
        assert (terminated or truncated) == game_over and reward == total
        assert step_info["episode_start"] == (life_lost and not game_over)
        if game_over:
            games += 1
            obs, _ = env.reset()
        np.testing.assert_array_equal(obs, actor.observation[0])
    vector.close()
    assert lives_lost >= 2  # lives were lost, and the stacks compared after them


def test_make_env_observations_play_with_predict(runs):
    policy = acer_sync.load(runs["mlp"])
    env = acer_sync.make_env("CartPole-v1")
    obs, _ = env.reset(seed=1)
    action, _ = policy.predict(obs)
    env.step(action)


def test_a_gaussian_policy_predicts_actions_inside_the_box(tmp_path):
    run_dir = acer_sync.train("Pendulum-v1", run_dir=tmp_path / "run", progress_bar=False,
                              **{**SMALL, "total_timesteps": 80, "policy_std": 5.0})
    assert load_checkpoint(run_dir)["action_high"] == [2.0]
    policy = acer_sync.load(run_dir)
    observations = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    actions, state = policy.predict(observations)
    assert actions.shape == (64, 1) and state is None
    assert np.abs(actions).max() == 2.0  # σ of 5 half-widths: many samples fall outside, and are clipped
    single, _ = policy.predict(observations[0], deterministic=True)
    assert single.shape == (1,)


def test_a_run_gives_the_callers_torch_thread_count_back(tmp_path):
    # The classic preset trains on one torch thread; the caller's process keeps its own count.
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False,
                                  **{key: value for key, value in SMALL.items() if key != "vec_env"})
        assert json.loads((run_dir / "config.json").read_text())["config"]["threads"] == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_run_started_before_a_check_existed_resumes(tmp_path):
    # --replay-ratio is at most 100 since 1e6 kept a Ctrl-C waiting: a run of 150 (not resumable to
    # another ratio) could no longer be resumed at all
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, **SMALL)
    latest = run_dir / "checkpoints" / "latest.pt"
    payload = torch.load(latest, weights_only=True)
    payload["config"].update(replay_ratio=150.0, sdn_samples=2000)  # --sdn-samples' cap is older, the same
    torch.save(payload, latest)
    recorded = json.loads((run_dir / "config.json").read_text())
    recorded["config"].update(replay_ratio=150.0, sdn_samples=2000)
    (run_dir / "config.json").write_text(json.dumps(recorded))
    assert acer_sync.train(resume=run_dir, total_timesteps=240, progress_bar=False) == run_dir
    with pytest.raises(acer_sync.UserError, match="--replay-ratio must be from 0 to 100"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "new", replay_ratio=150.0, **SMALL)


def test_save_buffer_may_change_on_a_resume(tmp_path):
    # It was refused ("--save-buffer True (the run used False)"), though it changes nothing the run learns.
    from acer_sync.training.checkpoint import BUFFER_FILE

    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, **SMALL)
    buffer = run_dir / "checkpoints" / BUFFER_FILE
    assert not buffer.exists()
    acer_sync.train(resume=run_dir, total_timesteps=400, save_buffer=True, progress_bar=False)
    assert buffer.exists() and load_checkpoint(run_dir)["config"]["save_buffer"] is True
    acer_sync.train(resume=run_dir, total_timesteps=600, save_buffer=False, progress_bar=False)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 600


def test_what_a_run_reports_and_keeps_may_change_on_a_resume(tmp_path):
    # --eval-every, --checkpoint-every and the like were refused ("--checkpoint-every 40 (the run used
    # 1000000)"): a run could not be made to evaluate, or to checkpoint more often, without starting again
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, **SMALL)
    acer_sync.train(resume=run_dir, total_timesteps=400, eval_every=100, eval_episodes=2,
                    checkpoint_every=40, keep_checkpoints=2, log_interval=2, log_seconds=0.0, progress_bar=False)
    rows = read_progress(run_dir)
    evaluated = [(int(row["total_timesteps"]), int(row["eval_episodes"])) for row in rows if int(row["eval_episodes"])]
    assert evaluated == [(320, 2), (400, 2)]  # the iterations of 40 steps that reach 300 and 400
    assert [int(row["total_timesteps"]) for row in rows if int(row["total_timesteps"]) > 200] == [240, 320, 400]  # every 2nd
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("step_*.pt")) == ["step_0000000360.pt", "step_0000000400.pt"]
    saved = load_checkpoint(run_dir)
    assert {name: saved["config"][name] for name in ("eval_every", "checkpoint_every", "keep_checkpoints", "log_interval")} == \
        dict(eval_every=100, checkpoint_every=40, keep_checkpoints=2, log_interval=2)
    acer_sync.train(resume=run_dir, total_timesteps=600, eval_every=0, progress_bar=False)  # and off again
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 600
    with pytest.raises(acer_sync.UserError, match=r"--lr 0.5 \(the run used"):  # what it learns still may not
        acer_sync.train(resume=run_dir, total_timesteps=800, lr=0.5, eval_every=100)
    with pytest.raises(acer_sync.UserError, match=r"--eval-greedy True \(the run used False\)$"):  # nor mixed scores
        acer_sync.train(resume=run_dir, total_timesteps=800, eval_greedy=True)


def test_settings_the_run_does_not_use_get_one_warning(tmp_path, caplog):
    # --lstm-size 256 on a feed-forward Pong run trained 10 hours as if it were not given, in silence
    import logging

    with caplog.at_level(logging.WARNING, logger="acer_sync"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", lstm_size=7, sdn_samples=3, trust_region=False, delta=5.0,
                        progress_bar=False, **SMALL)
    warnings = [record.getMessage() for record in caplog.records if "does not use" in record.getMessage()]
    assert warnings == ["this run does not use --lstm-size (the network has no LSTM), --sdn-samples (the actions are "
                        "discrete), --delta (--no-trust-region)"]
    caplog.clear()  # a value the run has anyway (configs/classic.yaml's delta, its preset's) is no setting to warn of
    with caplog.at_level(logging.WARNING, logger="acer_sync"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "preset", trust_region=False, delta=PRESETS["classic"].get("delta", 1.0),
                        lstm_norm="none", progress_bar=False, **SMALL)
    assert not [record for record in caplog.records if "does not use" in record.getMessage()]


def test_each_message_shows_once_where_the_program_shows_log_records_itself(tmp_path, capsys):
    # After logging.basicConfig, every line of the run came twice: ours on stdout, the root's on stderr.
    import logging

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    try:
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, num_envs=2, vec_env="sync", eval_every=0,
                        progress_bar=False)
    finally:
        root.removeHandler(handler)
    said = capsys.readouterr()
    assert "run directory" not in said.out
    assert said.err.count(f"acer_sync INFO run directory: {tmp_path / 'run'}") == 1


def test_a_message_while_the_progress_bar_is_drawn_gets_a_line_of_its_own(capsys):
    # Written as it was, "…0/10 [00:00<?, ?step/s]" ran on with the message on the terminal's line.
    from tqdm import tqdm

    from acer_sync.base.log import console, log

    with console(1):
        bar = tqdm(total=10, file=sys.stderr, bar_format="[{n}/{total}]")
        bar.update(3)
        log.info("reached the reward")
        bar.close()
    said = capsys.readouterr()
    assert said.out == "reached the reward\n"
    cleared = said.err.index("\r      \r")  # the bar taken off its line before the message, then drawn again
    assert said.err.startswith("\r[0/10]") and "[3/10]" in said.err[cleared:]


def test_an_evaluation_due_before_a_session_without_evaluations_is_not_owed_after_it(tmp_path):
    # The evaluation state a session with --eval-every 0 carried on untouched (next_eval 240) was
    # taken, once evaluations were back on, for one a stop had skipped: played off its schedule, at 440.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, **{**SMALL, "eval_every": 100,
                                                                                                 "eval_episodes": 2})
    acer_sync.train(resume=run_dir, total_timesteps=400, eval_every=0, progress_bar=False)
    acer_sync.train(resume=run_dir, total_timesteps=560, eval_every=100, progress_bar=False)
    evaluated = [int(row["total_timesteps"]) for row in read_progress(run_dir) if int(row["eval_episodes"])]
    assert evaluated == [120, 200, 520]  # the iterations of 40 steps that reach 100, 200 and 500


def test_config_json_records_each_resumed_session_and_its_changes(tmp_path, capsys):
    # A resume's settings and command were recorded nowhere: a run extended to 400 steps said 200 in
    # config.json, and plot.py labelled it so.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, **SMALL)
    first = json.loads((run_dir / "config.json").read_text())
    assert "resumes" not in first
    assert train.main(["--resume", str(run_dir), "--total-timesteps", "400", "--eval-every", "100", "--no-progress"]) in (0, None)
    record = json.loads((run_dir / "config.json").read_text())
    assert record["command"] == first["command"] and record["git_commit"] == first["git_commit"]
    assert record["config"] == {**first["config"], "total_timesteps": 400, "eval_every": 100}
    [session] = record["resumes"]
    assert session["step"] == 200 and session["changed"] == {"total_timesteps": [200, 400], "eval_every": [0, 100]}
    assert session["command"][-7:] == ["--resume", str(run_dir), "--total-timesteps", "400", "--eval-every", "100", "--no-progress"]
    assert session["git_commit"] == first["git_commit"] and session["versions"] == first["versions"]
    acer_sync.train(resume=run_dir, total_timesteps=600, verbose=0)  # and a resume from Python, with its call
    sessions = json.loads((run_dir / "config.json").read_text())["resumes"]
    assert [s["step"] for s in sessions] == [200, 400] and sessions[1]["changed"] == {"total_timesteps": [400, 600]}
    assert sessions[1]["command"] == [f"acer_sync.train(resume={str(run_dir)!r}, total_timesteps=600)"]
    capsys.readouterr()

"""Recurrent ACER: the LSTM replays exactly as it acted, from the state stored with each segment."""

import dataclasses

import numpy as np
import pytest
import torch
from reference_acer import categorical_forward, categorical_policy, gaussian_advantage, gaussian_policy, gaussian_value

from acer_sync.base.config import Config, build_config
from acer_sync.cli import train
from acer_sync.math import losses
from acer_sync.nets.build import build_model
from acer_sync.nets.distributions import distribution_for
from acer_sync.nets.networks import ActorCriticNet
from acer_sync.replay.buffer import ReplayBuffer, buffer_fields, to_batch
from acer_sync.rollout.runner import Runner
from acer_sync.training.acer import ACER
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker
from helpers import categorical_net, ff_batch, gaussian_net, one_line_error, random_batch, recurrent_net


def hand_set_lstm() -> ActorCriticNet:
    """One LSTM unit whose gates are all open (i = f = o = σ(100) = 1) and whose candidate is
    g_t = tanh(u_t), with u_t = tanh(x_t) the torso's one tanh unit: c_t = c_{t−1} + tanh(tanh(x_t)),
    h_t = tanh(c_t)."""
    net = recurrent_net((1, 1), 2, "lstm", hidden=(1,), lstm_size=1)
    with torch.no_grad():
        linear = net.torso.body[1]
        linear.weight.fill_(1.0)
        linear.bias.zero_()
        net.memory.lstm.weight_ih.copy_(torch.tensor([[0.0], [0.0], [1.0], [0.0]]))  # rows: i, f, g, o
        net.memory.lstm.weight_hh.zero_()
        net.memory.lstm.bias_ih.copy_(torch.tensor([100.0, 100.0, 0.0, 100.0]))
        net.memory.lstm.bias_hh.zero_()
    return net


def test_unroll_resets_the_state_at_an_episode_start_inside_a_segment_hand_worked():
    # x = 0.5, 1, −0.5, 2 in both envs, from the stored state (h, c) = (0.2, 0.3). Env 0 starts an
    # episode at t = 2, env 1 does not. g_t = tanh(tanh(x_t)) = 0.4318082, 0.6420150, −0.4318082,
    # 0.7460680.
    #   env 0: c = 0.3 + g_0 = 0.7318082, + g_1 = 1.3738232; reset: c = g_2 = −0.4318082, + g_3 = 0.3142598
    #   env 1: c = 0.7318082, 1.3738232, 0.9420150, 1.6880830
    # and h = tanh(c).
    net = hand_set_lstm()
    x = torch.tensor([0.5, 1.0, -0.5, 2.0])
    obs = x[:, None, None, None].expand(4, 2, 1, 1)
    firsts = torch.tensor([[False, False], [False, False], [True, False], [False, False]])
    state = (torch.full((2, 1), 0.2), torch.full((2, 1), 0.3))
    features, (h, c) = net.unroll(obs, firsts, state)
    expected_h = torch.tensor([[0.6241703, 0.6241703], [0.8795606, 0.8795606], [-0.4068313, 0.7361467],
                               [0.3043074, 0.9339026]])
    torch.testing.assert_close(features.reshape(4, 2), expected_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.squeeze(-1), torch.tensor([0.3142598, 1.6880830]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h.squeeze(-1), expected_h[-1], rtol=1e-5, atol=1e-6)
    # Step by step, as the Actor acts, gives the same.
    step_state = state
    for t in range(4):
        step_features, step_state = net.step(obs[t], step_state, firsts[t])
        torch.testing.assert_close(step_features.squeeze(-1), expected_h[t], rtol=1e-5, atol=1e-6)


def test_unroll_of_a_feed_forward_net_is_its_old_forward_pass():
    torch.manual_seed(0)
    T, N = 3, 2
    firsts = torch.zeros(T, N, dtype=torch.bool)
    for net, obs in (
        (categorical_net((1, 4), 3, "mlp", (8,), normalize_obs=True), torch.randn(T, N, 1, 4)),
        (categorical_net((4, 36, 36), 3, "cnn"), torch.randint(0, 256, (T, N, 4, 36, 36), dtype=torch.uint8)),
    ):
        features, state = net.unroll(obs, firsts, net.initial_state(N))
        flat = obs.reshape(T * N, *obs.shape[2:])
        assert state == ()
        for got, expected in zip(net(features), categorical_forward(net, flat)):
            assert torch.equal(got, expected)
        assert torch.equal(net.policy_of(features), categorical_policy(net, flat))
    net = gaussian_net((1, 4), 2, (8,), [0.3, 0.3], normalize_obs=True)
    obs = torch.randn(T, N, 1, 4)
    features, _ = net.unroll(obs, firsts, ())
    flat = obs.reshape(T * N, 1, 4)
    actions = torch.randn(T * N, 5, 2)
    assert torch.equal(net.policy_of(features), gaussian_policy(net, flat))
    assert torch.equal(net.value_of(features), gaussian_value(net, flat))
    assert torch.equal(net.advantage_of(features, actions), gaussian_advantage(net, flat, actions))


def lstm_runner(env_id: str, num_envs: int, nsteps: int, **settings):
    info = env_info(env_id)
    config = build_config(info.atari, dict(env=env_id, network="lstm", hidden="16", lstm_size=8, **settings))
    model = build_model(info, config)
    fields = buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info), model.state_shapes)
    env = VecEnv(info, num_envs, "sync")
    runner = Runner(env, model, torch.device("cpu"), nsteps, EpisodeTracker(num_envs, False, False), fields)
    runner.reset(seed=0)
    return runner, model, fields, env


def replayed_pi(model, batch, state) -> torch.Tensor:
    T, N = batch.actions.shape
    with torch.no_grad():
        features, _ = model.unroll(batch.obs[:T], batch.firsts[:T], state)
        return model.policy_of(features).reshape(T, N, -1)


def test_replay_from_the_stored_state_gives_pi_equal_mu_at_every_step_and_zero_state_replay_does_not():
    # The identity no other ACER passes: with unchanged weights, replaying a stored segment from
    # its stored state recomputes μ, so ρ = 1 at every step and the bias correction vanishes.
    torch.manual_seed(0)
    T, N = 8, 3
    runner, model, fields, env = lstm_runner("CartPole-v1", N, T)
    with torch.no_grad():
        model.head.pi.weight.mul_(100)  # a policy that depends on its state, as a trained one does
    buffer = ReplayBuffer(fields, N, T, 6 * T, 1)
    carried_in = []
    try:
        for _ in range(6):
            carried_in.append(tuple(s.clone() for s in runner.actor.state))
            buffer.put(runner.run())
    finally:
        env.close()
    zero_state_gaps = []
    for index in range(6):
        batch = to_batch(buffer.gather(np.full(N, index)), fields, 1, torch.device("cpu"))
        # The stored state is the Actor's at the segment start.
        for stored, actor_state in zip(batch.state, carried_in[index]):
            assert torch.equal(stored, actor_state)
        pi = replayed_pi(model, batch, batch.state)
        assert (pi - batch.mu).abs().max() <= 1e-6
        rho = losses.importance_weights(pi, batch.mu).gather(-1, batch.actions.unsqueeze(-1))
        assert (rho - 1).abs().max() <= 1e-5
        _, correction = losses.acer_policy_gain(
            pi, torch.zeros(T, N, 2), torch.zeros(T, N), torch.ones(T, N), losses.importance_weights(pi, batch.mu),
            batch.actions, 0.5,
        )
        assert correction.abs().max() <= 1e-5  # ρ ≤ c everywhere: [1 − c/ρ]₊ = 0
        zero_pi = replayed_pi(model, batch, model.initial_state(N))
        gap = (zero_pi - batch.mu).abs().amax(-1)  # [T, N]
        # Replaying from zeros is wrong from the segment's start until an episode starts.
        started = torch.cumsum(batch.firsts[:T].int(), 0) > 0
        assert (gap[started] <= 1e-6).all()
        zero_state_gaps.append(gap[0][~batch.firsts[0]])
    assert torch.cat(zero_state_gaps).min() > 1e-3


@pytest.mark.parametrize("pipeline, lr", [("serial", 7e-4), ("overlap", 1e-30)])
def test_trainer_on_policy_updates_see_rho_one_from_the_stored_state(tmp_path, pipeline, lr):
    # Through the whole loop: the on-policy update's ρ is 1 (its weights acted the segment), and
    # replay from the zero state (Baselines' way) makes it wrong. Overlapped, the envs collect with
    # the acting copy in a thread, one update behind; weights that do not move (lr 1e-30 moves
    # none by more than about 1e-29) make that lag nothing, so ρ from the state it stored is 1 there too.
    rho = {}
    for replay_state in ("stored", "zero"):
        info = env_info("CartPole-v1")
        config = build_config(False, dict(
            env="CartPole-v1", network="lstm", hidden="16", lstm_size=8, vec_env="sync", num_envs=4, nsteps=10,
            total_timesteps=400, replay_ratio=0, log_interval=1, eval_every=0, replay_state=replay_state,
            pipeline=pipeline, lr=lr,
        ))
        rows = []
        (tmp_path / replay_state).mkdir()
        trainer = build_trainer(config, info, tmp_path / replay_state, progress_bar=False, on_progress=rows.append)
        with torch.no_grad():  # a policy that depends on its state, as a trained one does
            for model in {trainer.model, trainer.runner.actor.model}:
                model.head.pi.weight.mul_(100)
        assert trainer.train().finished
        assert (trainer.acting is None) == (pipeline == "serial")
        rho[replay_state] = np.array([row["rho_mean"] for row in rows])
        if pipeline == "overlap":  # the session's first segment had no update before the next was collected
            assert np.isnan(rho[replay_state][0])
            rho[replay_state] = rho[replay_state][1:]
    assert np.abs(rho["stored"] - 1).max() <= 1e-5
    assert np.abs(rho["zero"] - 1).max() > 1e-4


def test_an_lstm_run_checkpoints_resumes_and_refuses_another_network(tmp_path):
    run_dir = tmp_path / "run"
    common = ["--no-progress"]
    assert train.main(["--env", "CartPole-v1", "--network", "lstm", "--lstm-size", "8", "--hidden", "16",
                       "--vec-env", "sync", "--num-envs", "2", "--total-timesteps", "400", "--eval-every", "0",
                       "--save-buffer", "--run-dir", str(run_dir), *common]) == 0
    first = load_checkpoint(run_dir)
    assert first["model_spec"]["arch"] == "lstm" and first["model_spec"]["lstm_size"] == 8
    with np.load(run_dir / "checkpoints" / "buffer.npz") as arrays:
        assert arrays["state_h"].shape[1:] == (2, 8)
    assert train.main(["--resume", str(run_dir), "--total-timesteps", "800", *common]) == 0
    second = load_checkpoint(run_dir)
    assert second["counters"]["timesteps"] == 800 and second["model_spec"] == first["model_spec"]
    assert any(not torch.equal(second["model"][k], first["model"][k]) for k in first["model"])


def test_resume_with_another_network_is_one_line(tmp_path):
    import subprocess
    import sys

    from helpers import ROOT

    run_dir = tmp_path / "run"
    assert train.main(["--env", "CartPole-v1", "--network", "lstm", "--lstm-size", "8", "--vec-env", "sync",
                       "--num-envs", "2", "--total-timesteps", "200", "--eval-every", "0", "--run-dir", str(run_dir),
                       "--no-progress"]) == 0
    result = subprocess.run([sys.executable, "train.py", "--resume", str(run_dir), "--network", "mlp"],
                            cwd=ROOT, capture_output=True, text=True)
    assert "--network mlp (the run used lstm)" in one_line_error(result)


@pytest.mark.parametrize("network", ["cnn", "cnn_lstm"])
def test_a_network_that_does_not_fit_the_observations_is_one_line(tmp_path, network):
    import subprocess
    import sys

    from helpers import ROOT

    result = subprocess.run([sys.executable, "train.py", "--env", "CartPole-v1", "--network", network,
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True)
    assert f"--network {network} does not fit CartPole-v1" in one_line_error(result)
    assert not (tmp_path / "run").exists()


def cue_recall_returns(network: str, tmp_path) -> list[float]:
    import memory_env

    rows = []
    config = build_config(False, dict(
        env=memory_env.ENV_ID, network=network, vec_env="sync", num_envs=4, nsteps=10, replay_ratio=8, lr=0.002,
        total_timesteps=16_000, log_interval=25, eval_every=0, threads=1, seed=0,
    ))
    run_dir = tmp_path / network
    run_dir.mkdir()
    assert build_trainer(config, env_info(memory_env.ENV_ID), run_dir, progress_bar=False, on_progress=rows.append).train().finished
    return [row["mean_episode_reward"] for row in rows]


def test_an_lstm_solves_a_memory_task_that_a_feed_forward_policy_cannot(tmp_path):
    # Cue recall (tests/memory_env.py): the cue is seen 4 steps before it must be named. Without
    # memory the best policy earns 0.5; with it, 1. Measured: the LSTM's 100-episode mean passes
    # 0.95 near 10k steps and stays at 1.0; the MLP's stays between 0.44 and 0.63.
    lstm, mlp = cue_recall_returns("lstm", tmp_path), cue_recall_returns("mlp", tmp_path)
    assert lstm[-1] >= 0.95, lstm
    assert mlp[-1] <= 0.65, mlp


def test_the_classic_preset_with_memory_takes_the_recurrent_settings_unless_told_otherwise():
    plain, lstm = build_config(False, {}), build_config(False, {"network": "lstm"})
    assert (plain.nsteps, plain.replay_ratio, plain.lr) == (20, 4.0, 1e-3)
    assert (lstm.nsteps, lstm.replay_ratio, lstm.lr) == (10, 8.0, 2e-3)
    assert dataclasses.replace(lstm, network="auto", nsteps=20, replay_ratio=4.0, lr=1e-3) == plain  # nothing else
    assert build_config(False, {}, env_settings={"network": "lstm"}).nsteps == 10  # an env file's network counts
    # An env file, then the user's settings, still come after it.
    env_file = build_config(False, {"network": "lstm"}, env_settings={"lr": 5e-3, "nsteps": 5})
    assert (env_file.nsteps, env_file.replay_ratio, env_file.lr) == (5, 8.0, 5e-3)
    assert build_config(False, {"network": "lstm", "lr": 1e-4}, env_settings={"lr": 5e-3}).lr == 1e-4
    # Atari's cnn_lstm and the continuous preset keep theirs.
    assert build_config(True, {"network": "cnn_lstm"}) == dataclasses.replace(build_config(True, {}), network="cnn_lstm")
    continuous = build_config(False, {}, continuous=True)
    assert build_config(False, {"network": "lstm"}, continuous=True) == dataclasses.replace(continuous, network="lstm")


def test_the_average_network_replays_from_the_stored_state_too():
    # A fresh ACER's average network is a copy of the online one: unrolled from the same stored
    # LSTM state, π_avg = π at every step and the KL (taken before the step) is 0. An average
    # network replayed from zeros differs on the steps before an episode starts.
    torch.manual_seed(0)
    T, N = 4, 3
    model = recurrent_net((1, 4), 3, "lstm", hidden=(16,), lstm_size=8)
    with torch.no_grad():
        model.head.pi.weight.mul_(50)  # π depends strongly on the state
    agent = ACER(model, Config(env="test", nsteps=T, num_envs=N, hidden="16"))
    batch = ff_batch(**random_batch(T, N, (1, 4), 3, False, seed=1))
    generator = torch.Generator().manual_seed(2)
    batch = batch._replace(state=tuple(torch.randn(N, 8, generator=generator) for _ in range(2)))
    assert agent.update(batch, lr=1e-3)["kl_avg"].item() == pytest.approx(0.0, abs=1e-6)

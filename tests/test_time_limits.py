"""Time limits bootstrap from the final observation, for both action kinds; old runs still load."""

import hashlib

import numpy as np
import torch

import train
from acer_sync import losses
from acer_sync.agent import ACER, Batch
from acer_sync.buffer import ReplayBuffer, Segment
from acer_sync.checkpoint import load_checkpoint, save_checkpoint
from acer_sync.config import Config, build_config
from acer_sync.distributions import DiagGaussian
from acer_sync.learn import build_model
from acer_sync.networks import ActorCritic
from acer_sync.runner import Runner
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker


def test_q_retrace_bootstraps_a_truncated_step_from_its_final_value():
    # T = 2, γ = 0.9, ρ̄ = 1. Step 1 is cut by a time limit: done, with V(x_final) = 5.
    # Q^ret_1 = 2 + 0.9·0·100 + 0.9·5 = 6.5;  Q^ret_0 = 1 + 0.9·(1·(6.5 − 3) + 4) = 7.75
    rewards = torch.tensor([[1.0], [2.0]])
    dones = torch.tensor([[0.0], [1.0]])
    q_taken = torch.tensor([[0.0], [3.0]])
    values = torch.tensor([[0.0], [4.0], [100.0]])
    timeout_values = torch.tensor([[0.0], [5.0]])
    q_ret = losses.q_retrace(rewards, dones, q_taken, values, torch.ones(2, 1), 0.9, timeout_values=timeout_values)
    torch.testing.assert_close(q_ret, torch.tensor([[7.75], [6.5]]))


def test_zero_timeout_values_change_no_bit():
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(7, 3, generator=g), (torch.rand(7, 3, generator=g) < 0.3).float(), torch.randn(7, 3, generator=g),
            torch.randn(8, 3, generator=g), torch.rand(7, 3, generator=g) * 2, 0.99)
    assert torch.equal(losses.q_retrace(*args), losses.q_retrace(*args, timeout_values=torch.zeros(7, 3)))


#: The parameters after three discrete updates on the batch below, hashed with the code of main
#: before continuous ACER and the time-limit bootstrap landed (commit d082ab5).
DISCRETE_DIGEST = "76a938b7dcb39d1ec7365d0d9601c463570dde999d8ca06ec0ccc07b2fde2c9f"


def test_discrete_update_is_bit_identical_without_truncation():
    for timeout_values in (None, torch.zeros(5, 3)):
        torch.manual_seed(3)
        model = ActorCritic((1, 4), 3, "mlp", (16,))
        agent = ACER(model, Config(env="test", nsteps=5, num_envs=3, hidden="16"))
        g = torch.Generator().manual_seed(4)
        T, N = 5, 3
        batch = Batch(
            obs=torch.randn(T + 1, N, 1, 4, generator=g), actions=torch.randint(0, 3, (T, N), generator=g),
            mu=torch.softmax(torch.randn(T, N, 3, generator=g), -1), rewards=torch.randn(T, N, generator=g),
            dones=(torch.rand(T, N, generator=g) < 0.2).float(), timeout_values=timeout_values,
        )
        for _ in range(3):
            stats = agent.update(batch, lr=1e-2)
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        assert digest == DISCRETE_DIGEST
        assert float(stats["loss_policy"]) == -0.24137912690639496 and float(stats["loss_q"]) == 0.49999386072158813


def runner_for(env_id: str, num_envs: int, nsteps: int, config: Config):
    info = env_info(env_id)
    env = VecEnv(info, num_envs, "sync")
    model = build_model(info, config)
    runner = Runner(env, model, torch.device("cpu"), nsteps, EpisodeTracker(num_envs, False, False))
    runner.reset(seed=0)
    return runner, env, model


def test_runner_stores_the_final_value_of_truncated_steps_only():
    # Pendulum-v1 is cut at 200 steps and never terminates: step 199 of every env is done, with
    # the value of its final observation; every other step has 0.
    torch.manual_seed(0)
    config = build_config(False, dict(env="Pendulum-v1", hidden="8"), continuous=True)
    runner, env, model = runner_for("Pendulum-v1", 2, 50, config)
    try:
        segments = [runner.run() for _ in range(4)]
        last = segments[-1]
        assert last.dones[49].all() and not np.concatenate([s.dones for s in segments])[:-1].any()
        expected = model.value(torch.from_numpy(env.final_frames[:, None])).detach().numpy()
        np.testing.assert_allclose(last.timeout_values[49], expected, rtol=1e-6)
        assert (last.timeout_values[49] != 0).all()
        assert not np.concatenate([s.timeout_values for s in segments])[:-1].any()
        # The actions are stored unclipped; μ is [mean, log σ].
        assert last.actions.shape == (50, 2, 1) and last.mu.shape == (50, 2, 2)
    finally:
        env.close()


def test_a_terminal_step_is_not_bootstrapped():
    torch.manual_seed(0)
    config = build_config(False, dict(env="CartPole-v1", hidden="8"))
    runner, env, _ = runner_for("CartPole-v1", 2, 40, config)
    try:
        segment = runner.run()
        assert segment.dones.any() and not segment.timeout_values.any()  # CartPole falls long before 500 steps
    finally:
        env.close()


def test_a_buffer_saved_before_timeout_values_loads_with_zeros():
    def filled(buffer, value):
        T, N = 4, 2
        buffer.put(Segment(
            np.full((T + 1, N, 3), value, np.float32), np.zeros((T + 1, N), bool), np.zeros((T, N), np.int64),
            np.full((T, N, 2), 0.5, np.float32), np.ones((T, N), np.float32), np.zeros((T, N), bool),
            np.full((T, N), 7.0, np.float32),
        ))
        return buffer

    new = filled(ReplayBuffer(2, 4, 8, (3,), np.dtype(np.float32), 1, 2), 1.0)
    old_state = {name: array for name, array in new.state().items() if name != "timeout_values"}
    restored = ReplayBuffer(2, 4, 8, (3,), np.dtype(np.float32), 1, 2)
    restored.timeout_values[...] = 9.0
    restored.load_state(old_state)
    assert not restored.timeout_values.any()
    np.testing.assert_array_equal(restored.frames, new.frames)
    assert restored.latest().timeout_values.shape == (4, 2)


def test_continuous_buffer_round_trip():
    dist = DiagGaussian(2, [-1, -1], [1, 1])
    buffer = ReplayBuffer(3, 4, 8, (5,), np.dtype(np.float32), 1, 2, dist)
    T, N = 4, 3
    actions = np.random.default_rng(0).normal(size=(T, N, 2)).astype(np.float32) * 3  # beyond the bounds: kept
    mu = np.random.default_rng(1).normal(size=(T, N, 4)).astype(np.float32)
    buffer.put(Segment(np.zeros((T + 1, N, 5), np.float32), np.zeros((T + 1, N), bool), actions, mu,
                       np.zeros((T, N), np.float32), np.zeros((T, N), bool), np.arange(T * N, dtype=np.float32).reshape(T, N)))
    sample = buffer.latest()
    np.testing.assert_array_equal(sample.actions, actions)
    np.testing.assert_array_equal(sample.mu, mu)
    np.testing.assert_array_equal(sample.timeout_values, np.arange(T * N).reshape(T, N))
    assert buffer.nbytes == ReplayBuffer.bytes_needed(3, 4, 8, (5,), np.dtype(np.float32), 1, 2, dist)


def test_a_checkpoint_from_before_continuous_acer_resumes(tmp_path):
    run_dir = tmp_path / "old"
    assert train.main(["--env", "CartPole-v1", "--vec-env", "sync", "--device", "cpu", "--num-envs", "2",
                       "--total-timesteps", "200", "--eval-every", "0", "--hidden", "8", "--run-dir", str(run_dir),
                       "--no-progress"]) == 0
    path = run_dir / "checkpoints" / "latest.pt"
    payload = load_checkpoint(path)
    # What an older version wrote: no new config fields, the four-key network spec.
    for name in ("normalize_obs", "reward_scale", "policy_std", "sdn_samples"):
        del payload["config"][name]
    payload["model_spec"] = {key: payload["model_spec"][key] for key in ("obs_shape", "n_actions", "arch", "hidden")}
    payload.pop("format")
    save_checkpoint(path, payload)
    assert train.main(["--resume", str(run_dir), "--total-timesteps", "400", "--no-progress"]) == 0
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 400

"""Time limits bootstrap from the final observation, for both action kinds; old runs still load."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from reference_acer import ReferenceRMSpropTF, reference_update

from acer_sync.base.config import Config, build_config
from acer_sync.cli import train
from acer_sync.math import losses
from acer_sync.nets.build import build_model
from acer_sync.nets.distributions import Categorical, DiagGaussian, distribution_for, distribution_of_spec
from acer_sync.replay.buffer import Batch, ReplayBuffer, Segment, buffer_fields
from acer_sync.rollout.runner import Runner
from acer_sync.training.acer import ACER
from acer_sync.training.checkpoint import load_checkpoint
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker
from helpers import categorical_net, gaussian_net, random_batch


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


def _updated_both_ways(make_model, config, batch, updates=3, sync_free=False):
    """Parameters after ``updates`` steps of ACER.update (its host-branch or its sync-free step)
    and of the frozen reference, from one init."""
    torch.manual_seed(3)
    model = make_model()
    reference_model = copy.deepcopy(model)
    agent = ACER(model, config, sync_free=sync_free)
    reference_average = copy.deepcopy(agent.average_model)
    reference_optimizer = ReferenceRMSpropTF(reference_model.parameters(), lr=config.lr, alpha=config.rms_alpha, eps=config.rms_eps)
    dist = distribution_of_spec(model.spec())
    T, N = batch["actions"].shape[:2]
    torch.manual_seed(5)
    for _ in range(updates):
        agent.update(Batch(**batch, firsts=torch.zeros(T + 1, N, dtype=torch.bool), state=()), lr=1e-2)
    torch.manual_seed(5)
    for _ in range(updates):
        assert reference_update(reference_model, reference_average, reference_optimizer, config, dist, batch, lr=1e-2)
    return model, agent.average_model, reference_model, reference_average


def _assert_bit_identical(model, reference):
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(p, q), name


SYNC_FREE = pytest.mark.parametrize("sync_free", [False, True], ids=["host-branch", "sync-free"])


@SYNC_FREE
def test_discrete_update_is_bit_identical_to_the_frozen_reference_with_or_without_zero_timeouts(sync_free):
    # The frozen copy of the old update is the oracle, computed here; a stored digest of the
    # parameters would differ between CPUs (AVX2, AVX-512).
    config = Config(env="test", nsteps=5, num_envs=3, hidden="16")
    for timeout_values in (None, torch.zeros(5, 3)):
        batch = random_batch(5, 3, (1, 4), 3, False, seed=4, timeout_values=timeout_values)
        model, average, reference, reference_average = _updated_both_ways(
            lambda: categorical_net((1, 4), 3, "mlp", (16,)), config, batch, sync_free=sync_free
        )
        _assert_bit_identical(model, reference)
        _assert_bit_identical(average, reference_average)
        assert not torch.equal(model.head.q.weight, average.head.q.weight)  # three steps really moved it


@SYNC_FREE
def test_cnn_update_is_bit_identical_to_the_frozen_reference(sync_free):
    config = Config(env="test", nsteps=4, num_envs=2)
    batch = random_batch(4, 2, (4, 36, 36), 4, False, seed=6, frames=True, timeout_values=torch.zeros(4, 2))
    model, average, reference, reference_average = _updated_both_ways(
        lambda: categorical_net((4, 36, 36), 4, "cnn"), config, batch, updates=2, sync_free=sync_free
    )
    _assert_bit_identical(model, reference)
    _assert_bit_identical(average, reference_average)


@SYNC_FREE
def test_gaussian_update_is_bit_identical_to_the_frozen_reference(sync_free):
    config = build_config(False, dict(env="test", nsteps=5, num_envs=3, hidden="16"), continuous=True)
    timeout_values = torch.zeros(5, 3)
    timeout_values[4, 1] = 2.5
    batch = random_batch(5, 3, (1, 4), 2, True, seed=7, timeout_values=timeout_values)
    model, average, reference, reference_average = _updated_both_ways(
        lambda: gaussian_net((1, 4), 2, (16,), [0.3, 0.3], normalize_obs=True), config, batch, sync_free=sync_free
    )
    _assert_bit_identical(model, reference)
    _assert_bit_identical(average, reference_average)


def runner_for(env_id: str, num_envs: int, nsteps: int, config: Config):
    info = env_info(env_id)
    env = VecEnv(info, num_envs, "sync")
    model = build_model(info, config)
    fields = buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info), model.state_shapes)
    runner = Runner(env, model, torch.device("cpu"), nsteps, EpisodeTracker(num_envs, False, False), fields)
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
        features, _ = model.step(torch.from_numpy(env.final_frames[:, None]), (), torch.zeros(2, dtype=torch.bool))
        expected = model.value_of(features).detach().numpy()
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


class EndsAtLimit(gym.Env):
    """Terminates at step 5, which is also its TimeLimit: gymnasium reports it terminated and truncated."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, 1.0], np.float32), 1.0, self.t >= 5, False, {}


if "EndsAtLimit-v0" not in gym.registry:
    gym.register("EndsAtLimit-v0", entry_point=EndsAtLimit, max_episode_steps=5)


def test_a_step_both_terminated_and_truncated_is_terminal_not_bootstrapped():
    torch.manual_seed(0)
    runner, env, _ = runner_for("EndsAtLimit-v0", 2, 10, build_config(False, dict(env="EndsAtLimit-v0", hidden="8")))
    try:
        segment = runner.run()
        assert segment.dones[4].all() and segment.dones[9].all() and not segment.timeout_values.any()
    finally:
        env.close()


def test_a_recurrent_nets_final_value_continues_the_actors_state():
    # Pendulum is cut at 200 steps: step 199's V(x_final) is the LSTM's value of the final
    # observation from the state after observation 199, not from a reset state.
    torch.manual_seed(0)
    config = build_config(False, dict(env="Pendulum-v1", network="lstm", hidden="8", lstm_size=8), continuous=True)
    runner, env, model = runner_for("Pendulum-v1", 2, 50, config)
    try:
        last = [runner.run() for _ in range(4)][-1]
        assert last.dones[49].all()
        not_first = torch.zeros(2, dtype=torch.bool)
        final = torch.from_numpy(env.final_frames[:, None])
        with torch.no_grad():
            expected = model.value_of(model.step(final, runner.actor.state, not_first)[0]).numpy()
            from_zeros = model.value_of(model.step(final, model.initial_state(2), not_first)[0]).numpy()
        assert np.abs(expected - from_zeros).max() > 1e-4  # the check can fail
        np.testing.assert_allclose(last.timeout_values[49], expected, rtol=1e-5, atol=1e-6)
    finally:
        env.close()


@pytest.mark.parametrize("device_stack", [False, True], ids=["numpy-stack", "device-stack"])
def test_the_final_value_of_a_frame_stack_is_its_last_three_frames_and_the_final_one(device_stack):
    from acer_sync.rollout.actor import Actor

    info = env_info("PongNoFrameskip-v4")
    assert info.stack == 4
    torch.manual_seed(0)
    model = build_model(info, build_config(True, dict(env=info.env_id)))
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (2, *info.frame_shape), dtype=np.uint8) for _ in range(5)]
    actor = Actor(model, info, 2, torch.device("cpu"), generator=torch.Generator().manual_seed(1), device_stack=device_stack)
    actor.reset(frames[0])
    for new in frames[1:]:  # the stack now holds frames 1 to 4
        actor.act()
        actor.observe(new, np.zeros(2, bool), np.zeros(2, bool), np.zeros(2, bool))
    actor.act()
    final = rng.integers(0, 256, (2, *info.frame_shape), dtype=np.uint8)
    values = actor.final_values(final, np.array([True, True]))
    stacked = torch.from_numpy(np.stack([frames[2], frames[3], frames[4], final], axis=1))
    with torch.no_grad():
        expected = model.value_of(model.step(stacked, model.initial_state(2), torch.zeros(2, dtype=torch.bool))[0]).numpy()
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)


def test_a_buffer_saved_before_timeout_values_loads_with_zeros():
    def filled(buffer, value):
        T, N = 4, 2
        buffer.put(Segment(
            frames=np.full((T + 1, N, 3), value, np.float32), firsts=np.zeros((T + 1, N), bool),
            actions=np.zeros((T, N), np.int64), mu=np.full((T, N, 2), 0.5, np.float32),
            rewards=np.ones((T, N), np.float32), dones=np.zeros((T, N), bool),
            timeout_values=np.full((T, N), 7.0, np.float32),
        ))
        return buffer

    fields = buffer_fields((3,), np.dtype(np.float32), Categorical(2))
    new = filled(ReplayBuffer(fields, 2, 4, 8, 1), 1.0)
    old_state = {name: array for name, array in new.state().items() if name not in ("timeout_values", "format")}
    restored = ReplayBuffer(fields, 2, 4, 8, 1)
    restored.timeout_values[...] = 9.0
    restored.load_state(old_state)
    assert not restored.timeout_values.any()
    np.testing.assert_array_equal(restored.frames, new.frames)
    assert restored.latest().timeout_values.shape == (4, 2)


def test_continuous_buffer_round_trip():
    dist = DiagGaussian(2, [-1, -1], [1, 1])
    fields = buffer_fields((5,), np.dtype(np.float32), dist)
    buffer = ReplayBuffer(fields, 3, 4, 8, 1)
    T, N = 4, 3
    actions = np.random.default_rng(0).normal(size=(T, N, 2)).astype(np.float32) * 3  # beyond the bounds: kept
    mu = np.random.default_rng(1).normal(size=(T, N, 4)).astype(np.float32)
    buffer.put(Segment(
        frames=np.zeros((T + 1, N, 5), np.float32), firsts=np.zeros((T + 1, N), bool), actions=actions, mu=mu,
        rewards=np.zeros((T, N), np.float32), dones=np.zeros((T, N), bool),
        timeout_values=np.arange(T * N, dtype=np.float32).reshape(T, N),
    ))
    sample = buffer.latest()
    np.testing.assert_array_equal(sample.actions, actions)
    np.testing.assert_array_equal(sample.mu, mu)
    np.testing.assert_array_equal(sample.timeout_values, np.arange(T * N).reshape(T, N))
    assert buffer.nbytes == ReplayBuffer.bytes_needed(fields, 3, 4, 8, 1)


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
    payload.pop("callbacks")
    torch.save({**payload, "format": 1}, path)  # checkpoint format 1, which those versions wrote
    assert train.main(["--resume", str(run_dir), "--total-timesteps", "400", "--no-progress"]) == 0
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 400

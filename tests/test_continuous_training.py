"""Continuous ACER end to end: the Gaussian net and SDN, normalization through resume, learning (a
point steered to the origin in CI; Pendulum, slow, by name)."""

import csv
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import acer_sync
from acer_sync.base.config import Config, build_config
from acer_sync.base.errors import UserError
from acer_sync.nets.networks import LOG_STD_MAX, LOG_STD_MIN, network_from_spec
from acer_sync.nets.normalization import ObservationNormalizer
from acer_sync.training.acer import ACER
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import features_of, ff_batch, gaussian_net, random_batch


def test_running_normalizer_matches_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 1, 3)) for n in (5, 1, 17, 40)]
    normalizer = ObservationNormalizer((1, 3))
    for batch in batches:
        normalizer.update(torch.from_numpy(batch))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(normalizer.mean.numpy(), everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(normalizer.var.numpy(), everything.var(0), rtol=1e-4)
    normalized = normalizer(torch.from_numpy(everything).float()).numpy()
    np.testing.assert_allclose(normalized.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalized.std(0), 1.0, rtol=1e-3)


def test_gaussian_network_shapes_and_log_std_clamp():
    model = gaussian_net((1, 3), 2, (8,), [0.6, 0.6], normalize_obs=True)
    obs = torch.randn(4, 1, 3)
    stats = model.policy_of(features_of(model, obs))
    assert stats.shape == (4, 4)
    torch.testing.assert_close(stats[:, 2:], torch.full((4, 2), float(np.log(0.6))))
    features = features_of(model, obs)
    assert model.value_of(features).shape == (4,) and model.advantage_of(features, torch.randn(4, 7, 2)).shape == (4, 7)
    with torch.no_grad():
        model.head.log_std.copy_(torch.tensor([-100.0, 100.0]))
    assert model.policy_of(features_of(model, obs))[0, 2:].tolist() == [LOG_STD_MIN, LOG_STD_MAX]
    assert network_from_spec(model.spec()).spec() == model.spec()
    assert network_from_spec(model.spec()).spec()["policy"] == "gaussian"


def test_gaussian_update_moves_the_policy_and_stays_finite():
    torch.manual_seed(0)
    model = gaussian_net((1, 3), 1, (16,), [0.5], normalize_obs=False)
    agent = ACER(model, Config(env="test", nsteps=6, num_envs=2, hidden="16", c=5.0))
    g = torch.Generator().manual_seed(1)
    T, N = 6, 2
    batch = ff_batch(
        obs=torch.randn(T + 1, N, 1, 3, generator=g), actions=torch.randn(T, N, 1, generator=g),
        mu=torch.cat([torch.zeros(T, N, 1), torch.full((T, N, 1), -1.0)], -1), rewards=torch.randn(T, N, generator=g),
        dones=torch.zeros(T, N), timeout_values=torch.zeros(T, N),
    )
    before = {name: p.clone() for name, p in model.named_parameters()}
    stats = agent.update(batch, lr=1e-2)
    assert stats["nonfinite"].item() == 0 and all(torch.isfinite(v).all() for v in stats.values())
    moved = {name: (p - before[name]).abs().max().item() for name, p in model.named_parameters()}
    # Q̃ = V + A(a) − mean_i A(u_i): a constant in A cancels, so A's output bias gets no gradient
    # but float rounding's (RMSProp then scales that by lr / sqrt(eps): well below 1e-6).
    assert moved.pop("head.advantage.bias") < 1e-6
    assert min(moved.values()) > 1e-5, moved


def test_log_std_past_a_bound_is_projected_back_and_moves_again():
    # log σ is a parameter and the policy clamps it: past a bound the clamp passed no gradient, and a
    # log σ that a step carried past 2 (or -5) stayed there for the rest of the run.
    T, N, d = 5, 4, 2
    b = random_batch(T, N, (1, 3), d, True, seed=1)
    # behaviour data from a narrow policy, all rewarded: the update narrows σ
    b["actions"] = b["mu"][..., :d] + 0.05 * torch.randn(T, N, d, generator=torch.Generator().manual_seed(3))
    b["rewards"] = torch.ones(T, N)
    batch = ff_batch(**b)
    torch.manual_seed(0)
    model = gaussian_net((1, 3), d, (16,), [1.0, 1.0])
    with torch.no_grad():
        model.head.log_std.fill_(LOG_STD_MAX + 0.01)
    agent = ACER(model, Config(env="test", nsteps=T, num_envs=N, hidden="16"))
    agent.update(batch, lr=1e-2)
    assert model.head.log_std.max().item() <= LOG_STD_MAX
    for _ in range(20):
        agent.update(batch, lr=1e-2)
    assert model.head.log_std.max().item() < LOG_STD_MAX  # moving inside again (it stayed at 2.01)


def test_trust_region_shrinks_the_gaussian_kl_step():
    def kl_after(trust_region: bool) -> float:
        torch.manual_seed(5)
        model = gaussian_net((1, 4), 2, (16,), [0.5, 0.5], normalize_obs=False)
        agent = ACER(model, Config(env="test", nsteps=4, num_envs=4, hidden="16", trust_region=trust_region, delta=1e-3))
        g = torch.Generator().manual_seed(6)
        batch = ff_batch(
            obs=torch.randn(5, 4, 1, 4, generator=g), actions=torch.randn(4, 4, 2, generator=g),
            mu=model.policy_of(features_of(model, torch.randn(16, 1, 4, generator=g))).detach().reshape(4, 4, 4),
            rewards=torch.randn(4, 4, generator=g) * 10, dones=torch.zeros(4, 4),
        )
        for _ in range(3):
            agent.update(batch, lr=1e-2)
        with torch.no_grad():
            flat = batch.obs[:-1].reshape(16, 1, 4)
            stats_avg = agent.average_model.policy_of(features_of(agent.average_model, flat))
            return float(agent.distribution.kl(stats_avg, model.policy_of(features_of(model, flat))).mean())

    assert kl_after(True) < kl_after(False)


def pendulum_config(**overrides):
    values = dict(env="Pendulum-v1", vec_env="sync", device="cpu", eval_every=0, log_interval=5)
    values.update(overrides)
    return build_config(False, values, continuous=True)


def test_observation_normalization_survives_checkpoint_and_resume(tmp_path):
    config = pendulum_config(total_timesteps=400, num_envs=2, nsteps=20, replay_start=40, hidden="8")
    assert config.normalize_obs
    build_trainer(config, env_info("Pendulum-v1"), tmp_path, progress_bar=False).train()
    payload = load_checkpoint(tmp_path)
    saved = {k: v for k, v in payload["model"].items() if k.startswith("normalizer.")}
    assert float(saved["normalizer.count"]) > 400 and float(saved["normalizer.var"].min()) != 1.0
    resumed = build_trainer(config, env_info("Pendulum-v1"), tmp_path, resume=payload, progress_bar=False)
    for name, value in saved.items():
        assert torch.equal(resumed.model.state_dict()[name], value)
        assert torch.equal(resumed.agent.average_model.state_dict()[name], value)
    resumed.close()


def test_play_scores_a_gaussian_checkpoint(tmp_path, capsys):
    from acer_sync.cli import play

    config = pendulum_config(total_timesteps=200, num_envs=2, nsteps=20, hidden="8")
    build_trainer(config, env_info("Pendulum-v1"), tmp_path, progress_bar=False).train()
    assert play.main([str(tmp_path), "--episodes", "2", "--greedy"]) == 0
    assert "mean score over 2 episodes" in capsys.readouterr().out


def test_videos_follow_mujoco_agents_with_the_track_camera():
    import mujoco

    from acer_sync.rollout.video import follow_the_agent
    from atari.envs import VecEnv

    cheetah = VecEnv(env_info("HalfCheetah-v5"), 1, "sync", render_mode="rgb_array")  # no GL until a frame is drawn
    pendulum = VecEnv(env_info("Pendulum-v1"), 1, "sync", render_mode="rgb_array")
    try:
        renderer = cheetah.first_env().unwrapped.mujoco_renderer
        assert renderer.camera_id == -1  # gymnasium's camera fixed in the world
        follow_the_agent(cheetah)
        assert renderer.camera_id == mujoco.mj_name2id(renderer.model, mujoco.mjtObj.mjOBJ_CAMERA, "track") >= 0
        follow_the_agent(pendulum)  # not MuJoCo: left alone
    finally:
        cheetah.close()
        pendulum.close()


def test_continuous_preset_is_chosen_for_box_actions():
    config = build_config(False, dict(env="HalfCheetah-v5"), continuous=True)
    assert (config.nsteps, config.c, config.alpha, config.buffer_size, config.sdn_samples) == (20, 5.0, 0.995, 5_000, 5)
    info = env_info("InvertedPendulum-v5")
    assert info.continuous and info.n_actions == 1 and info.action_low == (-3.0,)


@pytest.fixture
def one_torch_thread():
    """Small MLPs act 16x faster on one thread than on two when the 2-core machine is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def last_row_of_a_run(tmp_path, env_id: str, **settings) -> dict:
    """Train Pendulum's setting (the continuous preset with γ = 0.9, a buffer of 2,500 steps per env
    and lr 1e-3, as docs/runs/Pendulum-v1) on ``env_id``; its last progress row."""
    config = pendulum_config(env=env_id, gamma=0.9, buffer_size=2500, lr=1e-3, **settings)
    build_trainer(config, env_info(env_id), tmp_path, progress_bar=False).train()
    with open(tmp_path / "progress.csv", newline="") as handle:
        return list(csv.DictReader(handle))[-1]


def test_a_gaussian_policy_learns_to_steer_a_point_to_the_origin(tmp_path, one_torch_thread):
    """tests/reach_env.py: random actions average −11.6 an episode, steering straight in −0.44, and
    the policy's fixed σ = 0.3 costs about 1 more. Pendulum's setting, 16k steps (10 s): 50
    evaluation episodes averaged −1.48 on the 2-core machine (seeds 0 and 2–5: −1.77, −1.45, −1.66,
    −1.52, −1.65); we ask for −3. The CI's learning check of continuous ACER; Pendulum's is below."""
    import reach_env

    last = last_row_of_a_run(tmp_path, reach_env.ENV_ID, seed=1, total_timesteps=16_000, eval_every=16_000,
                             eval_episodes=50)
    assert int(last["eval_episodes"]) == 50 and float(last["eval_mean"]) >= -3, last["eval_mean"]


@pytest.mark.slow
def test_pendulum_is_solved(tmp_path, one_torch_thread):
    """docs/runs/Pendulum-v1's setting: the continuous preset (k = 20, replay ratio 8, δ = 0.25) with
    its env file's γ = 0.9, buffer of 2,500 steps per env and lr 1e-3. After 100k steps (about 1
    minute on one core) 100 evaluation episodes averaged −154 on the 2-core machine (seeds 1–4:
    −169, −162, −195, −155); we ask for −250 to allow for another machine's rounding. Its 72 s are
    a tenth of the suite's 12 minutes: run it by name (the point to the origin above stands in)."""
    last = last_row_of_a_run(tmp_path, "Pendulum-v1", seed=0, total_timesteps=100_000, eval_every=100_000,
                             eval_episodes=100)
    assert int(last["eval_episodes"]) == 100 and float(last["eval_mean"]) >= -250, last["eval_mean"]


def test_the_head_centres_the_mean_and_scales_sigmas_bounds_on_an_off_centre_box():
    # The mean started near 0 in the action's units and σ's bounds were [0.0067, 7.4] whatever the
    # Box: on a Box of [5, 10] every action was clipped to 5 (see the next test).
    torch.manual_seed(0)
    base = dict(obs_shape=[1, 3], n_actions=1, arch="mlp", hidden=[8], policy="gaussian", normalize_obs=False,
                init_std=[0.75])
    scaled = network_from_spec({**base, "action_scale": [[7.5], [2.5]]})
    plain = network_from_spec(base)
    assert set(scaled.state_dict()) == set(plain.state_dict())  # the scale is the spec's, not state
    plain.load_state_dict(scaled.state_dict())
    features = features_of(scaled, torch.randn(4, 1, 3))
    stats = scaled.policy_of(features)
    assert (stats[:, 0] - 7.5).abs().max() < 0.1 and torch.allclose(stats[:, 1], torch.log(torch.tensor(0.75)))
    assert torch.allclose(stats[:, 0], 7.5 + plain.policy_of(features)[:, 0])
    actions = torch.tensor([[[5.0]], [[7.5]], [[10.0]], [[6.0]]])
    assert torch.allclose(scaled.advantage_of(features, actions), plain.advantage_of(features, actions - 7.5))
    with torch.no_grad():
        for log_std, sigma in ((-10.0, 2.5 * math.exp(LOG_STD_MIN)), (10.0, 2.5 * math.exp(LOG_STD_MAX))):
            scaled.head.log_std.fill_(log_std)
            assert math.isclose(scaled.policy_of(features)[0, 1].exp().item(), sigma, rel_tol=1e-5)
            (parameter, low, high), = scaled.parameter_bounds()
            parameter.clamp_(low, high)
            assert math.isclose(parameter.exp().item(), sigma, rel_tol=1e-5)


def test_on_a_box_centred_on_zero_the_scale_changes_no_bit_of_a_run(tmp_path):
    # Pendulum's Box is [-2, 2]: its runs (docs/runs/Pendulum-v1*) are what they were, as long as σ
    # stays inside both ranges of bounds
    rows = []
    for action_scale in ("none", "box"):
        config = pendulum_config(total_timesteps=800, num_envs=2, nsteps=20, replay_start=40, hidden="8",
                                 action_scale=action_scale, seed=3, threads=1)
        (tmp_path / action_scale).mkdir()
        build_trainer(config, env_info("Pendulum-v1"), tmp_path / action_scale, progress_bar=False).train()
        with open(tmp_path / action_scale / "progress.csv", newline="") as handle:
            rows.append([{k: v for k, v in row.items() if k not in ("time_elapsed", "fps", "rss_mb")}
                         for row in csv.DictReader(handle)])
    assert rows[0] == rows[1] and len(rows[0]) >= 2


def test_a_gaussian_policy_learns_inside_an_off_centre_box(tmp_path, one_torch_thread):
    """tests/reach_env.py's AimOffCentre: aim at 7.5 in a Box of [5, 10]. With the mean starting
    near 0, every action went to the bound 5 and the run stayed at −62.5 an episode (8k steps,
    greedy evaluation −62.5); with it starting at the Box's centre, the greedy evaluation was −0.01
    (seed 0, 9 s). We ask for −5 (|a − 7.5| < 0.71)."""
    import reach_env

    config = pendulum_config(env=reach_env.OFF_CENTRE_ID)
    assert config.action_scale == "box"  # the continuous preset's
    last = last_row_of_a_run(tmp_path, reach_env.OFF_CENTRE_ID, seed=0, total_timesteps=8_000, eval_every=8_000,
                             eval_episodes=10, eval_greedy=True)
    assert int(last["eval_episodes"]) == 10 and float(last["eval_mean"]) >= -5, last["eval_mean"]


@pytest.mark.parametrize("space, message", [
    (gym.spaces.Box(0, 10, (1,), np.int64), "a Box of int64 takes whole numbers"),
    (gym.spaces.Box(np.array([0.0, 1.0], np.float32), np.array([0.0, 2.0], np.float32)), "whose low is not below its high"),
])
def test_an_integer_or_a_zero_width_box_of_actions_is_a_one_line_error(tmp_path, space, message):
    # the env got float actions its Box refused; a zero-width dimension, a traceback from init_std
    class Env(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = space

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

    with pytest.raises(UserError, match=message) as error:
        acer_sync.train(Env, run_dir=tmp_path / "run", total_timesteps=40, verbose=0)
    assert "\n" not in str(error.value) and not (tmp_path / "run").exists()


def test_log_sigma_at_a_bound_gets_its_whole_gradient():
    # The update projects log σ exactly onto a bound after a step past it; torch.minimum/maximum
    # then passed half its gradient (a tie), where clamp passes all of it, as before the scale.
    for action_scale in (None, [[0.0, 0.0], [2.0, 0.5]]):
        spec = dict(obs_shape=[1, 4], n_actions=2, arch="mlp", hidden=[8], policy="gaussian", normalize_obs=False,
                    init_std=[0.3, 0.3], **({"action_scale": action_scale} if action_scale else {}))
        model = network_from_spec(spec)
        (log_std, low, high), = model.parameter_bounds()
        with torch.no_grad():
            log_std.copy_(torch.stack([low[0], high[1]]))
        model.policy_of(features_of(model, torch.randn(5, 1, 4)))[:, 2:].sum().backward()
        assert log_std.grad.tolist() == [5.0, 5.0]

"""Observations of several parts, an image and a vector (issue 33): each part stored as its own
field in its own dtype, each image through its own CNN, the vectors flattened, one network for
acting and replay, with the LSTM memory, users' torsos, bf16, saved buffers and predict."""

from __future__ import annotations

import gymnasium as gym
import multi_sensor_envs
import numpy as np
import pytest
import torch
import user_torsos

import acer_sync
from acer_sync.base.config import Config
from acer_sync.nets.build import build_model
from acer_sync.nets.distributions import distribution_for
from acer_sync.nets.torsos import MultiInputTorso, NatureCNN
from acer_sync.replay.buffer import ReplayBuffer, buffer_fields, to_batch
from acer_sync.rollout.runner import Runner
from acer_sync.training.checkpoint import load_checkpoint
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker

ENV = "multi_sensor_envs:CueSwitch-v0"
SMALL = dict(num_envs=2, vec_env="sync", device="cpu", eval_every=0, log_interval=1, threads=1, verbose=0,
             replay_start=40, lstm_size=8)


def test_a_dict_or_tuple_with_an_image_becomes_parts_images_channels_first():
    for space in ("dict", "tuple"):
        info = env_info(ENV, {"space": space, "size": 40})
        camera, switch = ("camera", "switch") if space == "dict" else ("0", "1")
        assert info.frame_parts == ((camera, (3, 40, 40), "uint8"), (switch, (2,), "float32"))
        assert info.arch == "multi" and info.stack == 1
    assert env_info("CartPole-v1").frame_parts == ()


def test_a_part_too_small_for_the_cnn_is_one_line(tmp_path):
    # refused where the CNN is built for it (a torso of one's own takes it): env_info takes it
    assert env_info(ENV, {"size": 20}).frame_parts[0] == ("camera", (3, 20, 20), "uint8")
    with pytest.raises(acer_sync.UserError, match=r"^multi_sensor_envs:CueSwitch-v0 has 20x20 images in its part 'camera'; "
                                                  r"the CNN takes images of at least 36x36"):
        acer_sync.train(ENV, env_kwargs={"size": 20}, run_dir=tmp_path / "run", total_timesteps=40, verbose=0)
    assert not (tmp_path / "run").exists()


def test_each_part_is_a_field_of_its_own_dtype_and_an_image_costs_its_bytes():
    info = env_info(ENV)
    fields = buffer_fields((), info.frame_dtype, distribution_for(info), frame_parts=info.frame_layout)
    frame_fields = {f.name: (f.shape, f.dtype) for f in fields if f.per == "frame"}
    assert frame_fields == {"frames/camera": ((3, 48, 48), np.uint8), "frames/switch": ((2,), np.float32),
                            "firsts": ((), np.dtype(bool))}
    N, size = 4, 1000
    # Per frame: camera 48·48·3 uint8, switch one-hot 2 float32, first 1 (one spare frame for the
    # stack of 1); per step: action 1, μ 2·4, reward 4, done 1, timeout value 4. So 6,939 bytes per
    # transition; flattened into float32, as before this issue, it was 27,675.
    per_frame, per_step = 6912 + 8 + 1, 1 + 8 + 4 + 1 + 4
    assert ReplayBuffer.bytes_needed(fields, N, 20, size, 1) == N * ((size + 1) * per_frame + size * per_step)
    assert per_frame + per_step == 6939


def test_the_multi_input_torso_has_a_cnn_per_image_and_flattens_the_vectors():
    info = env_info(ENV, {"size": 40})
    model = build_model(info, Config(env=ENV))
    assert model.spec()["arch"] == "multi"
    assert model.spec()["obs_parts"] == [["camera", [3, 40, 40], "uint8"], ["switch", [2], "float32"]]
    torso = model.torso
    assert isinstance(torso, MultiInputTorso) and isinstance(torso.extractors[0], NatureCNN)
    assert torso.features_dim == 256 + 2
    obs = {"camera": torch.randint(0, 256, (5, 1, 3, 40, 40), dtype=torch.uint8), "switch": torch.eye(2)[[0, 1, 1, 0, 1]][:, None]}
    features = torso(obs)
    assert features.shape == (5, 258)
    assert torch.equal(features[:, 256:], obs["switch"][:, 0])  # the vector part as it is
    cnn = torso.extractors[0]
    assert torch.equal(features[:, :256], cnn(obs["camera"]))  # the image through its own CNN, scaled inside


def collect(network: str = "auto", precision: str = "fp32"):
    info = env_info(ENV, {"length": 7})
    config = Config(env=ENV, network=network, lstm_size=8, precision=precision)
    torch.manual_seed(0)
    model = build_model(info, config)
    fields = buffer_fields((), info.frame_dtype, distribution_for(info), model.state_shapes, frame_parts=info.frame_layout)
    env = VecEnv(info, 3, "sync")
    runner = Runner(env, model, torch.device("cpu"), 5, EpisodeTracker(3, False, False), fields, precision=precision)
    runner.reset(seed=0)
    buffer = ReplayBuffer(fields, 3, 5, 100, 1)
    segments = []
    for _ in range(3):
        segments.append(runner.run())
        buffer.put(segments[-1])
    env.close()
    return model, fields, buffer, segments


@pytest.mark.parametrize("network, precision", [("auto", "fp32"), ("lstm", "fp32"), ("auto", "bf16")])
def test_replay_rebuilds_what_acting_saw_and_recomputes_mu(network, precision):
    model, fields, buffer, segments = collect(network, precision)
    from acer_sync.nets.precision import NetworkPasses

    net = NetworkPasses(model, precision, torch.device("cpu"))
    for index, segment in enumerate(segments):
        batch = to_batch(buffer.gather(np.full(3, index)), fields, 1, torch.device("cpu"))
        assert set(batch.obs) == {"camera", "switch"}
        assert batch.obs["camera"].dtype == torch.uint8 and batch.obs["camera"].shape == (6, 3, 1, 3, 48, 48)
        assert torch.equal(batch.obs["camera"][:, :, 0], torch.from_numpy(segment.frames["camera"]))
        assert torch.equal(batch.obs["switch"][:, :, 0], torch.from_numpy(segment.frames["switch"]))
        with torch.no_grad():
            features, _ = net.unroll(batch.obs, batch.firsts, batch.state)
            stats = net.policy_of(features).reshape(6, 3, -1)[:5]
        torch.testing.assert_close(stats, torch.from_numpy(segment.mu), rtol=1e-5, atol=1e-6)  # on-policy ρ = 1


def test_a_saved_buffer_of_parts_loads_back_exactly(tmp_path):
    _, fields, buffer, _ = collect()
    np.savez(tmp_path / "buffer.npz", **buffer.state())
    restored = ReplayBuffer(fields, 3, 5, 100, 1)
    restored.load_state(np.load(tmp_path / "buffer.npz"))
    for name in ("frames/camera", "frames/switch"):
        assert np.array_equal(restored.arrays[name], buffer.arrays[name])


@pytest.mark.parametrize("network, replay_state", [("auto", "stored"), ("lstm", "stored"), ("lstm", "burn_in")])
def test_trains_resumes_with_its_buffer_and_predicts_from_the_envs_own_observations(tmp_path, network, replay_state):
    # burn_in sliced the previous segment's observations as one tensor: a TypeError at the first replay
    run_dir = acer_sync.train(ENV, run_dir=tmp_path / "run", total_timesteps=160, network=network, save_buffer=True,
                              env_kwargs={"size": 36}, replay_state=replay_state, **SMALL)
    assert load_checkpoint(run_dir)["model_spec"]["arch"] == ("multi_lstm" if network == "lstm" else "multi")
    acer_sync.train(resume=run_dir, total_timesteps=240, verbose=0)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 240
    policy = acer_sync.load(run_dir)
    env = gym.make(ENV, size=36)
    obs, _ = env.reset(seed=0)
    assert obs["camera"].shape == (36, 36, 3)
    action, state = policy.predict(obs, episode_start=[True])
    assert env.action_space.contains(action) and (state is not None) == (network == "lstm")
    frames_env = acer_sync.make_env(ENV, env_kwargs={"size": 36})
    frames, _ = frames_env.reset(seed=0)
    assert frames["camera"].shape == (3, 36, 36)
    assert env.action_space.contains(policy.predict(frames, episode_start=[True])[0])


def test_a_users_torso_gets_the_dict_of_parts(tmp_path):
    run_dir = acer_sync.train(ENV, run_dir=tmp_path / "run", total_timesteps=120, torso=user_torsos.PartsTorso,
                              env_kwargs={"size": 40, "space": "tuple"}, **SMALL)
    policy = acer_sync.load(run_dir)
    torso = policy.model.torso.module
    env = gym.make(ENV, size=40, space="tuple")
    obs, _ = env.reset(seed=0)
    policy.predict(obs)
    assert set(torso.seen) == {"0", "1"}
    camera = torso.seen["0"]
    assert camera.dtype == torch.float32 and camera.shape == (1, 3, 40, 40) and float(camera.max()) == 1.0  # scaled
    assert torso.seen["1"].shape == (1, 2)


def test_network_and_normalization_that_do_not_fit_parts_are_one_line(tmp_path):
    with pytest.raises(acer_sync.UserError, match="^--network cnn does not fit .*several parts; use auto"):
        acer_sync.train(ENV, run_dir=tmp_path / "a", total_timesteps=40, network="cnn", **SMALL)
    with pytest.raises(acer_sync.UserError, match="^--normalize-obs is for vector observations"):
        acer_sync.train(ENV, run_dir=tmp_path / "b", total_timesteps=40, normalize_obs=True, **SMALL)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_cue_switch_task_needs_both_parts():
    env = multi_sensor_envs.CueSwitch(length=400)
    obs, _ = env.reset(seed=1)
    image_only = switch_only = both = 0
    for _ in range(400):
        side = int(obs["camera"][:, 24:].max() > 0)
        switch = int(obs["switch"])
        answer = env.answer
        image_only += side == answer
        switch_only += switch == answer
        both += (side ^ switch) == answer
        obs, *_ = env.step(answer)
    assert both == 400 and 150 < image_only < 250 and 150 < switch_only < 250


def test_every_vector_kind_beside_an_image_becomes_a_float_part_one_hot_where_discrete():
    from atari.envs import part_frames

    space = gym.spaces.Dict({
        "camera": gym.spaces.Box(0, 255, (40, 40), np.uint8), "gear": gym.spaces.MultiDiscrete([3, 2]),
        "contacts": gym.spaces.MultiBinary(4), "speed": gym.spaces.Box(-1, 1, (2,), np.float64),
    })
    frames_space, to_frames = part_frames(space, "Robot-v0")
    assert {key: (box.shape, box.dtype) for key, box in frames_space.spaces.items()} == {
        "camera": ((40, 40), np.uint8), "gear": ((5,), np.float32), "contacts": ((4,), np.float32), "speed": ((2,), np.float32),
    }
    frames = to_frames({"camera": np.full((40, 40), 7, np.uint8), "gear": np.array([2, 0]),
                        "contacts": np.array([1, 0, 0, 1], np.int8), "speed": np.array([0.5, -0.25])})
    assert frames["camera"].dtype == np.uint8 and frames["camera"][0, 0] == 7
    assert frames["gear"].tolist() == [0, 0, 1, 1, 0] and frames["contacts"].tolist() == [1, 0, 0, 1]
    assert frames["speed"].dtype == np.float32 and frames["speed"].tolist() == [0.5, -0.25]

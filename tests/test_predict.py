"""Policy.predict takes exactly what the env returns (issue 33): one observation or a gymnasium
vector env's batch, for every supported space (int, dict, tuple, HWC image, vector), with and
without memory; a wrong observation is one line naming the space it expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import multi_sensor_envs
import numpy as np
import pytest
import torch

import acer_sync

SMALL = dict(total_timesteps=40, num_envs=2, vec_env="sync", device="cpu", eval_every=0, verbose=0, hidden="8",
             lstm_size=4, threads=1)


class DictSensors(gym.Env):
    """A Dict of a 3-vector and a Discrete(4) sensor; two actions; 20 steps an episode."""

    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (3,), np.float32), "mode": gym.spaces.Discrete(4)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)  # its samples are the observations: the same for a seed
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action), False, self.t >= 20, {}


class Camera(DictSensors):
    """An HWC RGB image, 36x36x3."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)


class PositionAndPixels(DictSensors):
    """gym-pusht's kind of Dict: a position and an HWC image, the vector first (gymnasium sorts the keys)."""

    observation_space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
                                         "agent_pos": gym.spaces.Box(0, 512, (2,), np.float32)})


class NumberedSensors(DictSensors):
    """A Dict with int keys (gymnasium takes them): an HWC image and a 2-vector."""

    observation_space = gym.spaces.Dict({0: gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), 1: gym.spaces.Box(-1, 1, (2,), np.float32)})


def make_dict_env():
    return DictSensors()


def make_position_and_pixels_env():
    return PositionAndPixels()


def make_camera_and_switch_env():
    return multi_sensor_envs.CueSwitch(size=36)


def make_camera_env():
    return Camera()


CASES = {  # name: (env for training, a function that makes the env whose observations predict gets)
    "discrete int (FrozenLake)": ("FrozenLake-v1", lambda: gym.make("FrozenLake-v1")),
    "tuple (Blackjack)": ("Blackjack-v1", lambda: gym.make("Blackjack-v1")),
    "dict": (make_dict_env, make_dict_env),
    "hwc image": (make_camera_env, make_camera_env),
    "dict of an hwc image and a discrete": (make_camera_and_switch_env, make_camera_and_switch_env),
    "dict of a vector and an hwc image": (make_position_and_pixels_env, make_position_and_pixels_env),
    "vector (CartPole)": ("CartPole-v1", lambda: gym.make("CartPole-v1")),
}


@pytest.fixture(scope="module", params=[(name, network) for name in CASES for network in ("auto", "lstm")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request, tmp_path_factory):
    name, network = request.param
    if name == "hwc image" and network == "lstm":
        network = "cnn_lstm"
    env, make = CASES[name]
    run_dir = acer_sync.train(env, run_dir=tmp_path_factory.mktemp("predict") / "run", network=network, **SMALL)
    return acer_sync.load(run_dir), make


def test_predict_takes_one_observation_as_the_env_returns_it(trained):
    policy, make = trained
    env = make()
    obs, _ = env.reset(seed=0)
    state = None
    for start in (True, False, False):
        action, state = policy.predict(obs, state, episode_start=[start])
        assert env.action_space.contains(action) and policy.action_space.contains(action)
        assert (state is not None) == policy.recurrent
        obs, *_ = env.step(action)
    if isinstance(env.action_space, gym.spaces.Discrete):  # SB3's model.action_space
        assert policy.action_space == env.action_space


def test_predict_takes_a_vector_envs_batch(trained):
    policy, make = trained
    envs = gym.vector.SyncVectorEnv([make, make, make])
    obs, _ = envs.reset(seed=0)
    actions, state = policy.predict(obs, episode_start=np.ones(3, bool))
    assert np.shape(actions) == (3,) and all(envs.single_action_space.contains(a) for a in actions)
    envs.step(actions)
    envs.close()


def test_predict_refuses_a_wrong_observation_in_one_line_naming_the_space(trained):
    policy, _ = trained
    with pytest.raises(acer_sync.UserError) as error:
        policy.predict({"no": "such"} if policy.own_space is None else np.zeros((2, 2, 2, 2, 2)))
    message = str(error.value)
    assert "\n" not in message and "predict takes an observation of " in message
    if policy.own_space is not None:
        assert str(policy.own_space) in message


def test_the_observation_space_holds_what_the_env_and_make_env_return(trained):
    # SB3's model.observation_space: a gymnasium space always (it was None where training kept the env's observations)
    policy, make = trained
    env = make()
    raw, _ = env.reset(seed=0)
    assert isinstance(policy.observation_space, gym.spaces.Space) and policy.observation_space.contains(raw)
    if policy.own_space is not None:
        assert policy.observation_space == env.observation_space
    else:  # the frames' Box: the env's own shape (and an image's dtype and bounds)
        frames, _ = acer_sync.make_env(make).reset(seed=0)
        assert policy.observation_space.contains(frames) and policy.observation_space.shape == env.observation_space.shape
        assert policy.observation_space.shape == policy.observation_shape


def test_make_env_takes_the_callable_a_run_was_trained_with(tmp_path):
    run_dir = acer_sync.train(make_dict_env, run_dir=tmp_path / "run", **SMALL)
    policy, env = acer_sync.load(run_dir), acer_sync.make_env(make_dict_env)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (7,)  # flattened as training flattens it: 3 + one-hot of 4; predict takes it too
    action, _ = policy.predict(obs)
    assert env.action_space.contains(action)


def test_make_envs_observations_give_one_action_as_the_envs_own_do(trained):
    # FrozenLake's one-hot from make_env, in int64, was read as a batch of 16 of the env's own ints
    policy, make = trained
    raw, _ = make().reset(seed=0)
    frames, _ = acer_sync.make_env(make).reset(seed=0)
    from_raw, _ = policy.predict(raw, deterministic=True)
    from_frames, _ = policy.predict(frames, deterministic=True)
    assert np.ndim(from_frames) == 0 and from_frames == from_raw


def test_a_loaded_policy_knows_the_vector_env_its_run_stepped_in(tmp_path):
    # play.py --num-envs plays in it: an env whose kwargs the ALE vector env cannot take trained in another
    assert acer_sync.load(acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", **SMALL)).vec_env == "sync"


def test_a_device_this_machine_has_not_is_one_line_given_as_a_name_or_a_torch_device(tmp_path):
    # torch.device("cuda") skipped the check: "AssertionError: Torch not compiled with CUDA enabled";
    # "mps" was a RuntimeError from torch either way.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", **SMALL)
    absent = [name for name in ("cuda", "mps", "xpu") if not (name == "cuda" and torch.cuda.is_available())]
    for device in [*absent, *map(torch.device, absent)]:
        with pytest.raises(acer_sync.UserError, match=f"^--device {torch.device(device)} was asked for, but torch") as error:
            acer_sync.load(run_dir, device=device)
        assert "\n" not in str(error.value)


def test_a_checkpoint_whose_config_lacks_a_setting_loads_it_at_its_default(tmp_path):
    # KeyError: 'env_kwargs' from acer_sync.load, a traceback.
    from acer_sync.training.checkpoint import load_checkpoint, save_checkpoint

    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", **SMALL)
    payload = load_checkpoint(run_dir)
    for name in ("env_kwargs", "precision", "vec_env"):
        del payload["config"][name]
    save_checkpoint(tmp_path / "cut.pt", payload)
    policy = acer_sync.load(tmp_path / "cut.pt")
    assert policy.env_kwargs == {} and policy.precision == "fp32"
    assert np.ndim(policy.predict(np.zeros(4, np.float32))[0]) == 0


def test_load_leaves_the_callers_random_numbers_alone(tmp_path):
    # Building the network before its weights load drew from torch's global generator.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", **SMALL)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    acer_sync.load(run_dir)
    assert torch.equal(torch.rand(3), expected)


def test_a_runs_checkpoints_folder_given_for_the_run_names_what_to_give(tmp_path):
    # "RUN/checkpoints holds no checkpoint (RUN/checkpoints/checkpoints/latest.pt is missing)"
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", **SMALL)
    with pytest.raises(acer_sync.UserError, match=f"^{run_dir / 'checkpoints'} is a run's checkpoints folder: give the run "
                                                  f"directory, {run_dir}, or a .pt file in it$"):
        acer_sync.load(run_dir / "checkpoints")


def test_a_damaged_state_an_empty_batch_and_non_boolean_starts_are_one_line_errors(tmp_path):
    policy = acer_sync.load(acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", network="lstm", **SMALL))
    obs = np.zeros(4, np.float32)
    _, state = policy.predict(obs)
    damaged = tuple(np.full_like(s, np.nan) for s in state)
    for call, match in [
        (lambda: policy.predict(obs, damaged), "state holds NaN or infinity"),
        (lambda: policy.predict(obs, damaged, episode_start=[True]), "state holds NaN or infinity"),
        (lambda: policy.predict(np.zeros((0, 4), np.float32)), "empty batch"),
        (lambda: policy.predict(obs, state, episode_start=["False"]), "episode_start holds booleans"),
        (lambda: policy.predict(obs, state, episode_start=[0.5]), "episode_start holds booleans"),
    ]:
        with pytest.raises(acer_sync.UserError, match=match) as error:
            call()
        assert "\n" not in str(error.value)
    assert np.ndim(policy.predict(obs, state, episode_start=[1])[0]) == 0  # 0 and 1 are booleans too


class PixelsAndSpeed(DictSensors):
    """An HWC image and a Box (1,) whose value the env returns as a number, which training takes."""

    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
                                         "speed": gym.spaces.Box(-1, 1, (1,), np.float32)})

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return {**observation, "speed": np.float32(0.5)}, info


def test_a_number_for_a_box_of_one_in_a_dict_is_taken_as_training_takes_it(tmp_path):
    # since every part of a Dict is checked, the number was refused as not of shape (1,)
    policy = acer_sync.load(acer_sync.train(PixelsAndSpeed, run_dir=tmp_path / "run", **SMALL))
    observation, _ = PixelsAndSpeed().reset(seed=0)
    assert np.shape(observation["speed"]) == ()
    action, _ = policy.predict(observation, deterministic=True)
    assert action == policy.predict({**observation, "speed": np.array([0.5], np.float32)}, deterministic=True)[0]


def test_an_empty_batch_of_any_space_is_one_line(tmp_path):
    # an empty batch of a space that training converts (an image, a Dict) was taken for one observation
    for make, empty in [
        (make_camera_env, np.zeros((0, 36, 36, 3), np.uint8)),
        (make_position_and_pixels_env, {"pixels": np.zeros((0, 36, 36, 3), np.uint8), "agent_pos": np.zeros((0, 2), np.float32)}),
    ]:
        policy = acer_sync.load(acer_sync.train(make, run_dir=tmp_path / make.__name__, **SMALL))
        with pytest.raises(acer_sync.UserError, match="predict got an empty batch") as error:
            policy.predict(empty)
        assert "\n" not in str(error.value)


def test_every_part_of_a_dict_is_checked_whatever_the_order_of_its_keys(tmp_path):
    # only the first part decided whether an observation fitted: a wrong image after a vector was a traceback
    policy = acer_sync.load(acer_sync.train(make_position_and_pixels_env, run_dir=tmp_path / "run", **SMALL))
    pixels, position = np.zeros((36, 36, 3), np.uint8), np.zeros(2, np.float32)
    for wrong in [
        {"pixels": np.zeros((20, 20, 3), np.uint8), "agent_pos": position},
        {"pixels": np.zeros((20, 80, 3), np.uint8), "agent_pos": position},
        {"pixels": np.stack([pixels, pixels]), "agent_pos": position},
        {"pixels": pixels, "agent_pos": np.zeros(5, np.float32)},
    ]:
        with pytest.raises(acer_sync.UserError, match="predict takes an observation of Dict") as error:
            policy.predict(wrong)
        assert "\n" not in str(error.value)


def test_a_dict_with_int_keys_and_an_image_trains_and_predicts(tmp_path):
    # its parts were looked up by the text of their keys in the env's observation: KeyError '0'
    make = NumberedSensors
    policy = acer_sync.load(acer_sync.train(make, run_dir=tmp_path / "run", **SMALL))
    raw, _ = make().reset(seed=0)
    frames, _ = acer_sync.make_env(make).reset(seed=0)
    assert policy.predict(raw, deterministic=True)[0] == policy.predict(frames, deterministic=True)[0]


def test_a_discrete_observation_below_its_start_is_refused_not_read_from_the_end(tmp_path):
    policy = acer_sync.load(acer_sync.train("FrozenLake-v1", run_dir=tmp_path / "run", **SMALL))
    for observation in (-1, np.array([0, -1])):
        with pytest.raises(acer_sync.UserError, match="has a discrete part outside its range"):
            policy.predict(observation)
    assert np.shape(policy.predict(np.array([0, 15]))[0]) == (2,)


class GridCell(DictSensors):
    """A MultiDiscrete([3, 3]) cell."""

    observation_space = gym.spaces.MultiDiscrete([3, 3])


def test_a_multi_discrete_or_multi_binary_observation_outside_its_range_is_refused(tmp_path):
    # gymnasium's flatten encoded [3, 0] as [0 0 0 1 0 0] (the 3 as the second entry's 0) and [-1, 0]
    # from the end, and predict gave an action for them
    policy = acer_sync.load(acer_sync.train(GridCell, run_dir=tmp_path / "run", **SMALL))
    for observation in ([3, 0], [-1, 0], [0, 3], [[0, 0], [2, 3]]):
        with pytest.raises(acer_sync.UserError, match="has a discrete part outside its range"):
            policy.predict(np.array(observation))
    assert np.shape(policy.predict(np.array([[0, 0], [2, 2]]))[0]) == (2,)
    binary = acer_sync.load(acer_sync.train(Switches, run_dir=tmp_path / "binary", **SMALL))
    with pytest.raises(acer_sync.UserError, match="has a discrete part outside its range"):
        binary.predict(np.array([0, 2, 1]))
    assert np.ndim(binary.predict(np.array([0, 1, 1]))[0]) == 0


class Switches(DictSensors):
    """A MultiBinary(3) of switches."""

    observation_space = gym.spaces.MultiBinary(3)


LOAD_ELSEWHERE = """
import sys
sys.path.insert(0, {tests!r})
import acer_sync, test_predict
policy = acer_sync.load({run_dir!r})
obs, _ = test_predict.{make}().reset(seed=0)
print(policy.predict(obs)[0], policy.predict(acer_sync.make_env(test_predict.{make}).reset(seed=0)[0])[0])
"""


@pytest.mark.parametrize("make", ["make_dict_env", "make_camera_and_switch_env"])
def test_a_run_of_a_callable_loaded_in_another_process_takes_the_envs_own_observations(tmp_path, make):
    # The callable's env cannot be made where the run is loaded (its registration was the training
    # process's), so load knew no observation space and refused the env's own observations: "predict
    # takes an observation of shape (7,) ..., got dict". The checkpoint keeps the space as plain data.
    run_dir = acer_sync.train(globals()[make], run_dir=tmp_path / "run", **SMALL)
    script = LOAD_ELSEWHERE.format(tests=str(Path(__file__).parent), run_dir=str(run_dir), make=make)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr
    assert all(action in ("0", "1") for action in result.stdout.split())


class NarrowFloat64Box(gym.Env):
    """A float64 Box of actions whose bounds float32 cannot hold (±0.1); it records each action that
    ``Box.contains`` refuses. Its reward pulls the actions to the bounds, where clipping acts."""

    observation_space = gym.spaces.Box(-1, 1, (3,), np.float64)
    action_space = gym.spaces.Box(-0.1, 0.1, (2,), np.float64)
    refused: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3), {}

    def step(self, action):
        self.t += 1
        if not self.action_space.contains(np.asarray(action)):
            NarrowFloat64Box.refused.append(np.asarray(action).copy())
        return np.full(3, 0.5), float(np.abs(action).sum()), False, self.t >= 20, {}


def test_actions_clipped_to_a_float64_box_are_inside_it_in_training_evaluation_and_predict(tmp_path):
    # float32(0.1) is above 0.1: clipping to the bounds in float32 put actions just outside.
    NarrowFloat64Box.refused.clear()
    run = acer_sync.train(NarrowFloat64Box, run_dir=tmp_path / "run", **{**SMALL, "total_timesteps": 200, "eval_every": 100,
                                                                          "eval_episodes": 2})
    policy = acer_sync.load(run)
    torch.manual_seed(0)
    actions, _ = policy.predict(np.full((20_000, 3), 0.9))  # its σ puts 0.15% of the draws past the bounds
    assert NarrowFloat64Box.refused == []
    assert all(NarrowFloat64Box.action_space.contains(action) for action in actions)
    assert np.abs(actions).max() > 0.0999  # some were clipped, to the bound
    space = policy.action_space  # SB3's model.action_space: the Box of what predict returns
    assert space.dtype == np.float32 and space.shape == NarrowFloat64Box.action_space.shape
    assert np.allclose(space.low, -0.1) and np.allclose(space.high, 0.1)
    assert all(space.contains(action) for action in actions)

"""Users' own envs: ``--env module:EnvId``, ``--env-kwargs``, observation spaces beyond a flat Box,
and the tuned settings of ``acer_sync/data/envs/``.

The envs live in a module this file writes (:data:`ENV_MODULE`), as a user's would: importing it
registers them, and nothing else does.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from acer_sync.base.config import Config, build_config
from acer_sync.base.config_file import check_setting, load_env_settings
from acer_sync.base.errors import UserError
from acer_sync.sweeps.spec import load_sweep
from acer_sync.training.checkpoint import load_checkpoint
from atari.envs import MIN_IMAGE_SIDE, VecEnv, env_info
from helpers import ROOT, categorical_net, features_of, one_line_error

MODULE = "acer_test_own_envs"
USER_ENV = f"{MODULE}:Corridor-v0"

ENV_MODULE = '''
"""A corridor of ``length`` cells: action 1 steps right, 0 left; reaching the last cell pays 1 and
ends the episode. ``kind`` chooses the observation space the cell is shown through."""

import gymnasium as gym
import numpy as np

SPACES = {
    "discrete": lambda length: gym.spaces.Discrete(length),
    "multidiscrete": lambda length: gym.spaces.MultiDiscrete([length, 2]),
    "tuple": lambda length: gym.spaces.Tuple((gym.spaces.Discrete(length), gym.spaces.Box(-1, 1, (1,), np.float32))),
    "dict": lambda length: gym.spaces.Dict({"cell": gym.spaces.Discrete(length), "parity": gym.spaces.MultiBinary(1)}),
    "hwc": lambda length: gym.spaces.Box(0, 255, (40, 36, 3), np.uint8),
    "chw": lambda length: gym.spaces.Box(0, 255, (2, 36, 40), np.uint8),
    "gray": lambda length: gym.spaces.Box(0, 255, (36, 38), np.uint8),
    "small": lambda length: gym.spaces.Box(0, 255, (35, 36, 3), np.uint8),
    "text": lambda length: gym.spaces.Text(5),
    "sequence": lambda length: gym.spaces.Dict({"cells": gym.spaces.Sequence(gym.spaces.Discrete(length))}),
}


class Corridor(gym.Env):
    def __init__(self, length=5, kind="discrete", continuous=False):
        self.length, self.kind, self.continuous = length, kind, continuous
        self.observation_space = SPACES[kind](length)
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.cell = 0

    def observation(self):
        cell = self.cell
        if self.kind in ("hwc", "chw", "gray"):
            # channel c holds 10 c + cell everywhere, so a test can see where each channel went
            image = np.zeros(self.observation_space.shape, np.uint8)
            if self.kind == "hwc":
                image[:] = 10 * np.arange(3, dtype=np.uint8) + cell
            elif self.kind == "chw":
                image[:] = (10 * np.arange(2, dtype=np.uint8) + cell)[:, None, None]
            else:
                image[:] = cell
            return image
        return {
            "discrete": cell,
            "multidiscrete": np.array([cell, cell % 2]),
            "tuple": (cell, np.array([cell / self.length], np.float32)),
            "dict": {"cell": cell, "parity": np.array([cell % 2], np.int8)},
            "small": np.zeros((35, 36, 3), np.uint8),
            "text": "a",
            "sequence": {"cells": (cell,)},
        }[self.kind]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return self.observation(), {}

    def step(self, action):
        right = float(np.asarray(action).reshape(-1)[0]) > 0 if self.continuous else int(action) == 1
        self.cell = min(self.cell + 1, self.length - 1) if right else max(self.cell - 1, 0)
        done = self.cell == self.length - 1
        return self.observation(), float(done), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
'''

SMALL_RUN = [
    "--num-envs", "2", "--nsteps", "5", "--buffer-size", "100", "--replay-start", "20", "--log-interval", "5",
    "--eval-every", "0", "--checkpoint-every", "100", "--device", "cpu", "--threads", "1", "--no-progress",
]


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory) -> Path:
    """A folder holding the user's env module, on sys.path here and on PYTHONPATH for subprocesses."""
    folder = tmp_path_factory.mktemp("user_envs")
    (folder / f"{MODULE}.py").write_text(ENV_MODULE)
    (folder / "acer_test_broken_envs.py").write_text("raise RuntimeError('the module is broken')\n")
    (folder / "acer_test_fresh_envs.py").write_text(
        f"import gymnasium as gym\ngym.register('AcerTestFresh-v0', entry_point='{MODULE}:Corridor')\n"
    )
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def run(module_dir: Path, script: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(module_dir), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environment,
    )


# --- module:EnvId ------------------------------------------------------------------------------


def test_module_env_id_imports_the_module_that_registers_the_env(module_dir):
    assert "acer_test_fresh_envs" not in sys.modules
    with pytest.raises(gym.error.Error):
        gym.spec("AcerTestFresh-v0")  # not registered until the module is imported
    info = env_info("acer_test_fresh_envs:AcerTestFresh-v0")
    assert info.env_id == "acer_test_fresh_envs:AcerTestFresh-v0" and info.n_actions == 2 and not info.atari


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("acer_test_no_such_module:Corridor-v0", "cannot import module 'acer_test_no_such_module' for env "
         "'acer_test_no_such_module:Corridor-v0': no such module; install it or put its folder on PYTHONPATH"),
        ("acer_test_broken_envs:Corridor-v0", "importing 'acer_test_broken_envs' for env "
         "'acer_test_broken_envs:Corridor-v0' failed: RuntimeError: the module is broken"),
        (f"{MODULE}:Corridorr-v0", f"unknown env id 'Corridorr-v0' (module '{MODULE}' was imported and registers "
         "no such env); did you mean Corridor-v0?"),
    ],
)
def test_module_env_id_mistakes_are_one_line_user_errors(module_dir, env_id, message):
    with pytest.raises(UserError) as error:
        env_info(env_id)
    assert str(error.value) == message


# --- env kwargs --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_env_kwargs_reach_every_env_of_the_vector_env(module_dir, backend):
    info = env_info(USER_ENV, {"length": 3})
    assert info.env_kwargs == {"length": 3} and info.frame_shape == (3,)
    env = VecEnv(info, 2, backend)
    try:
        env.reset(seed=0)
        env.step(np.array([1, 0]))
        frames, rewards, terminated, _, _ = env.step(np.array([1, 1]))
    finally:
        env.close()
    # Two steps right end a corridor of 3 cells (5 with the env's default length).
    np.testing.assert_array_equal(terminated, [True, False])
    np.testing.assert_array_equal(env.final_frames[0], [0, 0, 1])  # one-hot: the last cell
    np.testing.assert_array_equal(frames[1], [0, 1, 0])


@pytest.mark.parametrize(
    "env_id, env_kwargs, message",
    [
        (USER_ENV, {"width": 3}, "cannot build acer_test_own_envs:Corridor-v0 with --env-kwargs width=3: "),
        (USER_ENV, {"render_mode": "human"}, "--env-kwargs render_mode is acer_sync's to set"),
        ("PongNoFrameskip-v4", {"frameskip": 2}, "--env-kwargs frameskip is acer_sync's to set"),
    ],
)
def test_env_kwargs_the_env_cannot_take_are_one_line_user_errors(module_dir, env_id, env_kwargs, message):
    with pytest.raises(UserError) as error:
        env_info(env_id, env_kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_ale_backend_takes_the_kwargs_of_its_vector_env_only():
    env = VecEnv(env_info("PongNoFrameskip-v4", {"repeat_action_probability": 0.25}), 1, "ale")
    env.close()
    with pytest.raises(UserError, match="--vec-env ale takes the env kwargs .* only, not mode; use --vec-env subproc"):
        VecEnv(env_info("PongNoFrameskip-v4", {"mode": 0}), 1, "ale")


@pytest.mark.parametrize(
    "value, message",
    [
        ({"length": 3, "kind": "discrete", "goal": [1, 2], "extra": {"a": None}}, None),
        ("length=3", "env_kwargs must be a mapping of names to values"),
        ({"not a name": 1}, "'not a name' is not a keyword argument name"),
        ({"when": __import__("datetime").date(2020, 1, 1)}, "when must be a number, true/false, a string"),
    ],
)
def test_config_files_take_env_kwargs_as_a_mapping(value, message):
    if message is None:
        assert check_setting("env_kwargs", value, "run.yaml") == value
    else:
        with pytest.raises(UserError, match=f"^run.yaml: .*{message}"):
            check_setting("env_kwargs", value, "run.yaml")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-kwargs", "length"], "argument --env-kwargs: expected KEY=VALUE, got 'length'"),
        (["--env-kwargs", "length=3", "length=4"], "--env-kwargs gives length twice"),
        (["--env-kwargs", "length=[3"], "argument --env-kwargs: length=[3: not a YAML value"),
        (["--env-kwargs", "width=3"], "cannot build acer_test_own_envs:Corridor-v0 with --env-kwargs width=3"),
        (["--env-kwargs", "kind=gray", "--normalize-obs"], "--normalize-obs is for vector observations; image frames"),
    ],
)
def test_bad_env_kwargs_flags_are_one_line_errors(module_dir, tmp_path, capsys, args, message):
    """In this process (train.main, as run_cli calls it): argparse's errors exit 2 with one line,
    the others are UserErrors, which run_cli prints as one line."""
    from acer_sync.cli import train

    with pytest.raises((SystemExit, UserError)) as error:
        train.main(["--env", USER_ENV, *args, "--run-dir", str(tmp_path / "run")])
    if isinstance(error.value, SystemExit):
        assert error.value.code == 2
        text = capsys.readouterr().err.strip()
    else:
        text = str(error.value)
    assert message in text and "\n" not in text
    assert not (tmp_path / "run").exists()


# --- the whole loop from the command line --------------------------------------------------------


@pytest.fixture(scope="module")
def user_run(module_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "corridor"
    result = run(
        module_dir, "train.py", "--env", USER_ENV, "--env-kwargs", "length=4", "kind=dict", "--vec-env", "subproc",
        "--total-timesteps", "300", *SMALL_RUN, "--run-dir", run_dir,
    )
    assert result.returncode == 0, result.stderr
    return run_dir


def test_a_user_env_trains_with_its_kwargs_saved_in_config_and_checkpoint(user_run):
    config = json.loads((user_run / "config.json").read_text())["config"]
    assert config["env"] == f"{MODULE}:Corridor-v0"
    assert config["env_kwargs"] == {"length": 4, "kind": "dict"}
    payload = load_checkpoint(user_run)
    assert payload["env_id"] == f"{MODULE}:Corridor-v0"
    assert payload["config"]["env_kwargs"] == {"length": 4, "kind": "dict"}
    assert payload["model_spec"]["obs_shape"] == [1, 4 + 1]  # one-hot cell, and the parity bit


def test_a_user_env_run_resumes_and_plays_in_a_fresh_process(module_dir, user_run, tmp_path):
    resumed = run(module_dir, "train.py", "--resume", user_run, "--total-timesteps", "400")
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(user_run)["counters"]["timesteps"] == 400
    played = run(module_dir, "play.py", user_run, "--episodes", "2")
    assert played.returncode == 0, played.stderr
    assert "mean score over 2 episodes" in played.stdout


def test_resume_refuses_other_env_kwargs(module_dir, user_run):
    line = one_line_error(run(module_dir, "train.py", "--resume", user_run, "--env-kwargs", "length=5"))
    assert "--env-kwargs {'length': 5} (the run used {'length': 4, 'kind': 'dict'})" in line


def test_checkpoints_from_before_env_kwargs_still_load(module_dir, user_run, tmp_path):
    old_run = tmp_path / "old"
    (old_run / "checkpoints").mkdir(parents=True)
    payload = load_checkpoint(user_run)
    del payload["config"]["env_kwargs"]
    payload["config"]["env"] = payload["env_id"] = f"{MODULE}:Corridor-v0"
    payload["model_spec"]["obs_shape"] = [1, 5]  # the env's defaults: 5 cells, Discrete
    payload["model"] = categorical_net((1, 5), 2, "mlp", (64, 64)).state_dict()
    payload["average_model"] = payload["model"]
    payload.pop("callbacks")
    torch.save({**payload, "format": 1}, old_run / "checkpoints" / "latest.pt")  # format 1, as those versions wrote
    assert Config(**payload["config"]).env_kwargs == {}
    played = run(module_dir, "play.py", old_run, "--episodes", "1")
    assert played.returncode == 0, played.stderr


def test_an_image_env_trains_through_the_cnn(module_dir, tmp_path):
    run_dir = tmp_path / "image"
    result = run(
        module_dir, "train.py", "--env", USER_ENV, "--env-kwargs", "kind=hwc", "--vec-env", "sync",
        "--total-timesteps", "100", *SMALL_RUN, "--run-dir", run_dir,
    )
    assert result.returncode == 0, result.stderr
    assert load_checkpoint(run_dir)["model_spec"]["arch"] == "cnn"


# --- observation spaces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, first_frames",
    [
        ("discrete", [[1, 0, 0, 0], [0, 1, 0, 0]]),
        ("multidiscrete", [[1, 0, 0, 0, 1, 0], [0, 1, 0, 0, 0, 1]]),  # cell one-hot, then parity one-hot
        ("tuple", [[1, 0, 0, 0, 0.0], [0, 1, 0, 0, 0.25]]),
        ("dict", [[1, 0, 0, 0, 0], [0, 1, 0, 0, 1]]),  # keys in sorted order: cell, parity
    ],
)
def test_discrete_and_composite_observations_are_flattened_one_hot(module_dir, kind, first_frames):
    info = env_info(USER_ENV, {"kind": kind, "length": 4})
    assert info.arch == "mlp" and info.frame_shape == (len(first_frames[0]),) and info.frame_dtype == np.float32
    env = VecEnv(info, 1, "sync")
    try:
        frames, _ = env.reset(seed=0)
        next_frames, *_ = env.step(np.array([1]))
    finally:
        env.close()
    np.testing.assert_allclose(np.concatenate([frames, next_frames]), first_frames)


@pytest.mark.parametrize(
    "kind, channels, height, width",
    [("hwc", 3, 40, 36), ("chw", 2, 36, 40), ("gray", 1, 36, 38)],
)
def test_image_observations_go_through_the_cnn_with_their_channels(module_dir, kind, channels, height, width):
    info = env_info(USER_ENV, {"kind": kind})
    frame_shape = (channels, height, width) if channels > 1 else (height, width)  # channels first
    assert info.arch == "cnn" and info.frame_shape == frame_shape and info.frame_dtype == np.uint8
    env = VecEnv(info, 2, "sync")
    try:
        env.reset(seed=0)
        frames, *_ = env.step(np.array([1, 0]))
    finally:
        env.close()
    for env_index, cell in enumerate([1, 0]):
        planes = frames[env_index].reshape(channels, height, width)
        for channel in range(channels):
            assert (planes[channel] == 10 * channel + cell).all(), (kind, channel)
    model = categorical_net(info.obs_shape, info.n_actions, info.arch)
    assert model.torso.convs[0].in_channels == channels  # the stack of 1 frame, times its channels
    pi, q = model(features_of(model, torch.from_numpy(frames[:, None])))  # [B, stack, *frame_shape], as acting feeds it
    assert pi.shape == q.shape == (2, 2)


def test_the_smallest_image_side_is_the_smallest_the_cnn_takes():
    categorical_net((1, MIN_IMAGE_SIDE, MIN_IMAGE_SIDE), 2, "cnn")
    with pytest.raises(RuntimeError):
        categorical_net((1, MIN_IMAGE_SIDE - 1, MIN_IMAGE_SIDE), 2, "cnn")


@pytest.mark.parametrize(
    "env_kwargs, message",
    [
        ({"kind": "text"}, "has observation space Text(1, 5, charset="),
        ({"kind": "sequence"}, "(its Sequence part); acer_sync supports Box, Discrete, MultiDiscrete, MultiBinary, and Tuple"),
        ({"kind": "hwc", "continuous": True}, "has image observations and Box actions"),
    ],
)
def test_unsupported_observations_are_one_line_user_errors(module_dir, env_kwargs, message):
    with pytest.raises(UserError) as error:
        env_info(USER_ENV, env_kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)
    if env_kwargs["kind"] in ("text", "sequence"):
        assert "uint8 images (H, W), (H, W, C) or (C, H, W) of at least 36x36" in str(error.value)


def test_images_smaller_than_the_cnn_takes_are_refused_for_it_and_train_a_torso_of_ones_own(module_dir, tmp_path):
    # The size check ran when the env's observations were adapted, so a torso made for small images
    # (a MiniGrid-style 7x7 grid, as SB3's docs show) was refused with the Nature CNN's limit.
    import user_torsos

    import acer_sync

    info = env_info(USER_ENV, {"kind": "small"})
    assert info.frame_shape == (3, 35, 36)
    with pytest.raises(UserError, match=r"has 35x36 images; the CNN takes images of at least 36x36 \(give it a torso "
                                        r"of your own with --torso") as error:
        acer_sync.train(USER_ENV, env_kwargs={"kind": "small"}, run_dir=tmp_path / "cnn", total_timesteps=40, verbose=0)
    assert "\n" not in str(error.value) and not (tmp_path / "cnn").exists()
    run_dir = acer_sync.train(USER_ENV, env_kwargs={"kind": "small"}, run_dir=tmp_path / "torso", torso=user_torsos.SmallTorso,
                              total_timesteps=40, num_envs=2, vec_env="sync", eval_every=0, verbose=0)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 40


def test_a_uint8_box_that_is_not_pixels_is_a_vector_and_stacked_rgb_frames_are_refused(module_dir):
    # uint8 of rank 2 or 3 was taken for an image whatever its bounds (SB3 asks for 0 and 255), so a
    # grid of cell codes went to the CNN (or was refused as too small); pixels of rank 4 were flattened
    grid = gym.spaces.Box(0, 2, (5, 5), np.uint8)
    from atari.envs import adapt_observations, image_layout

    assert image_layout(grid) is None and image_layout(gym.spaces.Box(0, 255, (40, 40), np.uint8)) == "hw"

    class Grid(gym.Env):
        observation_space, action_space = grid, gym.spaces.Discrete(2)

    class Stacked(gym.Env):
        observation_space, action_space = gym.spaces.Box(0, 255, (4, 48, 48, 3), np.uint8), gym.spaces.Discrete(2)

    class StackedPart(gym.Env):
        observation_space = gym.spaces.Dict({"camera": Stacked.observation_space, "speed": gym.spaces.Box(-1, 1, (1,))})
        action_space = gym.spaces.Discrete(2)

    assert adapt_observations(Grid(), "Grid").observation_space.shape == (25,)
    for env in (Stacked(), StackedPart()):  # a part as well: it was flattened in silence
        with pytest.raises(UserError, match=r"pixels of rank 4 \(a frame stack of RGB frames\?\)") as error:
            adapt_observations(env, "Stacked")
        assert "\n" not in str(error.value)


def test_a_missing_box2d_is_a_one_line_error_naming_the_extra(tmp_path):
    try:
        import Box2D  # noqa: F401
        pytest.skip("Box2D is installed here")
    except ImportError:
        pass
    result = subprocess.run([sys.executable, "train.py", "--env", "LunarLander-v3", "--run-dir", str(tmp_path / "run")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert "Box2D is not installed" in line and 'pip install "gymnasium[box2d]"' in line


# --- sweeps ------------------------------------------------------------------------------------


def test_sweep_files_take_module_env_ids_and_env_kwargs(module_dir, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"name: own\nenvs: ['{MODULE}:Corridor-v0']\nseeds: [0]\n"
        "settings:\n  env_kwargs: [{length: 3}, {length: 4, kind: dict}]\n  total_timesteps: 100\n"
    )
    trials = load_sweep(path).trials
    assert [trial.name for trial in trials] == [
        f"{MODULE}-Corridor-v0_seed0_env_kwargslength-3", f"{MODULE}-Corridor-v0_seed0_env_kwargslength-4-kind-dict",
    ]
    assert [trial.config.env_kwargs for trial in trials] == [{"length": 3}, {"length": 4, "kind": "dict"}]
    assert all(trial.config.env == f"{MODULE}:Corridor-v0" for trial in trials)
    path.write_text(f"name: own\nenvs: ['{MODULE}:Corridor-v0']\nseeds: [0]\nsettings:\n  env_kwargs: {{width: 3}}\n")
    with pytest.raises(UserError, match="cannot build .* with --env-kwargs width=3"):
        load_sweep(path)


def test_the_preset_follows_the_env_as_its_kwargs_make_it(module_dir, tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"name: own\nenvs: ['{MODULE}:Corridor-v0']\nseeds: [0]\nsettings:\n  env_kwargs: [{{}}, {{continuous: true}}]\n")
    discrete, continuous = (trial.config for trial in load_sweep(path).trials)
    assert discrete == build_config(False, {"env": USER_ENV, "seed": 0, "threads": 1})
    assert continuous == build_config(False, {"env": USER_ENV, "seed": 0, "threads": 1, "env_kwargs": {"continuous": True}},
                                      continuous=True)


# --- tuned settings per env (acer_sync/data/envs/) ------------------------------------------------------


def test_env_file_goes_between_the_preset_and_the_users_settings(tmp_path):
    (tmp_path / "Pendulum-v1.yaml").write_text("gamma: 0.9\nnsteps: 7\nlr: 0.002\n")
    path, env_settings = load_env_settings("Pendulum-v1", tmp_path)
    assert path == tmp_path / "Pendulum-v1.yaml" and env_settings == {"gamma": 0.9, "nsteps": 7, "lr": 0.002}
    preset = build_config(False, {}, continuous=True)
    config = build_config(False, {"nsteps": 9}, continuous=True, env_settings=env_settings)
    assert config.gamma == 0.9 and config.lr == 0.002  # the file beats the preset
    assert config.nsteps == 9  # the user beats the file
    assert config.buffer_size == preset.buffer_size  # the preset where neither speaks
    assert load_env_settings("Acrobot-v1", tmp_path) == (None, {})
    assert load_env_settings("gymnasium:Pendulum-v1", tmp_path)[1] == env_settings  # the module part is not the name


def test_an_env_file_is_checked_as_a_config_file(tmp_path):
    (tmp_path / "Pendulum-v1.yaml").write_text("gama: 0.9\n")
    with pytest.raises(UserError, match="Pendulum-v1.yaml: unknown setting 'gama'"):
        load_env_settings("Pendulum-v1", tmp_path)
    (tmp_path / "Pendulum-v1.yaml").write_text("env: CartPole-v1\n")
    with pytest.raises(UserError, match="Pendulum-v1.yaml: sets env, which the file's name already gives"):
        load_env_settings("Pendulum-v1", tmp_path)


def test_train_applies_the_env_file_under_config_and_flags_and_says_so(tmp_path):
    """Pendulum-v1's shipped file sets gamma 0.9, total_timesteps 100000, vec_env sync, buffer_size 2500 and lr
    0.001 (threads 1 is the preset's)."""
    config_file = tmp_path / "run.yaml"
    config_file.write_text("gamma: 0.95\ntotal_timesteps: 20\nnum_envs: 1\nnsteps: 5\neval_every: 0\n")
    result = subprocess.run(
        [sys.executable, "train.py", "--env", "Pendulum-v1", "--config", str(config_file), "--gamma", "0.8",
         "--run-dir", str(tmp_path / "run"), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["vec_env"] == "sync"  # the file beats the preset (which leaves the backend to the env kind)
    assert config["threads"] == 1  # the continuous preset's
    assert config["total_timesteps"] == 20  # --config beats the file
    assert config["gamma"] == 0.8  # a flag beats --config and the file
    assert config["lr"] == 0.001 and config["buffer_size"] == 2500  # the file's
    assert config["delta"] == build_config(False, {}, continuous=True).delta  # the preset where none speaks
    lines = [line for line in result.stdout.splitlines() if line.startswith("tuned settings")]
    assert lines == ["tuned settings for Pendulum-v1 from acer_sync/data/envs/Pendulum-v1.yaml: vec_env=sync, "
                     "buffer_size=2500, lr=0.001 (overridden by your settings: gamma, total_timesteps)"], result.stdout


def test_sweeps_apply_the_env_file_under_their_settings(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: s\nenvs: [Pendulum-v1]\nseeds: [0]\nsettings:\n  total_timesteps: 5000\ntrial: {cpus: 2}\n")
    config = load_sweep(path).trials[0].config
    assert config.gamma == 0.9 and config.vec_env == "sync"  # the file beats the preset
    assert config.total_timesteps == 5000  # the sweep's settings beat the file
    assert config.threads == 2  # the trial's CPUs, which the sweep sets over the file's 1


def shipped_env_files() -> list[Path]:
    return sorted((ROOT / "acer_sync" / "data" / "envs").glob("*.yaml"))


@pytest.mark.parametrize("path", shipped_env_files(), ids=lambda path: path.stem)
def test_shipped_env_files_hold_only_what_their_reported_runs_used(path):
    """Each setting of a shipped env file is what the reported runs of that env (docs/results.md) ran with
    (docs/runs/<EnvId>*/config.json), and differs from the preset; threads may come from
    OMP_NUM_THREADS=1, which the reported continuous-control runs all used."""
    env_id = path.stem
    _, settings = load_env_settings(env_id)
    assert settings, path
    info = env_info(f"popgym:{env_id}" if env_id.startswith("popgym-") else env_id)  # POPGym's ids need its module
    preset = build_config(info.atari, {}, continuous=info.continuous)
    runs = sorted((ROOT / "docs" / "runs").glob(f"{env_id}*/config.json"))
    for name, value in settings.items():
        assert value != getattr(preset, name), (path, name)
        if name == "threads" and value == 1:
            continue
        assert runs, f"{path}: no reported run in docs/runs to back {name}"
        for run_config in runs:
            assert json.loads(run_config.read_text())["config"][name] == value, (run_config, name)


class RendersOddly(gym.Env):
    """Two actions, 4-step episodes, and a render of the ``kind`` asked for (None, floats, a
    grayscale or RGBA frame, or a frame that grows each step)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None, kind="none"):
        self.render_mode, self.kind, self.t = render_mode, kind, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 4, False, {}

    def render(self):
        return {"none": None, "float": np.full((32, 48, 3), 0.5, np.float32), "gray": np.full((32, 48), 128, np.uint8),
                "rgba": np.full((32, 48, 4), 200, np.uint8), "growing": np.full((32 + 2 * self.t, 48, 3), 200, np.uint8)}[self.kind]


def test_a_render_that_is_not_an_rgb_frame_is_one_line_before_training_and_gray_rgba_or_growing_frames_are_filmed(tmp_path):
    # render() returning None or floats: a traceback at the first evaluation, after training; a
    # grayscale, RGBA or growing frame: "only 0 of its 5 frames reached the file", blaming the disk
    import acer_sync
    from acer_sync.rollout.video import VideoRecorder, video_env

    gym.register("RendersOddly-v0", entry_point=RendersOddly)
    try:
        for kind, said in [("none", "render() gives None"), ("float", "render() gives float32 of shape (32, 48, 3)")]:
            with pytest.raises(UserError, match="RendersOddly-v0's " + said.replace("(", "\\(").replace(")", "\\)")):
                acer_sync.train("RendersOddly-v0", run_dir=tmp_path / kind, env_kwargs={"kind": kind}, total_timesteps=80,
                                num_envs=2, vec_env="sync", eval_every=40, capture_video=True, verbose=0)
            assert not (tmp_path / kind).exists()
        for kind in ("gray", "rgba", "growing"):
            env = video_env(env_info("RendersOddly-v0", {"kind": kind}))
            recorder = VideoRecorder(env, tmp_path / f"{kind}.mp4")
            env.reset(seed=0)
            for _ in range(3):
                recorder(None)
                env.step(np.zeros(1, np.int64))
            assert recorder.finish() == tmp_path / f"{kind}.mp4" and recorder.frames == 3
            env.close()
    finally:
        gym.registry.pop("RendersOddly-v0")


def test_a_video_plays_at_the_frame_rate_its_env_declares(tmp_path):
    # every video was written at 30 fps: CartPole's (50) played slower than the game, HalfCheetah's
    # (1/dt = 20) faster, and a user's env at 10 three times as fast
    import cv2

    from acer_sync.rollout.video import VIDEO_FPS, VideoRecorder, video_env

    gym.register("RendersOddly-v0", entry_point=RendersOddly)
    try:
        for render_fps, fps in [(None, VIDEO_FPS), (10, 10), (12.5, 12.5)]:  # gymnasium's checker refuses 0
            env = video_env(env_info("RendersOddly-v0", {"kind": "gray"}))
            env.first_env().unwrapped.metadata = {"render_modes": ["rgb_array"]} | (
                {} if render_fps is None else {"render_fps": render_fps})
            recorder = VideoRecorder(env, tmp_path / "game.mp4")
            env.reset(seed=0)
            for _ in range(3):
                recorder(None)
                env.step(np.zeros(1, np.int64))
            recorder.finish()
            env.close()
            capture = cv2.VideoCapture(str(tmp_path / "game.mp4"))
            assert (recorder.fps, capture.get(cv2.CAP_PROP_FPS)) == pytest.approx((fps, fps)), render_fps
            capture.release()
    finally:
        gym.registry.pop("RendersOddly-v0")


class OddSpaces(gym.Env):
    """Four-step episodes of an env with what users' envs have: a Box of actions of ``action_dtype``
    and ``bound``, observations of ``obs_shape`` (values ``obs_value``, float64), and an ``info``."""

    def __init__(self, action_dtype="float32", bound=1.0, action_size=1, obs_shape=(2,), obs_value=0.0, info=None,
                 discrete=False):
        self.action_space = gym.spaces.Discrete(2) if discrete else \
            gym.spaces.Box(-bound, bound, (action_size,), np.dtype(action_dtype))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, tuple(obs_shape), np.float64)
        self.obs_value, self.info, self.t = obs_value, dict(info or {}), 0

    def _obs(self):
        return np.full(self.observation_space.shape, self.obs_value, np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), dict(self.info)

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        return self._obs(), 1.0, self.t >= 4, False, dict(self.info)


@pytest.fixture
def odd_spaces():
    gym.register("OddSpaces-v0", entry_point=OddSpaces)
    yield "OddSpaces-v0"
    gym.registry.pop("OddSpaces-v0")


@pytest.mark.parametrize("kwargs, said", [
    (dict(bound=1e20), "bounds beyond ±1e+18, whose squares (the Gaussian's variance) float32 cannot hold; rescale"),
    (dict(action_dtype="float64", bound=1e300), "bounds beyond ±1e+18"),
    (dict(action_size=0), "Box actions only as a flat vector of at least one number, with finite bounds"),
    (dict(obs_shape=[0]), "which holds no numbers: there is nothing to act on"),
])
def test_spaces_a_run_cannot_work_on_are_one_line_before_anything_is_written(tmp_path, odd_spaces, kwargs, said):
    # huge bounds: every update non-finite ("keeping the last good checkpoint" of none) or a policy
    # "not finite"; an empty Box: a ValueError or a reshape's RuntimeError traceback
    import acer_sync

    with pytest.raises(UserError, match=said.replace("(", "\\(").replace(")", "\\)").replace("+", "\\+")) as error:
        acer_sync.train(odd_spaces, env_kwargs=kwargs, run_dir=tmp_path / "run", total_timesteps=40, num_envs=2,
                        vec_env="sync", verbose=0)
    assert "\n" not in str(error.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs", [
    dict(action_dtype="float16"),  # every step refused: a float32 action is not in a float16 Box
    dict(discrete=True, info={"lives": "many"}),  # lives are read only for Atari: a ValueError traceback
    dict(discrete=True, info={"lives": [3]}),
])
def test_what_an_own_envs_actions_and_info_hold_trains(tmp_path, odd_spaces, kwargs):
    import acer_sync

    run_dir = acer_sync.train(odd_spaces, env_kwargs=kwargs, run_dir=tmp_path / "run", total_timesteps=80, num_envs=2,
                              vec_env="sync", eval_every=40, eval_episodes=2, verbose=0)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 80


def test_an_info_key_final_obs_that_is_not_an_observation_is_one_line(tmp_path, odd_spaces):
    # gymnasium's vector envs keep the key for the final observation: it was read as a frame, a traceback
    import acer_sync

    with pytest.raises(acer_sync.TrainingStopped) as stopped:
        acer_sync.train(odd_spaces, env_kwargs=dict(discrete=True, info={"final_obs": "bogus"}), run_dir=tmp_path / "run",
                        total_timesteps=80, num_envs=2, vec_env="sync", verbose=0)
    assert "ended an episode with an info['final_obs'] that is not an observation (str) at its vector step 4; " \
           "gymnasium's vector envs keep that key" in stopped.value.outcome.error


def test_an_observation_beyond_float32s_range_is_named_as_such_not_as_the_envs_inf(tmp_path, odd_spaces):
    import acer_sync

    with pytest.raises(acer_sync.TrainingStopped) as stopped:
        acer_sync.train(odd_spaces, env_kwargs=dict(discrete=True, obs_value=1e39), run_dir=tmp_path / "run",
                        total_timesteps=80, num_envs=2, vec_env="sync", verbose=0)
    assert "returned an observation of 1e+39 at its vector step 0, beyond float32's range (±3.4e38): scale the env's " \
           "observations" in stopped.value.outcome.error

"""A torso of the user's own (issue 33): SB3's features-extractor contract, from the command line and
from Python, with the LSTM memory, both heads and bf16; rebuilt by play.py, load and resume in a
fresh process; and every broken contract a one-line error before anything is written."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import user_torsos

import acer_sync
from acer_sync.base.config import build_config
from acer_sync.nets.networks import network_from_spec
from acer_sync.nets.torsos import TorsoError, import_torso
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import ROOT, one_line_error, requires_cuda

SMALL = dict(num_envs=2, vec_env="sync", device="cpu", eval_every=0, log_interval=1, threads=1, verbose=0)
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / name), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=ENV)


def test_a_torso_from_the_command_line_trains_replays_in_play_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    result = script("train.py", "--env", "CartPole-v1", "--torso", "user_torsos:SmallTorso", "--torso-kwargs",
                    "features_dim=24", "--num-envs", "2", "--total-timesteps", "400", "--eval-every", "0",
                    "--run-dir", str(run_dir), "--no-progress")
    assert result.returncode == 0, result.stderr
    payload = load_checkpoint(run_dir)
    spec = payload["model_spec"]
    assert spec["arch"] == "torso" and spec["torso"] == "user_torsos:SmallTorso" and spec["torso_kwargs"] == {"features_dim": 24}
    assert payload["model"]["torso.module.layer.1.weight"].shape == (24, 4)
    played = script("play.py", str(run_dir), "--episodes", "1")
    assert played.returncode == 0 and "episode 1: score" in played.stdout, played.stderr
    elsewhere = subprocess.run([sys.executable, str(ROOT / "play.py"), str(run_dir), "--episodes", "1"], cwd=ROOT,
                               capture_output=True, text=True, timeout=300,
                               env={name: value for name, value in os.environ.items() if name != "PYTHONPATH"})
    assert elsewhere.returncode == 2 and one_line_error(elsewhere).startswith(  # it named play.py's --torso, which play.py has not
        f"play.py: error: {run_dir} was trained with a network that does not build here: its torso "
        "user_torsos:SmallTorso: cannot import user_torsos (ModuleNotFoundError"), elsewhere.stderr
    assert one_line_error(elsewhere).endswith("its module must import where the run is loaded (run from its folder, or put that on PYTHONPATH)")
    resumed = script("train.py", "--resume", str(run_dir), "--total-timesteps", "480", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 480


@pytest.mark.parametrize("env, network, precision", [
    ("CartPole-v1", "auto", "fp32"), ("CartPole-v1", "lstm", "bf16"), ("Pendulum-v1", "auto", "fp32"),
    ("Pendulum-v1", "lstm", "fp32"),
])
def test_a_torso_class_from_python_with_either_memory_head_and_precision(tmp_path, env, network, precision):
    run_dir = acer_sync.train(env, run_dir=tmp_path / "run", total_timesteps=200, torso=user_torsos.SmallTorso,
                              torso_kwargs={"features_dim": 16}, network=network, precision=precision, lstm_size=8,
                              replay_start=40, **SMALL)
    spec = load_checkpoint(run_dir)["model_spec"]
    assert spec["torso"] == "user_torsos:SmallTorso" and spec["arch"] == ("torso_lstm" if network == "lstm" else "torso")
    policy = acer_sync.load(run_dir)
    torso = policy.model.torso.module
    obs = np.zeros(4 if env == "CartPole-v1" else 3, np.float32)
    action, state = policy.predict(obs)
    assert (state is not None) == (network == "lstm")
    # The torso got a float batch of the observation space's shape.
    assert torso.seen.dtype == torch.float32 and tuple(torso.seen.shape) == (1, obs.size)


def test_an_image_torso_gets_the_frames_scaled_to_one():
    torso = network_from_spec(dict(
        obs_shape=[4, 84, 84], n_actions=6, arch="torso", hidden=[], policy="categorical", normalize_obs=False,
        torso="user_torsos:SmallTorso", torso_kwargs={"features_dim": 8}, obs_dtype="uint8",
    )).torso
    frames = torch.full((2, 4, 84, 84), 255, dtype=torch.uint8)
    torso(frames)
    assert tuple(torso.module.seen.shape) == (2, 4, 84, 84) and float(torso.module.seen.max()) == 1.0


@pytest.mark.parametrize("torso, message", [
    ("no_such_module:Torso", "cannot import no_such_module (ModuleNotFoundError"),
    ("user_torsos:Missing", "user_torsos has no Missing"),
    ("user_torsos", "--torso takes MODULE:CLASS"),
    ("user_torsos:NotAModule", "is not an nn.Module class"),
    ("user_torsos:NoFeaturesDim", "must be an nn.Module with an int attribute features_dim >= 1"),
    ("user_torsos:WrongWidth", "forward must return floats of shape [B, features_dim] = [2, 32] for a batch of 2 observations, got (2, 33)"),
    ("user_torsos:Refuses", "Refuses(Box("),
    (user_torsos.SmallTorso(gym.spaces.Box(-1, 1, (4,))), "got an instance of SmallTorso (pass its class"),
    (None, "got None (leave it out"),
])
def test_a_broken_torso_is_one_line_before_anything_is_written(tmp_path, torso, message):
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, torso=torso, **SMALL)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_the_command_line_reports_a_broken_torso_in_one_line(tmp_path):
    result = script("train.py", "--env", "CartPole-v1", "--torso", "user_torsos:Refuses", "--torso-kwargs", "width=3",
                    "--run-dir", str(tmp_path / "run"))
    assert "raised ValueError: width 3 is not supported" in one_line_error(result)
    assert not (tmp_path / "run").exists()


def test_torso_takes_network_auto_or_lstm_only(tmp_path):
    with pytest.raises(acer_sync.UserError, match="takes --network auto .* or lstm"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", torso=user_torsos.SmallTorso, network="mlp", **SMALL)


def test_net_arch_and_activation_shape_the_vector_mlps(tmp_path):
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, net_arch="32,8",
                              activation="relu", **SMALL)
    payload = load_checkpoint(run_dir)
    assert payload["config"]["hidden"] == "32,8" and payload["model_spec"]["activation"] == "relu"
    model = acer_sync.load(run_dir).model
    assert isinstance(model.head.pi_mlp.body[2], torch.nn.ReLU) and model.head.q_mlp.body[3].out_features == 8


@pytest.mark.parametrize("pipeline, device, compile_mode", [
    ("serial", "cpu", "off"), ("overlap", "cpu", "off"),
    # acting's CUDA graph replays what its capture recorded: the capture must run in evaluation mode
    pytest.param("serial", "cuda", "graph", marks=requires_cuda), pytest.param("overlap", "cuda", "graph", marks=requires_cuda),
])
def test_a_torso_acts_and_evaluates_in_evaluation_mode_and_learns_in_training_mode(tmp_path, pipeline, device,
                                                                                   compile_mode):
    # As SB3 collects rollouts: Dropout off and BatchNorm on its running statistics while acting,
    # so one env acts alone (a BatchNorm in training mode refused a batch of one) and the greedy
    # evaluation is the policy's; the updates train both, and their running statistics reach the
    # network that acts.
    user_torsos.NormedTorso.MODES.clear()
    config = build_config(False, dict(env="CartPole-v1", torso="user_torsos:NormedTorso", vec_env="sync", device=device,
                                      num_envs=1, nsteps=5, total_timesteps=100, eval_every=50, eval_episodes=1,
                                      eval_greedy=True, log_interval=1, threads=1, pipeline=pipeline, compile=compile_mode))
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)
    assert trainer.train().finished
    modes = set(user_torsos.NormedTorso.MODES)
    # acting and evaluation one env at a time; the update's (T + 1) x N = 6, its bootstrap row with
    # them; the average network's T x N = 5, in evaluation mode too
    assert {(False, 1), (True, 6), (False, 5)} <= modes
    assert modes <= {(False, 1), (False, 2), (True, 6), (False, 5)}  # and the torso's check at its build
    assert trainer.model.training
    online = dict(trainer.model.named_buffers())
    assert online["torso.module.layer.2.running_mean"].abs().sum() > 0  # the updates moved it
    if pipeline == "overlap":
        for name, buffer in trainer.acting.model.named_buffers():
            assert torch.equal(buffer, online[name])


def trained_with_torso(tmp_path, torso: str, pipeline: str):
    """A finished 100-step CartPole run of the user torso ``torso`` (``user_torsos:Class``) in ``pipeline`` mode."""
    config = build_config(False, dict(env="CartPole-v1", torso=torso, vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=100, eval_every=0, log_interval=1, threads=1, pipeline=pipeline,
                                      replay_start=10))
    trainer = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False)
    assert trainer.train().finished
    return config, trainer


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_the_average_network_is_a_fixed_function_in_evaluation_mode(tmp_path, pipeline):
    # It ran in training mode: a user's Dropout drew fresh noise into φ_θa at each update, so the
    # trust region's KL(π_avg ‖ π) measured noise, and its BatchNorm normalised by the batch.
    config, trainer = trained_with_torso(tmp_path, "user_torsos:NormedTorso", pipeline)
    average = trainer.agent.average_model
    assert not average.training and trainer.model.training
    obs = torch.randn(8, 4)
    assert torch.equal(average.torso(obs), average.torso(obs))  # no dropout noise
    assert torch.equal(average.torso.module.layer[2].running_mean, trainer.model.torso.module.layer[2].running_mean)
    resumed = build_trainer(config, env_info("CartPole-v1"), tmp_path, resume=load_checkpoint(tmp_path))
    assert not resumed.agent.average_model.training


@pytest.mark.parametrize("network", ["auto", "lstm"])
def test_a_torso_returning_float64_trains_with_either_memory(tmp_path, network):
    # The start-up check took any float; the LSTM then failed at the first act ("mat1 and mat2
    # must have the same dtype"), leaving a run directory without a checkpoint.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=100, torso=user_torsos.Float64Torso,
                              network=network, lstm_size=8, **SMALL)
    features = acer_sync.load(run_dir).model.torso(torch.zeros(3, 1, 4))
    assert features.dtype == torch.float32 and features.shape == (3, 16)


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_a_buffer_the_torso_does_not_save_reaches_the_acting_copy_and_the_average_network(tmp_path, pipeline):
    # Every unsaved buffer was taken for a constant of the spec (as the Gaussian head's Box centre)
    _, trainer = trained_with_torso(tmp_path, "user_torsos:UnsavedStateTorso", pipeline)
    online = trainer.model.torso.module.running_max
    assert online > 0
    assert torch.equal(trainer.agent.average_model.torso.module.running_max, online)
    if pipeline == "overlap":
        assert torch.equal(trainer.acting.model.torso.module.running_max, online)


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_a_buffer_the_torso_rebinds_reaches_the_acting_copy_and_the_average_network(tmp_path, pipeline):
    # ActingCopy and PolyakAverage listed the buffer tensors once: a torso that rebinds its buffer
    # (self.mean = ...) left the acting copy, and the average network, on the first tensor.
    _, trainer = trained_with_torso(tmp_path, "user_torsos:RebindingTorso", pipeline)
    online = trainer.model.torso.module.mean
    assert online.abs().sum() > 0  # the updates moved it
    assert torch.equal(trainer.agent.average_model.torso.module.mean, online)
    if pipeline == "overlap":
        assert torch.equal(trainer.acting.model.torso.module.mean, online)


def test_loading_after_the_torso_class_changed_names_what_differs(tmp_path, monkeypatch):
    # It said only "does not hold a usable model (RuntimeError)", as for a damaged file.
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, torso=user_torsos.SmallTorso, **SMALL)

    class Grown(user_torsos.SmallTorso):
        def __init__(self, observation_space, features_dim: int = 32):
            super().__init__(observation_space, features_dim)
            self.extra = torch.nn.Linear(2, 2)

    monkeypatch.setattr(user_torsos, "SmallTorso", Grown)
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.load(run_dir)
    message = str(error.value)
    assert "\n" not in message and "torso.module.extra.weight" in message and "has user_torsos:SmallTorso changed since the run saved it?" in message


def test_loading_a_torso_that_no_longer_builds_says_why_as_the_loader_not_as_train_py(tmp_path, monkeypatch):
    # Its class gone from its module, refusing its contract, or failing an import of its own: no "--torso" (load
    # and resume have no such flag), and no advice about the import path, which only a module that does not
    # import needs (the class's own ImportError got it too, where load read "cannot import" in the text).
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, torso=user_torsos.SmallTorso, **SMALL)
    said = f"{run_dir} was trained with a network that does not build here: its torso user_torsos:SmallTorso"
    monkeypatch.delattr(user_torsos, "SmallTorso")
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.load(run_dir)
    assert str(error.value) == f"{said}: user_torsos has no SmallTorso"
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.train(resume=run_dir, total_timesteps=80, verbose=0)
    assert str(error.value) == f"{said}: user_torsos has no SmallTorso"
    for stand_in, detail in [(user_torsos.NoFeaturesDim, " must be an nn.Module with an int attribute features_dim >= 1"),
                             (user_torsos.ImportsWhatTorchHasNot, ": ImportsWhatTorchHasNot(Box("),
                             (user_torsos.RefusesInTwoLines, ": RefusesInTwoLines(Box(")]:
        monkeypatch.setattr(user_torsos, "SmallTorso", stand_in, raising=False)
        for attempt in (lambda: acer_sync.load(run_dir), lambda: acer_sync.train(resume=run_dir, total_timesteps=80, verbose=0)):
            with pytest.raises(acer_sync.UserError) as error:
                attempt()
            message = str(error.value)
            assert message.startswith(said + detail) and "\n" not in message, message
            assert "PYTHONPATH" not in message and "--torso" not in message
    assert message.endswith("raised ValueError: the first line the second line")


def test_a_checkpoint_whose_torso_is_not_module_class_says_so_as_the_loader(tmp_path):
    run_dir = acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, torso=user_torsos.SmallTorso, **SMALL)
    path = run_dir / "checkpoints" / "latest.pt"
    payload = torch.load(path, weights_only=True)
    payload["model_spec"]["torso"] = "user_torsos"
    torch.save(payload, path)
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.load(path)
    assert str(error.value) == (f"{path} was trained with a network that does not build here: "
                                "its torso user_torsos is not MODULE:CLASS (e.g. my_nets:ImpalaTorso)")


def test_a_torso_error_survives_pickle_and_copy_with_its_fields():
    with pytest.raises(TorsoError) as raised:
        import_torso("no_such_module:Torso")
    for copied in (pickle.loads(pickle.dumps(raised.value)), copy.deepcopy(raised.value)):
        assert type(copied) is TorsoError and str(copied) == str(raised.value)
        assert (copied.torso, copied.detail, copied.cannot_import) == (raised.value.torso, raised.value.detail, True)


def _one_hot(index: int, size: int) -> np.ndarray:
    return np.eye(size, dtype=np.float32)[index]


@pytest.mark.parametrize("space, shown", [
    ("box", {"shape": (2, 3)}), ("image", {"shape": (3, 8, 8)}), ("grid", {"shape": (5, 5)}), ("bits", {"shape": (2, 3)}),
    ("dict", {"pos": (2, 3), "mode": (3,)}), ("tuple", {"0": (2, 3), "1": (3,)}),
    ("dict_image", {"camera": (3, 40, 40), "pos": (2, 3)}), ("ordered", {"z": (2, 3), "a": (3,)}),
])
def test_a_torso_is_shown_each_observation_in_the_envs_own_shape(tmp_path, space, shown):
    # As SB3 shows its extractors: they were shown the frames the trainer stores, a Box (2, 3) as 6
    # numbers and a Dict of vectors as one vector, so a convolution on a float image, or an SB3 Dict
    # extractor, could not be used.
    import shaped_envs

    run_dir = acer_sync.train("shaped_envs:ShapedObs-v0", env_kwargs={"space": space}, run_dir=tmp_path / "run",
                              total_timesteps=80, torso=user_torsos.ShapeTorso, replay_start=40, **SMALL)
    policy = acer_sync.load(run_dir)
    torso = policy.model.torso.module
    built = torso.built_with
    if "shape" in shown:
        assert built == gym.spaces.Box(-np.inf, np.inf, shown["shape"], np.float32)
    else:
        assert isinstance(built, gym.spaces.Dict) and {key: box.shape for key, box in built.spaces.items()} == shown
        assert list(built.spaces) == list(shaped_envs.SPACES[space].spaces if space != "tuple" else shown)  # the env's order
    env = shaped_envs.ShapedObs(space)
    observation, _ = env.reset(seed=3)
    policy.predict(observation)
    seen = torso.seen
    if space in ("box", "image", "grid", "bits"):
        assert seen.dtype == torch.float32 and torch.equal(seen, torch.as_tensor(observation, dtype=torch.float32)[None])
    elif space == "dict_image":
        assert torch.equal(seen["camera"], torch.as_tensor(observation["camera"]).permute(2, 0, 1)[None].float() / 255)
        assert torch.equal(seen["pos"], torch.as_tensor(observation["pos"])[None])
    else:
        pos, mode = {"dict": lambda: (observation["pos"], observation["mode"]), "ordered": lambda: (observation["z"], observation["a"]),
                     "tuple": lambda: observation}[space]()
        first, second = {"dict": ("pos", "mode"), "ordered": ("z", "a"), "tuple": ("0", "1")}[space]
        assert torch.equal(seen[first], torch.as_tensor(pos)[None])
        assert torch.equal(seen[second], torch.as_tensor(_one_hot(mode, 3))[None])
    resumed = acer_sync.train(resume=run_dir, total_timesteps=120, progress_bar=False)
    assert load_checkpoint(resumed)["counters"]["timesteps"] == 120


def test_a_torso_run_from_before_the_envs_own_shapes_that_does_not_fit_names_only_what_differs(tmp_path):
    # Its spec, lacking torso_view, was compared with the new form's for the message: load named
    # torso_view among the keys that differ ("torso_view None (the env gives {'shape': [2, 3]})").
    run_dir = acer_sync.train("shaped_envs:ShapedObs-v0", env_kwargs={"space": "dict"}, run_dir=tmp_path / "run",
                              total_timesteps=80, torso=user_torsos.ShapeTorso, replay_start=40, **SMALL)
    latest = run_dir / "checkpoints" / "latest.pt"
    payload = torch.load(latest, weights_only=True)
    del payload["model_spec"]["torso_view"]
    payload["config"]["env_kwargs"] = {"space": "box"}  # the env changed since: 6 numbers, not 9
    torch.save(payload, latest)
    with pytest.raises(acer_sync.UserError, match="does not fit") as loading:
        acer_sync.load(run_dir)
    assert "obs_shape" in str(loading.value) and "torso_view" not in str(loading.value)


def test_a_torso_run_from_before_the_envs_own_shapes_keeps_the_frames_it_was_shown(tmp_path):
    # Its spec has no torso_view: the torso was built on the flattened frames, and it loads,
    # plays and resumes so (the new form would build other layers, here a Box (2, 3) and not 6 numbers).
    import shaped_envs

    run_dir = acer_sync.train("shaped_envs:ShapedObs-v0", env_kwargs={"space": "dict"}, run_dir=tmp_path / "run",
                              total_timesteps=80, torso=user_torsos.ShapeTorso, replay_start=40, **SMALL)
    latest = run_dir / "checkpoints" / "latest.pt"
    payload = torch.load(latest, weights_only=True)
    assert payload["model_spec"].pop("torso_view") == {"parts": [["mode", [3]], ["pos", [2, 3]]]}  # gymnasium sorts a plain dict's keys
    torch.save(payload, latest)
    policy = acer_sync.load(run_dir)
    assert policy.model.torso.module.built_with == gym.spaces.Box(-np.inf, np.inf, (9,), np.float32)
    observation, _ = shaped_envs.ShapedObs("dict").reset(seed=1)
    policy.predict(observation)
    assert policy.model.torso.module.seen.shape == (1, 9)
    acer_sync.train(resume=run_dir, total_timesteps=120, progress_bar=False)
    assert "torso_view" not in load_checkpoint(run_dir)["model_spec"]
    played = script("play.py", str(run_dir), "--episodes", "1")
    assert played.returncode == 0, played.stderr

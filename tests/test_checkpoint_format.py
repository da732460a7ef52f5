"""One checkpoint format: every earlier file loads, plays and resumes through one migration.

The files under ``tests/data/format1`` were written by earlier versions (its README says how);
``cartpole_mlp_first`` holds only the keys the first release of format 1 wrote.
"""

import dataclasses
import shutil
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

import acer_sync
from acer_sync.base.config import Config
from acer_sync.replay.buffer import BUFFER_FORMAT, migrate_buffer
from acer_sync.training.checkpoint import FORMAT_VERSION, format3_name, load_checkpoint, migrate
from atari.space_data import space_from_data, space_to_data
from helpers import ROOT, read_progress

FORMAT1 = ROOT / "tests" / "data" / "format1"
FORMAT2 = ROOT / "tests" / "data" / "format2"
RUNS = ["cartpole_mlp", "cartpole_lstm", "pendulum_gaussian", "cartpole_mlp_first"]
OBSERVATIONS = {"cartpole": np.zeros(4, np.float32), "pendulum": np.array([1.0, 0.0, 0.0], np.float32)}


def copied(tmp_path, name):
    run_dir = tmp_path / name
    shutil.copytree(FORMAT1 / name, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def current(tmp_path_factory):
    """A checkpoint of the current format, for its keys."""
    run_dir = tmp_path_factory.mktemp("current") / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=40, num_envs=2, nsteps=20, vec_env="sync",
                    eval_every=0, progress_bar=False, verbose=0)
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


@pytest.mark.parametrize("name", RUNS)
def test_a_format_1_checkpoint_loads_as_the_current_format_with_every_key(name, current):
    stored = torch.load(FORMAT1 / name / "checkpoints" / "latest.pt", weights_only=True)
    assert stored["format"] == 1
    payload = load_checkpoint(FORMAT1 / name)
    assert payload["format"] == FORMAT_VERSION == current["format"] == 3
    assert set(payload) == set(current)
    assert set(payload["counters"]) == set(current["counters"])
    assert set(payload["config"]) == {f.name for f in dataclasses.fields(Config)}
    assert set(payload["model_spec"]) == set(acer_sync.load(FORMAT1 / name).model.spec())
    assert payload["callbacks"] == {}
    for key, tensor in stored["model"].items():  # the weights are the file's, renamed and untouched
        assert torch.equal(payload["model"][format3_name(key, stored["model_spec"])], tensor)
    assert migrate(payload) == payload  # the current format passes through


def test_the_first_release_keys_are_filled_as_those_versions_behaved():
    payload = load_checkpoint(FORMAT1 / "cartpole_mlp_first")
    full = load_checkpoint(FORMAT1 / "cartpole_mlp")
    assert payload["model_spec"] == full["model_spec"]  # a categorical net without normalization
    assert payload["counters"]["nonfinite_updates"] == 0 and payload["counters"]["time_elapsed"] == 0.0
    assert payload["recent_lengths"] == [] and payload["action_low"] == payload["action_high"] == []
    assert payload["config"]["precision"] == "fp32" and payload["config"]["network"] == "auto"
    gaussian = load_checkpoint(FORMAT1 / "pendulum_gaussian")
    assert gaussian["action_low"] == [-2.0] and gaussian["action_high"] == [2.0]


@pytest.mark.parametrize("name", RUNS)
def test_a_format_1_run_plays_and_resumes_with_its_saved_buffer(tmp_path, name, capsys):
    run_dir = copied(tmp_path, name)
    policy = acer_sync.load(run_dir)
    action, state = policy.predict(OBSERVATIONS[name.split("_")[0]], deterministic=True)
    assert (state is not None) == policy.recurrent
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False)
    assert "replay resumes with the saved buffer (200 steps per env)" in capsys.readouterr().out
    resumed = load_checkpoint(run_dir)
    assert resumed["counters"]["timesteps"] == 520 and resumed["format"] == FORMAT_VERSION
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) == 520
    with np.load(run_dir / "checkpoints" / "buffer.npz") as arrays:
        assert int(arrays["format"]) == BUFFER_FORMAT


def test_a_buffer_of_the_first_release_loads_with_zero_timeout_values():
    with np.load(FORMAT1 / "cartpole_mlp_first" / "checkpoints" / "buffer.npz") as arrays:
        assert "timeout_values" not in arrays and "format" not in arrays
        migrated = migrate_buffer(arrays)
        assert migrated["timeout_values"].shape == arrays["dones"].shape and not migrated["timeout_values"].any()


def test_files_of_a_newer_format_are_refused_in_one_line(tmp_path):
    run_dir = copied(tmp_path, "cartpole_mlp")
    path = run_dir / "checkpoints" / "latest.pt"
    torch.save({**torch.load(path, weights_only=True), "format": FORMAT_VERSION + 1}, path)
    with pytest.raises(acer_sync.UserError, match=f"checkpoint format {FORMAT_VERSION + 1}, newer than"):
        acer_sync.load(run_dir)
    with pytest.raises(ValueError, match=f"buffer format {BUFFER_FORMAT + 1}, newer than"):
        migrate_buffer({"format": np.array(BUFFER_FORMAT + 1)})


@pytest.mark.parametrize("name", ["cartpole_mlp", "pendulum_lstm"])
def test_a_format_2_checkpoint_gets_the_composed_networks_names_and_order_and_resumes(tmp_path, name):
    stored = torch.load(FORMAT2 / name / "checkpoints" / "latest.pt", weights_only=True)
    assert stored["format"] == 2
    payload = load_checkpoint(FORMAT2 / name)
    model = acer_sync.load(FORMAT2 / name).model
    assert payload["model_spec"] == model.spec() and set(payload["model"]) == set(model.state_dict())
    for key, tensor in stored["model"].items():
        assert torch.equal(payload["model"][format3_name(key, stored["model_spec"])], tensor)
    # The optimizer's state is by parameter index: each entry sits at its parameter's new index.
    parameters = list(model.parameters())
    for index, state in payload["optimizer"]["state"].items():
        assert state["square_avg"].shape == parameters[index].shape
    if name == "pendulum_lstm":  # its log_std moved from first to after the torso and the LSTM
        names = [n for n, _ in model.named_parameters()]
        log_std = names.index("head.log_std")
        assert log_std > 0 and torch.equal(payload["optimizer"]["state"][log_std]["square_avg"],
                                           stored["optimizer"]["state"][0]["square_avg"])
    run_dir = tmp_path / name
    shutil.copytree(FORMAT2 / name, run_dir)
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False, verbose=0)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 520


def test_a_checkpoint_saved_with_numpy_values_in_a_callbacks_state_loads_and_object_arrays_stay_refused(tmp_path, current):
    # Before callbacks' states were made plain, an np.mean in one was saved as numpy's scalar, and
    # weights_only refused every checkpoint of the run. numpy's numbers are data: they load.
    saved = {**current, "callbacks": {"Mine": {"mean": np.float64(1.5), "count": np.int32(3), "flags": np.ones(2, bool)}}}
    torch.save(saved, tmp_path / "numpy.pt")
    state = load_checkpoint(tmp_path / "numpy.pt")["callbacks"]["Mine"]
    assert state["mean"] == 1.5 and state["count"] == 3 and state["flags"].tolist() == [True, True]
    # numpy 1 named its scalar and array builders numpy.core.multiarray: such a file loads too.
    archive = zipfile.ZipFile(tmp_path / "numpy.pt")
    with zipfile.ZipFile(tmp_path / "numpy1.pt", "w") as numpy1:
        for item in archive.infolist():
            data = archive.read(item.filename)
            numpy1.writestr(item, data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
                            if item.filename.endswith("data.pkl") else data)
    assert load_checkpoint(tmp_path / "numpy1.pt")["callbacks"]["Mine"]["mean"] == 1.5
    # torch's allowlist is the process's: a caller's own entry stays, and acer_sync's are taken away.
    with torch.serialization.safe_globals([np.ndarray]):
        load_checkpoint(tmp_path / "numpy.pt")
        assert np.ndarray in torch.serialization.get_safe_globals()
        assert np.dtype not in torch.serialization.get_safe_globals()
    torch.save({**current, "callbacks": {"Mine": {"items": np.array([object()])}}}, tmp_path / "objects.pt")
    with pytest.raises(acer_sync.UserError, match=r"not a plain-data checkpoint \(it holds a numpy\.dtypes\.ObjectDType"):
        load_checkpoint(tmp_path / "objects.pt")


@pytest.mark.parametrize("space", [
    gym.spaces.Box(0, 255, (36, 36, 3), np.uint8), gym.spaces.Box(-np.inf, np.inf, (7,), np.float64),
    gym.spaces.Discrete(5, start=2), gym.spaces.MultiDiscrete([3, 4], start=[1, 0]), gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (8, 8), np.uint8), "mode": gym.spaces.Discrete(4)}),
    gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32))),
], ids=lambda space: type(space).__name__)
def test_an_observation_space_goes_through_a_checkpoint_as_plain_data(tmp_path, space):
    path = tmp_path / "space.pt"
    torch.save({"space": space_to_data(space)}, path)
    assert space_from_data(torch.load(path, weights_only=True)["space"]) == space


def test_a_dict_space_keeps_the_envs_own_order_of_its_keys():
    # The frames' parts follow it; gymnasium sorts a plain dict's keys, and Dict's == ignores the order.
    space = gym.spaces.Dict([("z", gym.spaces.Discrete(2)), ("a", gym.spaces.Box(-1, 1, (3,), np.float32))])
    assert list(space_from_data(space_to_data(space)).spaces) == ["z", "a"]


@pytest.mark.parametrize("data", [{"kind": "Text"}, {"kind": "Box", "low": 1}, [1, 2], {"kind": "Dict", "keys": ["a"], "spaces": []}])
def test_data_that_is_no_observation_space_is_a_value_error(data):
    with pytest.raises(ValueError, match="^not an observation space's data"):
        space_from_data(data)


def test_a_flipped_bit_in_the_pickle_that_torch_asserts_on_is_a_one_line_error(tmp_path):
    # torch's unpickler asserted ("saved_id must be a tuple, got int"), a traceback
    data = bytearray((ROOT / "tests/data/format2/cartpole_mlp/checkpoints/latest.pt").read_bytes())
    data[2195] ^= 0x01
    (tmp_path / "latest.pt").write_bytes(bytes(data))
    with pytest.raises(acer_sync.UserError, match=r"corrupt or truncated.*\(AssertionError\)"):
        load_checkpoint(tmp_path / "latest.pt")

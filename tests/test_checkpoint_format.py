"""One checkpoint format: every earlier file loads, plays and resumes through one migration.

The files under ``tests/data/format1`` were written by earlier versions (its README says how);
``cartpole_mlp_first`` holds only the keys the first release of format 1 wrote.
"""

import dataclasses
import shutil
import zipfile
import zlib

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


def test_the_first_versions_mlp_whose_pi_and_q_share_a_torso_loads_as_the_same_function_and_resumes(tmp_path):
    # 574b2b6 gave Q a torso of its own without a migration: the first version's MLP runs did not load
    stored = torch.load(FORMAT1 / "cartpole_mlp_shared" / "checkpoints" / "latest.pt", weights_only=True)
    weights = stored["model"]
    assert not any(name.startswith("q_torso.") for name in weights)
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4], [-1.0, 0.5, 0.2, -0.1]])
    shared = torch.tanh(torch.tanh(obs @ weights["torso.body.1.weight"].T + weights["torso.body.1.bias"])
                        @ weights["torso.body.3.weight"].T + weights["torso.body.3.bias"])
    pi_then = torch.softmax(shared @ weights["policy_head.weight"].T + weights["policy_head.bias"], dim=-1)
    q_then = shared @ weights["q_head.weight"].T + weights["q_head.bias"]
    policy = acer_sync.load(FORMAT1 / "cartpole_mlp_shared")
    with torch.no_grad():
        features, _ = policy.model.unroll(obs[None, :, None], torch.zeros(1, 2, dtype=torch.bool), policy.model.initial_state(2))
        pi_now, q_now = policy.model(features)
    torch.testing.assert_close(pi_now, pi_then, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(q_now, q_then, rtol=1e-6, atol=1e-6)
    payload = load_checkpoint(FORMAT1 / "cartpole_mlp_shared")
    names = [name for name, _ in policy.model.named_parameters()]
    state = payload["optimizer"]["state"]
    assert len(state) == len(names) == len(payload["optimizer"]["param_groups"][0]["params"])
    for layer in ("body.1.weight", "body.3.bias"):  # Q's copy of RMSProp's v is the shared torso's
        assert torch.equal(state[names.index(f"head.q_mlp.{layer}")]["square_avg"],
                           state[names.index(f"head.pi_mlp.{layer}")]["square_avg"])
    assert torch.equal(payload["average_model"]["head.q_mlp.body.1.weight"], stored["average_model"]["torso.body.1.weight"])
    run_dir = copied(tmp_path, "cartpole_mlp_shared")
    acer_sync.train(resume=run_dir, total_timesteps=560, progress_bar=False)
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 560


def without_its_step(run_dir, **changed):
    """The run's buffer.npz as written before buffers recorded their checkpoint's step (and ``changed`` arrays)."""
    path = run_dir / "checkpoints" / "buffer.npz"
    with np.load(path) as arrays:
        kept = {name: arrays[name] for name in arrays.files if name != "checkpoint_step"}
    np.savez(path, **{**kept, **changed})


def test_a_buffer_that_did_not_record_its_step_is_not_used_with_an_earlier_checkpoint(tmp_path, capsys):
    # its step was not recorded, and any checkpoint took it: it is at least its steps per env times its envs
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=480, num_envs=2, vec_env="sync", buffer_size=200,
                    replay_start=40, checkpoint_every=240, save_buffer=True, eval_every=0, verbose=0)
    without_its_step(run_dir)
    checkpoints = run_dir / "checkpoints"
    shutil.copy(checkpoints / "step_0000000240.pt", checkpoints / "latest.pt")  # the docs' way back to a step copy
    capsys.readouterr()
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False)
    said = capsys.readouterr().out
    assert "the saved replay buffer is from step 480 or later, not the checkpoint's 240, so it is not used" in said


def test_a_buffer_that_did_not_record_its_step_is_used_where_it_may_be_the_checkpoints(tmp_path, capsys):
    # a run resumed once without its buffer wrote fewer steps into the next: 60 per env at step 240
    run_dir = copied(tmp_path, "cartpole_mlp")
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False)
    with np.load(run_dir / "checkpoints" / "buffer.npz") as arrays:
        starts = np.zeros_like(arrays["segment_start"])
    starts[:3] = [0, 20, 40]  # where such a buffer's 3 segments of 20 steps start
    without_its_step(run_dir, counters=np.array([60, 3]), segment_start=starts)
    acer_sync.train(resume=run_dir, total_timesteps=560, progress_bar=False)
    said = capsys.readouterr().out
    assert "replay resumes with the saved buffer (60 steps per env) (saved before buffers recorded" in said
    without_its_step(run_dir, counters=np.array([60, 3, 0]))
    with pytest.raises(acer_sync.UserError, match="counters is \\(3,\\), expected \\(2,\\)"):
        acer_sync.train(resume=run_dir, total_timesteps=600, progress_bar=False)


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


def test_a_run_from_before_the_auto_defaults_resumes_with_the_modes_it_ran_with(tmp_path):
    # A format 2 run predates --pipeline (it ran serial) and --compile auto (compile: false, the
    # update eager): its resume keeps them, as a change of neither (auto would overlap it on CUDA).
    import json

    run_dir = tmp_path / "cartpole_mlp"
    shutil.copytree(FORMAT2 / "cartpole_mlp", run_dir)
    assert "pipeline" not in torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["config"]
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False, verbose=0)
    record = json.loads((run_dir / "config.json").read_text())
    assert (record["config"]["pipeline"], record["config"]["compile"]) == ("serial", "off")
    assert record["resumes"][-1]["changed"] == {"total_timesteps": [480, 520]}
    assert load_checkpoint(run_dir)["config"]["pipeline"] == "serial"
    ran = {"device": "cpu", "compile": "off", "pipeline": "serial", "replay_device": "cpu"}
    assert record["ran"] == record["resumes"][-1]["ran"] == ran  # what the session's settings resolved to


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
    # The CRC check refuses the flip first; with the member's CRC made to match it (as a writer that
    # computed it after the flip would leave it), torch's unpickler reads it, and asserts.
    source = ROOT / "tests/data/format2/cartpole_mlp/checkpoints/latest.pt"
    data = bytearray(source.read_bytes())
    data[2195] ^= 0x01
    (tmp_path / "latest.pt").write_bytes(bytes(data))
    with pytest.raises(acer_sync.UserError, match=r"corrupt or truncated.*\(archive/data.pkl fails its CRC check\)"):
        load_checkpoint(tmp_path / "latest.pt")
    with zipfile.ZipFile(source) as archive:
        pickle_member = archive.getinfo("archive/data.pkl")
        flipped_pickle = bytearray(archive.read(pickle_member))
    flipped_pickle[2195 - _data_start(data, pickle_member)] ^= 0x01
    stored, matching = (crc.to_bytes(4, "little") for crc in (pickle_member.CRC, zlib.crc32(flipped_pickle)))
    assert data.count(stored) == 2  # the local header's and the central directory's
    (tmp_path / "latest.pt").write_bytes(bytes(data).replace(stored, matching))
    with pytest.raises(acer_sync.UserError, match=r"corrupt or truncated.*\(AssertionError\)"):
        load_checkpoint(tmp_path / "latest.pt")


def _data_start(data, member):
    """Where ``member``'s bytes start in ``data``, its zip file: after the local header's 30 fixed
    bytes, the name and the local extra field (torch pads it to align tensors; the central
    directory's copy differs)."""
    name_length, extra_length = (int.from_bytes(data[member.header_offset + at:member.header_offset + at + 2], "little") for at in (26, 28))
    return member.header_offset + 30 + name_length + extra_length


def _flip_a_bit_in_the_weights(source, target):
    """``source`` with one bit flipped in the middle of its first tensor's bytes, written to ``target``."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        member = next(info for info in archive.infolist() if info.filename.endswith("/data/0"))
    data[_data_start(data, member) + member.file_size // 2] ^= 0x10
    target.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_weights_is_refused_with_the_step_copy_to_go_back_to(tmp_path):
    # torch's reader checks no CRC: the file loaded with one weight changed, in silence
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=80, num_envs=2, nsteps=20, vec_env="sync",
                    eval_every=0, checkpoint_every=40, progress_bar=False, verbose=0)
    latest = run_dir / "checkpoints" / "latest.pt"
    intact = torch.load(latest, weights_only=True)["model"]
    _flip_a_bit_in_the_weights(latest, latest)
    with zipfile.ZipFile(latest) as archive:  # the flip is in a tensor's bytes, so torch alone would read it
        name = next(info.filename for info in archive.infolist() if info.filename.endswith("/data/0"))
    flipped = torch.load(latest, weights_only=True)["model"]
    assert sum(not torch.equal(intact[key], flipped[key]) for key in intact) == 1
    with pytest.raises(acer_sync.UserError, match=rf"^cannot read checkpoint .*latest.pt: it is corrupt or truncated, or not a checkpoint "
                                                  rf"\({name} fails its CRC check\); step_0000000080.pt beside it holds step 80: copy it"):
        load_checkpoint(run_dir)
    with pytest.raises(acer_sync.UserError, match="fails its CRC check"):
        acer_sync.load(run_dir)


def test_a_flipped_bit_in_the_archives_index_is_a_one_line_error(tmp_path):
    # The first member's compression method, 0 (stored), read as 8 (deflated): zlib raised, a traceback.
    data = bytearray((FORMAT2 / "cartpole_mlp" / "checkpoints" / "latest.pt").read_bytes())
    entry = data.find(b"PK\x01\x02")  # the first member's entry in the central directory
    data[entry + 10] ^= 0x08
    (tmp_path / "latest.pt").write_bytes(bytes(data))
    with pytest.raises(acer_sync.UserError, match=r"corrupt or truncated.*\(archive/data.pkl is damaged in the zip's index\)"):
        load_checkpoint(tmp_path / "latest.pt")
    # A tensor's entry marked a folder (MS-DOS attribute 0x10): torch read the tensor as other numbers, in silence.
    data = bytearray((FORMAT2 / "cartpole_mlp" / "checkpoints" / "latest.pt").read_bytes())
    entries = [index for index in range(len(data)) if data.startswith(b"PK\x01\x02", index)]
    entry = next(index for index in entries if data.startswith(b"archive/data/0", index + 46))  # its name follows 46 bytes
    data[entry + 38] ^= 0x10  # the first byte of the entry's external attributes
    (tmp_path / "latest.pt").write_bytes(bytes(data))
    with pytest.raises(acer_sync.UserError, match=r"corrupt or truncated.*\(archive/data/0 is damaged in the zip's index\)"):
        load_checkpoint(tmp_path / "latest.pt")
    # ... but a real folder entry (``zip -r`` writes them) is no damage: torch reads the file
    source = load_checkpoint(FORMAT2 / "cartpole_mlp")
    torch.save(source, tmp_path / "intact.pt")
    with zipfile.ZipFile(tmp_path / "intact.pt") as original, zipfile.ZipFile(tmp_path / "rezipped.pt", "w") as rezipped:
        folder = original.namelist()[0].split("/")[0] + "/"
        entry = zipfile.ZipInfo(folder)
        entry.external_attr = 0o40775 << 16 | 0x10  # a folder's entry as zipfile.write and zip -r make it: a name ending in "/", and 0x10
        rezipped.writestr(entry, b"")
        for name in original.namelist():
            rezipped.writestr(original.getinfo(name), original.read(name))
    assert load_checkpoint(tmp_path / "rezipped.pt")["config"] == source["config"]


def test_a_checkpoint_written_without_crcs_loads(tmp_path):
    # torch stores 0 for every member when compute_crc32 is off; those are not checked
    from torch.utils.serialization import config
    payload = load_checkpoint(FORMAT2 / "cartpole_mlp")
    config.save.compute_crc32 = False
    try:
        torch.save(payload, tmp_path / "latest.pt")
    finally:
        config.save.compute_crc32 = True
    with zipfile.ZipFile(tmp_path / "latest.pt") as archive:
        assert {info.CRC for info in archive.infolist()} == {0}
    loaded = load_checkpoint(tmp_path / "latest.pt")["model"]
    assert all(torch.equal(loaded[key], tensor) for key, tensor in payload["model"].items())


class CellsOrFrames(gym.Env):
    """A uint8 observation of ``SHAPE`` bounded 0 and ``HIGH``: a grid of cell codes (40x40, up to
    9), or two stacked RGB frames (2x8x8x3, up to 255). The bound is a class attribute, so that a
    test can give a run the space its env had and then the one it has now."""

    SHAPE, HIGH = (40, 40), 255
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, self.HIGH, self.SHAPE, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 10, self.SHAPE).astype(np.uint8), {}

    def step(self, action):
        self.t += 1
        return self.np_random.integers(0, 10, self.SHAPE).astype(np.uint8), float(action), self.t >= 15, False, {}


@pytest.mark.parametrize("shape, high_then, high_now", [((40, 40), 255, 9), ((2, 8, 8, 3), 254, 255)], ids=["grid", "rank4"])
def test_a_run_from_before_sb3s_image_rule_loads_plays_and_resumes_as_it_read_its_images(tmp_path, monkeypatch, shape,
                                                                                        high_then, high_now):
    # Before 8c65b58 any uint8 Box of rank 2 or 3 was an image (a grid of cell codes 0-9 went to the
    # CNN) and pixels of rank 4 were flattened; since, the grid is a vector and rank-4 pixels are
    # refused, and such runs did not load. The bounds then make the env read as it was read then.
    from acer_sync.cli.play import policy_env

    env_id = f"CellsOrFrames{len(shape)}-v0"
    gym.register(env_id, entry_point=CellsOrFrames)
    try:
        monkeypatch.setattr(CellsOrFrames, "SHAPE", shape)
        monkeypatch.setattr(CellsOrFrames, "HIGH", high_then)
        run_dir = tmp_path / "run"
        acer_sync.train(env_id, run_dir=run_dir, total_timesteps=80, num_envs=2, vec_env="sync", hidden="8",
                        eval_every=0, verbose=0)
        arch = load_checkpoint(run_dir)["model_spec"]["arch"]
        assert arch == ("cnn" if len(shape) == 2 else "mlp")
        monkeypatch.setattr(CellsOrFrames, "HIGH", high_now)
        policy = acer_sync.load(run_dir)
        assert policy.legacy_images
        observation, _ = CellsOrFrames().reset(seed=0)
        action, _ = policy.predict(observation, deterministic=True)
        assert action in (0, 1)
        assert policy_env(policy, run_dir).legacy_images  # play.py plays it so
        acer_sync.train(resume=run_dir, total_timesteps=160, verbose=0)
        assert load_checkpoint(run_dir)["counters"]["timesteps"] == 160
        assert load_checkpoint(run_dir)["model_spec"]["arch"] == arch
        fresh = acer_sync.train(env_id, run_dir=tmp_path / "fresh", total_timesteps=40, num_envs=2, vec_env="sync",
                                hidden="8", eval_every=0, verbose=0) if len(shape) == 2 else None
        if fresh is not None:  # a run started now reads the grid as a vector
            assert load_checkpoint(fresh)["model_spec"]["arch"] == "mlp" and not acer_sync.load(fresh).legacy_images
    finally:
        gym.registry.pop(env_id)


class HwcGrid(CellsOrFrames):
    """A 40x40x3 grid (HWC) of cell codes."""

    SHAPE = (40, 40, 3)


def test_a_callable_envs_run_from_before_sb3s_image_rule_takes_its_envs_observations_in_another_process(tmp_path):
    # Where the env cannot be made (a callable of another process), the space saved in the checkpoint
    # was read by today's rule: a grid of cell codes (bounds 0 and 9) that the CNN read in HWC was
    # flattened and its numbers reshaped into channels, silently.
    run_dir = acer_sync.train(HwcGrid, run_dir=tmp_path / "run", total_timesteps=40, num_envs=2, vec_env="sync",
                              eval_every=0, verbose=0)
    path = run_dir / "checkpoints" / "latest.pt"
    payload = torch.load(path, weights_only=True)
    assert payload["model_spec"]["arch"] == "cnn"
    payload["observation_space"] = space_to_data(gym.spaces.Box(0, 9, (40, 40, 3), np.uint8))  # as the old version saved it
    torch.save(payload, path)
    gym.registry.pop(payload["env_id"])  # the callable is another process's
    policy = acer_sync.load(run_dir)
    assert policy.legacy_images
    observation, _ = HwcGrid().reset(seed=0)
    frames = np.moveaxis(observation, -1, 0)  # what training stored
    with torch.no_grad():
        features, _ = policy.model.unroll(torch.as_tensor(frames)[None, None, None], torch.zeros(1, 1, dtype=torch.bool),
                                          policy.model.initial_state(1))
        greedy = int(policy.model(features)[0].argmax())
    assert policy.predict(observation, deterministic=True)[0] == greedy
    assert policy._frames(observation)[0].shape == (1, 3, 40, 40) and np.array_equal(policy._frames(observation)[0][0], frames)


def test_a_resumed_format_1_run_records_only_the_settings_its_resume_changed(tmp_path):
    # Its config.json lacks the settings added since and holds compile: false; those are no change.
    import json

    run_dir = copied(tmp_path, "cartpole_mlp")
    acer_sync.train(resume=run_dir, total_timesteps=520, progress_bar=False, verbose=0)
    record = json.loads((run_dir / "config.json").read_text())
    [session] = record["resumes"]
    assert session["changed"] == {"total_timesteps": [480, 520]} and session["step"] == 480
    assert record["config"]["compile"] == "off" and record["config"]["total_timesteps"] == 520

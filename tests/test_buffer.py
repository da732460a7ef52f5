"""The replay buffer: frames stored once, stacks rebuilt exactly as acting built them."""

import io
import itertools
import threading
import time

import numpy as np
import pytest
import torch

from acer_sync.nets.distributions import Categorical
from acer_sync.replay.buffer import ReplayBuffer, Segment, buffer_fields, rebuild_stacks, to_batch
from atari.stacking import FrameStacker
from helpers import random_segments

N, T, STACK, A = 3, 5, 4, 2


class FakeRollout:
    """Produces segments like the Runner: unique frame ids, random episode ends, acting stacks."""

    def __init__(self, seed: int, done_prob: float = 0.2):
        self.rng = np.random.default_rng(seed)
        self.done_prob = done_prob
        self.step = 0
        self.stacker = FrameStacker(N, STACK, ((1,), np.dtype(np.float32)))
        self.frames = self._frames()
        self.first = np.ones(N, dtype=bool)
        self.stacker.reset(self.frames)

    def _frames(self) -> np.ndarray:
        # Frame id encodes (env, global step) so every frame is distinct.
        return (np.arange(N)[:, None] * 100_000 + self.step + 1).astype(np.float32)

    def segment(self) -> tuple[Segment, np.ndarray]:
        frames = np.empty((T + 1, N, 1), np.float32)
        firsts = np.empty((T + 1, N), bool)
        stacks = np.empty((T + 1, N, STACK, 1), np.float32)
        dones = np.empty((T, N), bool)
        for t in range(T):
            frames[t], firsts[t], stacks[t] = self.frames, self.first, self.stacker.stacked
            dones[t] = self.rng.random(N) < self.done_prob
            self.step += 1
            self.frames = self._frames()
            self.stacker.push(self.frames, dones[t])
            self.first = dones[t]
        frames[T], firsts[T], stacks[T] = self.frames, self.first, self.stacker.stacked
        actions = self.rng.integers(0, A, (T, N))
        mu = self.rng.dirichlet(np.ones(A), (T, N)).astype(np.float32)
        rewards = self.rng.normal(size=(T, N)).astype(np.float32)
        segment = Segment(
            frames=frames, firsts=firsts, actions=actions, mu=mu, rewards=rewards, dones=dones,
            timeout_values=np.zeros((T, N), np.float32),
        )
        return segment, stacks


FIELDS = buffer_fields((1,), np.dtype(np.float32), Categorical(A))


def make_buffer(segments: int) -> ReplayBuffer:
    return ReplayBuffer(FIELDS, N, T, segments * T, STACK)


def rebuilt(sample) -> np.ndarray:
    return rebuild_stacks(torch.from_numpy(sample.frames), torch.from_numpy(sample.firsts), STACK).numpy()


def test_frames_are_stored_once():
    fields = buffer_fields((84, 84), np.dtype(np.uint8), Categorical(6))
    buffer = ReplayBuffer(fields, 16, 20, 50_000, 4)
    assert buffer.frames.shape == (50_000 + 4, 16, 84, 84)
    per_transition = buffer.nbytes / (16 * 50_000)
    # One 84x84 frame (7,056 bytes) and its first flag, then 4·A + 10 bytes of step data: μ in
    # float32, a uint8 action, the reward and the time-limit value in float32, a bool done.
    assert per_transition == pytest.approx((50_004 * 7_057 + 50_000 * (4 * 6 + 10)) / 50_000)
    assert buffer.nbytes == ReplayBuffer.bytes_needed(fields, 16, 20, 50_000, 4)


def test_latest_rebuilds_the_acting_stacks_and_data():
    rollout, buffer = FakeRollout(0), make_buffer(4)
    for _ in range(3):
        segment, stacks = rollout.segment()
        buffer.put(segment)
        sample = buffer.latest()
        np.testing.assert_array_equal(rebuilt(sample), stacks)
        for name in ("actions", "mu", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(sample, name), getattr(segment, name))


def test_every_stored_segment_survives_wraparound():
    rollout, buffer = FakeRollout(1, done_prob=0.3), make_buffer(3)
    history = []
    for _ in range(11):  # more than three times around the ring
        segment, stacks = rollout.segment()
        buffer.put(segment)
        history.append((segment, stacks))
    assert buffer.segments_stored == 3
    # The three newest segments sit at ring slots (8 % 3, 9 % 3, 10 % 3).
    for age, (segment, stacks) in enumerate(history[-3:]):
        ring_index = (8 + age) % 3
        sample = buffer.gather(np.full(N, ring_index))
        np.testing.assert_array_equal(rebuilt(sample), stacks)
        np.testing.assert_array_equal(sample.actions, segment.actions)
        np.testing.assert_array_equal(sample.dones, segment.dones)


def test_stacks_are_zeroed_before_an_episode_start():
    frames = torch.arange(1, 8, dtype=torch.float32).view(7, 1, 1)  # window of T+stack = 7, N = 1
    firsts = torch.tensor([[False], [False], [False], [False], [True], [False], [False]])
    stacks = rebuild_stacks(frames, firsts, 4)[:, 0, :, 0]  # [T+1, stack]
    expected = torch.tensor(
        [
            [1.0, 2.0, 3.0, 4.0],
            [0.0, 0.0, 0.0, 5.0],  # frame 5 starts an episode
            [0.0, 0.0, 5.0, 6.0],
            [0.0, 5.0, 6.0, 7.0],
        ]
    )
    assert torch.equal(stacks, expected)


def _stacks_by_masking(frames, firsts, stack):
    """The stacks built the plain way: every observation's rows indexed, earlier episodes' frames
    masked to zero element by element. rebuild_stacks must give the same values."""
    episode_id = torch.cumsum(firsts.to(torch.int32), dim=0)
    rows = torch.arange(frames.shape[0] - stack + 1)[:, None] + torch.arange(stack)[None, :]
    stacked, ids = frames[rows], episode_id[rows]  # [T+1, stack, N, ...], [T+1, stack, N]
    mask = (ids == ids[:, -1:]).reshape(*ids.shape, *([1] * (frames.dim() - 2)))
    return torch.where(mask, stacked, torch.zeros((), dtype=frames.dtype)).transpose(1, 2)


def test_rebuilt_stacks_equal_the_masked_ones_for_any_shape():
    generator = torch.Generator().manual_seed(3)
    for trial in range(60):
        stack, T, N = 1 + trial % 4, int(torch.randint(1, 9, (), generator=generator)), int(torch.randint(1, 6, (), generator=generator))
        frame_shape = [(), (3,), (2, 3, 4)][trial % 3]
        frames = torch.randint(0, 255, (T + stack, N, *frame_shape), generator=generator, dtype=torch.uint8)
        if trial % 2:
            frames = frames.float() / 7
        firsts = torch.rand(T + stack, N, generator=generator) < [0.0, 0.2, 0.6][trial % 5 % 3]
        stacks = rebuild_stacks(frames, firsts, stack)
        expected = _stacks_by_masking(frames, firsts, stack)
        assert stacks.shape == (T + 1, N, stack, *frame_shape) and stacks.dtype == frames.dtype, trial
        assert stacks.is_contiguous() and torch.equal(stacks, expected), trial


def test_one_segment_is_sampled_per_env():
    rollout, buffer = FakeRollout(2), make_buffer(6)
    segments = []
    for _ in range(6):
        segment, _ = rollout.segment()
        buffer.put(segment)
        segments.append(segment)
    rng = np.random.default_rng(0)
    index_sets = []
    for _ in range(10):
        sample = buffer.sample(rng)
        assert sample.actions.shape == (T, N) and sample.frames.shape == (T + STACK, N, 1)
        chosen = []
        for env in range(N):
            # The env's frames come from that env (id // 100000) and from exactly one stored segment.
            newest = sample.frames[STACK - 1 :, env, 0]
            assert np.all(newest // 100_000 == env)
            matches = [i for i, seg in enumerate(segments) if np.array_equal(seg.frames[:, env, 0], newest)]
            assert len(matches) == 1
            np.testing.assert_array_equal(sample.rewards[:, env], segments[matches[0]].rewards[:, env])
            chosen.append(matches[0])
        index_sets.append(chosen)
    # Each env draws its own segment index, as Baselines does, rather than one shared index.
    assert any(len(set(chosen)) > 1 for chosen in index_sets)


def test_put_checks_shapes():
    buffer = make_buffer(2)
    segment, _ = FakeRollout(3).segment()
    with pytest.raises(ValueError):
        buffer.put(segment._replace(actions=segment.actions[:-1]))


def test_too_small_buffer_is_refused():
    with pytest.raises(ValueError, match="no segment"):
        ReplayBuffer(FIELDS, N, T, T - 1, STACK)


def test_the_table_of_fields_drives_storage_sampling_saving_and_the_batch():
    # A recurrent network's state is one more row of the table: stored per segment, sampled with
    # its segment, saved, and handed to the update as the batch's state.
    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A), {"h": (3,), "c": (3,)})
    assert [(f.name, f.per) for f in fields][-2:] == [("state_h", "segment"), ("state_c", "segment")]
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK)
    assert buffer.nbytes == ReplayBuffer.bytes_needed(fields, N, T, 4 * T, STACK)
    assert buffer.state_h.shape == (4, N, 3)
    rollout, segments = FakeRollout(4), []
    for index in range(6):
        segment, _ = rollout.segment()
        state_h = (np.full((N, 3), index) + np.arange(N)[:, None] / 10).astype(np.float32)
        segment = segment._replace(state=(state_h, -state_h))
        buffer.put(segment)
        segments.append(segment)
    np.testing.assert_array_equal(buffer.latest().state[0], segments[-1].state[0])
    sample = buffer.sample(np.random.default_rng(0))
    for env in range(N):
        matches = [s for s in segments[-4:] if np.array_equal(s.frames[:, env], sample.frames[STACK - 1 :, env])]
        assert len(matches) == 1
        np.testing.assert_array_equal(sample.state[0][env], matches[0].state[0][env])
        np.testing.assert_array_equal(sample.state[1][env], matches[0].state[1][env])
    batch = to_batch(sample, fields, STACK, torch.device("cpu"))
    assert [tuple(s.shape) for s in batch.state] == [(N, 3), (N, 3)]
    assert torch.equal(batch.state[0], torch.from_numpy(sample.state[0]))
    assert batch.obs.shape == (T + 1, N, STACK, 1) and batch.firsts.shape == (T + 1, N)
    assert torch.equal(batch.firsts, torch.from_numpy(sample.firsts[STACK - 1 :]))
    assert batch.actions.dtype == torch.int64 and batch.dones.dtype == torch.float32
    restored = ReplayBuffer(fields, N, T, 4 * T, STACK)
    restored.load_state(buffer.state())
    np.testing.assert_array_equal(restored.state_c, buffer.state_c)


def test_a_saved_buffer_missing_a_field_it_always_had_is_refused_in_one_message():
    buffer = make_buffer(2)
    buffer.put(FakeRollout(5).segment()[0])
    state = {name: array for name, array in buffer.state().items() if name != "mu"}
    with pytest.raises(ValueError, match="has no mu"):
        make_buffer(2).load_state(state)


def test_a_buffer_of_tensors_gathers_what_the_numpy_one_does_on_fixed_indices(tmp_path):
    # --replay-device cuda keeps the arrays as tensors on the GPU; the same code path runs here on
    # the CPU (tensors=True) against the numpy buffer, for frames, parts of a frame and an LSTM state.
    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A), {"h": (3,), "c": (3,)})
    numpy_buffer = ReplayBuffer(fields, N, T, 4 * T, STACK)
    tensor_buffer = ReplayBuffer(fields, N, T, 4 * T, STACK, tensors=True)
    assert isinstance(tensor_buffer.arrays["frames"], torch.Tensor) and tensor_buffer.nbytes == numpy_buffer.nbytes
    for segment in random_segments(fields, T, N, count=6):  # wraps around the ring of 4 segments
        numpy_buffer.put(segment)
        tensor_buffer.put(segment)
    for index in (np.array([0, 3, 1]), np.array([2, 2, 2]), np.array([1, 0, 3])):
        expected, got = numpy_buffer.gather(index), tensor_buffer.gather(index)
        for name, value in zip(Segment._fields[:-1], expected[:-1]):
            assert np.array_equal(getattr(got, name).numpy(), value), name
        assert all(np.array_equal(g.numpy(), e) for g, e in zip(got.state, expected.state))
        batch = to_batch(got, fields, STACK, torch.device("cpu"))
        reference = to_batch(expected, fields, STACK, torch.device("cpu"))
        assert all(torch.equal(a, b) for a, b in zip(batch[:-1], reference[:-1]))
    np.savez(tmp_path / "buffer.npz", **tensor_buffer.state())
    restored = ReplayBuffer(fields, N, T, 4 * T, STACK, tensors=True)
    restored.load_state(np.load(tmp_path / "buffer.npz"))
    assert all(torch.equal(restored.arrays[name], tensor_buffer.arrays[name]) for name in ("frames", "actions", "state_h"))


def test_a_restart_cut_bootstraps_the_newest_segments_last_step_where_its_episode_went_on_in_either_kind_of_buffer():
    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A), {})
    restored = []
    for tensors in (False, True):
        buffer = ReplayBuffer(fields, N, T, 4 * T, STACK, tensors=tensors)
        segments = list(random_segments(fields, T, N, count=5))
        segments[-1].dones[-1] = [True, False, False]  # env 0's episode ended there, by a terminal
        segments[-1].timeout_values[-1] = [0.0, 0.0, 0.0]
        for segment in segments:
            buffer.put(segment)
        again = ReplayBuffer(fields, N, T, 4 * T, STACK, tensors=tensors)
        again.load_state(buffer.state())
        assert again.restart_cut.tolist() == [False, True, True]
        again.bootstrap_restart(np.array([7.0, 8.0, 9.0], dtype=np.float32))
        last = (again.steps_written - 1) % again.step_capacity
        values = again.timeout_values[last]
        restored.append(values.numpy() if tensors else values)
        assert not again.restart_cut.any()
    assert restored[0].tolist() == restored[1].tolist() == [0.0, 8.0, 9.0]


@pytest.mark.parametrize("tensors", [False, True])
def test_a_saved_buffer_loads_into_the_buffer_a_chunk_at_a_time(tmp_path, monkeypatch, tensors):
    # np.load's arrays were all read into memory beside the buffer: a resume needed its memory twice
    # (11.4 GB for the default Atari buffer of 5.7 GB); a buffer of tensors (--replay-device cuda)
    # still read each array whole, until this test took tensors too.
    import tracemalloc

    import acer_sync.replay.buffer as buffer_module
    from acer_sync.training.checkpoint import load_buffer, save_buffer

    monkeypatch.setattr(buffer_module, "READ_CHUNK_BYTES", 1 << 18, raising=False)
    fields = buffer_fields((84, 84), np.dtype(np.uint8), Categorical(6))
    buffer = ReplayBuffer(fields, 4, 20, 200, 4, tensors=tensors)
    for segment in random_segments(fields, 20, 4, count=12):
        buffer.put(segment)
    (tmp_path / "checkpoints").mkdir()
    save_buffer(tmp_path / "checkpoints", buffer, 960, "0123456789abcdef")
    restored = ReplayBuffer(fields, 4, 20, 200, 4, tensors=tensors)
    tracemalloc.start()
    try:
        assert "replay resumes with the saved buffer" in load_buffer(tmp_path, restored, 960, "0123456789abcdef")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    frames = buffer.arrays["frames"].nbytes
    assert frames > 5_000_000 and peak < frames / 4
    for name in ("frames", "actions", "mu", "rewards", "timeout_values"):
        assert np.array_equal(restored.arrays[name], buffer.arrays[name]), name


def host_state(buffer: ReplayBuffer) -> dict[str, np.ndarray]:
    """Copies of ``buffer.state()``'s arrays, on the host."""
    return {name: (array.cpu().numpy() if isinstance(array, torch.Tensor) else array).copy() for name, array in buffer.state().items()}


@pytest.mark.parametrize("tensors", [False, True])
def test_a_frozen_buffer_reads_as_it_was_while_segments_are_stored_over_it(monkeypatch, tensors):
    # A periodic save writes the buffer in a thread while training stores on: the file must hold
    # the buffer of the checkpoint's step, rows read before and after the ring overwrote them alike.
    import acer_sync.replay.frozen as frozen_module

    monkeypatch.setattr(frozen_module, "KEPT_FRACTION", 1.0)  # the copies may take the buffer's size
    fields = buffer_fields((2,), np.dtype(np.float32), Categorical(A), {"h": (3,), "c": (3,)})
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK, tensors=tensors)
    segments = random_segments(fields, T, N, count=12)
    for segment in itertools.islice(segments, 6):  # the ring has wrapped
        buffer.put(segment)
    expected = host_state(buffer)
    frozen = buffer.freeze()
    read = {name: [] for name in buffer.arrays}
    read["segment_start"] = []
    for name, parts_read in read.items():
        parts_read.append(frozen[name].read(0, 2))  # the first rows, then segments overwrite rows on both sides of them
    for segment in itertools.islice(segments, 3):
        buffer.put(segment)
    for name, parts_read in read.items():
        parts_read.append(frozen[name].read(2, frozen[name].shape[0]))
        assert np.array_equal(np.concatenate(parts_read), expected[name]), name
        assert not frozen[name].kept  # each kept row was read, and let go
    assert not np.array_equal(host_state(buffer)["frames"], expected["frames"])
    buffer.thaw()
    buffer.put(next(segments))
    assert not frozen["frames"].kept


def test_the_rows_kept_for_a_write_are_bounded_and_put_waits_for_the_write_past_that(monkeypatch):
    # The copies of the rows stored during a write grow with its length times the storing rate
    # (on the GPU, in the GPU's memory): past KEPT_FRACTION of the buffer, put waits for its end.
    import threading

    import acer_sync.replay.frozen as frozen_module

    monkeypatch.setattr(frozen_module, "KEPT_FRACTION", 0.1)
    fields = buffer_fields((2,), np.dtype(np.float32), Categorical(A))
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK)
    segments = random_segments(fields, T, N, count=3)
    buffer.put(next(segments))
    frozen = buffer.freeze()
    buffer.put(next(segments))  # its rows kept: over a tenth of the buffer
    assert buffer._freeze.kept_bytes > buffer._freeze.limit
    stored = threading.Thread(target=buffer.put, args=(next(segments),))
    stored.start()
    stored.join(0.2)
    assert stored.is_alive()  # waiting for the write's end
    buffer.thaw()
    stored.join(5)
    assert not stored.is_alive() and buffer.steps_written == 3 * T and not frozen["frames"].kept


@pytest.mark.parametrize("tensors", [False, True])
def test_a_buffer_written_in_a_thread_holds_its_step_while_segments_are_stored(tmp_path, monkeypatch, tensors):
    import acer_sync.training.checkpoint as checkpoint_module
    from acer_sync.training.checkpoint import BufferWriter, load_buffer

    monkeypatch.setattr(checkpoint_module, "WRITE_CHUNK_BYTES", 64)  # many reads, between the stores
    fields = buffer_fields((84, 84), np.dtype(np.uint8), Categorical(6))
    buffer = ReplayBuffer(fields, 2, T, 8 * T, STACK, tensors=tensors)
    segments = random_segments(fields, T, 2, count=40)
    for segment in itertools.islice(segments, 10):
        buffer.put(segment)
    expected = host_state(buffer)
    (tmp_path / "checkpoints").mkdir()
    writer = BufferWriter(tmp_path / "checkpoints", buffer, 100, "0123456789abcdef")
    for segment in segments:
        buffer.put(segment)
    writer.finish()
    assert buffer._freeze is None and writer.done
    restored = ReplayBuffer(fields, 2, T, 8 * T, STACK)
    assert "replay resumes with the saved buffer" in load_buffer(tmp_path, restored, 100, "0123456789abcdef")
    for name, array in host_state(restored).items():
        assert np.array_equal(array, expected[name]), name


def test_a_buffer_write_given_up_as_the_run_exits_at_once_leaves_no_temporary_file(tmp_path, monkeypatch):
    # A second signal exits at once: the writer thread, a daemon, died mid-write and left a
    # temporary file of up to the buffer's size until a resume removed it.
    from acer_sync.replay.frozen import FrozenArray, WriteCancelled
    from acer_sync.training.checkpoint import BufferWriter

    read, started = FrozenArray.read, threading.Event()

    def slow_read(frozen, start, stop):
        started.set()
        time.sleep(0.01)
        return read(frozen, start, stop)

    monkeypatch.setattr(FrozenArray, "read", slow_read)
    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A))
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK)
    writer = BufferWriter(tmp_path, buffer, 0, "0123456789abcdef")
    assert started.wait(5)
    buffer.cancel_save(5.0)
    assert buffer._freeze is None
    with pytest.raises(WriteCancelled):
        writer.finish()
    assert list(tmp_path.iterdir()) == []


def test_a_buffer_write_that_fails_in_its_thread_is_raised_by_finish_and_the_buffer_thawed(tmp_path):
    from acer_sync.base.errors import WriteFailed
    from acer_sync.training.checkpoint import BufferWriter

    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A))
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK)
    writer = BufferWriter(tmp_path / "missing", buffer, 0, "0123456789abcdef")  # no such folder
    with pytest.raises(WriteFailed, match="cannot write .*buffer.npz: No such file or directory"):
        writer.finish()
    assert buffer._freeze is None


@pytest.mark.parametrize("chunk", [1, 7, 64, 8 << 20])
def test_write_arrays_writes_numpy_arrays_in_np_saves_bytes_a_chunk_at_a_time(tmp_path, monkeypatch, chunk):
    # numpy's own writer copied a buffer's arrays twice on their way to the file; write_arrays
    # writes each from its own memory. Each member holds np.save's bytes (its C-order bytes where
    # the array was not C-contiguous), and an object array is refused as np.save refuses it.
    import zipfile

    import acer_sync.training.checkpoint as checkpoint_module
    from acer_sync.training.checkpoint import write_arrays

    monkeypatch.setattr(checkpoint_module, "WRITE_CHUNK_BYTES", chunk)
    generator = np.random.default_rng(1)
    frames = generator.integers(0, 256, size=(9, 3, 5, 7), dtype=np.uint8)
    arrays = {
        "frames": frames,
        "mu": generator.random((6, 3, 4), dtype=np.float32),
        "actions": generator.integers(-300, 300, size=(6, 3), dtype=np.int64),
        "dones": generator.random((6, 3)) < 0.5,
        "half": generator.random((5, 2)).astype(np.float16),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(960, dtype=np.int64),
        "key": np.array("0123456789abcdef"),
        "strided": frames[::2, :, 1:4],
        "fortran": np.asfortranarray(generator.random((4, 5))),
    }
    with open(tmp_path / "written.npz", "wb") as handle:
        write_arrays(handle, arrays)
    with zipfile.ZipFile(tmp_path / "written.npz") as archive:
        assert archive.testzip() is None and archive.namelist() == [f"{name}.npy" for name in arrays]
        for name, array in arrays.items():
            expected = io.BytesIO()
            np.save(expected, np.ascontiguousarray(array) if array.ndim else array)
            assert archive.read(f"{name}.npy") == expected.getvalue(), name
    with np.load(tmp_path / "written.npz", allow_pickle=False) as written:
        for name, array in arrays.items():
            assert written[name].dtype == array.dtype and np.array_equal(written[name], array), name
    with open(tmp_path / "objects.npz", "wb") as handle, pytest.raises(ValueError, match="Object arrays cannot be saved"):
        write_arrays(handle, {"objects": np.array([{}, None], dtype=object)})


def test_write_arrays_writes_what_np_savez_writes_a_tensor_a_chunk_at_a_time(tmp_path, monkeypatch):
    # A buffer of tensors was copied to the host whole for np.savez: on the GPU (--replay-device
    # cuda) a save needed the buffer's size in host memory. write_arrays streams each tensor.
    import acer_sync.training.checkpoint as checkpoint_module
    from acer_sync.replay.buffer import SavedArrays
    from acer_sync.training.checkpoint import write_arrays

    monkeypatch.setattr(checkpoint_module, "WRITE_CHUNK_BYTES", 64)
    generator = np.random.default_rng(0)
    arrays = {
        "frames": generator.integers(0, 256, size=(7, 3, 5, 5), dtype=np.uint8),
        "mu": generator.random((6, 3, 4), dtype=np.float32),
        "actions": generator.integers(0, 300, size=(6, 3), dtype=np.int64),
        "dones": generator.random((6, 3)) < 0.5,
        "empty": np.zeros((0, 3), dtype=np.float32),
        "counters": np.array([40, 2], dtype=np.int64),
        "scalar": np.array(960, dtype=np.int64),
        "key": np.array("0123456789abcdef"),
    }
    given = {name: torch.from_numpy(a) if a.dtype.kind != "U" and name != "scalar" else a for name, a in arrays.items()}
    copied, to_host = [], torch.Tensor.cpu

    def counted_cpu(tensor, *args, **kwargs):
        copied.append(tensor.numel() * tensor.element_size())
        return to_host(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted_cpu)
    with open(tmp_path / "written.npz", "wb") as handle:
        write_arrays(handle, given)
    monkeypatch.undo()
    assert max(copied) <= 64 and sum(copied) == sum(a.nbytes for a in given.values() if isinstance(a, torch.Tensor))
    np.savez(tmp_path / "savez.npz", **arrays)
    with np.load(tmp_path / "written.npz", allow_pickle=False) as written, np.load(tmp_path / "savez.npz") as reference:
        assert written.files == reference.files
        for name in reference.files:
            assert written[name].dtype == reference[name].dtype and written[name].shape == reference[name].shape, name
            assert np.array_equal(written[name], reference[name]), name
        saved = SavedArrays(written)
        for name in ("frames", "mu", "dones"):
            target = torch.zeros(arrays[name].shape, dtype=torch.from_numpy(arrays[name]).dtype)
            saved.copy_into(name, target)
            assert torch.equal(target, torch.from_numpy(arrays[name])), name

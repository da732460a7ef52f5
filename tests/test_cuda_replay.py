"""Replay on CUDA without a host sync (issue 35): a segment stored, a sample gathered and loaded as
a batch, and the Trainer's whole learning step (the on-policy update and the replayed ones, with
R2D2's burn-in for an LSTM), from a buffer on the GPU and from one in host memory through the side
stream, never wait for the device. A copy from pageable memory or a masked assignment would: under
``torch.cuda.set_sync_debug_mode("error")`` each raises. Skipped without CUDA; ``tools/gpu_report.sh``
runs them on a GPU box. On the CPU the side stream is a plain call (``test_the_side_stream_*``)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config
from acer_sync.base.transfer import SideStream
from acer_sync.nets.distributions import Categorical
from acer_sync.replay.buffer import ReplayBuffer, buffer_fields, to_batch
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import random_segments, requires_cuda

N, T, STACK, A = 3, 5, 4, 2


@contextlib.contextmanager
def no_host_sync():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_side_stream_is_a_plain_call_off_cuda():
    side = SideStream(torch.device("cpu"))
    batch = {"obs": torch.ones(2)}
    assert side.stream is None and side(lambda: batch) is batch


@requires_cuda
@pytest.mark.parametrize("storage", ["cuda", "cpu"])
def test_cuda_replay_stores_gathers_and_loads_without_a_host_sync(storage):
    cuda = torch.device("cuda")
    fields = buffer_fields((1,), np.dtype(np.float32), Categorical(A), {"h": (3,), "c": (3,)})
    reference = ReplayBuffer(fields, N, T, 4 * T, STACK)
    buffer = ReplayBuffer(fields, N, T, 4 * T, STACK, device=storage)
    side = SideStream(cuda, enabled=storage == "cpu")
    loaded, expected = [], []
    with no_host_sync():
        for segment in random_segments(fields, T, N, count=6):  # wraps around the ring of 4 segments
            buffer.put(segment)
            reference.put(segment)
        for index in (np.array([0, 3, 1]), np.array([2, 2, 2])):
            loaded.append(side(lambda: to_batch(buffer.gather(index), fields, STACK, cuda)))
            expected.append(to_batch(reference.gather(index), fields, STACK, torch.device("cpu")))
    for batch, reference_batch in zip(loaded, expected):
        assert all(torch.equal(a.cpu(), b) for a, b in zip(batch[:-1], reference_batch[:-1]))
        assert all(torch.equal(a.cpu(), b) for a, b in zip(batch.state, reference_batch.state))


@requires_cuda
@pytest.mark.parametrize("storage", ["cuda", "cpu"])
@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_the_trainers_learning_step_never_waits_for_the_gpu(tmp_path, storage, network):
    settings = dict(env="CartPole-v1", num_envs=2, vec_env="sync", device="cuda", replay_device=storage,
                    eval_every=0, hidden="16", network=network, replay_start=20, buffer_size=400,
                    replay_ratio=4, total_timesteps=10_000)
    if network == "lstm":
        settings.update(replay_state="burn_in", lstm_size=8)
    config = build_config(False, settings)
    trainer = build_trainer(config, env_info(config.env), tmp_path, progress_bar=False, builtin=False)
    try:
        assert trainer.buffer.device.type == storage
        assert (trainer.side_stream.stream is not None) == (storage == "cpu")
        for _ in range(8):  # past replay_start, and the first updates' allocations behind
            trainer.collect()
            trainer.learn()
        updates = trainer.updates
        for _ in range(3):
            trainer.collect()
            with no_host_sync():
                trainer.learn()
        assert trainer.updates > updates + 3  # replayed updates ran under the check
        assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    finally:
        trainer.close()


@requires_cuda
def test_cuda_replay_saves_and_loads_a_chunk_at_a_time_as_the_host_buffer_does(tmp_path, monkeypatch):
    import acer_sync.replay.buffer as buffer_module
    import acer_sync.training.checkpoint as checkpoint_module
    from acer_sync.training.checkpoint import load_buffer, save_buffer

    monkeypatch.setattr(buffer_module, "READ_CHUNK_BYTES", 1 << 10, raising=False)
    monkeypatch.setattr(checkpoint_module, "WRITE_CHUNK_BYTES", 1 << 10)
    fields = buffer_fields((8, 8), np.dtype(np.uint8), Categorical(A))
    buffers = {device: ReplayBuffer(fields, N, T, 6 * T, STACK, device=device) for device in ("cpu", "cuda")}
    for segment in random_segments(fields, T, N, count=9):
        for buffer in buffers.values():
            buffer.put(segment)
    for device, buffer in buffers.items():
        (tmp_path / device / "checkpoints").mkdir(parents=True)
        save_buffer(tmp_path / device / "checkpoints", buffer, 9 * T * N, "0123456789abcdef")
    with np.load(tmp_path / "cpu/checkpoints/buffer.npz") as host, np.load(tmp_path / "cuda/checkpoints/buffer.npz") as gpu:
        for name in host.files:
            assert np.array_equal(host[name], gpu[name]), name
    restored = ReplayBuffer(fields, N, T, 6 * T, STACK, device="cuda")
    load_buffer(tmp_path / "cuda", restored, 9 * T * N, "0123456789abcdef")
    for name, array in buffers["cpu"].arrays.items():
        if name != "dones":  # a resume marks the newest step done (ReplayBuffer.load_state)
            assert np.array_equal(restored.arrays[name].cpu().numpy(), array), name


@requires_cuda
def test_cuda_a_buffer_on_the_gpu_written_in_a_thread_holds_its_step_while_segments_are_stored(tmp_path, monkeypatch):
    # A periodic checkpoint's buffer (--replay-device cuda) comes to the host on the writer
    # thread's stream while training stores on the GPU: the rows stored meanwhile are kept first.
    import acer_sync.training.checkpoint as checkpoint_module
    from acer_sync.training.checkpoint import BufferWriter

    monkeypatch.setattr(checkpoint_module, "WRITE_CHUNK_BYTES", 1 << 10)
    fields = buffer_fields((8, 8), np.dtype(np.uint8), Categorical(A))
    buffer = ReplayBuffer(fields, N, T, 6 * T, STACK, device="cuda")
    segments = random_segments(fields, T, N, count=40)
    for _ in range(9):
        buffer.put(next(segments))
    expected = {name: (array.cpu().numpy() if isinstance(array, torch.Tensor) else array).copy()
                for name, array in buffer.state().items()}
    (tmp_path / "checkpoints").mkdir()
    writer = BufferWriter(tmp_path / "checkpoints", buffer, 9 * T * N, "0123456789abcdef")
    for segment in segments:
        buffer.put(segment)
    writer.finish()
    with np.load(tmp_path / "checkpoints/buffer.npz") as saved:
        for name, array in expected.items():
            assert np.array_equal(saved[name], array), name

"""``--lstm-norm layer``: Baselines' layer-normalized LSTM (:class:`LayerNormLSTMMemory`), against a
reference written out here, by hand on one small case, and in the networks, specs and runs."""

import math

import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config
from acer_sync.nets.build import model_spec
from acer_sync.nets.memory import LayerNormLSTMMemory, LSTMMemory
from acer_sync.nets.networks import network_from_spec
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import recurrent_net


def reference_unroll(memory: LayerNormLSTMMemory, x: np.ndarray, firsts: np.ndarray, h: np.ndarray, c: np.ndarray):
    """The cell of the class docstring in float64 numpy, step by step."""
    def ln(v, norm):
        mean = v.mean(-1, keepdims=True)
        var = ((v - mean) ** 2).mean(-1, keepdims=True)
        return (v - mean) / np.sqrt(var + norm.eps) * norm.weight.detach().double().numpy() + norm.bias.detach().double().numpy()

    def sigmoid(v):
        return 1.0 / (1.0 + np.exp(-v))

    wx = memory.input_weights.weight.detach().double().numpy()
    wh = memory.hidden_weights.weight.detach().double().numpy()
    b = memory.bias.detach().double().numpy()
    outputs = []
    for t in range(x.shape[0]):
        keep = ~firsts[t][:, None]
        h, c = h * keep, c * keep
        z = ln(x[t] @ wx.T, memory.input_norm) + ln(h @ wh.T, memory.hidden_norm) + b
        i, f, g, o = np.split(z, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(ln(c, memory.cell_norm))
        outputs.append(h)
    return np.stack(outputs), h, c


def test_unroll_matches_the_reference_with_an_episode_start_inside_the_segment():
    torch.manual_seed(0)
    memory = LayerNormLSTMMemory(5, 3)
    with torch.no_grad():  # gains and biases away from 1 and 0, so that every term counts
        for norm in (memory.input_norm, memory.hidden_norm, memory.cell_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.3, 0.3)
        memory.bias.uniform_(-0.5, 0.5)
    x = torch.randn(6, 2, 5, dtype=torch.float64)
    firsts = torch.zeros(6, 2, dtype=torch.bool)
    firsts[3, 0] = True
    h0, c0 = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    memory = memory.double()
    out, (h, c) = memory.unroll(x, firsts, (h0, c0))
    expected, h_ref, c_ref = reference_unroll(memory, x.numpy(), firsts.numpy(), h0.numpy(), c0.numpy())
    np.testing.assert_allclose(out.detach().numpy(), expected.reshape(12, 3), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h.detach().numpy(), h_ref, rtol=1e-10)
    np.testing.assert_allclose(c.detach().numpy(), c_ref, rtol=1e-10)
    # one step at a time, carrying the state, is the same as the segment
    state, steps = (h0, c0), []
    for t in range(6):
        step, state = memory.unroll(x[t:t + 1], firsts[t:t + 1], state)
        steps.append(step)
    torch.testing.assert_close(torch.cat(steps), out)


def test_hand_worked_open_gates():
    # Two units; every gate open (bias 100), the candidate's sums LN_x(x W_x) with W_x's rows +1, -1,
    # +1, -1, ...: for x > 0 the eight sums are ±x, mean 0, variance x², so LN gives ±x/√(x² + ε)
    # and g = tanh(±x/√(x² + ε)). With W_h = 0 the hidden sums are 0. From c = (0, 0):
    #   c1 = g = (tanh(s), −tanh(s)) with s = x/√(x² + ε);  c2 = 2·c1.
    # LN_c of (a, −a) is (a, −a)/√(a² + ε), so h = tanh(±a/√(a² + ε)).
    memory = LayerNormLSTMMemory(1, 2).double()
    with torch.no_grad():
        memory.input_weights.weight.copy_(torch.tensor([[1.0], [-1.0]] * 4))
        memory.hidden_weights.weight.zero_()
        memory.bias.copy_(torch.tensor([100.0, 100.0, 100.0, 100.0, 0.0, 0.0, 100.0, 100.0]))
    x = 3.0
    eps = 1e-5
    s = x / math.sqrt(x * x + eps)
    a1, a2 = math.tanh(s), 2 * math.tanh(s)
    expected_h = [[math.tanh(a / math.sqrt(a * a + eps)), -math.tanh(a / math.sqrt(a * a + eps))] for a in (a1, a2)]
    out, (h, c) = memory.unroll(torch.full((2, 1, 1), x, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.bool),
                                memory.initial_state(1))
    assert expected_h[0][0] == pytest.approx(0.76159, abs=1e-5)  # about tanh(1): LN hides c's scale
    torch.testing.assert_close(out, torch.tensor(expected_h, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(c, torch.tensor([[a2, -a2]], dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_the_cell_state_stays_small_where_a_plain_lstm_grows_over_a_long_episode():
    """Large positive inputs, as a trained Nature CNN's features are (mean |x| of 2.3 in the
    cnn_lstm Pong run), over a Pong-length episode of 900 steps."""
    torch.manual_seed(0)
    base = torch.relu(torch.randn(16, 512)) * 4
    x = (base + 0.5 * torch.randn(900, 16, 512)).clamp_min(0)
    firsts = torch.zeros(900, 16, dtype=torch.bool)
    cells = {}
    with torch.no_grad():
        for kind in (LSTMMemory, LayerNormLSTMMemory):
            memory = kind(512, 128)
            _, (_, c) = memory.unroll(x, firsts, memory.initial_state(16))
            cells[kind] = c.abs().mean().item()
    assert cells[LSTMMemory] > 10 and cells[LayerNormLSTMMemory] < 3


def test_the_spec_records_it_and_an_older_spec_means_a_plain_lstm():
    info = env_info("PongNoFrameskip-v4")
    config = build_config(True, dict(env="PongNoFrameskip-v4", network="cnn_lstm", lstm_norm="layer"))
    spec = model_spec(info, config)
    assert spec["lstm_norm"] == "layer"
    assert isinstance(network_from_spec(spec).memory, LayerNormLSTMMemory)
    older = {key: value for key, value in spec.items() if key != "lstm_norm"}
    assert type(network_from_spec(older).memory) is LSTMMemory
    assert "lstm_norm" not in model_spec(info, build_config(True, dict(env="PongNoFrameskip-v4")))  # no LSTM
    # the Atari preset's cnn_lstm is layer-normalized; the classic preset's lstm is not
    assert model_spec(info, build_config(True, dict(env="PongNoFrameskip-v4", network="cnn_lstm")))["lstm_norm"] == "layer"
    cartpole = env_info("CartPole-v1")
    assert model_spec(cartpole, build_config(False, dict(env="CartPole-v1", network="lstm")))["lstm_norm"] == "none"
    assert network_from_spec(spec).spec() == spec
    assert type(recurrent_net((4, 84, 84), 6, "cnn_lstm", lstm_size=8).memory) is LSTMMemory


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_cnn_lstm_with_layer_norm_trains_resumes_and_acts_on_pong(tmp_path, precision):
    info = env_info("PongNoFrameskip-v4")
    config = build_config(True, dict(
        env="PongNoFrameskip-v4", network="cnn_lstm", lstm_norm="layer", lstm_size=16, num_envs=2, nsteps=5,
        buffer_size=40, replay_start=10, total_timesteps=60, eval_every=0, device="cpu", precision=precision,
        checkpoint_every=30, log_interval=2,
    ))
    trainer = build_trainer(config, info, tmp_path)
    assert trainer.train().finished
    from acer_sync.training.checkpoint import load_checkpoint

    payload = load_checkpoint(tmp_path)
    assert payload["model_spec"]["lstm_norm"] == "layer"
    loaded = network_from_spec(payload["model_spec"])
    loaded.load_state_dict(payload["model"])
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value)


def test_a_recurrent_checkpoint_written_before_lstm_norm_loads_and_resumes(tmp_path):
    import acer_sync
    from acer_sync.training.checkpoint import LATEST

    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, network="lstm", lstm_size=8, hidden="8", total_timesteps=160,
                    num_envs=2, nsteps=10, eval_every=0, verbose=0)
    path = run_dir / "checkpoints" / LATEST
    payload = torch.load(path, weights_only=True)
    del payload["model_spec"]["lstm_norm"]  # as the files of the version before it
    del payload["config"]["lstm_norm"]
    torch.save(payload, path)
    assert type(acer_sync.load(run_dir).model.memory) is LSTMMemory
    acer_sync.train(resume=run_dir, total_timesteps=240, verbose=0)
    assert torch.load(path, weights_only=True)["model_spec"]["lstm_norm"] == "none"

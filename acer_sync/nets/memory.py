"""Memory: what carries a state from step to step between the torso and the heads.

One interface (``state_shapes``, ``initial_state(n)``, ``unroll``), three kinds: :class:`NoMemory`
for a feed-forward network, :class:`LSTMMemory`, one LSTM cell unrolled in time, and
:class:`LayerNormLSTMMemory`, Baselines' ``lnlstm``: the same cell with its pre-activations and its
cell state layer-normalized, so that large inputs and a cell state that grows over a long episode
do not saturate h (``--lstm-norm layer``; docs/recurrent.md has the measurement on Pong).
"""

from __future__ import annotations

import torch
from torch import nn

State = tuple[torch.Tensor, ...]


class NoMemory(nn.Module):
    """No state: the features pass through."""

    state_shapes: dict[str, tuple[int, ...]] = {}

    def __init__(self, features_dim: int):
        super().__init__()
        self.features_dim = features_dim

    def initial_state(self, n: int) -> State:
        return ()

    def unroll(self, features: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Features ``[T, N, F]`` as ``[T·N, F]``; ``firsts`` and ``state`` are unused."""
        return features.reshape(-1, features.shape[-1]), state


class LSTMMemory(nn.Module):
    """An LSTM cell over the torso's features; the features the heads see are its output h_t.

    The state is ``(h, c)``, ``[N, size]`` each, zero at an episode start: :meth:`unroll` zeroes
    it before every step whose ``firsts`` flag is set (Baselines' masks), so acting step by step
    and replaying a stored segment from its stored state compute the same thing. The LSTM keeps
    PyTorch's initialisation.
    """

    def __init__(self, in_features: int, size: int):
        super().__init__()
        self.size = size
        self.lstm = nn.LSTMCell(in_features, size)
        self.features_dim = size
        self.state_shapes = {"h": (size,), "c": (size,)}

    def initial_state(self, n: int) -> State:
        weight = next(self.parameters())
        zeros = torch.zeros(n, self.size, dtype=weight.dtype, device=weight.device)
        return zeros, zeros.clone()

    def check_state(self, n: int, state: State) -> State:
        """``state`` as ``(h, c)``, or a ValueError where they are not two ``[n, size]`` tensors."""
        h, c = state
        if h.shape != (n, self.size) or c.shape != (n, self.size):
            raise ValueError(f"the state must be two [{n}, {self.size}] tensors, got {tuple(h.shape)}, {tuple(c.shape)}")
        return h, c

    def unroll(self, features: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """h_t for torso features ``[T, N, F]`` from ``state`` (the state before step 0):
        ``[T·N, size]`` and the state after step T−1.

        (h, c) ← 0 where ``firsts[t]``; then (h, c) ← LSTM(x_t, (h, c)).
        """
        T, N = features.shape[:2]
        h, c = self.check_state(N, state)
        keep = (~firsts).to(features.dtype).unsqueeze(-1)  # [T, N, 1]
        outputs = []
        for t in range(T):
            h, c = self.lstm(features[t], (h * keep[t], c * keep[t]))
            outputs.append(h)
        return torch.stack(outputs).reshape(T * N, self.size), (h, c)


class LayerNormLSTMMemory(LSTMMemory):
    """An LSTM whose gates and output see layer-normalized sums (Ba et al. 2016, *Layer
    Normalization*, Sec. 6; Baselines' ``lnlstm``), with the interface of :class:`LSTMMemory`:

        z = LN_x(x_t W_x) + LN_h(h W_h) + b;  i, f, g, o = σ(z_i), σ(z_f), tanh(z_g), σ(z_o)
        c ← f ⊙ c + i ⊙ g;  h ← o ⊙ tanh(LN_c(c))

    Each LN has its own gain (1) and bias (0). x W_x and its LN are computed for all T steps at
    once, before the loop. W_x and W_h keep PyTorch's Linear initialisation; b is zero.
    """

    def __init__(self, in_features: int, size: int):
        nn.Module.__init__(self)
        self.size = size
        self.input_weights = nn.Linear(in_features, 4 * size, bias=False)
        self.hidden_weights = nn.Linear(size, 4 * size, bias=False)
        self.bias = nn.Parameter(torch.zeros(4 * size))
        self.input_norm = nn.LayerNorm(4 * size)
        self.hidden_norm = nn.LayerNorm(4 * size)
        self.cell_norm = nn.LayerNorm(size)
        self.features_dim = size
        self.state_shapes = {"h": (size,), "c": (size,)}

    def unroll(self, features: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """As :meth:`LSTMMemory.unroll`: (h, c) ← 0 where ``firsts[t]``, then one step of the cell above."""
        T, N = features.shape[:2]
        h, c = self.check_state(N, state)
        keep = (~firsts).unsqueeze(-1)  # [T, N, 1]
        from_input = self.input_norm(self.input_weights(features)) + self.bias  # [T, N, 4·size]
        outputs = []
        for t in range(T):
            h, c = h * keep[t], c * keep[t]
            z = from_input[t] + self.hidden_norm(self.hidden_weights(h))
            i, f, g, o = z.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(self.cell_norm(c))
            outputs.append(h)
        return torch.stack(outputs).reshape(T * N, self.size), (h, c)

"""Memory: what carries a state from step to step between the torso and the heads.

Two kinds, one interface (``state_shapes``, ``initial_state(n)``, ``unroll``): :class:`NoMemory`
for a feed-forward network, and :class:`LSTMMemory`, one LSTM cell unrolled in time.
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
        weight = self.lstm.weight_hh
        zeros = torch.zeros(n, self.size, dtype=weight.dtype, device=weight.device)
        return zeros, zeros.clone()

    def unroll(self, features: torch.Tensor, firsts: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """h_t for torso features ``[T, N, F]`` from ``state`` (the state before step 0):
        ``[T·N, size]`` and the state after step T−1.

        (h, c) ← 0 where ``firsts[t]``; then (h, c) ← LSTM(x_t, (h, c)).
        """
        T, N = features.shape[:2]
        h, c = state
        if h.shape != (N, self.size) or c.shape != (N, self.size):
            raise ValueError(f"the state must be two [{N}, {self.size}] tensors, got {tuple(h.shape)}, {tuple(c.shape)}")
        keep = (~firsts).to(features.dtype).unsqueeze(-1)  # [T, N, 1]
        outputs = []
        for t in range(T):
            h, c = self.lstm(features[t], (h * keep[t], c * keep[t]))
            outputs.append(h)
        return torch.stack(outputs).reshape(T * N, self.size), (h, c)

"""Wall-clock time per phase of the training loop, for bench.py; a no-op unless enabled."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per named phase: ``with timer("env"): ...``.

    Disabled (the default in training), it only yields. Enabled on CUDA, it synchronizes the
    device at both ends of a phase so that queued kernels are charged to the phase that queued them.
    """

    def __init__(self, enabled: bool = False, device: torch.device | None = None):
        self.enabled = enabled
        self.on_cuda = device is not None and device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str):
        if not self.enabled:
            yield
            return
        if self.on_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.on_cuda:
                torch.cuda.synchronize()
            self.seconds[phase] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()

"""Mixed precision: the network's passes in bfloat16, ACER's math in float32.

Under ``--precision bf16`` the forward passes of a network (acting, evaluation, the update's
unroll and heads, the average network's) run under ``torch.autocast(device_type, torch.bfloat16)``,
and :class:`NetworkPasses` hands every floating tensor they return to the math as float32: the
boundary between the network and the math is crossed in one place, once per pass. So the
log-probabilities, importance weights, Retrace, the bias correction, the KL, k, the trust region
and the losses are float32 whatever the network ran in. The weights, their gradients, the
optimizer's state and the checkpoints stay float32: autocast casts copies of the weights for each
pass, and backward sends the gradients back to the float32 leaves.

Every net but the built-in MLPs (:data:`BF16_ARCHS`: the convolutional, multi-input and users'
torsos) runs in bf16: the small MLPs of classic control
and MuJoCo were measured slower under autocast (docs/performance.md), so their
passes stay float32 under ``--precision bf16``.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from acer_sync.base.config import PRECISIONS

#: The torsos (``spec()["arch"]``) whose passes run in bf16 under ``--precision bf16``.
BF16_ARCHS = ("cnn", "cnn_lstm", "multi", "multi_lstm", "torso", "torso_lstm")
#: CPU flags of native bfloat16 arithmetic in /proc/cpuinfo: x86's AVX512-BF16 and AMX, Arm's BF16.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def runs_in_bf16(model: torch.nn.Module, precision: str) -> bool:
    """Whether ``model``'s passes run under bf16 autocast at ``precision``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision == "bf16" and model.spec()["arch"] in BF16_ARCHS


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device``'s type where ``enabled``, else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()


def to_float32(outputs):
    """``outputs`` (a tensor, or nested tuples of them) with every bf16/fp16 tensor cast to float32."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float() if outputs.dtype in (torch.bfloat16, torch.float16) else outputs
    return tuple(to_float32(item) for item in outputs)


class NetworkPasses:
    """A network's passes (:mod:`acer_sync.nets.networks`' interface) in the run's precision, with float32 results.

    At fp32, or for a net that stays fp32 (:func:`runs_in_bf16`), each method is the network's own
    call, unchanged. Under bf16 each runs in bf16 autocast and its floating results, the features
    and recurrent state of ``step``/``unroll`` and the heads' statistics φ, Q, V and A, come back
    float32 (a recurrent state carried in float32 holds the bf16 values exactly, so acting and a
    replay from the stored state see the same numbers).

    :param model: the network.
    :param precision: one of :data:`PRECISIONS`.
    :param device: where ``model`` lives (its type picks CPU or CUDA autocast).
    """

    def __init__(self, model, precision: str, device: torch.device):
        self.model = model
        self.bf16 = runs_in_bf16(model, precision)
        self.device = torch.device(device)

    def _run(self, method, *args):
        if not self.bf16:
            return method(*args)
        with autocast(self.device, True):
            return to_float32(method(*args))

    def step(self, obs: torch.Tensor, state: tuple, first: torch.Tensor):
        return self._run(self.model.step, obs, state, first)

    def unroll(self, obs: torch.Tensor, firsts: torch.Tensor, state: tuple):
        return self._run(self.model.unroll, obs, firsts, state)

    def heads(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The softmax net's ``forward``: (π, Q)."""
        return self._run(self.model, features)

    def policy_of(self, features: torch.Tensor) -> torch.Tensor:
        return self._run(self.model.policy_of, features)

    def value_of(self, features: torch.Tensor) -> torch.Tensor:
        return self._run(self.model.value_of, features)

    def advantage_of(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self._run(self.model.advantage_of, features, actions)


def cpu_bf16_flags(cpuinfo: str) -> set[str]:
    """The native-bf16 flags among a /proc/cpuinfo text's ``flags``/``Features`` lines."""
    found = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            found.update(flag for flag in value.split() if flag in BF16_CPU_FLAGS)
    return found


def native_bf16(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether ``device`` computes in bfloat16 natively: True, False, or None where it cannot tell
    (a CPU without /proc/cpuinfo). On CUDA, torch's own check, emulation not counted."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    return bool(cpu_bf16_flags(text))


def slow_bf16_warning(precision: str, device: torch.device, model: torch.nn.Module,
                      cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """One line to warn that bf16 will be slower than fp32 on ``device``, or None.

    bf16 without native support is emulated: correct, only slower. The run goes on (see the
    docs/performance.md for why it warns rather than refuses).
    """
    if not runs_in_bf16(model, precision):
        return None
    native = native_bf16(device, cpuinfo)
    if native:
        return None
    where = "this GPU" if device.type == "cuda" else "this CPU"
    lacks = (
        "cannot tell whether it computes in bf16 natively" if native is None
        else "has no native bf16 (" + ("torch.cuda.is_bf16_supported() is False" if device.type == "cuda"
                                      else "no avx512_bf16, amx_bf16 or bf16 in /proc/cpuinfo") + ")"
    )
    return f"warning: --precision bf16: {where} {lacks}, so bf16 may run slower than fp32; --precision fp32 avoids it (it may change on --resume)"

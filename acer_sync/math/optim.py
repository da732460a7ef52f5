"""RMSProp as TensorFlow 1 computes it, which is what OpenAI Baselines' ACER was tuned with."""

from __future__ import annotations

from typing import Iterable

import torch


class RMSpropTF(torch.optim.Optimizer):
    """RMSProp with epsilon inside the square root and the mean square started at one.

    For each parameter θ with gradient g::

        v ← α v + (1 − α) g²          (v starts at 1, as TF1's ``RMSPropOptimizer`` does)
        θ ← θ − lr · g / √(v + ε)

    ``torch.optim.RMSprop`` instead computes g / (√v + ε) with v starting at 0. With ε = 1e-5
    the two differ most when gradients are tiny: TF's form caps the step at lr·g/√ε, PyTorch's
    at lr·g/ε, and PyTorch's first steps are large because v starts at 0. We match Baselines,
    whose defaults (lr 7e-4, α 0.99, ε 1e-5) assume TF's form; pfrl (``RMSpropEpsInsideSqrt``)
    and Stable-Baselines3 (``RMSpropTFLike``) ship the same variant for the same reason.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, alpha: float = 0.99, eps: float = 1e-5):
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    @torch.no_grad()
    def init_state(self) -> None:
        """Create v (ones) for every parameter now, not at its first step: a step then allocates
        nothing, as a captured or compiled one must not."""
        for group in self.param_groups:
            for p in group["params"]:
                if "square_avg" not in self.state[p]:
                    self.state[p]["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step_masked(self, finite: torch.Tensor, lr: torch.Tensor) -> None:
        """:meth:`step` without a host read: ``lr`` is a tensor on the parameters' device, and where
        the bool tensor ``finite`` is False every parameter and its v keep their values (a skipped
        step). The arithmetic is :meth:`step`'s, θ + (−lr·g)/√(v + ε), so a finite step gives the
        same bits. Needs :meth:`init_state` first. A parameter without a gradient, or frozen (as a
        pretrained layer of a user's torso, whose last gradient may stay), is left alone, as
        :meth:`step` leaves it."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None and p.requires_grad]
            if not params:
                continue
            grads = [p.grad for p in params]
            square_avgs = [self.state[p]["square_avg"] for p in params]
            new_square_avgs = torch._foreach_mul(square_avgs, group["alpha"])
            torch._foreach_addcmul_(new_square_avgs, grads, grads, value=1.0 - group["alpha"])
            denominators = torch._foreach_add(new_square_avgs, group["eps"])
            torch._foreach_sqrt_(denominators)
            steps = torch._foreach_mul(grads, torch.neg(lr))
            torch._foreach_div_(steps, denominators)
            new_params = torch._foreach_add(params, steps)
            for p, v, new_p, new_v in zip(params, square_avgs, new_params, new_square_avgs):
                p.copy_(torch.where(finite, new_p, p))
                v.copy_(torch.where(finite, new_v, v))

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - the class docstring gives the update
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None and p.requires_grad]  # a layer frozen keeps its last grad
            if not params:
                continue
            grads = [p.grad for p in params]
            square_avgs = []
            for p in params:
                state = self.state[p]
                if "square_avg" not in state:
                    state["square_avg"] = torch.ones_like(p)
                square_avgs.append(state["square_avg"])
            torch._foreach_mul_(square_avgs, group["alpha"])
            torch._foreach_addcmul_(square_avgs, grads, grads, value=1.0 - group["alpha"])
            denominators = torch._foreach_add(square_avgs, group["eps"])
            torch._foreach_sqrt_(denominators)
            torch._foreach_addcdiv_(params, grads, denominators, value=-group["lr"])
        return None

"""One ACER update: the losses of Wang et al. 2017 on a batch, the trust region, and the step."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from acer_sync import losses
from acer_sync.buffer import Sample, rebuild_stacks
from acer_sync.config import Config
from acer_sync.networks import ActorCritic, polyak_update
from acer_sync.optim import RMSpropTF
from acer_sync.profiling import PhaseTimer


class Batch(NamedTuple):
    """One update's data on the device, time-major.

    ``obs[t]`` goes with ``actions[t]``, ``mu[t]``, ``rewards[t]`` and ``dones[t]``;
    ``obs[T]`` is the bootstrap observation.
    """

    obs: torch.Tensor  # [T+1, N, stack, ...], uint8 for frames
    actions: torch.Tensor  # [T, N] int64
    mu: torch.Tensor  # [T, N, A]
    rewards: torch.Tensor  # [T, N]
    dones: torch.Tensor  # [T, N] float


def to_batch(sample: Sample, stack: int, device: torch.device) -> Batch:
    """Move a buffer sample to ``device`` (frames stay uint8 in transit) and rebuild its stacks."""
    non_blocking = device.type == "cuda"

    def move(array):
        return torch.from_numpy(array).to(device, non_blocking=non_blocking)

    obs = rebuild_stacks(move(sample.frames), move(sample.firsts), stack)
    return Batch(
        obs=obs,
        actions=move(sample.actions).long(),
        mu=move(sample.mu),
        rewards=move(sample.rewards),
        dones=move(sample.dones).float(),
    )


def explained_variance(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 − Var[target − prediction] / Var[target]: 1 is perfect, 0 no better than a constant."""
    var_target = target.var()
    return 1.0 - (target - prediction).var() / var_target.clamp_min(1e-12)


#: The statistics :meth:`ACER.update` returns, in the order progress.csv lists them.
UPDATE_STATS = (
    "loss_policy", "loss_f", "loss_bc", "loss_q", "entropy", "explained_variance", "grad_norm", "kl_avg",
    "rho_mean", "rho_clipped_frac", "avg_norm_k", "avg_norm_g", "avg_norm_k_dot_g", "avg_norm_adj",
    "tr_active_frac", "nonfinite",
)


class ACER:
    """The online network, the average network, the optimizer, and the update rule.

    :param model: the online actor-critic θ.
    :param config: the run's settings (gamma, c, trust region, coefficients, ...).
    :param timer: charges the Polyak update to the ``average_update`` phase (bench.py).
    """

    def __init__(self, model: ActorCritic, config: Config, timer: PhaseTimer | None = None):
        self.config = config
        self.timer = timer or PhaseTimer()
        self.model = model
        self.average_model = ActorCritic.from_spec(model.spec()).to(next(model.parameters()).device)
        self.average_model.load_state_dict(model.state_dict())
        self.average_model.requires_grad_(False)
        self.optimizer = RMSpropTF(model.parameters(), lr=config.lr, alpha=config.rms_alpha, eps=config.rms_eps)
        self.nonfinite_updates = 0
        self.nonfinite_streak = 0  # non-finite updates in a row

    def update(self, batch: Batch, lr: float) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch`` at learning rate ``lr``; returns detached statistics.

        The policy gradient is formed with respect to the probability vector π (the statistics
        φ of eq. 10), adjusted there by the trust region (eq. 12), and only then sent back
        through the network, so one backward pass serves the policy and the critic (eq. 6).
        If the gradient is not finite the step is skipped and ``nonfinite`` is 1.
        """
        cfg = self.config
        T, N = batch.actions.shape
        if batch.obs.shape[:2] != (T + 1, N):
            raise ValueError(f"obs must be [T+1, N, ...] = {(T + 1, N)}, got {tuple(batch.obs.shape[:2])}")

        flat_obs = batch.obs.reshape((T + 1) * N, *batch.obs.shape[2:])
        pi_all, q_all = self.model(flat_obs)
        pi_all = pi_all.reshape(T + 1, N, -1)
        q_all = q_all.reshape(T + 1, N, -1)
        with torch.no_grad():
            pi_avg = self.average_model.policy(flat_obs[: T * N]).reshape(T, N, -1)
            values_all = (pi_all * q_all).sum(-1)  # V(x_t) for t = 0..T
        pi, q = pi_all[:-1], q_all[:-1]
        values = values_all[:-1]

        actions = batch.actions.unsqueeze(-1)
        q_taken = q.gather(-1, actions).squeeze(-1)
        rho = losses.importance_weights(pi.detach(), batch.mu)
        rho_taken = rho.gather(-1, actions).squeeze(-1)
        q_ret = losses.q_retrace(batch.rewards, batch.dones, q_taken.detach(), values_all, rho_taken, cfg.gamma)

        # ĝ^acer with respect to the statistics π, one row per sample.
        pi_stat = pi.detach().requires_grad_(True)
        gain_truncated, gain_correction = losses.acer_policy_gain(
            pi_stat, q, values, q_ret, rho, batch.actions, cfg.c
        )
        entropy = losses.entropy(pi_stat)
        objective = (gain_truncated + gain_correction + cfg.ent_coef * entropy).sum()
        (g,) = torch.autograd.grad(objective, pi_stat)
        k = losses.kl_grad(pi_avg, pi.detach())
        z = losses.trust_region_adjust(g, k, cfg.delta) if cfg.trust_region else g

        loss_policy_surrogate = -(pi * z).sum() / (T * N)
        loss_q = 0.5 * (q_ret - q_taken).pow(2).mean()
        loss = loss_policy_surrogate + cfg.q_coef * loss_q

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        finite = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(loss))
        if finite:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            with self.timer("average_update"):
                polyak_update(self.average_model, self.model, cfg.alpha)
            self.nonfinite_streak = 0
        else:
            self.nonfinite_updates += 1
            self.nonfinite_streak += 1

        with torch.no_grad():
            k_dot_g = (k * g).sum(-1)
            return {
                "loss_policy": -(gain_truncated + gain_correction).mean(),
                "loss_f": -gain_truncated.mean(),
                "loss_bc": -gain_correction.mean(),
                "loss_q": loss_q.detach(),
                "entropy": entropy.mean(),
                "explained_variance": explained_variance(q_taken.detach(), q_ret),
                "grad_norm": grad_norm,
                "kl_avg": losses.kl_divergence(pi_avg, pi.detach()).mean(),
                "rho_mean": rho_taken.mean(),
                "rho_clipped_frac": (rho_taken > cfg.c).float().mean(),
                "avg_norm_k": k.norm(dim=-1).mean(),
                "avg_norm_g": g.norm(dim=-1).mean(),
                "avg_norm_k_dot_g": k_dot_g.abs().mean(),
                "avg_norm_adj": (g - z).norm(dim=-1).mean(),
                "tr_active_frac": (k_dot_g > cfg.delta).float().mean(),
                "nonfinite": torch.tensor(0.0 if finite else 1.0),
            }


"""A frozen copy of the feed-forward ACER update as it was before the state-carrying interfaces
(main at 4fc8c19), kept as a test oracle.

Tests run it and :meth:`acer_sync.training.acer.ACER.update` side by side, in one process, on two copies of
the same network, and require bit-identical parameters afterwards. That proves the feed-forward
update unchanged on whatever CPU the tests run, where a stored float digest would differ between
instruction sets (AVX2, AVX-512).

The network's forward passes are frozen here too, as functions of its submodules (whose names the
checkpoints' state_dicts fix), so the oracle does not depend on the interface it checks; so are the
optimizer's step and the Polyak average, as they were before the update became sync-free (main at
34ed7cc: a host branch on the finite check, the learning rate a Python float), in
:class:`ReferenceRMSpropTF` and :func:`reference_polyak_update`.
"""

from __future__ import annotations

import torch
from torch import nn

from acer_sync.math import losses
from acer_sync.nets.networks import LOG_STD_MAX, LOG_STD_MIN


class ReferenceRMSpropTF(torch.optim.Optimizer):
    """RMSProp with ε inside the root and v started at one, stepped as main stepped it at 34ed7cc."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-5):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
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


@torch.no_grad()
def reference_polyak_update(average: nn.Module, online: nn.Module, alpha: float) -> None:
    """θ_a ← α θ_a + (1 − α) θ, buffers copied, as main did it at 34ed7cc."""
    average_params, online_params = list(average.parameters()), list(online.parameters())
    for average_buffer, online_buffer in zip(average.buffers(), online.buffers()):
        average_buffer.copy_(online_buffer)
    torch._foreach_mul_(average_params, alpha)
    torch._foreach_add_(average_params, online_params, alpha=1.0 - alpha)


def _features(net, obs):
    """The torso's features of ``[B, stack, ...]`` observations (normalized first, where the net does)."""
    normalizer = getattr(net, "normalizer", None)
    return net.torso(obs if normalizer is None else normalizer(obs))


def categorical_forward(net, obs):
    """(π, Q) of the softmax actor-critic, ``[B, A]`` each."""
    features, head = _features(net, obs), net.head
    pi = torch.softmax(head.pi(head.pi_mlp(features)), dim=-1)
    return pi, head.q(head.q_mlp(features))


def categorical_policy(net, obs):
    head = net.head
    return torch.softmax(head.pi(head.pi_mlp(_features(net, obs))), dim=-1)


def gaussian_policy(net, obs):
    head = net.head
    mean = head.mean(head.mean_mlp(_features(net, obs)))
    log_std = head.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).expand_as(mean)
    return torch.cat([mean, log_std], dim=-1)


def gaussian_value(net, obs):
    head = net.head
    return head.value(head.value_mlp(_features(net, obs))).squeeze(-1)


def gaussian_advantage(net, obs, actions):
    features, head = _features(net, obs), net.head
    k = actions.shape[1]
    paired = torch.cat([features.unsqueeze(1).expand(-1, k, -1), actions.float()], dim=-1)
    return head.advantage(head.advantage_mlp(paired.reshape(-1, paired.shape[-1]))).reshape(-1, k)


def _categorical_terms(model, cfg, batch, flat_obs):
    T, N = batch["rewards"].shape
    pi_all, q_all = categorical_forward(model, flat_obs)
    pi_all = pi_all.reshape(T + 1, N, -1)
    q_all = q_all.reshape(T + 1, N, -1)
    with torch.no_grad():
        values_all = (pi_all * q_all).sum(-1)
    pi, q = pi_all[:-1], q_all[:-1]
    values = values_all[:-1]
    actions = batch["actions"].unsqueeze(-1)
    q_taken = q.gather(-1, actions).squeeze(-1)
    rho = losses.importance_weights(pi.detach(), batch["mu"])
    rho_taken = rho.gather(-1, actions).squeeze(-1)
    q_ret = losses.q_retrace(
        batch["rewards"], batch["dones"], q_taken.detach(), values_all, rho_taken, cfg.gamma,
        timeout_values=batch["timeout_values"],
    )
    pi_stat = pi.detach().requires_grad_(True)
    gain_truncated, gain_correction = losses.acer_policy_gain(pi_stat, q, values, q_ret, rho, batch["actions"], cfg.c)
    loss_q = 0.5 * (q_ret - q_taken).pow(2).mean()
    return pi, pi_stat, gain_truncated, gain_correction, loss_q


def _gaussian_terms(model, cfg, dist, batch, flat_obs):
    T, N = batch["rewards"].shape
    n = cfg.sdn_samples
    stats_all = gaussian_policy(model, flat_obs).reshape(T + 1, N, -1)
    values_all = gaussian_value(model, flat_obs).reshape(T + 1, N)
    stats, values = stats_all[:-1], values_all[:-1]
    with torch.no_grad():
        drawn = dist.sample(stats.detach().unsqueeze(2).expand(T, N, n + 1, dist.stat_size))
    a_prime = drawn[:, :, n]
    candidates = torch.cat([batch["actions"].unsqueeze(2), drawn], dim=2)
    advantage = gaussian_advantage(model, flat_obs[: T * N], candidates.reshape(T * N, n + 2, -1)).reshape(T, N, n + 2)
    advantage_u = advantage[:, :, 1 : n + 1]
    q_taken = losses.sdn_q(values, advantage[:, :, 0], advantage_u)
    q_prime = losses.sdn_q(values, advantage[:, :, n + 1], advantage_u)
    stats_param = stats.detach().requires_grad_(True)
    log_pi_taken = dist.log_prob(stats_param, batch["actions"])
    log_pi_prime = dist.log_prob(stats_param, a_prime)
    log_rho_taken = log_pi_taken.detach() - dist.log_prob(batch["mu"], batch["actions"])
    log_rho_prime = log_pi_prime.detach() - dist.log_prob(batch["mu"], a_prime)
    rho_bar = losses.retrace_weight_continuous(log_rho_taken, dist.dim)
    values_target_all = values_all.detach()
    q_ret = losses.q_retrace(
        batch["rewards"], batch["dones"], q_taken.detach(), values_target_all, rho_bar, cfg.gamma,
        timeout_values=batch["timeout_values"],
    )
    q_opc = losses.q_retrace(
        batch["rewards"], batch["dones"], q_taken.detach(), values_target_all, torch.ones_like(rho_bar), cfg.gamma,
        timeout_values=batch["timeout_values"],
    )
    gain_truncated, gain_correction = losses.gaussian_policy_gain(
        log_pi_taken, log_pi_prime, log_rho_taken, log_rho_prime, q_opc, q_prime, values, cfg.c
    )
    v_target = losses.value_target(log_rho_taken, q_ret, q_taken, values)
    loss_critic = 0.5 * (q_ret - q_taken).pow(2).mean() + 0.5 * (v_target - values).pow(2).mean()
    return stats, stats_param, gain_truncated, gain_correction, loss_critic


def reference_update(model, average_model, optimizer, cfg, dist, batch: dict, lr: float) -> bool:
    """One update exactly as main did it before the interface change; returns whether it stepped.
    ``optimizer`` is a :class:`ReferenceRMSpropTF`.

    ``batch`` maps ``obs`` ``[T+1, N, ...]``, ``actions``, ``mu``, ``rewards``, ``dones`` (float)
    and ``timeout_values`` (or None) to tensors, as the old ``Batch`` held them.
    """
    T, N = batch["actions"].shape[:2]
    flat_obs = batch["obs"].reshape((T + 1) * N, *batch["obs"].shape[2:])
    if dist.kind == "gaussian":
        stats, stats_param, gain_truncated, gain_correction, loss_critic = _gaussian_terms(model, cfg, dist, batch, flat_obs)
        policy_of_average = gaussian_policy
    else:
        stats, stats_param, gain_truncated, gain_correction, loss_critic = _categorical_terms(model, cfg, batch, flat_obs)
        policy_of_average = categorical_policy
    with torch.no_grad():
        stats_avg = policy_of_average(average_model, flat_obs[: T * N]).reshape(T, N, -1)
    entropy = dist.entropy(stats_param)
    objective = (gain_truncated + gain_correction + cfg.ent_coef * entropy).sum()
    (g,) = torch.autograd.grad(objective, stats_param)
    k = dist.kl_grad(stats_avg, stats.detach())
    z = losses.trust_region_adjust(g, k, cfg.delta) if cfg.trust_region else g
    loss = -(stats * z).sum() / (T * N) + cfg.q_coef * loss_critic
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    finite = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(loss))
    if finite:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        reference_polyak_update(average_model, model, cfg.alpha)
    return finite

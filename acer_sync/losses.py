"""ACER's math as pure, time-major functions.

Every function takes torch tensors laid out ``[T, N, ...]`` (time first, then env) and returns
tensors; none of them touches a network, an optimizer or global state. The symbols follow
Wang et al. 2017, "Sample Efficient Actor-Critic with Experience Replay" (arXiv:1611.01224):

=============  =========  ==========================================================
name here      paper      meaning
=============  =========  ==========================================================
``pi``         π(·|x_t)   current policy's probability vector (the statistics φ_θ(x_t))
``mu``         μ(·|x_t)   behaviour policy's probability vector, stored when acting
``pi_avg``     π_a        the average policy network's probability vector
``rho``        ρ_t(a)     importance weight π(a|x_t) / μ(a|x_t)
``rho_bar``    ρ̄_t        truncated weight min(ρ_clip, ρ_t(a_t)) in the Retrace recursion
``q``          Q_θv       the critic's action values
``values``     V_θv       Σ_a π(a|x_t) Q_θv(x_t, a)
``q_ret``      Q^ret      the Retrace target
``c``          c          the importance-weight truncation constant of the policy gradient
``k``          k          ∇_φ D_KL[f(·|φ_θa) ‖ f(·|φ)], the trust region's constraint normal
``delta``      δ          the trust region's radius
=============  =========  ==========================================================

Alignment: ``rewards[t]``, ``dones[t]`` and ``actions[t]`` belong to the step taken from
observation ``t``; ``dones[t] = 1`` means the episode ended with step ``t``, so nothing after it
is bootstrapped. Arrays of values carry one more row: ``values[T]`` is the bootstrap value of the
observation reached after the last step.
"""

from __future__ import annotations

import torch

#: Added to probabilities before a log or a division, as OpenAI Baselines does (its ``eps``). It
#: bounds ∂ log π / ∂π by 1e6 where a softmax underflows to 0.
PROB_EPS = 1e-6


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"expected equal shapes, got {shapes}")


def _check_rank(name: str, tensor: torch.Tensor, rank: int) -> None:
    if tensor.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(tensor.shape)}")


def q_retrace(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    q_taken: torch.Tensor,
    values: torch.Tensor,
    rho_taken: torch.Tensor,
    gamma: float,
    rho_clip: float = 1.0,
) -> torch.Tensor:
    """Retrace targets Q^ret, Wang et al. 2017 eq. (5) with the truncation of Algorithm 2.

    The recursion runs backwards from the bootstrap value V(x_T)::

        Q^ret_t = r_t + γ (1 − d_t) [ρ̄_{t+1} (Q^ret_{t+1} − Q(x_{t+1}, a_{t+1})) + V(x_{t+1})]
        Q^ret_{T−1} = r_{T−1} + γ (1 − d_{T−1}) V(x_T)
        ρ̄_t = min(ρ_clip, ρ_t(a_t))

    The text of eq. (5) writes ρ̄ = min(c, ρ); Algorithm 2, OpenAI Baselines and pfrl use
    min(1, ρ), which is the default here.

    :param rewards: r_t, ``[T, N]``.
    :param dones: d_t ∈ {0, 1}, ``[T, N]``; 1 when the episode ended with step t.
    :param q_taken: Q(x_t, a_t), ``[T, N]``.
    :param values: V(x_t) for t = 0..T, ``[T+1, N]``; ``values[T]`` is the bootstrap value.
    :param rho_taken: ρ_t(a_t) = π(a_t|x_t) / μ(a_t|x_t), ``[T, N]``.
    :param gamma: the discount γ.
    :param rho_clip: the truncation level of ρ̄.
    :return: Q^ret, ``[T, N]``, in the dtype of ``rewards``.
    """
    _check_rank("rewards", rewards, 2)
    _check_same_shape(rewards=rewards, dones=dones, q_taken=q_taken, rho_taken=rho_taken)
    if values.shape != (rewards.shape[0] + 1, rewards.shape[1]):
        raise ValueError(
            f"values must be [T+1, N] = {(rewards.shape[0] + 1, rewards.shape[1])}, "
            f"got {tuple(values.shape)}"
        )
    dtype = rewards.dtype
    not_done = 1.0 - dones.to(dtype)
    rho_bar = rho_taken.to(dtype).clamp(max=rho_clip)
    q_taken = q_taken.to(dtype)
    values = values.to(dtype)

    q_ret = torch.empty_like(rewards)
    next_target = values[-1]
    for t in reversed(range(rewards.shape[0])):
        q_ret[t] = rewards[t] + gamma * not_done[t] * next_target
        next_target = rho_bar[t] * (q_ret[t] - q_taken[t]) + values[t]
    return q_ret


def importance_weights(pi: torch.Tensor, mu: torch.Tensor, eps: float = PROB_EPS) -> torch.Tensor:
    """Importance weights ρ_t(a) = π(a|x_t) / μ(a|x_t) for every action, ``[T, N, A]``.

    ``eps`` is added to μ so that an action μ never takes gives a large, finite weight.
    """
    _check_rank("pi", pi, 3)
    _check_same_shape(pi=pi, mu=mu)
    return pi / (mu + eps)


def acer_policy_gain(
    pi: torch.Tensor,
    q: torch.Tensor,
    values: torch.Tensor,
    q_ret: torch.Tensor,
    rho: torch.Tensor,
    actions: torch.Tensor,
    c: float,
    eps: float = PROB_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Surrogate gains whose gradient with respect to π is ĝ^acer_t, Wang et al. 2017 eq. (10).

    Truncated importance sampling with bias correction (the trick of eqs. 7–8), written with
    respect to the policy statistics φ = π::

        ĝ^acer_t = min(c, ρ_t(a_t)) ∇_φ log f(a_t|φ) [Q^ret_t − V(x_t)]
                 + Σ_a [1 − c / ρ_t(a)]_+ π(a|x_t) ∇_φ log f(a|φ) [Q(x_t, a) − V(x_t)]

    Every factor but log π is held constant (detached), so ``(gain_truncated +
    gain_correction).sum()`` differentiated with respect to ``pi`` gives ĝ^acer for each sample.
    When π = μ (on-policy) every ρ is 1 and, for c ≥ 1, the correction term is exactly zero; as
    c → ∞ the truncated term becomes plain importance sampling and the correction vanishes.

    :param pi: π(·|x_t), ``[T, N, A]``; gradients flow through it.
    :param q: Q(x_t, ·), ``[T, N, A]``.
    :param values: V(x_t), ``[T, N]`` (without the bootstrap row).
    :param q_ret: Q^ret_t, ``[T, N]``.
    :param rho: ρ_t(·), ``[T, N, A]``.
    :param actions: a_t, ``[T, N]``, integer.
    :param c: the truncation constant c (``math.inf`` disables truncation).
    :return: ``(gain_truncated, gain_correction)``, each ``[T, N]``.
    """
    _check_rank("pi", pi, 3)
    _check_same_shape(pi=pi, q=q, rho=rho)
    _check_same_shape(values=values, q_ret=q_ret, actions=actions)
    if values.shape != pi.shape[:2]:
        raise ValueError(f"values must be [T, N] = {tuple(pi.shape[:2])}, got {tuple(values.shape)}")

    log_pi = torch.log(pi + eps)
    index = actions.long().unsqueeze(-1)
    log_pi_taken = log_pi.gather(-1, index).squeeze(-1)
    values = values.detach()

    truncated_weight = rho.detach().gather(-1, index).squeeze(-1).clamp(max=c)
    gain_truncated = log_pi_taken * (truncated_weight * (q_ret.detach() - values))

    # [1 − c/ρ]_+ is nonzero only where ρ > c (≥ 0), so the division there never sees ρ = 0;
    # where ρ ≤ c, including π = μ with c ≥ 1, the weight is exactly zero.
    rho = rho.detach()
    correction_weight = torch.where(rho > c, 1.0 - c / rho, torch.zeros((), dtype=rho.dtype))
    advantage_all = q.detach() - values.unsqueeze(-1)
    gain_correction = (log_pi * (correction_weight * pi.detach() * advantage_all)).sum(-1)
    return gain_truncated, gain_correction


def entropy(pi: torch.Tensor, eps: float = PROB_EPS) -> torch.Tensor:
    """Policy entropy H(π(·|x_t)) = −Σ_a π(a|x_t) log π(a|x_t), ``[T, N]``."""
    return -(pi * torch.log(pi + eps)).sum(-1)


def kl_divergence(pi_avg: torch.Tensor, pi: torch.Tensor, eps: float = PROB_EPS) -> torch.Tensor:
    """D_KL[π_a ‖ π] = Σ_a π_a(a) [log π_a(a) − log π(a)], ``[..., A] → [...]``."""
    _check_same_shape(pi_avg=pi_avg, pi=pi)
    return (pi_avg * (torch.log(pi_avg + eps) - torch.log(pi + eps))).sum(-1)


def kl_grad(pi_avg: torch.Tensor, pi: torch.Tensor, eps: float = PROB_EPS) -> torch.Tensor:
    """k = ∇_π D_KL[π_a ‖ π] = −π_a / π, the k of Wang et al. 2017 eq. (12).

    The gradient is taken with respect to the probability vector π (the statistics φ of the
    categorical distribution), not the network's parameters. ``eps`` is added to π, matching the
    ``eps`` inside :func:`kl_divergence`, so autograd of that function gives exactly this.
    """
    _check_same_shape(pi_avg=pi_avg, pi=pi)
    return -pi_avg / (pi + eps)


def trust_region_adjust(g: torch.Tensor, k: torch.Tensor, delta: float) -> torch.Tensor:
    """The efficient trust-region step z*, Wang et al. 2017 eqs. (11)–(12).

    Solves, independently for each row of the last dimension::

        minimise_z ½ ‖g − z‖²  subject to  kᵀz ≤ δ
        z* = g − max(0, (kᵀg − δ) / ‖k‖²) k

    so g comes back unchanged when kᵀg ≤ δ, and otherwise kᵀz* = δ exactly.

    :param g: the policy gradient with respect to the statistics φ (here π), ``[..., A]``.
    :param k: ∇_φ D_KL[f(·|φ_θa) ‖ f(·|φ)], ``[..., A]``.
    :param delta: the radius δ > 0.
    :return: z*, shaped like ``g``.
    """
    _check_same_shape(g=g, k=k)
    k_dot_g = (k * g).sum(-1, keepdim=True)
    k_norm_sq = (k * k).sum(-1, keepdim=True)
    # Where kᵀg ≤ δ the step is zero whatever ‖k‖ is; the clamp keeps 0/0 out of that branch.
    scale = torch.relu(k_dot_g - delta) / k_norm_sq.clamp_min(torch.finfo(k.dtype).tiny)
    return g - scale * k

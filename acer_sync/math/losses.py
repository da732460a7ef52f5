"""ACER's math as pure, time-major functions.

Every function takes torch tensors laid out ``[T, N, ...]`` (time first, then env) and returns
tensors; none of them touches a network, an optimizer or global state. The symbols follow
Wang et al. 2017, "Sample Efficient Actor-Critic with Experience Replay" (arXiv:1611.01224):

| name here | paper | meaning |
|---|---|---|
| ``pi`` | π(·∣x_t) | current policy's probability vector (the statistics φ_θ(x_t)) |
| ``mu`` | μ(·∣x_t) | behaviour policy's probability vector, stored when acting |
| ``pi_avg`` | π_a | the average policy network's probability vector |
| ``rho`` | ρ_t(a) | importance weight π(a∣x_t) / μ(a∣x_t) |
| ``rho_bar`` | ρ̄_t | truncated weight min(ρ_clip, ρ_t(a_t)) in the Retrace recursion |
| ``q`` | Q_θv | the critic's action values |
| ``values`` | V_θv | Σ_a π(a∣x_t) Q_θv(x_t, a) |
| ``q_ret`` | Q^ret | the Retrace target |
| ``c`` | c | the importance-weight truncation constant of the policy gradient |
| ``k`` | k | ∇_φ D_KL[f(·∣φ_θa) ‖ f(·∣φ)], the trust region's constraint normal |
| ``delta`` | δ | the trust region's radius |
| ``q_opc`` | Q^opc | Retrace with every ρ̄ = 1, the continuous policy gradient's target (§5) |
| ``q_sdn`` | Q̃_θv | the stochastic dueling network's estimate, eq. (13) |
| ``log_std`` | log σ | the Gaussian policy's log standard deviation (φ = [m, log σ]) |

The discrete functions take probability vectors; the continuous ones (Gaussian policy, §5 and
Algorithm 3) take log-densities and log importance weights, so that a tiny σ or a far-off action
gives large but finite numbers instead of ``inf / inf``.

Alignment: ``rewards[t]``, ``dones[t]`` and ``actions[t]`` belong to the step taken from
observation ``t``; ``dones[t] = 1`` means the episode ended with step ``t``, so nothing after it
is bootstrapped. Arrays of values carry one more row: ``values[T]`` is the bootstrap value of the
observation reached after the last step.
"""

from __future__ import annotations

import math

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
    timeout_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Retrace targets Q^ret, Wang et al. 2017 eq. (5) with the truncation of Algorithm 2.

    The recursion runs backwards from the bootstrap value V(x_T):

        Q^ret_t = r_t + γ (1 − d_t) [ρ̄_{t+1} (Q^ret_{t+1} − Q(x_{t+1}, a_{t+1})) + V(x_{t+1})]
                      + γ V^timeout_t
        Q^ret_{T−1} = r_{T−1} + γ (1 − d_{T−1}) V(x_T) + γ V^timeout_{T−1}
        ρ̄_t = min(ρ_clip, ρ_t(a_t))

    The text of eq. (5) writes ρ̄ = min(c, ρ); Algorithm 2, OpenAI Baselines and pfrl use
    min(1, ρ), which is the default here. The same recursion with every ρ̄ = 1 is Q^opc (§5),
    and with ρ̄ = min(1, ρ^(1/d)) the continuous Q^ret (pass those weights as ``rho_taken``).

    A step cut by a time limit has d_t = 1 (the next observation is a new episode's) and
    V^timeout_t = V(x_final), the value of the observation the env would have continued from
    (gymnasium's ``final_obs``); every other step has V^timeout_t = 0. The term is added on its
    own, so with zeros every target is bit-for-bit what it is without it.

    :param rewards: r_t, ``[T, N]``.
    :param dones: d_t ∈ {0, 1}, ``[T, N]``; 1 when the episode ended with step t.
    :param q_taken: Q(x_t, a_t), ``[T, N]``.
    :param values: V(x_t) for t = 0..T, ``[T+1, N]``; ``values[T]`` is the bootstrap value.
    :param rho_taken: ρ_t(a_t) = π(a_t|x_t) / μ(a_t|x_t), ``[T, N]``.
    :param gamma: the discount γ.
    :param rho_clip: the truncation level of ρ̄.
    :param timeout_values: V^timeout_t, ``[T, N]``; None means no step was cut by a time limit.
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

    if timeout_values is not None:
        _check_same_shape(rewards=rewards, timeout_values=timeout_values)
        timeout_values = timeout_values.to(dtype)

    # The rows are taken apart once (unbind) and γ(1 − d_t), γ V^timeout_t formed for all rows at
    # once: per element the same operations in the same order as indexing row by row, so the same
    # bits, in a third of the operators (each a dispatch on a row of N numbers: half the time of a
    # call at T = 20, N = 16 on the CPU).
    discounts = (gamma * not_done).unbind(0)
    timeout_terms = (gamma * timeout_values).unbind(0) if timeout_values is not None else None
    reward_rows, rho_bar_rows, q_taken_rows, value_rows = (x.unbind(0) for x in (rewards, rho_bar, q_taken, values))
    q_ret = [None] * rewards.shape[0]
    next_target = value_rows[-1]
    for t in reversed(range(rewards.shape[0])):
        q_ret[t] = reward_rows[t] + discounts[t] * next_target
        if timeout_terms is not None:
            q_ret[t] = q_ret[t] + timeout_terms[t]
        next_target = rho_bar_rows[t] * (q_ret[t] - q_taken_rows[t]) + value_rows[t]
    return torch.stack(q_ret)


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
    respect to the policy statistics φ = π:

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
    correction_weight = torch.where(rho > c, 1.0 - c / rho, rho.new_zeros(()))
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
    ``eps`` inside [`kl_divergence`][], so autograd of that function gives exactly this.
    """
    _check_same_shape(pi_avg=pi_avg, pi=pi)
    return -pi_avg / (pi + eps)


def trust_region_adjust(g: torch.Tensor, k: torch.Tensor, delta: float) -> torch.Tensor:
    """The efficient trust-region step z*, Wang et al. 2017 eqs. (11)–(12).

    Solves, independently for each row of the last dimension:

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


LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log f(a|φ) of N(m, diag σ²), summed over the d action dimensions, ``[..., d] → [...]``:

        log f(a|m, σ) = Σ_j −½ ((a_j − m_j) / σ_j)² − log σ_j − ½ log 2π
    """
    _check_same_shape(mean=mean, log_std=log_std, actions=actions)
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """H(N(m, diag σ²)) = Σ_j log σ_j + ½ (1 + log 2π), ``[..., d] → [...]``."""
    return (log_std + 0.5 * (1.0 + LOG_2PI)).sum(-1)


def gaussian_kl(
    mean_avg: torch.Tensor, log_std_avg: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """D_KL[N(m_a, σ_a²) ‖ N(m, σ²)] in closed form, summed over dimensions, ``[..., d] → [...]``:

        Σ_j log σ_j − log σ_a,j + (σ_a,j² + (m_a,j − m_j)²) / (2 σ_j²) − ½
    """
    _check_same_shape(mean_avg=mean_avg, log_std_avg=log_std_avg, mean=mean, log_std=log_std)
    ratio = (torch.exp(2.0 * log_std_avg) + (mean_avg - mean).pow(2)) * torch.exp(-2.0 * log_std)
    return (log_std - log_std_avg + 0.5 * ratio - 0.5).sum(-1)


def gaussian_kl_grad(
    mean_avg: torch.Tensor, log_std_avg: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """k = ∇_φ D_KL[f(·|φ_θa) ‖ f(·|φ)] for φ = [m, log σ], Wang et al. 2017 eq. (12), ``[..., 2d]``:

        ∂KL/∂m_j     = (m_j − m_a,j) / σ_j²
        ∂KL/∂log σ_j = 1 − (σ_a,j² + (m_a,j − m_j)²) / σ_j²

    the closed form of what autograd gives on [`gaussian_kl`][].
    """
    _check_same_shape(mean_avg=mean_avg, log_std_avg=log_std_avg, mean=mean, log_std=log_std)
    inv_var = torch.exp(-2.0 * log_std)
    grad_mean = (mean - mean_avg) * inv_var
    grad_log_std = 1.0 - (torch.exp(2.0 * log_std_avg) + (mean_avg - mean).pow(2)) * inv_var
    return torch.cat([grad_mean, grad_log_std], dim=-1)


def sdn_q(values: torch.Tensor, advantage_taken: torch.Tensor, advantage_sampled: torch.Tensor) -> torch.Tensor:
    """The stochastic dueling network's Q̃, Wang et al. 2017 eq. (13):

        Q̃(x_t, a_t) = V(x_t) + A(x_t, a_t) − (1/n) Σ_i A(x_t, u_i),   u_i ~ π(·|x_t)

    :param values: V(x_t), ``[T, N]``.
    :param advantage_taken: A(x_t, a_t), ``[T, N]``.
    :param advantage_sampled: A(x_t, u_i) for the n samples, ``[T, N, n]``.
    :return: Q̃(x_t, a_t), ``[T, N]``.
    """
    _check_rank("advantage_sampled", advantage_sampled, 3)
    _check_same_shape(values=values, advantage_taken=advantage_taken, sampled=advantage_sampled[..., 0])
    return values + advantage_taken - advantage_sampled.mean(-1)


def retrace_weight_continuous(log_rho_taken: torch.Tensor, action_dim: int) -> torch.Tensor:
    """ρ̄_t = min{1, ρ_t^(1/d)} of the continuous Q^ret (§5), from log ρ_t, ``[T, N]``.

    Computed as exp(min{0, log ρ_t / d}), which never overflows however far π and μ are apart.
    """
    _check_rank("log_rho_taken", log_rho_taken, 2)
    if action_dim < 1:
        raise ValueError(f"action_dim must be >= 1, got {action_dim}")
    return torch.exp((log_rho_taken / action_dim).clamp(max=0.0))


def value_target(
    log_rho_taken: torch.Tensor, q_ret: torch.Tensor, q_sdn_taken: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """V^target_t = min{1, ρ_t} (Q^ret_t − Q̃(x_t, a_t)) + V(x_t), Wang et al. 2017 §5, ``[T, N]``.

    All inputs are held constant: this is a regression target for V.
    """
    _check_rank("q_ret", q_ret, 2)
    _check_same_shape(log_rho_taken=log_rho_taken, q_ret=q_ret, q_sdn_taken=q_sdn_taken, values=values)
    weight = torch.exp(log_rho_taken.detach().clamp(max=0.0))
    return (weight * (q_ret.detach() - q_sdn_taken.detach()) + values.detach())


def gaussian_policy_gain(
    log_prob_taken: torch.Tensor,
    log_prob_sampled: torch.Tensor,
    log_rho_taken: torch.Tensor,
    log_rho_sampled: torch.Tensor,
    q_opc: torch.Tensor,
    q_sdn_sampled: torch.Tensor,
    values: torch.Tensor,
    c: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Surrogate gains whose gradient with respect to φ is ĝ^acer_t for a continuous policy, eq. (14):

        ĝ^acer_t = min{c, ρ_t(a_t)} (Q^opc_t − V(x_t)) ∇_φ log f(a_t|φ)
                 + [1 − c / ρ_t(a'_t)]_+ (Q̃(x_t, a'_t) − V(x_t)) ∇_φ log f(a'_t|φ),   a'_t ~ π(·|x_t)

    The sum over actions of the discrete bias correction becomes one sample a' from π, which keeps
    ĝ^acer an unbiased estimate of the untruncated importance-sampled gradient. Every factor but
    the log-densities is held constant. The weights are taken from log ρ: min{c, ρ} =
    exp(min{log c, log ρ}) and c/ρ = exp(log c − log ρ), finite whatever the densities. When
    π = μ every ρ is 1 and, for c ≥ 1, the correction is exactly zero.

    :param log_prob_taken: log f(a_t|φ_t), ``[T, N]``; gradients flow through it.
    :param log_prob_sampled: log f(a'_t|φ_t), ``[T, N]``; gradients flow through it (a' is constant).
    :param log_rho_taken: log ρ_t(a_t) = log f(a_t|φ_t) − log μ(a_t|x_t), ``[T, N]``.
    :param log_rho_sampled: log ρ_t(a'_t), ``[T, N]``.
    :param q_opc: Q^opc_t, ``[T, N]``.
    :param q_sdn_sampled: Q̃(x_t, a'_t), ``[T, N]``.
    :param values: V(x_t), ``[T, N]``.
    :param c: the truncation constant c (``math.inf`` disables truncation).
    :return: ``(gain_truncated, gain_correction)``, each ``[T, N]``.
    """
    _check_rank("log_prob_taken", log_prob_taken, 2)
    _check_same_shape(
        log_prob_taken=log_prob_taken, log_prob_sampled=log_prob_sampled, log_rho_taken=log_rho_taken,
        log_rho_sampled=log_rho_sampled, q_opc=q_opc, q_sdn_sampled=q_sdn_sampled, values=values,
    )
    values = values.detach()
    log_c = math.log(c) if c > 0 else -math.inf
    truncated_weight = torch.exp(log_rho_taken.detach().clamp(max=log_c))
    gain_truncated = log_prob_taken * (truncated_weight * (q_opc.detach() - values))
    correction_weight = torch.relu(1.0 - torch.exp(log_c - log_rho_sampled.detach()))
    gain_correction = log_prob_sampled * (correction_weight * (q_sdn_sampled.detach() - values))
    return gain_truncated, gain_correction

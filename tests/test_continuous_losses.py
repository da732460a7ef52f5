"""Continuous ACER's math (§5, Algorithm 3): hand-worked numbers, identities, an unbiasedness check."""

import copy
import math

import numpy as np
import pytest
import torch

from acer_sync.math import losses
from acer_sync.nets.distributions import Categorical, DiagGaussian


def close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


def test_sdn_q_hand_worked():
    # Q̃ = V + A(a) − mean_i A(u_i): 1 + 2 − (1+2+3+4+5)/5 = 0;  −1 + 0.5 − (0+0+0+0+1)/5 = −0.7
    values = torch.tensor([[1.0, -1.0]])
    advantage_taken = torch.tensor([[2.0, 0.5]])
    advantage_sampled = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 0.0, 1.0]]])
    close(losses.sdn_q(values, advantage_taken, advantage_sampled), [[0.0, -0.7]])


def test_q_opc_and_continuous_q_ret_hand_worked():
    # T = 2, N = 1, γ = 0.9, d = 2. ρ_1 = 0.25 → ρ̄_1 = min(1, 0.25^(1/2)) = 0.5.
    rewards = torch.tensor([[1.0], [2.0]])
    dones = torch.zeros(2, 1)
    q_sdn = torch.tensor([[0.5], [1.0]])
    values = torch.tensor([[0.4], [0.8], [3.0]])
    log_rho = torch.log(torch.tensor([[4.0], [0.25]]))
    rho_bar = losses.retrace_weight_continuous(log_rho, action_dim=2)
    close(rho_bar, [[1.0], [0.5]])
    # Q^ret_1 = 2 + 0.9·3 = 4.7;  Q^ret_0 = 1 + 0.9·(0.5·(4.7 − 1.0) + 0.8) = 3.385
    q_ret = losses.q_retrace(rewards, dones, q_sdn, values, rho_bar, gamma=0.9)
    close(q_ret, [[3.385], [4.7]])
    # Q^opc: every ρ̄ = 1, so Q^opc_0 = 1 + 0.9·((4.7 − 1.0) + 0.8) = 5.05
    q_opc = losses.q_retrace(rewards, dones, q_sdn, values, torch.ones_like(rho_bar), gamma=0.9)
    close(q_opc, [[5.05], [4.7]])


def test_continuous_rho_bar_is_finite_for_huge_log_rho():
    log_rho = torch.tensor([[1e4, -1e4, 0.0]])
    close(losses.retrace_weight_continuous(log_rho, 3), [[1.0, 0.0, 1.0]])


def test_value_target_hand_worked():
    # V^target = min(1, ρ)(Q^ret − Q̃) + V:  min(1, 0.5)(3 − 1) + 2 = 3;  min(1, 4)(3 − 1) + 2 = 4
    log_rho = torch.log(torch.tensor([[0.5, 4.0]]))
    target = losses.value_target(log_rho, torch.tensor([[3.0, 3.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 2.0]]))
    close(target, [[3.0, 4.0]])


def test_gaussian_log_prob_and_entropy_match_torch():
    mean = torch.tensor([[0.3, -1.0]])
    log_std = torch.tensor([[-0.5, 0.2]])
    actions = torch.tensor([[1.0, 0.5]])
    normal = torch.distributions.Normal(mean, log_std.exp())
    close(losses.gaussian_log_prob(mean, log_std, actions), normal.log_prob(actions).sum(-1))
    close(losses.gaussian_entropy(log_std), normal.entropy().sum(-1))


def test_gaussian_kl_hand_worked():
    # KL[N(0, 1) ‖ N(1, 2²)] = log 2 − 0 + (1 + 1)/(2·4) − 1/2 = log 2 − 0.25
    kl = losses.gaussian_kl(torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([math.log(2.0)]))
    close(kl, math.log(2.0) - 0.25)
    normal = torch.distributions.Normal
    expected = torch.distributions.kl_divergence(normal(0.0, 1.0), normal(1.0, 2.0))
    close(kl, expected)


def test_gaussian_kl_grad_matches_autograd():
    g = torch.Generator().manual_seed(0)
    mean_avg, log_std_avg = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64) * 0.3
    mean = torch.randn(4, 3, generator=g, dtype=torch.float64).requires_grad_(True)
    log_std = (torch.randn(4, 3, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    losses.gaussian_kl(mean_avg, log_std_avg, mean, log_std).sum().backward()
    k = losses.gaussian_kl_grad(mean_avg, log_std_avg, mean.detach(), log_std.detach())
    torch.testing.assert_close(k, torch.cat([mean.grad, log_std.grad], -1), rtol=1e-12, atol=1e-12)
    # Hand-worked, d = 1: m_a = 0, σ_a = 1, m = 1, σ = 2: ∂/∂m = 1/4, ∂/∂log σ = 1 − (1 + 1)/4 = 0.5
    k1 = losses.gaussian_kl_grad(torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([math.log(2.0)]))
    close(k1, [0.25, 0.5])


def test_trust_region_on_gaussian_statistics_meets_the_constraint():
    g = torch.Generator().manual_seed(1)
    k = losses.gaussian_kl_grad(torch.zeros(5, 2), torch.zeros(5, 2), torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g) * 0.2)
    grad = torch.randn(5, 4, generator=g) * 10
    z = losses.trust_region_adjust(grad, k, delta=0.5)
    assert ((k * z).sum(-1) <= 0.5 + 1e-5).all()


def gains_and_grad(log_rho_taken_fn, actions, sampled, stats, mu_stats, q_taken, q_sampled, values, c):
    """ĝ^acer per sample (rows of ``stats``), through the Gaussian's log-densities."""
    dist = DiagGaussian(1, [-np.inf], [np.inf])
    stats_param = stats.clone().requires_grad_(True)
    log_pi_taken = dist.log_prob(stats_param, actions)
    log_pi_sampled = dist.log_prob(stats_param, sampled)
    log_rho_taken = log_pi_taken.detach() - dist.log_prob(mu_stats, actions)
    log_rho_sampled = log_pi_sampled.detach() - dist.log_prob(mu_stats, sampled)
    truncated, correction = losses.gaussian_policy_gain(
        log_pi_taken, log_pi_sampled, log_rho_taken, log_rho_sampled, q_taken, q_sampled, values, c
    )
    (grad,) = torch.autograd.grad((truncated + correction).sum(), stats_param)
    return truncated, correction, grad


def test_on_policy_removes_the_bias_correction():
    g = torch.Generator().manual_seed(2)
    stats = torch.tensor([0.3, -0.2]).expand(6, 4, 2).clone()
    actions = torch.randn(6, 4, 1, generator=g)
    sampled = torch.randn(6, 4, 1, generator=g)
    q = torch.randn(6, 4, generator=g)
    _, correction, _ = gains_and_grad(None, actions, sampled, stats, stats, q, q, torch.zeros(6, 4), c=5.0)
    assert torch.equal(correction, torch.zeros_like(correction))


def test_bias_correction_keeps_the_gradient_unbiased():
    """Monte Carlo, seed 0, 400k samples, float64: the truncated gradient with its correction and
    the untruncated importance-sampled gradient both match the exact ∇_φ E_π[Q(a)], within 5
    standard errors; truncation without the correction does not (it is biased by 30%+)."""
    torch.manual_seed(0)
    samples = 400_000
    m, log_s, b = 0.5, math.log(0.6), 1.5
    # π = N(0.5, 0.6²), μ = N(0, 0.3²): μ is narrow, so ρ is often above c = 1.
    stats = torch.tensor([m, log_s], dtype=torch.float64).expand(1, samples, 2)
    mu_stats = torch.tensor([0.0, math.log(0.3)], dtype=torch.float64).expand(1, samples, 2)
    actions = torch.randn(1, samples, 1, dtype=torch.float64) * 0.3
    sampled = m + math.exp(log_s) * torch.randn(1, samples, 1, dtype=torch.float64)

    def q_fn(a):  # Q(a) = −(a − b)², so E_π[Q] = −((m − b)² + σ²)
        return -(a[..., 0] - b) ** 2

    values = torch.zeros(1, samples, dtype=torch.float64)
    exact = torch.tensor([-2 * (m - b), -2 * math.exp(2 * log_s)], dtype=torch.float64)

    def estimate(c):
        _, _, grad = gains_and_grad(None, actions, sampled, stats, mu_stats, q_fn(actions), q_fn(sampled), values, c)
        grad = grad[0]
        return grad.mean(0), grad.std(0) / math.sqrt(samples)

    with_correction, se_corrected = estimate(c=1.0)
    importance_sampled, se_is = estimate(c=math.inf)
    assert ((with_correction - exact).abs() < 5 * se_corrected).all(), (with_correction, exact, se_corrected)
    assert ((importance_sampled - exact).abs() < 5 * se_is).all(), (importance_sampled, exact, se_is)

    # Without its correction term, the truncated estimate is far off: the check can fail.
    dist = DiagGaussian(1, [-np.inf], [np.inf])
    stats_param = stats.clone().requires_grad_(True)
    log_pi = dist.log_prob(stats_param, actions)
    log_rho = log_pi.detach() - dist.log_prob(mu_stats, actions)
    truncated, _ = losses.gaussian_policy_gain(log_pi, log_pi, log_rho, log_rho, q_fn(actions), q_fn(actions), values, 1.0)
    (biased,) = torch.autograd.grad(truncated.sum(), stats_param)
    assert ((biased[0].mean(0) - exact).abs() > 0.3 * exact.abs()).any()


def test_no_nan_for_tiny_sigma_or_far_off_actions():
    dist = DiagGaussian(2, [-1.0, -1.0], [1.0, 1.0])
    # μ with σ = e^-20 and actions 1e3 away from π's mean; π's own σ at the network's clamp.
    mu_stats = torch.tensor([0.0, 0.0, -20.0, -20.0]).expand(3, 2, 4)
    stats = torch.tensor([5.0, -5.0, -5.0, -5.0]).expand(3, 2, 4).clone().requires_grad_(True)
    actions = torch.tensor([1e3, -1e3]).expand(3, 2, 2)
    sampled = torch.tensor([-1e3, 1e3]).expand(3, 2, 2)
    log_pi = dist.log_prob(stats, actions)
    log_pi_sampled = dist.log_prob(stats, sampled)
    log_rho = log_pi.detach() - dist.log_prob(mu_stats, actions)
    log_rho_sampled = log_pi_sampled.detach() - dist.log_prob(mu_stats, sampled)
    rho_bar = losses.retrace_weight_continuous(log_rho, 2)
    q = torch.ones(3, 2)
    truncated, correction = losses.gaussian_policy_gain(log_pi, log_pi_sampled, log_rho, log_rho_sampled, q, q, torch.zeros(3, 2), 5.0)
    (grad,) = torch.autograd.grad((truncated + correction).sum(), stats)
    kl = dist.kl(mu_stats, stats.detach())
    k = dist.kl_grad(mu_stats, stats.detach())
    for tensor in (log_pi, log_rho, rho_bar, truncated, correction, grad, kl, k, losses.trust_region_adjust(grad, k, 1.0)):
        assert torch.isfinite(tensor).all()
    np.testing.assert_array_equal(dist.env_actions(actions[0].numpy()), [[1.0, -1.0], [1.0, -1.0]])


def test_categorical_interface_matches_the_discrete_losses():
    dist = Categorical(3)
    pi = torch.tensor([[0.2, 0.5, 0.3]])
    close(dist.log_prob(pi, torch.tensor([1])), [math.log(0.5 + losses.PROB_EPS)])
    np.testing.assert_array_equal(dist.forced_stats(np.array([2, 0])), [[0, 0, 1], [1, 0, 0]])
    close(dist.kl(pi, pi), [0.0])


def test_gaussian_policy_gain_hand_worked():
    # Eq. 14's two terms, each with its V baseline (a Monte Carlo test with V = 0 cannot see one
    # dropped). T = N = 1, c = 1.5; ρ(a) = 2 -> min(c, ρ) = 1.5; ρ(a') = 4 -> [1 - c/ρ']+ = 0.625.
    # Q^opc = 3, Q~(a') = 5, V = 1; log f(a) = -0.5, log f(a') = -1.
    #   truncated  = 1.5 (3 - 1)(-0.5)  = -1.5   (d/d log f(a)  = 3)
    #   correction = 0.625 (5 - 1)(-1)  = -2.5   (d/d log f(a') = 2.5)
    # Without V in the truncated term it is -2.25; without it in the correction, -3.125.
    log_prob_taken = torch.tensor([[-0.5]], requires_grad=True)
    log_prob_sampled = torch.tensor([[-1.0]], requires_grad=True)
    truncated, correction = losses.gaussian_policy_gain(
        log_prob_taken, log_prob_sampled, torch.log(torch.tensor([[2.0]])), torch.log(torch.tensor([[4.0]])),
        torch.tensor([[3.0]]), torch.tensor([[5.0]]), torch.tensor([[1.0]]), c=1.5,
    )
    assert math.isclose(truncated.item(), -1.5, rel_tol=1e-6) and math.isclose(correction.item(), -2.5, rel_tol=1e-6)
    grad_taken, grad_sampled = torch.autograd.grad((truncated + correction).sum(), [log_prob_taken, log_prob_sampled])
    assert math.isclose(grad_taken.item(), 3.0, rel_tol=1e-6) and math.isclose(grad_sampled.item(), 2.5, rel_tol=1e-6)


def test_the_gaussian_update_matches_a_step_by_step_loop_of_algorithm_3(monkeypatch):
    # Algorithm 3 written as the paper writes it, one step at a time in float64, beside the
    # vectorized update on the same network and batch: d = 2, T = 4, N = 2, n = 5, an average
    # network apart from the online one, a terminal (env 0, t = 1) and a time-limit cut (env 1,
    # t = 2, V(x_final) = 2.5). It pins what the frozen reference (a copy of this code) cannot:
    # ρ̄ = min(1, ρ^(1/d)) in Q^ret but min(1, ρ) in V's target, ρ' from the sampled a', the
    # correction min(c, ρ) with plain ρ (eq. 14), the KL's gradient against π_avg, and Polyak.
    from acer_sync.base.config import Config
    from acer_sync.training.acer import ACER
    from helpers import features_of, ff_batch, gaussian_net

    torch.manual_seed(0)
    T, N, d, n = 4, 2, 2, 5
    model = gaussian_net((1, 3), d, (8,), [0.5, 0.8])
    config = Config(env="test", nsteps=T, num_envs=N, hidden="8", c=1.3, delta=0.05, ent_coef=0.01, gamma=0.9,
                    sdn_samples=n, alpha=0.5, compile="off")
    agent = ACER(model, config)
    with torch.no_grad():  # the online network moves away from the average one
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    data = torch.Generator().manual_seed(7)
    obs = torch.randn(T + 1, N, 1, 3, generator=data)
    actions = torch.randn(T, N, d, generator=data)
    mu = torch.cat([torch.randn(T, N, d, generator=data) * 0.3, torch.full((T, N, d), -0.7)], -1)
    rewards = torch.randn(T, N, generator=data)
    dones = torch.zeros(T, N)
    dones[1, 0] = dones[2, 1] = 1
    timeout_values = torch.zeros(T, N)
    timeout_values[2, 1] = 2.5
    seen = {}

    def recorded(name, function, first_only=False):
        def wrapper(*args, **kwargs):
            out = function(*args, **kwargs)
            if not (first_only and name in seen):
                seen[name] = out.detach().clone()
            return out
        return wrapper

    monkeypatch.setattr(agent.distribution, "sample", recorded("drawn", agent.distribution.sample))
    monkeypatch.setattr(losses, "q_retrace", recorded("q_ret", losses.q_retrace, first_only=True))  # then Q^opc's
    monkeypatch.setattr(losses, "value_target", recorded("v_target", losses.value_target))

    adjust = losses.trust_region_adjust

    def trust_region(g, k, delta):  # eq. 12, its g and k kept
        seen["g"], seen["k"] = g.detach().clone(), k.detach().clone()
        seen["z"] = adjust(g, k, delta)
        return seen["z"]

    monkeypatch.setattr(losses, "trust_region_adjust", trust_region)
    online, average = copy.deepcopy(model), copy.deepcopy(agent.average_model)  # before the update
    agent.update(ff_batch(obs, actions, mu, rewards, dones, timeout_values), lr=0.0)  # lr 0: only Polyak moves

    features = features_of(online, obs.reshape((T + 1) * N, 1, 3))
    phi = online.policy_of(features).reshape(T + 1, N, 2 * d).detach().double()
    values = online.value_of(features).reshape(T + 1, N).detach().double()

    def log_density(stats, action):
        mean, log_std = stats[..., :d], stats[..., d:]
        return (-0.5 * ((action - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def advantage(t, j, action):
        return online.advantage_of(features[t * N + j:t * N + j + 1], action.reshape(1, 1, d).float()).item()

    drawn = seen["drawn"].double()
    q_ret_loop, v_target_loop = torch.zeros(T, N, dtype=torch.float64), torch.zeros(T, N, dtype=torch.float64)
    g_loop, k_loop = torch.zeros(T, N, 2 * d, dtype=torch.float64), torch.zeros(T, N, 2 * d, dtype=torch.float64)
    for j in range(N):
        q_ret = q_opc = values[T, j].item()
        for t in reversed(range(T)):
            if dones[t, j]:
                q_ret = q_opc = 0.0
            q_ret = rewards[t, j].item() + config.gamma * (q_ret + timeout_values[t, j].item())
            q_opc = rewards[t, j].item() + config.gamma * (q_opc + timeout_values[t, j].item())
            baseline = sum(advantage(t, j, drawn[t, j, i]) for i in range(n)) / n  # eq. 13's mean over u_i
            v = values[t, j].item()
            q_taken = v + advantage(t, j, actions[t, j].double()) - baseline
            a_prime = drawn[t, j, n]
            q_prime = v + advantage(t, j, a_prime) - baseline
            stats = phi[t, j].clone().requires_grad_(True)
            rho = math.exp(log_density(stats, actions[t, j].double()).item() - log_density(mu[t, j].double(), actions[t, j].double()).item())
            rho_prime = math.exp(log_density(stats, a_prime).item() - log_density(mu[t, j].double(), a_prime).item())
            objective = (min(config.c, rho) * (q_opc - v) * log_density(stats, actions[t, j].double())
                         + max(0.0, 1 - config.c / rho_prime) * (q_prime - v) * log_density(stats, a_prime)
                         + config.ent_coef * stats[d:].sum())  # the entropy's gradient in log σ
            g_loop[t, j] = torch.autograd.grad(objective, stats)[0]
            stats_avg = average.policy_of(features_of(average, obs[t, j:j + 1]))[0].detach().double()
            stats = phi[t, j].clone().requires_grad_(True)
            std_avg, std = stats_avg[d:].exp(), stats[d:].exp()
            kl = (torch.log(std / std_avg) + (std_avg ** 2 + (stats_avg[:d] - stats[:d]) ** 2) / (2 * std ** 2) - 0.5).sum()
            k_loop[t, j] = torch.autograd.grad(kl, stats)[0]
            q_ret_loop[t, j] = q_ret
            v_target_loop[t, j] = min(1.0, rho) * (q_ret - q_taken) + v
            q_ret = min(1.0, rho ** (1 / d)) * (q_ret - q_taken) + v
            q_opc = (q_opc - q_taken) + v

    torch.testing.assert_close(seen["q_ret"].double(), q_ret_loop, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["v_target"].double(), v_target_loop, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["g"].double(), g_loop, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(seen["k"].double(), k_loop, rtol=1e-5, atol=1e-5)
    k_dot_g, k_dot_z = (seen["k"] * seen["g"]).sum(-1), (seen["k"] * seen["z"]).sum(-1)
    assert (k_dot_g > config.delta).any() and (k_dot_g <= config.delta).any()  # both sides of eq. 12
    torch.testing.assert_close(k_dot_z, torch.minimum(k_dot_g, torch.tensor(config.delta)), rtol=1e-5, atol=1e-6)
    for name, parameter in agent.average_model.named_parameters():  # θ_a ← α θ_a + (1 − α) θ, α = 0.5
        expected = 0.5 * dict(average.named_parameters())[name] + 0.5 * dict(online.named_parameters())[name]
        torch.testing.assert_close(parameter, expected, rtol=0, atol=1e-7)


def test_the_logged_rho_mean_stays_finite_when_mu_gave_the_action_almost_no_density():
    # log ρ past 88 overflows float32's exp. The update itself only uses ρ truncated (eq. 14's
    # min(c, ρ), min(1, ρ^(1/d))), but rho_mean logged inf. Each ρ in the statistic is now capped
    # at 1/ε = 10⁶, where the discrete μ's ε caps it, and rho_clipped_frac still counts it.
    from acer_sync.base.config import Config
    from acer_sync.training.acer import ACER
    from helpers import ff_batch, gaussian_net

    torch.manual_seed(0)
    T, N, d = 3, 2, 1
    model = gaussian_net((1, 3), d, (8,), [0.5])
    agent = ACER(model, Config(env="test", nsteps=T, num_envs=N, hidden="8", compile="off"))
    obs = torch.zeros(T + 1, N, 1, 3)
    actions = torch.zeros(T, N, d)
    mu = torch.cat([torch.full((T, N, d), 2.0), torch.full((T, N, d), -2.0)], -1)  # σ = 0.135, 15σ away
    stats = agent.update(ff_batch(obs, actions, mu, torch.zeros(T, N), torch.zeros(T, N)), lr=0.0)
    assert stats["nonfinite"].item() == 0
    assert math.isfinite(stats["rho_mean"].item()) and stats["rho_mean"].item() == pytest.approx(1e6, rel=1e-5)
    assert stats["rho_clipped_frac"].item() == 1.0

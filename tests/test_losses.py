"""ACER's math against hand-worked cases and identities (expected numbers are written out)."""

import math

import pytest
import torch

from acer_sync.math import losses

GAMMA = 0.9
# Two envs side by side; env 1 ends its episode with step 1.
REWARDS = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
DONES = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
Q_TAKEN = torch.tensor([[0.5, 0.5], [1.0, 1.0], [1.5, 1.5]])
VALUES = torch.tensor([[0.4, 0.4], [0.8, 0.8], [1.2, 1.2], [2.0, 2.0]])
RHO = torch.tensor([[0.5, 0.5], [2.0, 2.0], [0.3, 0.3]])


def test_q_retrace_hand_worked():
    # Env 0, backwards:  Q2 = 3 + .9*2.0 = 4.8;  carry = .3*(4.8-1.5)+1.2 = 2.19
    #                    Q1 = 2 + .9*2.19 = 3.971; carry = 1*(3.971-1)+.8 = 3.771
    #                    Q0 = 1 + .9*3.771 = 4.3939
    # Env 1 (done at t=1): Q1 = 2; carry = 1*(2-1)+.8 = 1.8;  Q0 = 1 + .9*1.8 = 2.62
    q_ret = losses.q_retrace(REWARDS, DONES, Q_TAKEN, VALUES, RHO, GAMMA)
    expected = torch.tensor([[4.3939, 2.62], [3.971, 2.0], [4.8, 4.8]])
    torch.testing.assert_close(q_ret, expected, rtol=1e-6, atol=1e-6)


def test_q_retrace_rho_zero_is_one_step_target():
    q_ret = losses.q_retrace(REWARDS, torch.zeros_like(DONES), Q_TAKEN, VALUES, torch.zeros_like(RHO), GAMMA)
    # r_t + γ V(x_{t+1}): 1 + .9*.8, 2 + .9*1.2, 3 + .9*2.0
    expected = torch.tensor([[1.72, 1.72], [3.08, 3.08], [4.8, 4.8]])
    torch.testing.assert_close(q_ret, expected, rtol=1e-6, atol=1e-6)


def test_q_retrace_rho_one_and_q_equal_v_is_n_step_return():
    q_ret = losses.q_retrace(REWARDS, torch.zeros_like(DONES), VALUES[:-1], VALUES, torch.ones_like(RHO), GAMMA)
    # 3 + .9*2 = 4.8;  2 + .9*4.8 = 6.32;  1 + .9*6.32 = 6.688
    expected = torch.tensor([[6.688, 6.688], [6.32, 6.32], [4.8, 4.8]])
    torch.testing.assert_close(q_ret, expected, rtol=1e-6, atol=1e-6)


def test_q_retrace_truncates_at_one_by_default_and_takes_rho_clip():
    big = torch.full_like(RHO, 5.0)
    torch.testing.assert_close(
        losses.q_retrace(REWARDS, DONES, Q_TAKEN, VALUES, big, GAMMA),
        losses.q_retrace(REWARDS, DONES, Q_TAKEN, VALUES, torch.ones_like(RHO), GAMMA),
    )
    # With rho_clip = 10 the weight 5 passes: env 0, Q2 = 4.8; carry = 5*(3.3)+1.2 = 17.7; Q1 = 2 + .9*17.7
    q_ret = losses.q_retrace(REWARDS, DONES, Q_TAKEN, VALUES, big, GAMMA, rho_clip=10.0)
    assert q_ret[1, 0].item() == pytest.approx(17.93, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_q_retrace_keeps_dtype_and_accepts_bool_dones(dtype):
    q_ret = losses.q_retrace(
        REWARDS.to(dtype), DONES.bool(), Q_TAKEN.to(dtype), VALUES.to(dtype), RHO.to(dtype), GAMMA
    )
    assert q_ret.dtype == dtype and q_ret.shape == (3, 2)


def _q_retrace_row_by_row(rewards, dones, q_taken, values, rho_taken, gamma, timeout_values=None):
    """Eq. (5) written the plain way, one row of the output at a time: q_retrace must give its bits."""
    not_done, rho_bar = 1.0 - dones.to(rewards.dtype), rho_taken.clamp(max=1.0)
    q_ret = torch.empty_like(rewards)
    next_target = values[-1]
    for t in reversed(range(rewards.shape[0])):
        q_ret[t] = rewards[t] + gamma * not_done[t] * next_target
        if timeout_values is not None:
            q_ret[t] += gamma * timeout_values[t]
        next_target = rho_bar[t] * (q_ret[t] - q_taken[t]) + values[t]
    return q_ret


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("timeouts", [False, True])
def test_q_retrace_gives_the_bits_of_the_row_by_row_recursion(dtype, timeouts):
    generator = torch.Generator().manual_seed(7)
    for T, N in [(1, 1), (3, 2), (20, 16), (5, 64)]:
        rewards, q_taken = (torch.randn(T, N, generator=generator, dtype=dtype) * 10 for _ in range(2))
        values = torch.randn(T + 1, N, generator=generator, dtype=dtype) * 10
        rho_taken = torch.rand(T, N, generator=generator, dtype=dtype) * 3
        dones = torch.rand(T, N, generator=generator) < 0.2
        timeout_values = (torch.randn(T, N, generator=generator, dtype=dtype) * (torch.rand(T, N, generator=generator) < 0.3)
                          if timeouts else None)
        expected = _q_retrace_row_by_row(rewards, dones, q_taken, values, rho_taken, 0.99, timeout_values)
        q_ret = losses.q_retrace(rewards, dones, q_taken, values, rho_taken, 0.99, timeout_values=timeout_values)
        assert q_ret.dtype == dtype and torch.equal(q_ret, expected), (T, N)


def test_q_retrace_rejects_bad_shapes():
    with pytest.raises(ValueError, match="T\\+1"):
        losses.q_retrace(REWARDS, DONES, Q_TAKEN, VALUES[:-1], RHO, GAMMA)
    with pytest.raises(ValueError, match="equal shapes"):
        losses.q_retrace(REWARDS, DONES[:2], Q_TAKEN, VALUES, RHO, GAMMA)


def _gain_grad(pi, q, values, q_ret, rho, actions, c):
    pi = pi.clone().requires_grad_(True)
    gain_truncated, gain_correction = losses.acer_policy_gain(pi, q, values, q_ret, rho, actions, c)
    (grad,) = torch.autograd.grad((gain_truncated + gain_correction).sum(), pi)
    return gain_truncated, gain_correction, grad


def test_acer_policy_gain_hand_worked():
    # π = (.25, .75), μ = (.5, .5) → ρ = (.5, 1.5); c = 1; a = 1; Q = (1, 2); V = Σπ Q = 1.75; Q^ret = 3.
    pi = torch.tensor([[[0.25, 0.75]]])
    mu = torch.tensor([[[0.5, 0.5]]])
    q = torch.tensor([[[1.0, 2.0]]])
    values = torch.tensor([[1.75]])
    q_ret = torch.tensor([[3.0]])
    actions = torch.tensor([[1]])
    rho = losses.importance_weights(pi, mu)
    gain_truncated, gain_correction, grad = _gain_grad(pi, q, values, q_ret, rho, actions, c=1.0)
    # truncated: min(1, 1.5)·(3 − 1.75) = 1.25 → gain 1.25·log .75, ∂/∂π_1 = 1.25/.75
    # correction: [1 − 1/ρ]_+ = (0, 1/3); π(Q − V) = (−.1875, .1875) → .0625·log .75, ∂/∂π_1 = .0625/.75
    assert gain_truncated.item() == pytest.approx(-0.3596025905647261, rel=1e-5)
    assert gain_correction.item() == pytest.approx(-0.017980129528236306, rel=1e-5)
    torch.testing.assert_close(grad, torch.tensor([[[0.0, 1.75]]]), rtol=1e-5, atol=1e-6)


def test_on_policy_removes_bias_correction():
    torch.manual_seed(0)
    pi = torch.softmax(torch.randn(4, 3, 5), -1)
    q = torch.randn(4, 3, 5)
    values = (pi * q).sum(-1)
    q_ret = torch.randn(4, 3)
    actions = torch.randint(0, 5, (4, 3))
    rho = losses.importance_weights(pi, pi, eps=0.0)
    for c in (1.0, 10.0, math.inf):
        gain_truncated, gain_correction, grad = _gain_grad(pi, q, values, q_ret, rho, actions, c)
        assert torch.count_nonzero(gain_correction) == 0
        log_pi_taken = torch.log(pi + losses.PROB_EPS).gather(-1, actions[..., None]).squeeze(-1)
        torch.testing.assert_close(gain_truncated, log_pi_taken * (q_ret - values))


def test_infinite_c_is_plain_importance_sampling():
    torch.manual_seed(1)
    pi = torch.softmax(torch.randn(4, 3, 5), -1)
    mu = torch.softmax(torch.randn(4, 3, 5), -1)
    q = torch.randn(4, 3, 5)
    values = (pi * q).sum(-1)
    q_ret = torch.randn(4, 3)
    actions = torch.randint(0, 5, (4, 3))
    rho = losses.importance_weights(pi, mu)
    gain_truncated, gain_correction, _ = _gain_grad(pi, q, values, q_ret, rho, actions, math.inf)
    assert torch.count_nonzero(gain_correction) == 0
    rho_taken = rho.gather(-1, actions[..., None]).squeeze(-1)
    log_pi_taken = torch.log(pi + losses.PROB_EPS).gather(-1, actions[..., None]).squeeze(-1)
    torch.testing.assert_close(gain_truncated, rho_taken * log_pi_taken * (q_ret - values))


def test_bias_correction_keeps_the_gradient_unbiased_in_expectation():
    # E_{a~μ}[ĝ^acer] = E_{a~π}[(Q(a) − V) ∇ log π(a)] when Q^ret = Q: summing the per-action
    # estimates weighted by μ must give the on-policy gradient exactly, whatever c is.
    torch.manual_seed(2)
    pi = torch.softmax(torch.randn(1, 1, 4), -1)
    mu = torch.softmax(torch.randn(1, 1, 4), -1)
    q = torch.randn(1, 1, 4)
    values = (pi * q).sum(-1)
    rho = losses.importance_weights(pi, mu, eps=0.0)
    on_policy = (pi * (q - values[..., None]) / (pi + losses.PROB_EPS)).squeeze()
    for c in (0.5, 1.0, 3.0):
        expected_grad = torch.zeros(4)
        for a in range(4):
            actions = torch.tensor([[a]])
            _, _, grad = _gain_grad(pi, q, values, q[..., a], rho, actions, c)
            expected_grad += mu[0, 0, a] * grad.squeeze()
        torch.testing.assert_close(expected_grad, on_policy, rtol=1e-4, atol=1e-5)


def test_trust_region_hand_worked():
    g = torch.tensor([1.0, 2.0])
    k = torch.tensor([1.0, 1.0])
    # kᵀg = 3 > δ = 1 → scale (3 − 1)/‖k‖² = 1 → z = g − k = (0, 1), and kᵀz = 1 = δ.
    z = losses.trust_region_adjust(g, k, 1.0)
    torch.testing.assert_close(z, torch.tensor([0.0, 1.0]))


def test_trust_region_leaves_g_unchanged_inside():
    g = torch.tensor([[0.2, 0.3], [-5.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [1.0, 2.0]])
    z = losses.trust_region_adjust(g, k, 1.0)
    assert torch.equal(z, g)  # kᵀg = 0.5 and −3, both ≤ δ


def test_trust_region_projects_onto_the_constraint():
    torch.manual_seed(3)
    g = torch.randn(64, 6) * 10
    k = torch.randn(64, 6)
    delta = 0.7
    z = losses.trust_region_adjust(g, k, delta)
    k_dot_g = (k * g).sum(-1)
    k_dot_z = (k * z).sum(-1)
    active = k_dot_g > delta
    assert active.any() and (~active).any()
    torch.testing.assert_close(k_dot_z[active], torch.full_like(k_dot_z[active], delta), rtol=1e-4, atol=1e-4)
    assert torch.equal(z[~active], g[~active])


def test_kl_grad_matches_autograd():
    torch.manual_seed(4)
    pi_avg = torch.softmax(torch.randn(3, 2, 6), -1)
    pi = torch.softmax(torch.randn(3, 2, 6), -1).requires_grad_(True)
    (autograd_k,) = torch.autograd.grad(losses.kl_divergence(pi_avg, pi).sum(), pi)
    torch.testing.assert_close(losses.kl_grad(pi_avg, pi.detach()), autograd_k)


def test_kl_of_identical_policies_is_zero():
    pi = torch.softmax(torch.randn(5, 4), -1)
    torch.testing.assert_close(losses.kl_divergence(pi, pi), torch.zeros(5), atol=1e-6, rtol=0)


DEGENERATE = [
    torch.tensor([1.0, 0.0, 0.0]),
    torch.tensor([0.0, 1.0, 0.0]),
    torch.tensor([1e-30, 1.0 - 2e-30, 1e-30]),
    torch.tensor([1 / 3, 1 / 3, 1 / 3]),
]


@pytest.mark.parametrize("c", [0.0, 1.0, 10.0, math.inf])
@pytest.mark.parametrize("pi_index", range(len(DEGENERATE)))
@pytest.mark.parametrize("mu_index", range(len(DEGENERATE)))
def test_no_nan_on_degenerate_policies(c, pi_index, mu_index):
    pi = DEGENERATE[pi_index].view(1, 1, 3)
    mu = DEGENERATE[mu_index].view(1, 1, 3)
    q = torch.tensor([[[1.0, -2.0, 3.0]]])
    values = (pi * q).sum(-1)
    actions = torch.tensor([[0]])
    rho = losses.importance_weights(pi, mu)
    rho_taken = rho.gather(-1, actions[..., None]).squeeze(-1)
    q_ret = losses.q_retrace(
        torch.ones(1, 1), torch.zeros(1, 1), q.gather(-1, actions[..., None]).squeeze(-1),
        torch.cat([values, values]), rho_taken, 0.99,
    )
    gain_truncated, gain_correction, grad = _gain_grad(pi, q, values, q_ret, rho, actions, c)
    k = losses.kl_grad(mu, pi)  # μ plays the average policy here
    z = losses.trust_region_adjust(grad, k, 1.0)
    for tensor in (q_ret, gain_truncated, gain_correction, grad, k, z, losses.entropy(pi), losses.kl_divergence(mu, pi)):
        assert torch.isfinite(tensor).all(), tensor


def test_acer_policy_gain_holds_rho_constant_even_when_given_with_a_graph():
    # Every factor but log π is a constant of the gradient (eq. 9): a ρ whose graph leads back to π
    # gives the same gradient, bit for bit, as a detached one.
    torch.manual_seed(0)
    pi0 = torch.softmax(torch.randn(2, 3, 4), -1)
    mu = torch.softmax(torch.randn(2, 3, 4) * 3, -1)  # far from π: many ρ > c
    q, q_ret = torch.randn(2, 3, 4), torch.randn(2, 3)
    actions = torch.randint(0, 4, (2, 3))
    values = (pi0 * q).sum(-1)

    def gradient(rho_with_graph: bool) -> torch.Tensor:
        pi = pi0.clone().requires_grad_(True)
        rho = losses.importance_weights(pi if rho_with_graph else pi.detach(), mu)
        gains = losses.acer_policy_gain(pi, q, values, q_ret, rho, actions, c=1.0)
        return torch.autograd.grad(sum(gain.sum() for gain in gains), pi)[0]

    torch.testing.assert_close(gradient(True), gradient(False), rtol=0, atol=0)

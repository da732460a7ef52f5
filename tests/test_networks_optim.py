"""Polyak averaging, the TF-style RMSProp, the schedule, and the update's trust region wiring."""

import pytest
import torch

from acer_sync.base.config import Config
from acer_sync.math.optim import RMSpropTF
from acer_sync.math.schedules import learning_rate
from acer_sync.nets.networks import polyak_update
from acer_sync.training.acer import ACER
from helpers import categorical_net, features_of, ff_batch


def test_polyak_moves_every_parameter_by_exactly_one_minus_alpha():
    online = categorical_net((1, 3), 2, "mlp", (4,))
    average = categorical_net((1, 3), 2, "mlp", (4,))
    with torch.no_grad():
        for p in online.parameters():
            p.fill_(1.0)
        for p in average.parameters():
            p.fill_(0.0)
    polyak_update(average, online, alpha=0.99)
    for p in average.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.01), rtol=0, atol=1e-7)
    polyak_update(average, online, alpha=0.99)
    for p in average.parameters():  # 0.99·0.01 + 0.01
        torch.testing.assert_close(p, torch.full_like(p, 0.0199), rtol=0, atol=1e-7)


def test_average_network_moves_during_training():
    torch.manual_seed(0)
    config = Config(env="test", nsteps=3, num_envs=2, hidden="8")
    model = categorical_net((1, 4), 3, "mlp", (8,))
    agent = ACER(model, config)
    before = [p.clone() for p in agent.average_model.parameters()]
    T, N = 3, 2
    batch = ff_batch(
        obs=torch.randn(T + 1, N, 1, 4),
        actions=torch.randint(0, 3, (T, N)),
        mu=torch.full((T, N, 3), 1 / 3),
        rewards=torch.randn(T, N),
        dones=torch.zeros(T, N),
    )
    stats = agent.update(batch, lr=1e-2)
    moved = [not torch.equal(a, b) for a, b in zip(before, agent.average_model.parameters())]
    assert all(moved)
    online_after = list(model.parameters())
    # θ_a = α θ_a(old) + (1 − α) θ(new), parameter by parameter.
    for old, new_avg, new_online in zip(before, agent.average_model.parameters(), online_after):
        torch.testing.assert_close(new_avg, 0.99 * old + 0.01 * new_online)
    assert all(torch.isfinite(v).all() for v in stats.values())
    assert stats["nonfinite"].item() == 0


@pytest.mark.parametrize("sync_free", [False, True], ids=["host-branch", "sync-free"])
def test_update_skips_nonfinite_gradients(sync_free):
    # Either way a non-finite update changes no parameter, no RMSProp v and no average parameter,
    # and is counted; the streak counts those in a row and a finite update ends it.
    config = Config(env="test", nsteps=2, num_envs=1, hidden="8")
    model = categorical_net((1, 4), 2, "mlp", (8,))
    agent = ACER(model, config, sync_free=sync_free)

    def batch(reward: float):
        return ff_batch(
            obs=torch.randn(3, 1, 1, 4),
            actions=torch.zeros(2, 1, dtype=torch.long),
            mu=torch.full((2, 1, 2), 0.5),
            rewards=torch.tensor([[reward], [0.0]]),
            dones=torch.zeros(2, 1),
        )

    agent.update(batch(1.0), lr=1e-2)  # one finite step first, so v and the average are not at their start
    state = [t.clone() for t in (*model.parameters(), *agent.average_model.parameters(),
                                 *(agent.optimizer.state[p]["square_avg"] for p in model.parameters()))]
    for streak in (1, 2):
        stats = agent.update(batch(float("nan")), lr=1e-2)
        assert stats["nonfinite"].item() == 1 and agent.nonfinite_updates == streak and agent.nonfinite_streak == streak
    after = (*model.parameters(), *agent.average_model.parameters(),
             *(agent.optimizer.state[p]["square_avg"] for p in model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(state, after))
    stats = agent.update(batch(1.0), lr=1e-2)
    assert stats["nonfinite"].item() == 0 and agent.nonfinite_updates == 2 and agent.nonfinite_streak == 0
    assert not torch.equal(state[0], next(model.parameters()))


def test_trust_region_shrinks_the_kl_step():
    # Identical start, same batch: the update with the trust region moves π less (in KL from the
    # average policy) than the update without it, when δ is small.
    def kl_after(trust_region: bool) -> float:
        torch.manual_seed(5)
        config = Config(env="test", nsteps=4, num_envs=4, hidden="16", trust_region=trust_region, delta=1e-3, ent_coef=0.0)
        model = categorical_net((1, 4), 3, "mlp", (16,))
        agent = ACER(model, config)
        g = torch.Generator().manual_seed(6)
        batch = ff_batch(
            obs=torch.randn(5, 4, 1, 4, generator=g),
            actions=torch.randint(0, 3, (4, 4), generator=g),
            mu=torch.full((4, 4, 3), 1 / 3),
            rewards=torch.randn(4, 4, generator=g) * 10,
            dones=torch.zeros(4, 4),
        )
        for _ in range(3):
            agent.update(batch, lr=1e-2)
        with torch.no_grad():
            flat = batch.obs[:-1].reshape(16, 1, 4)
            pi_avg = agent.average_model.policy_of(features_of(agent.average_model, flat))
            pi = model.policy_of(features_of(model, flat))
            return float((pi_avg * (pi_avg.log() - pi.log())).sum(-1).mean())

    assert kl_after(True) < kl_after(False)


def test_rmsprop_tf_hand_worked():
    # v = .9·1 + .1·2² = 1.3;  θ = 1 − .1·2/√(1.3 + 1e-5)
    param = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = RMSpropTF([param], lr=0.1, alpha=0.9, eps=1e-5)
    param.grad = torch.tensor([2.0])
    optimizer.step()
    assert param.item() == pytest.approx(0.8245890707947168, rel=1e-6)
    # v = .9·1.3 + .1·1² = 1.27;  θ −= .1·1/√(1.27 + 1e-5)
    param.grad = torch.tensor([1.0])
    optimizer.step()
    assert param.item() == pytest.approx(0.7358537692039988, rel=1e-6)


def test_learning_rate_schedules():
    assert learning_rate("linear", 7e-4, 0, 100) == pytest.approx(7e-4)
    assert learning_rate("linear", 7e-4, 50, 100) == pytest.approx(3.5e-4)
    assert learning_rate("linear", 7e-4, 150, 100) == 0.0
    assert learning_rate("constant", 7e-4, 90, 100) == 7e-4


def test_nature_cnn_shapes_and_uint8_input():
    model = categorical_net((4, 84, 84), 6, "cnn")
    pi, q = model(features_of(model, torch.zeros(2, 4, 84, 84, dtype=torch.uint8)))
    assert pi.shape == q.shape == (2, 6)
    torch.testing.assert_close(pi.sum(-1), torch.ones(2))


def test_atari_net_is_initialised_like_baselines():
    torch.manual_seed(0)
    model = categorical_net((4, 84, 84), 6, "cnn")
    first_conv = model.torso.convs[0].weight.flatten(1)  # [32, 256]: orthogonal rows of norm √2
    torch.testing.assert_close(first_conv @ first_conv.T, 2.0 * torch.eye(32), atol=1e-4, rtol=0)
    policy = model.head.pi.weight  # [6, 512]
    torch.testing.assert_close(policy @ policy.T, 1e-4 * torch.eye(6), atol=1e-8, rtol=0)
    assert all(not m.bias.detach().any() for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
    assert model.torso.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        pi, _ = model(features_of(model, torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)))
    assert float((pi - 1 / 6).abs().max()) < 0.01  # the policy starts near uniform

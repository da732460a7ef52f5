"""The policy's distribution behind one small interface: categorical (discrete) or diagonal Gaussian.

A distribution is described by its statistics φ, one tensor ``[..., stat_size]`` per state: the
probability vector π for :class:`Categorical`, the concatenated mean and log σ for
:class:`DiagGaussian`. The networks output φ, the Runner samples from it and stores it as the
behaviour policy μ, the buffer keeps it, the losses take log-densities and the KL from it, and the
trust region (Wang et al. 2017 eq. 12) acts on the gradient with respect to it.
"""

from __future__ import annotations

import numpy as np
import torch

from acer_sync.math import losses


class Categorical:
    """π(·|x) over ``n`` actions; φ is the probability vector ``[..., n]``; actions are int64 ``[...]``,
    0 to n-1, and the env's ``start`` more on their way to it (:meth:`env_actions`; ``Discrete(n, start)``)."""

    kind = "categorical"

    def __init__(self, n: int, start: int = 0):
        self.n = n
        self.start = start
        self.stat_size = n
        self.action_shape: tuple[int, ...] = ()
        self.action_dtype = np.dtype(np.int64)

    def sample(self, stats: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One action from each π: argmax(π / q), q ~ Exp(1) (the Gumbel-max trick in exponential
        form), as ``torch.multinomial(π, 1)`` draws it: the same actions from the same generator,
        without its checks of π. Those are device-side asserts on CUDA, where a NaN π broke the
        CUDA context (every later call failed, the final checkpoint's save too) instead of stopping
        the run as on the CPU; they also cost three reductions a step. A π with NaN gives an
        index here, and the callers check μ on the host (:class:`PolicyNotFinite`)."""
        q = torch.empty_like(stats).exponential_(1, generator=generator)
        return (stats / q).argmax(-1)

    def greedy(self, stats: torch.Tensor) -> torch.Tensor:
        return stats.argmax(-1)

    def log_prob(self, stats: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log π(a|x), with the probabilities' ``PROB_EPS`` as in the losses."""
        return torch.log(stats.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1) + losses.PROB_EPS)

    def entropy(self, stats: torch.Tensor) -> torch.Tensor:
        return losses.entropy(stats)

    def kl(self, stats_avg: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        return losses.kl_divergence(stats_avg, stats)

    def kl_grad(self, stats_avg: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        return losses.kl_grad(stats_avg, stats)

    def forced_stats(self, actions: np.ndarray) -> np.ndarray:
        """μ of actions played without the agent choosing them: one-hot on the action, ``[k, n]``."""
        return np.eye(self.n, dtype=np.float32)[actions]

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        return np.asarray(actions, dtype=np.int64) + self.start


class DiagGaussian:
    """π(·|x) = N(m, diag σ²) over ``R^d``; φ = [m, log σ], ``[..., 2d]``; actions are float32 ``[..., d]``.

    The sampled action, unclipped, is what is stored and trained on (its density is what μ and
    π describe); :meth:`env_actions` clips it to the Box bounds only on its way to the env, so
    the env sees the nearest valid action.

    :param dim: d, the action dimension.
    :param low: the Box's lower bounds, ``[d]``.
    :param high: the Box's upper bounds, ``[d]``.
    """

    kind = "gaussian"

    def __init__(self, dim: int, low, high):
        self.dim = dim
        self.stat_size = 2 * dim
        self.action_shape = (dim,)
        self.action_dtype = np.dtype(np.float32)
        self.low, self.high = float32_inside(low, high)

    def split(self, stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)``, each ``[..., d]``."""
        return stats[..., : self.dim], stats[..., self.dim :]

    def sample(self, stats: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = self.split(stats)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return mean + log_std.exp() * noise

    def greedy(self, stats: torch.Tensor) -> torch.Tensor:
        return self.split(stats)[0]

    def log_prob(self, stats: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(stats)
        return losses.gaussian_log_prob(mean, log_std, actions)

    def entropy(self, stats: torch.Tensor) -> torch.Tensor:
        return losses.gaussian_entropy(self.split(stats)[1])

    def kl(self, stats_avg: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        return losses.gaussian_kl(*self.split(stats_avg), *self.split(stats))

    def kl_grad(self, stats_avg: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        return losses.gaussian_kl_grad(*self.split(stats_avg), *self.split(stats))

    def forced_stats(self, actions: np.ndarray) -> np.ndarray:
        raise ValueError("continuous actions are never forced")

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(actions, dtype=np.float32), self.low, self.high)


def float32_inside(low, high) -> tuple[np.ndarray, np.ndarray]:
    """The Box ``[low, high]``'s bounds in float32, each rounded inwards where float32 cannot hold
    it (``float32(0.1)`` is above 0.1), so that an action clipped to them is inside a float64 Box
    as well as a float32 one (``Box.contains``)."""
    low64, high64 = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    low32, high32 = low64.astype(np.float32), high64.astype(np.float32)
    low32 = np.where(low32 < low64, np.nextafter(low32, np.float32(np.inf)), low32)
    high32 = np.where(high32 > high64, np.nextafter(high32, np.float32(-np.inf)), high32)
    return low32.astype(np.float32), high32.astype(np.float32)


Distribution = Categorical | DiagGaussian


def distribution_for(info) -> Distribution:
    """The distribution of an :class:`atari.envs.EnvInfo`'s action space."""
    if info.continuous:
        return DiagGaussian(info.n_actions, info.action_low, info.action_high)
    return Categorical(info.n_actions, info.action_start)


def distribution_of_spec(spec: dict) -> Distribution:
    """The distribution a network of this :meth:`spec` outputs, for the update (which never needs
    the Box bounds: it trains on the unclipped actions)."""
    n = int(spec["n_actions"])
    if spec["policy"] == "gaussian":
        return DiagGaussian(n, [-np.inf] * n, [np.inf] * n)
    return Categorical(n)

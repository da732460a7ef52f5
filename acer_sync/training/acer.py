"""One ACER update: the losses of Wang et al. 2017 on a batch, the trust region, and the step."""

from __future__ import annotations

import contextlib
import importlib
import math
import traceback
from typing import Callable, NamedTuple

import torch
from torch import nn

from acer_sync.base.config import Config
from acer_sync.base.log import log
from acer_sync.base.timing import PhaseTimer
from acer_sync.base.transfer import LaggedRead
from acer_sync.math import losses
from acer_sync.math.optim import RMSpropTF
from acer_sync.nets.distributions import distribution_of_spec
from acer_sync.nets.networks import Network, PolyakAverage, network_from_spec
from acer_sync.nets.precision import NetworkPasses, runs_in_bf16
from acer_sync.replay.buffer import Batch
from atari import parts


class PolicyTerms(NamedTuple):
    """What the two kinds of policy hand to the shared part of :meth:`ACER.update`."""

    stats: torch.Tensor  # φ_θ(x_t), [T, N, stat_size], differentiable in the network: ĝ^acer is taken there
    gain_truncated: torch.Tensor  # [T, N], functions of stats (every other factor detached)
    gain_correction: torch.Tensor  # [T, N]
    loss_critic: torch.Tensor  # scalar, differentiable in the network
    q_taken: torch.Tensor  # Q(x_t, a_t) or Q̃(x_t, a_t), [T, N], detached
    q_ret: torch.Tensor  # [T, N]
    rho_taken: torch.Tensor  # ρ_t(a_t), [T, N], for the statistics only; at most 1/PROB_EPS


LOG_RHO_LOGGED_MAX = -math.log(losses.PROB_EPS)  # log of the largest discrete ρ, 1/ε


def explained_variance(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 − Var[target − prediction] / Var[target]: 1 is perfect, 0 no better than a constant; NaN
    where the target is constant, as in Baselines (no prediction explains anything of it). Constant
    is all values equal: the variance of twenty 0.1s rounds to 6e-17, not 0, in float32."""
    var_target = target.var()
    undefined = torch.full_like(var_target, float("nan"))
    return torch.where(target.amax() > target.amin(), 1.0 - (target - prediction).var() / var_target, undefined)


#: Inductor's defaults of the settings :func:`compile_whole` gives.
INDUCTOR_DEFAULTS = {"fallback_random": False, "emulate_precision_casts": False, "loop_ordering_after_fusion": True}


def compile_whole(function: Callable, mode: str, model: nn.Module, precision: str) -> Callable:
    """``function``, a whole update of ``model`` (its passes, backward and the optimizer's step),
    under ``torch.compile(fullgraph=True)``, in ``mode`` ``graph`` also as a CUDA graph; the
    callable returned runs it with autograd's ops traced into the graph.

    Inductor's settings: ``fallback_random`` draws a Gaussian update's samples with torch's
    generator, as eager does (Inductor's own made a compiled run another trajectory than the eager
    one of its seed; the CUDA graph keeps them, replaying its own draws); ``emulate_precision_casts``
    rounds a bf16 net's fused intermediate values to bf16 as eager acting did, so π is μ on a fresh
    segment (kept in float32, an LSTM's gave π − μ up to 7e-4, and on-policy ρ ≠ 1). They are given
    to ``torch.compile`` once; the CUDA graph's mode excludes options, so there they are patched in
    at each call (Inductor compiles at the first). Before torch 2.13, ``loop_ordering_after_fusion``
    is off: its CUDA scheduler asserted that every node of a fused one could reorder its loops
    (``FusedSchedulerNode.reorder_loops_by_dep_pair``; 2.13 skips such a node), which failed the
    compile of the bf16 LSTM update on the lent H200 (torch 2.11), leaving it eager."""
    graph = mode == "graph"
    settings = {"fallback_random": not graph, "emulate_precision_casts": runs_in_bf16(model, precision)}
    if torch.__version__ < "2.13":
        settings["loop_ordering_after_fusion"] = False
    compiled = torch.compile(function, fullgraph=True, dynamic=False, mode="reduce-overhead" if graph else None,
                             options=None if graph else settings)
    # The CUDA graph's: those away from Inductor's defaults
    patched = {key: value for key, value in settings.items() if value != INDUCTOR_DEFAULTS[key]} if graph else {}
    inductor_config = importlib.import_module("torch._inductor.config") if patched else None  # a second to import

    def run(*args):
        with torch._dynamo.config.patch(trace_autograd_ops=True):  # autograd.grad and backward in the graph
            with inductor_config.patch(patched) if patched else contextlib.nullcontext():
                return compiled(*args)

    return run


#: The ``config.compile`` modes that compile the whole update (:meth:`ACER.update`).
COMPILED_UPDATES = ("update", "graph")


def release_frames(error: BaseException | None) -> None:
    """Drop the frames that ``error`` and the errors behind it hold: torch keeps a failed
    compile's error, and its frames would keep the run's envs alive to the end of the process."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def is_compile_error(error: BaseException) -> bool:
    """Whether ``error`` is what a failed ``torch.compile`` raises, before the compiled function
    has run (imported here: ``torch._inductor`` costs a second to import, and only a compiled run
    has it loaded)."""
    import torch._dynamo.exc
    import torch._inductor.exc

    return isinstance(error, (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError))

#: The statistics :meth:`ACER.update` returns, in the order progress.csv lists them.
UPDATE_STATS = (
    "loss_policy", "loss_f", "loss_bc", "loss_q", "entropy", "explained_variance", "grad_norm", "kl_avg",
    "rho_mean", "rho_clipped_frac", "avg_norm_k", "avg_norm_g", "avg_norm_k_dot_g", "avg_norm_adj",
    "tr_active_frac", "nonfinite",
)


class ACER:
    """The online network, the average network, the optimizer, and the update rule.

    One update serves every kind of policy and network: only how the gains and the critic's loss
    are formed differs between the distributions (:meth:`_categorical_terms`,
    :meth:`_gaussian_terms`, chosen once here); the networks, feed-forward or recurrent, are
    unrolled through their one interface (:mod:`acer_sync.nets.networks`) from the batch's stored
    state, and the trust region, the step and the Polyak average are shared. Both networks run
    their passes through :class:`acer_sync.nets.precision.NetworkPasses`, in ``config.precision``,
    and hand the math float32 results: everything after the heads is float32.

    :param model: the online actor-critic θ.
    :param config: the run's settings (gamma, c, trust region, coefficients, ...).
    :param timer: charges the Polyak update to the ``average_update`` phase (bench.py).
    :param compile_mode: the ``--compile`` mode (:func:`acer_sync.base.config.compile_mode`, which
        the Trainer's builder resolves for the run); None: ``config.compile``, with ``auto`` as ``off``.
    """

    def __init__(self, model: Network, config: Config, timer: PhaseTimer | None = None, sync_free: bool | None = None,
                 compile_mode: str | None = None):
        self.config = config
        #: The ``--compile`` mode this update runs in.
        self.compile_mode = compile_mode or ("off" if config.compile == "auto" else config.compile)
        self.timer = timer or PhaseTimer()
        self.model = model
        self.distribution = distribution_of_spec(model.spec())
        device = next(model.parameters()).device
        self.average_model = network_from_spec(model.spec()).to(device)
        self.average_model.load_state_dict(model.state_dict())
        # The average policy φ_θa is a fixed function, as SB3 keeps its target networks: in
        # evaluation mode a user's Dropout is off and a BatchNorm uses the running statistics that
        # the Polyak step copies from θ (training mode drew dropout noise into the trust region's KL).
        self.average_model.requires_grad_(False).eval()
        self.net = NetworkPasses(model, config.precision, device)
        self.average_net = NetworkPasses(self.average_model, config.precision, device)
        self.parameters = list(model.parameters())  # listed once (see PolyakAverage)
        self.bounded = model.parameter_bounds()  # projected back into their bounds after each step
        self.optimizer = RMSpropTF(self.parameters, lr=config.lr, alpha=config.rms_alpha, eps=config.rms_eps)
        self.optimizer.init_state()
        self.polyak = PolyakAverage(self.average_model, model)
        compiled = self.compile_mode in COMPILED_UPDATES
        #: Whether an update runs without a host read (see :meth:`update`).
        self.sync_free = (device.type == "cuda" or compiled) if sync_free is None else sync_free
        self.lr = torch.tensor(float(config.lr), device=device)  # the learning rate, on the device
        self._nonfinite_total = torch.zeros((), dtype=torch.int64, device=device)
        self._nonfinite_streak = torch.zeros((), dtype=torch.int64, device=device)  # non-finite updates in a row
        self._streak_read = LaggedRead(self._nonfinite_streak)
        #: True from the moment an update starts changing the weights until it has changed them all
        #: (θ, RMSProp's v, the average θa, the counters): an exception then (a memory error) leaves
        #: them partly stepped, and the Trainer does not save them. A compiled update counts from its
        #: call to its return, since Inductor orders its writes as it likes.
        self.weights_torn = False
        self._policy_terms = self._gaussian_terms if self.distribution.kind == "gaussian" else self._categorical_terms
        self.compiled = compiled
        self._update = self._update_eager
        if compiled:
            # Dynamo keeps the compiled update of every ACER built in this process under one code
            # object, guarded on each one's objects: the ninth (recompile_limit) failed with
            # FailOnRecompileLimitHit (acer_sync.train in a loop). The earlier ones' entries go; one
            # still alive compiles again at its next update.
            torch._dynamo.reset_code(ACER._update_eager.__code__)
            self._update = compile_whole(self._update_eager, self.compile_mode, model, config.precision)
        if self.compile_mode == "graph":
            self.mark_static_inputs()
            self.optimizer.register_load_state_dict_post_hook(lambda optimizer: self.mark_static_inputs())

    @torch.no_grad()
    def _keep_in_bounds(self) -> None:
        """Project the bounded parameters (log σ) back into their bounds after a step: at a bound
        the clamp passes the gradient, so the next step may move it back inside."""
        for parameter, low, high in self.bounded:
            parameter.clamp_(low, high)

    def mark_static_inputs(self) -> list[torch.Tensor]:
        """Mark the tensors the update changes in place, other than parameters, as static inputs
        of the CUDA graph: RMSProp's v, the average network's buffers, the learning rate and the
        counters. A CUDA graph replays at fixed addresses, and cudagraph trees skip the graph of a
        function that mutates an input they must copy ("mutated inputs"); parameters are static
        already. A checkpoint's optimizer state is new tensors, so loading one marks them again.
        Returns the tensors marked."""
        import torch._dynamo

        tensors = [state["square_avg"] for state in self.optimizer.state.values()]
        tensors += [*self.polyak.average_buffers, self.lr, self._nonfinite_total, self._nonfinite_streak]
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)  # unguarded: a new address re-records the graph
        return tensors

    @property
    def nonfinite_updates(self) -> int:
        """Non-finite updates (skipped) in the whole run; a host read."""
        return int(self._nonfinite_total)

    @nonfinite_updates.setter
    def nonfinite_updates(self, count: int) -> None:
        self._nonfinite_total.fill_(int(count))

    @property
    def nonfinite_streak(self) -> int:
        """Non-finite updates in a row, up to the last one; a host read."""
        return int(self._nonfinite_streak)

    @nonfinite_streak.setter
    def nonfinite_streak(self, count: int) -> None:
        self._nonfinite_streak.fill_(int(count))

    def recent_nonfinite_streak(self) -> int:
        """:attr:`nonfinite_streak` as of the newest update the device has finished, without
        waiting for it: on CUDA the value of the previous call's copy where it has landed (so it
        lags by the updates still queued, at least those since the previous call), elsewhere exact.
        The Trainer checks it once an iteration; a check that waited would stall the stream."""
        streak = self._streak_read.latest()
        self._streak_read.request()
        return int(streak)

    def _mark_weights_torn(self, torn: bool) -> None:
        """:attr:`weights_torn` in the eager update, around its writes; traced by torch.compile, nothing
        (:meth:`update` marks a compiled update's whole call)."""
        if not torch.compiler.is_compiling():
            self.weights_torn = torn

    def _categorical_terms(self, batch: Batch, features: torch.Tensor) -> PolicyTerms:
        """Eq. (10) with the Q head: Q^ret with ρ̄ = min(1, ρ), the correction summed over actions.

        ``features`` are the network's, unrolled over observations 0..T, ``[(T+1)·N, ...]``.
        """
        cfg = self.config
        T, N = batch.rewards.shape
        pi_all, q_all = self.net.heads(features)
        pi_all = pi_all.reshape(T + 1, N, -1)
        q_all = q_all.reshape(T + 1, N, -1)
        with torch.no_grad():
            values_all = (pi_all * q_all).sum(-1)  # V(x_t) for t = 0..T
        pi, q = pi_all[:-1], q_all[:-1]
        values = values_all[:-1]

        actions = batch.actions.unsqueeze(-1)
        q_taken = q.gather(-1, actions).squeeze(-1)
        rho = losses.importance_weights(pi.detach(), batch.mu)
        rho_taken = rho.gather(-1, actions).squeeze(-1)
        q_ret = losses.q_retrace(
            batch.rewards, batch.dones, q_taken.detach(), values_all, rho_taken, cfg.gamma,
            timeout_values=batch.timeout_values,
        )
        gain_truncated, gain_correction = losses.acer_policy_gain(pi, q, values, q_ret, rho, batch.actions, cfg.c)
        loss_q = 0.5 * (q_ret - q_taken).pow(2).mean()
        return PolicyTerms(pi, gain_truncated, gain_correction, loss_q, q_taken.detach(), q_ret, rho_taken)

    def _gaussian_terms(self, batch: Batch, features: torch.Tensor) -> PolicyTerms:
        """§5 and Algorithm 3: the SDN's Q̃ (eq. 13) with n samples u_i ~ π, Q^ret with
        ρ̄ = min{1, ρ^(1/d)}, Q^opc in the policy gradient, eq. (14) with one a' ~ π, and the
        critic's loss ½(Q^ret − Q̃)² + ½(V^target − V)²."""
        cfg, dist = self.config, self.distribution
        T, N = batch.rewards.shape
        n = cfg.sdn_samples
        stats_all = self.net.policy_of(features).reshape(T + 1, N, -1)
        values_all = self.net.value_of(features).reshape(T + 1, N)
        stats, values = stats_all[:-1], values_all[:-1]

        with torch.no_grad():
            # n samples u_i for the SDN's baseline and one a' for the bias correction, per step.
            drawn = dist.sample(stats.detach().unsqueeze(2).expand(T, N, n + 1, dist.stat_size))
        a_prime = drawn[:, :, n]
        candidates = torch.cat([batch.actions.unsqueeze(2), drawn], dim=2)  # [T, N, n+2, d]: a_t, u_1..u_n, a'
        advantage = self.net.advantage_of(features[: T * N], candidates.reshape(T * N, n + 2, -1)).reshape(T, N, n + 2)
        advantage_u = advantage[:, :, 1 : n + 1]
        q_taken = losses.sdn_q(values, advantage[:, :, 0], advantage_u)
        q_prime = losses.sdn_q(values, advantage[:, :, n + 1], advantage_u)

        log_pi_taken = dist.log_prob(stats, batch.actions)
        log_pi_prime = dist.log_prob(stats, a_prime)
        log_rho_taken = log_pi_taken.detach() - dist.log_prob(batch.mu, batch.actions)
        log_rho_prime = log_pi_prime.detach() - dist.log_prob(batch.mu, a_prime)

        rho_bar = losses.retrace_weight_continuous(log_rho_taken, dist.dim)
        values_target_all = values_all.detach()
        q_ret = losses.q_retrace(
            batch.rewards, batch.dones, q_taken.detach(), values_target_all, rho_bar, cfg.gamma,
            timeout_values=batch.timeout_values,
        )
        q_opc = losses.q_retrace(
            batch.rewards, batch.dones, q_taken.detach(), values_target_all, torch.ones_like(rho_bar), cfg.gamma,
            timeout_values=batch.timeout_values,
        )
        gain_truncated, gain_correction = losses.gaussian_policy_gain(
            log_pi_taken, log_pi_prime, log_rho_taken, log_rho_prime, q_opc, q_prime, values, cfg.c
        )
        v_target = losses.value_target(log_rho_taken, q_ret, q_taken, values)
        loss_critic = 0.5 * (q_ret - q_taken).pow(2).mean() + 0.5 * (v_target - values).pow(2).mean()
        return PolicyTerms(
            stats, gain_truncated, gain_correction, loss_critic, q_taken.detach(), q_ret,
            torch.exp(log_rho_taken.clamp(max=LOG_RHO_LOGGED_MAX)),  # a finite rho_mean, as discrete μ's ε gives
        )

    def update(self, batch: Batch, lr: float) -> dict[str, torch.Tensor]:
        """One gradient step on ``batch`` at learning rate ``lr``; returns detached statistics.

        The policy gradient is formed with respect to the policy's statistics φ (the probability
        vector π, or the Gaussian's mean and log σ; eq. 10 and 14), adjusted there by the trust
        region (eq. 12), and only then sent back through the network, so one backward pass
        serves the policy and the critic (eq. 6). If the gradient is not finite the step is
        skipped and ``nonfinite`` is 1.

        Sync-free (:attr:`sync_free`: on CUDA, and whenever the update is compiled), nothing in
        it reads the device from the host: the learning rate is a device tensor, a non-finite
        step is masked on the device (the parameters, RMSProp's v and the average keep their
        values), the counters of non-finite updates are device tensors, and the statistics stay
        there until a progress row reads them. Otherwise (the CPU's eager default, where a host
        read costs nothing) the finite check is a host branch, as the frozen reference has it
        (``tests/reference_acer.py``); both give the same bits. :attr:`compile_mode` ``update``
        runs it through ``torch.compile(fullgraph=True)``, ``graph`` also as a CUDA graph.
        """
        T, N = batch.actions.shape[:2]
        if parts.leading_shape(batch.obs, 2) != (T + 1, N) or batch.firsts.shape != (T + 1, N):
            raise ValueError(
                f"obs and firsts must be [T+1, N, ...] = {(T + 1, N)}, got {parts.leading_shape(batch.obs, 2)} "
                f"and {tuple(batch.firsts.shape)}"
            )
        self.lr.fill_(lr)
        if not self.compiled:
            return self._update_eager(batch, lr)
        try:
            self.weights_torn = True
            stats = self._update(batch, lr)
            self.weights_torn = False
            return stats
        except Exception as error:
            if not is_compile_error(error):
                raise
            self.weights_torn = False  # torch.compile failed before the update ran
            # torch.compile fails before the update runs (a graph it cannot capture, a user's torso,
            # or a code-generation bug such as Inductor's for bf16 on some CPUs): run it eagerly.
            first_line = next(iter(str(error).strip().splitlines()), "")[:160]
            log.warning(f"warning: --compile {self.compile_mode}: torch.compile failed ({type(error).__name__}: "
                        f"{first_line}); the update runs eagerly")
            self.compiled, self._update = False, self._update_eager
            release_frames(error)
            return self._update_eager(batch, lr)

    def _update_eager(self, batch: Batch, lr: float) -> dict[str, torch.Tensor]:
        cfg, dist = self.config, self.distribution
        T, N = batch.actions.shape[:2]
        features, _ = self.net.unroll(batch.obs, batch.firsts, batch.state)  # observations 0..T
        terms = self._policy_terms(batch, features)
        with torch.no_grad():
            # The average network unrolls from the same stored state, over observations 0..T−1.
            obs_avg = parts.map_parts(lambda obs: obs[:T], batch.obs)
            features_avg, _ = self.average_net.unroll(obs_avg, batch.firsts[:T], batch.state)
            stats_avg = self.average_net.policy_of(features_avg).reshape(T, N, -1)

        # ĝ^acer with respect to the statistics φ, one row per sample: the gradient stops at φ (the
        # network's output, not a fresh leaf: Dynamo in torch 2.11 cannot trace requires_grad_),
        # and the graph is kept for the backward pass through the network below.
        entropy = dist.entropy(terms.stats)
        objective = (terms.gain_truncated + terms.gain_correction + cfg.ent_coef * entropy).sum()
        (g,) = torch.autograd.grad(objective, terms.stats, retain_graph=True)
        stats_now = terms.stats.detach()
        k = dist.kl_grad(stats_avg, stats_now)
        z = losses.trust_region_adjust(g, k, cfg.delta) if cfg.trust_region else g

        loss_policy_surrogate = -(terms.stats * z).sum() / (T * N)
        loss = loss_policy_surrogate + cfg.q_coef * terms.loss_critic

        # Those that learn, at this update (a layer may be unfrozen during a run): a user's frozen
        # layer gets no gradient, and a compiled update that set a frozen parameter's grad failed at
        # its second call ("a gradient of size [1]"). Dynamo guards on requires_grad.
        trainable = [parameter for parameter in self.parameters if parameter.requires_grad]
        for parameter in trainable:  # the optimizer's zero_grad(set_to_none=True), which Dynamo does not trace
            parameter.grad = None
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm)
        finite = torch.isfinite(grad_norm) & torch.isfinite(loss)
        self._mark_weights_torn(True)
        if self.sync_free:
            self.optimizer.step_masked(finite, self.lr)
            self._keep_in_bounds()
            self.polyak.update(cfg.alpha, finite)
        elif bool(finite):
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self._keep_in_bounds()
            with self.timer("average_update"):
                self.polyak.update(cfg.alpha)
        self._nonfinite_total.add_(~finite)
        self._nonfinite_streak.copy_(torch.where(finite, 0, self._nonfinite_streak + 1))
        self._mark_weights_torn(False)

        with torch.no_grad():
            k_dot_g = (k * g).sum(-1)
            gain_truncated, gain_correction = terms.gain_truncated, terms.gain_correction
            return {
                "loss_policy": -(gain_truncated + gain_correction).mean(),
                "loss_f": -gain_truncated.mean(),
                "loss_bc": -gain_correction.mean(),
                "loss_q": terms.loss_critic.detach(),
                "entropy": entropy.mean(),
                "explained_variance": explained_variance(terms.q_taken, terms.q_ret),
                "grad_norm": grad_norm,
                "kl_avg": dist.kl(stats_avg, stats_now).mean(),
                "rho_mean": terms.rho_taken.mean(),
                "rho_clipped_frac": (terms.rho_taken > cfg.c).float().mean(),
                "avg_norm_k": k.norm(dim=-1).mean(),
                "avg_norm_g": g.norm(dim=-1).mean(),
                "avg_norm_k_dot_g": k_dot_g.abs().mean(),
                "avg_norm_adj": (g - z).norm(dim=-1).mean(),
                "tr_active_frac": (k_dot_g > cfg.delta).float().mean() * cfg.trust_region,  # no constraint, none active
                "nonfinite": (~finite).float(),
            }

"""The sync-free update compiles whole (issue 35): ``torch.compile(fullgraph=True)`` captures
:meth:`ACER.update`'s body, on- and off-policy, discrete and continuous, feed-forward and
recurrent, with no graph break; ``--compile update`` trains with it and agrees with eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

from acer_sync.base.config import AUTO_COMPILE_STEPS, Config, build_config, compile_mode
from acer_sync.base.transfer import LaggedRead
from acer_sync.replay.buffer import Batch
from acer_sync.training.acer import ACER
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import categorical_net, gaussian_net, random_batch, recurrent_net, requires_cuda

T, N = 4, 3


def make_batch(gaussian: bool, state, seed: int, on_policy_model=None) -> Batch:
    fields = random_batch(T, N, (1, 4), 2 if gaussian else 3, gaussian, seed=seed, timeout_values=torch.zeros(T, N))
    firsts = torch.zeros(T + 1, N, dtype=torch.bool)
    firsts[2, 1] = True  # an episode starts inside the segment
    batch = Batch(**fields, firsts=firsts, state=state)
    if on_policy_model is not None:  # μ = π: the on-policy update
        with torch.no_grad():
            features, _ = on_policy_model.unroll(batch.obs[:T], firsts[:T], state)
            batch = batch._replace(mu=on_policy_model.policy_of(features).reshape(T, N, -1))
    return batch


CASES = {
    "categorical-mlp": (lambda: categorical_net((1, 4), 3, "mlp", (16,)), False),
    "categorical-lstm": (lambda: recurrent_net((1, 4), 3, "lstm", (16,), lstm_size=8), False),
    "gaussian-mlp": (lambda: gaussian_net((1, 4), 2, (16,), [0.3, 0.3], normalize_obs=True), True),
    "gaussian-lstm": (lambda: gaussian_net((1, 4), 2, (16,), [0.3, 0.3], arch="lstm", lstm_size=8), True),
}


def config_for(gaussian: bool, **settings) -> Config:
    return build_config(False, dict(env="test", nsteps=T, num_envs=N, hidden="16", **settings), continuous=gaussian)


@pytest.mark.parametrize("case", list(CASES))
def test_the_whole_update_is_one_graph_on_and_off_policy(case):
    make_model, gaussian = CASES[case]
    torch.manual_seed(0)
    model = make_model()
    agent = ACER(model, config_for(gaussian), sync_free=True)
    state = tuple(torch.randn(N, *shape) * 0.1 for shape in model.state_shapes.values())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    # aot_eager: Dynamo's capture and AOTAutograd, without Inductor's code generation (fullgraph
    # raises at the first graph break); --compile update uses Inductor (the next test).
    compiled = torch.compile(agent._update_eager, fullgraph=True, backend="aot_eager", dynamic=False)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        for on_policy in (True, False):
            batch = make_batch(gaussian, state, seed=1 + on_policy, on_policy_model=model if on_policy else None)
            stats = compiled(batch, 1e-3)
            assert all(torch.isfinite(value).all() for value in stats.values()), stats
            if on_policy and not gaussian:
                assert stats["rho_mean"].item() == pytest.approx(1.0, abs=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph for both, no recompile
    assert not agent.weights_torn  # traced, the eager update's marks are nothing


def test_compile_update_trains_and_agrees_with_eager():
    make_model, gaussian = CASES["categorical-mlp"]
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = ACER(model, config_for(gaussian, compile="update"))
    eager = ACER(twin, config_for(gaussian))
    assert compiled.sync_free and compiled.compiled and not eager.compiled
    for seed in range(3):
        batch = make_batch(gaussian, (), seed)
        compiled_stats, eager_stats = compiled.update(batch, 1e-2), eager.update(batch, 1e-2)
        torch.testing.assert_close(compiled_stats["loss_q"], eager_stats["loss_q"], rtol=1e-4, atol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert not torch.equal(next(model.parameters()), next(copy.deepcopy(make_model()).parameters()))
    assert compiled.nonfinite_updates == 0
    assert not compiled.weights_torn and not eager.weights_torn


def test_an_update_that_raises_while_it_changes_the_weights_is_marked_torn(monkeypatch):
    # The Trainer then keeps the last checkpoint: eager, from the optimizer's step to the counters;
    # compiled, the whole call (Inductor orders the writes). A forward pass that raises is not torn.
    make_model, gaussian = CASES["categorical-mlp"]
    batch = make_batch(gaussian, (), seed=0)
    eager = ACER(make_model(), config_for(gaussian))
    eager.update(batch, 1e-2)
    assert not eager.weights_torn

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(eager.polyak, "update", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        eager.update(batch, 1e-2)
    assert eager.weights_torn
    forward = ACER(make_model(), config_for(gaussian))
    monkeypatch.setattr(forward.net, "unroll", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        forward.update(batch, 1e-2)
    assert not forward.weights_torn
    compiled = ACER(make_model(), config_for(gaussian, compile="update"))
    monkeypatch.setattr(compiled, "_update", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        compiled.update(batch, 1e-2)
    assert compiled.weights_torn


def test_a_compiled_gaussian_update_with_a_frozen_layer_draws_as_eager_and_leaves_the_layer_alone():
    # Inductor drew the Gaussian's samples from a generator of its own (loss_q 1.2788 against
    # eager's 1.3065 after a few updates: one seed, two runs), and the masked step took the None
    # gradient of a frozen parameter (TypeError: expected Tensor ... got NoneType).
    make_model, gaussian = CASES["gaussian-mlp"]
    torch.manual_seed(0)
    model = make_model()
    frozen = model.head.mean_mlp.body[1].weight  # a pretrained layer, say
    frozen.requires_grad_(False)
    before = frozen.clone()
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = ACER(model, config_for(gaussian, compile="update"))
    eager = ACER(twin, config_for(gaussian))
    for seed in range(3):
        batch = make_batch(gaussian, (), seed)
        torch.manual_seed(10 + seed)
        compiled_stats = compiled.update(batch, 1e-2)
        torch.manual_seed(10 + seed)
        eager_stats = eager.update(batch, 1e-2)
        torch.testing.assert_close(compiled_stats["loss_q"], eager_stats["loss_q"], rtol=1e-4, atol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.equal(frozen, before) and compiled.nonfinite_updates == 0


def test_a_layer_unfrozen_during_a_run_is_clipped_and_its_gradient_not_piled_up():
    # The layers that learn were listed once, at the start: one unfrozen later was neither reset
    # to no gradient before each backward nor clipped, and its gradients piled up across updates.
    make_model, gaussian = CASES["categorical-mlp"]
    torch.manual_seed(0)
    model = make_model()
    layer = next(model.parameters())
    layer.requires_grad_(False)
    agent = ACER(model, config_for(gaussian, max_grad_norm=1e-3))
    layer.requires_grad_(True)
    for seed in range(3):
        agent.update(make_batch(gaussian, (), seed), 1e-2)
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
        assert layer.grad is not None and total.item() <= 1e-3 * (1 + 1e-5)


@pytest.mark.parametrize("sync_free", [False, True])
def test_a_layer_frozen_during_a_run_stays_where_it_was(sync_free):
    # Its last gradient stayed on it, and RMSProp applied it again at every update.
    make_model, gaussian = CASES["categorical-mlp"]
    torch.manual_seed(0)
    model = make_model()
    agent = ACER(model, config_for(gaussian), sync_free=sync_free)
    agent.update(make_batch(gaussian, (), 0), 1e-2)
    layer = next(model.parameters())
    layer.requires_grad_(False)
    frozen = layer.detach().clone()
    for seed in (1, 2):
        agent.update(make_batch(gaussian, (), seed), 1e-2)
    assert torch.equal(layer, frozen)


#: torch 2.11 (the lent GPU machine's image) ignores emulate_precision_casts in its C++ code: a
#: bf16 value stored by one fused node is read by the next without its round trip through bf16
#: (pytorch#185337, which the pinned 2.13 honours). tools/torch_check.sh runs this test under 2.11,
#: where the CPU case fails, as expected. 2.11's Triton code reads the setting: the CUDA cases
#: check it on the GPU, under its torch.
CPU_CODEGEN_IGNORES_PRECISION_CASTS = torch.__version__ < "2.13"  # TorchVersion compares as versions, as acer.compile_whole does


@pytest.mark.parametrize("device, mode", [
    pytest.param("cpu", "update", marks=pytest.mark.xfail(
        CPU_CODEGEN_IGNORES_PRECISION_CASTS, strict=True, reason="torch before 2.13 ignores emulate_precision_casts on the CPU")),
    pytest.param("cuda", "update", marks=requires_cuda),
    pytest.param("cuda", "graph", marks=requires_cuda),
])
def test_a_compiled_bf16_recurrent_update_sees_the_policy_that_acted_on_a_fresh_segment(device, mode):
    # Inductor kept a bf16 LSTM's fused intermediate values in float32, where eager acting
    # rounds each to bf16: the compiled update's π differed from the stored μ by up to 7e-4, so
    # on-policy ρ was not 1 and the bias correction did not vanish. On CUDA (Triton's code, the
    # GPU report runs it), also replayed as a CUDA graph, where the setting is patched in at each call.
    from acer_sync.nets.build import build_model
    from acer_sync.nets.precision import NetworkPasses

    torch.manual_seed(0)
    config = config_for(False, torso="user_torsos:SmallTorso", network="lstm", lstm_size=32, precision="bf16", compile=mode,
                        device=device)
    model = build_model(env_info("CartPole-v1"), config)
    with torch.no_grad():
        model.head.pi.weight.mul_(300)  # a sharp policy: small probabilities, where rounding shows in ρ
    batch = make_batch(False, model.initial_state(N), seed=0)
    batch = batch._replace(obs=batch.obs.reshape(T + 1, N, 4), actions=batch.actions % 2)
    model.to(device)
    batch = batch._replace(**{name: getattr(batch, name).to(device) for name in
                              ("obs", "firsts", "actions", "rewards", "dones", "timeout_values")},
                           state=tuple(part.to(device) for part in batch.state))
    acting = NetworkPasses(model, "bf16", torch.device(device))
    with torch.no_grad():  # μ as the Actor stores it: one step at a time, eager
        state, mu = batch.state, []
        for t in range(T):
            features, state = acting.step(batch.obs[t], state, batch.firsts[t])
            mu.append(acting.policy_of(features))
    batch = batch._replace(mu=torch.stack(mu))
    torch._dynamo.reset()
    agent = ACER(model, config)
    # At learning rate 0 π stays the policy that acted (the average network too): as a CUDA graph
    # the first call warms up, the second records, the third replays the recording.
    for _ in range(3 if mode == "graph" else 1):
        stats = agent.update(batch, 0.0)
    assert agent.compiled
    # 0.99990 before; what is left (2e-6 here) is the fused softmax's own rounding, on a sharp policy's small probabilities
    assert stats["rho_mean"].item() == pytest.approx(1.0, abs=1e-5)


def test_a_skipped_sync_free_update_leaves_the_average_networks_buffers_as_eager_does():
    # The masked Polyak step copied the online normalizer's statistics into the average network
    # before it looked at finite: after a skipped update the two paths' averages differed.
    from acer_sync.nets.networks import PolyakAverage

    torch.manual_seed(0)
    online = CASES["gaussian-mlp"][0]()
    average = copy.deepcopy(online)
    with torch.no_grad():
        for buffer in online.normalizer.buffers():  # the running statistics, which acting moves
            buffer.add_(1.0)
    before = [buffer.clone() for buffer in average.buffers()]
    assert any(not torch.equal(a, b) for a, b in zip(online.buffers(), average.buffers()))
    PolyakAverage(average, online).update(0.99, torch.tensor(False))
    assert all(torch.equal(now, then) for now, then in zip(average.buffers(), before))
    PolyakAverage(average, online).update(0.99, torch.tensor(True))
    assert all(torch.equal(a, b) for a, b in zip(average.buffers(), online.buffers()))


def test_compiled_updates_of_many_runs_in_one_process_do_not_pile_up_to_dynamos_limit():
    # Each ACER's compiled update stayed cached under the one code object, guarded on its own
    # objects: the ninth run in a process (recompile_limit, here lowered to 1) failed with
    # FailOnRecompileLimitHit.
    make_model, gaussian = CASES["categorical-mlp"]
    with torch._dynamo.config.patch(recompile_limit=1):
        for seed in range(2):
            torch.manual_seed(seed)
            agent = ACER(make_model(), config_for(gaussian, compile="update"))
            agent.update(make_batch(gaussian, (), seed), 1e-2)
            assert agent.compiled


def test_a_bool_compile_setting_of_an_older_run_still_means_what_it_did():
    assert Config(compile=True).compile == "network" and Config(compile=False).compile == "off"


def test_compile_auto_compiles_the_update_of_a_long_run_where_it_wins():
    # The default: the update compiled for a run of 1M steps or more (the compile is then under 1%
    # of it), except bf16 on a CPU; an explicit mode is kept.
    long = {"env": "CartPole-v1", "total_timesteps": AUTO_COMPILE_STEPS}
    assert Config().compile == "auto"
    assert compile_mode(build_config(False, long), "cpu") == compile_mode(build_config(False, long), "cuda") == "update"
    assert compile_mode(build_config(False, {**long, "total_timesteps": AUTO_COMPILE_STEPS - 1}), "cpu") == "off"
    assert compile_mode(build_config(False, {**long, "precision": "bf16"}), "cpu") == "off"
    # a built-in MLP stays fp32 under --precision bf16: its run compiles as an fp32 run does
    assert compile_mode(build_config(False, {**long, "precision": "bf16"}), "cpu", net_in_bf16=False) == "update"
    assert compile_mode(build_config(False, {**long, "precision": "bf16"}), "cuda") == "update"
    assert compile_mode(build_config(False, {**long, "compile": "off"}), "cpu") == "off"
    assert compile_mode(build_config(False, {"env": "CartPole-v1", "compile": "network"}), "cpu") == "network"
    # The presets' own lengths: Atari (10M) and MuJoCo (1M) compile, the classic preset (200k) not.
    assert compile_mode(build_config(True, {"env": "PongNoFrameskip-v4"}), "cpu") == "update"
    assert compile_mode(build_config(False, {"env": "HalfCheetah-v5"}, continuous=True), "cpu") == "update"
    assert compile_mode(build_config(False, {"env": "CartPole-v1"}), "cpu") == "off"
    # An update built on its own has no run to size: auto is eager there.
    assert ACER(CASES["categorical-mlp"][0](), Config()).compile_mode == "off"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_long_run_under_compile_auto_builds_a_compiled_update_and_says_so(tmp_path, caplog, precision):
    # bf16: the MLP stays fp32, and its run compiles as an fp32 run does (it stayed eager)
    config = build_config(False, {"env": "CartPole-v1", "num_envs": 2, "vec_env": "sync", "hidden": "8",
                                  "total_timesteps": AUTO_COMPILE_STEPS, "eval_every": 0, "precision": precision})
    with caplog.at_level("INFO", logger="acer_sync"):
        trainer = build_trainer(config, env_info(config.env), tmp_path, builtin=False)  # compiles at the first update
    try:
        assert trainer.agent.compile_mode == "update" and trainer.agent.compiled and trainer.agent.sync_free
        assert "--compile auto: the update compiles (a run of 1,000,000 steps)" in caplog.text
    finally:
        trainer.close()


@requires_cuda
@pytest.mark.parametrize("mode", ["off", "update", "graph"])
def test_cuda_update_is_sync_free_and_agrees_with_the_cpus(mode):
    # On CUDA the update never reads the device from the host, in every mode; compiled (and as a
    # CUDA graph) it agrees with the eager CPU update to float tolerance.
    make_model, gaussian = CASES["categorical-mlp"]
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    on_cuda = ACER(model.cuda(), config_for(gaussian, compile=mode, device="cuda"))
    on_cpu = ACER(twin, config_for(gaussian))
    assert on_cuda.sync_free
    for seed in range(4):
        batch = make_batch(gaussian, (), seed)
        cuda_batch = batch._replace(**{name: getattr(batch, name).cuda() for name in
                                       ("obs", "firsts", "actions", "mu", "rewards", "dones", "timeout_values")})
        # From the third update on (the first compile and, for a CUDA graph, its warm-up and
        # recording are behind), any host read in the update raises.
        torch.cuda.set_sync_debug_mode("error" if seed >= 2 else "default")
        try:
            on_cuda.update(cuda_batch, 1e-2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        on_cpu.update(batch, 1e-2)
    # Compiled where asked: a failed compile falls back to the eager update with a warning, which
    # would leave these timings eager unnoticed (torch 2.11's Dynamo refused requires_grad_).
    assert on_cuda.compiled == (mode != "off")
    if mode == "graph":  # and replayed as CUDA graphs, not skipped (a mutated input that is not static)
        assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-3, atol=1e-4)


def test_the_trainers_check_of_the_non_finite_streak_is_exact_off_cuda():
    make_model, gaussian = CASES["categorical-mlp"]
    agent = ACER(make_model(), config_for(gaussian))
    for streak in (3, 0, 7):
        agent._nonfinite_streak.fill_(streak)
        assert agent.recent_nonfinite_streak() == streak == agent.nonfinite_streak


@requires_cuda
def test_cuda_the_non_finite_streak_is_checked_without_waiting_for_the_updates():
    # The Trainer checks the streak once an iteration; on CUDA it reads the newest copy that has
    # landed in pinned memory, so a busy stream is never waited for.
    streak = torch.zeros((), dtype=torch.int64, device="cuda")
    read = LaggedRead(streak)
    assert read.latest() == 0  # nothing copied yet: this first read waits, once
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda._sleep(10**8)  # the stream busy for tens of milliseconds
        streak.add_(5)
        read.request()
        while_busy = read.latest()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert while_busy == 0 and read.latest() == 5


def test_the_cuda_graph_mode_marks_what_the_update_changes_in_place_as_static_also_after_a_load():
    # A CUDA graph replays at fixed addresses, and cudagraph trees skip the graph of a function
    # that mutates an input they would copy: RMSProp's v, the average's buffers (a normalizer's
    # statistics here) and the counters must be static inputs, as parameters are by themselves.
    from torch._dynamo.utils import get_static_address_type

    from acer_sync.nets.networks import buffer_slots, read_slots

    make_model, gaussian = CASES["gaussian-mlp"]
    graphed = ACER(make_model(), config_for(gaussian, compile="graph"))
    buffers = read_slots(buffer_slots(graphed.average_model))  # not the spec's constants, which nothing changes
    assert buffers  # the observation normalizer's
    marked = graphed.mark_static_inputs()
    assert len(marked) == len(graphed.parameters) + len(buffers) + 3
    assert all(get_static_address_type(tensor) is not None for tensor in marked)
    # A checkpoint's optimizer state is new tensors: loading it marks them.
    before = [state["square_avg"] for state in graphed.optimizer.state.values()]
    graphed.optimizer.load_state_dict(copy.deepcopy(graphed.optimizer.state_dict()))
    after = [state["square_avg"] for state in graphed.optimizer.state.values()]
    assert all(new is not old for new, old in zip(after, before))
    assert all(get_static_address_type(tensor) == "unguarded" for tensor in after)
    eager = ACER(make_model(), config_for(gaussian))
    assert all(get_static_address_type(state["square_avg"]) is None for state in eager.optimizer.state.values())


def test_a_compile_that_fails_falls_back_to_the_eager_update_with_one_warning(monkeypatch, caplog):
    # A graph Dynamo cannot capture, a user's torso, or a code-generation bug (Inductor's for bf16 on
    # some CPUs): the run goes on with the eager update, saying so once.
    def failing_compile(function, **kwargs):
        def compiled(*args):
            raise torch._dynamo.exc.TorchDynamoException("backend failed to compile\nsecond line")
        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    make_model, gaussian = CASES["categorical-mlp"]
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    agent, eager = ACER(model, config_for(gaussian, compile="update")), ACER(twin, config_for(gaussian))
    with caplog.at_level("WARNING", logger="acer_sync"):
        for seed in range(2):
            batch = make_batch(gaussian, (), seed)
            agent.update(batch, 1e-2)
            eager.update(batch, 1e-2)
    warnings = [record.getMessage() for record in caplog.records if "torch.compile failed" in record.getMessage()]
    assert warnings == ["warning: --compile update: torch.compile failed (TorchDynamoException: backend failed to compile); "
                        "the update runs eagerly"]
    assert not agent.compiled and not agent.weights_torn
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))

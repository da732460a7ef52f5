"""The acting path without round trips (issue 35): the frame stack kept on the device, only the
newest frames uploaded, actions and μ back in one copy. On CUDA it is the default; here it runs on
the CPU against the numpy path it replaces, which it must equal exactly."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config
from acer_sync.nets.build import build_model
from acer_sync.rollout.actor import Actor, DeviceFrameStack
from atari import parts
from atari.envs import VecEnv, env_info
from atari.stacking import FrameStacker
from helpers import ROOT, assert_segments_equal, breakout_with_an_lstm, requires_cuda


@pytest.mark.parametrize("graphed", [False, True], ids=["eager-push", "graphed-push"])
@pytest.mark.parametrize("layout", [((6, 7), np.dtype(np.uint8)), {"camera": ((3, 5, 5), np.dtype(np.uint8)),
                                                                    "switch": ((2,), np.dtype(np.float32))}])
@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_the_device_stack_holds_what_the_numpy_stack_holds(where, layout, graphed):
    # Staged frames pushed once: a push with nothing staged (acting twice on one observation)
    # leaves the stack as it is, whether the host reads the staged flag or the device (a graph's push).
    # On CUDA the staging buffer is pinned, its upload does not wait, and the graphed push is
    # replayed from a CUDA graph captured before anything was staged (as acting's is).
    rng = np.random.default_rng(0)
    N, stack = 3, 4
    host, device = FrameStacker(N, stack, layout), DeviceFrameStack(N, stack, layout, torch.device(where))
    replay = lambda: device.push(graphed=graphed)  # noqa: E731
    if where == "cuda" and graphed:
        side = torch.cuda.Stream()  # the warm-up, as torch asks before a capture: nothing staged, nothing pushed
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            device.push(graphed=True)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            device.push(graphed=True)
        replay = captured.replay
        assert not any(part.any() for part in parts.parts_of(device.stacked))

    def frames():
        return parts.map_parts(lambda part: (rng.integers(1, 255, (N, *part[0]))).astype(part[1]), layout) \
            if isinstance(layout, dict) else rng.integers(1, 255, (N, *layout[0])).astype(layout[1])

    def push_staged():
        device.upload()
        replay()
        if where == "cuda":
            torch.cuda.current_stream().synchronize()  # the upload's copy has finished
        device.pushed()

    first = frames()
    host.reset(first)
    device.reset(first)
    for step in range(9):
        push_staged()
        for expected, got in zip(parts.parts_of(host.stacked), parts.parts_of(device.stacked), strict=True):
            assert np.array_equal(got.cpu().numpy(), expected), step
        if step % 3 == 2:
            push_staged()
            for expected, got in zip(parts.parts_of(host.stacked), parts.parts_of(device.stacked), strict=True):
                assert np.array_equal(got.cpu().numpy(), expected), step
        starts = rng.random(N) < 0.3
        new = frames()
        host.push(new, starts)
        device.stage(new, starts)
    for expected, got in zip(parts.parts_of(host.stacked), parts.parts_of(device.current()), strict=True):
        assert np.array_equal(got.cpu().numpy(), expected)
    assert not device.pending


def test_frames_observed_twice_before_acting_are_both_stacked():
    # Staged frames not yet pushed are pushed before the next ones are staged: a reset then two
    # observations without acting leave what the numpy stack holds.
    info = env_info("PongNoFrameskip-v4")
    model = build_model(info, build_config(False, dict(env="PongNoFrameskip-v4")))
    host, device = (Actor(model, info, 2, torch.device("cpu"), device_stack=flag) for flag in (False, True))
    none = np.zeros(2, bool)
    for actor in (host, device):
        actor.reset(np.full((2, 84, 84), 1, np.uint8))
        actor.observe(np.full((2, 84, 84), 2, np.uint8), none, none, none)
        actor.observe(np.full((2, 84, 84), 3, np.uint8), np.array([True, False]), none, none)
    np.testing.assert_array_equal(device.observation.numpy(), host.observation)
    assert host.observation[1, :, 0, 0].tolist() == [0, 1, 2, 3] and host.observation[0, :, 0, 0].tolist() == [0, 0, 0, 3]


def test_a_step_that_raises_after_the_push_leaves_nothing_staged(monkeypatch):
    # The push comes first in acting's step: a network that raises after it (a torso's error) has
    # its frames on the stack, and a later act() does not push them again.
    info = env_info("PongNoFrameskip-v4")
    model = build_model(info, build_config(False, dict(env="PongNoFrameskip-v4")))
    actor = Actor(model, info, 2, torch.device("cpu"), device_stack=True)
    actor.reset(np.full((2, 84, 84), 1, np.uint8))

    def broken(obs, first, state):
        raise RuntimeError("a torso's error")

    monkeypatch.setattr(actor, "_choose", broken)
    with pytest.raises(RuntimeError, match="a torso's error"):
        actor.act()
    assert not actor.stacker.pending and actor.observation[0, :, 0, 0].tolist() == [0, 0, 0, 1]


def test_a_runner_acting_through_the_device_stacks_graph_step_collects_the_numpy_runners_segments():
    # The whole collection on Breakout (frame stacks of 4 cleared at lost lives, the forced FIRE
    # after them, an LSTM state carried into each segment): the device stack pushed inside the
    # graph's static-tensor step (CUDA's path, run eagerly here) against the numpy stack, bit for bit.
    from acer_sync.rollout.runner import Runner
    from atari.episodes import EpisodeTracker

    info, model, fields = breakout_with_an_lstm()
    runs, trackers = [], []
    for device_stack in (False, True):
        env = VecEnv(info, 2, "ale")
        generator = torch.Generator().manual_seed(3)
        tracker = EpisodeTracker(2, True, True)
        runner = Runner(env, model, torch.device("cpu"), 20, tracker, fields, generator=generator)
        if device_stack:
            runner.actor = runner.actors[0] = Actor(model, info, 2, torch.device("cpu"), generator=generator,
                                                    update_normalizer=True, device_stack=True, graph=True)
        runner.reset(seed=0)
        runs.append([runner.run() for _ in range(8)])
        trackers.append(tracker)
        env.close()
    for index, (numpy_segment, device_segment) in enumerate(zip(*runs, strict=True)):
        assert_segments_equal(numpy_segment, device_segment, where=index)
    dones = np.concatenate([segment.dones for segment in runs[0]])
    assert dones.any() and trackers[0].counted() == trackers[1].counted()  # lost lives cleared the stacks


@requires_cuda
def test_cuda_a_runner_acting_through_the_device_stack_collects_the_numpy_stacks_segments():
    # On CUDA: the device stack (pinned staging, one upload a step, the push on the GPU, actions
    # and mu back in one pinned copy) against the numpy stack uploaded whole, both acting eagerly
    # with one network and one generator seed: the same inputs through the same kernels, so the
    # same segments bit for bit (Breakout: stacks cleared at lost lives, the forced FIRE after
    # them, an LSTM state carried into each segment).
    from acer_sync.rollout.runner import Runner
    from atari.episodes import EpisodeTracker

    info, model, fields = breakout_with_an_lstm()
    device = torch.device("cuda")
    model = model.to(device)
    runs = []
    for device_stack in (False, True):
        env = VecEnv(info, 2, "ale")
        generator = torch.Generator(device).manual_seed(3)
        runner = Runner(env, model, device, 20, EpisodeTracker(2, True, True), fields, generator=generator)
        runner.actor = runner.actors[0] = Actor(model, info, 2, device, generator=generator, update_normalizer=True,
                                                device_stack=device_stack)
        runner.reset(seed=0)
        runs.append([runner.run() for _ in range(12)])
        env.close()
    for index, (numpy_segment, device_segment) in enumerate(zip(*runs, strict=True)):
        assert_segments_equal(numpy_segment, device_segment, where=index)
    assert np.concatenate([segment.dones for segment in runs[0]]).any()  # lost lives cleared the stacks


def test_observing_on_the_device_stack_calls_no_torch_function():
    # The newest frames and episode starts are staged by numpy alone; act() uploads them in one copy.
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls: list = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls.append(func)
            return func(*args, **(kwargs or {}))

    info = env_info("CartPole-v1")
    model = build_model(info, build_config(False, dict(env="CartPole-v1", hidden="16")))
    actor = Actor(model, info, 3, torch.device("cpu"), device_stack=True)
    frames = np.ones((3, 4), np.float32)
    actor.reset(frames)
    actor.act()
    with Count():
        actor.observe(frames, np.array([True, False, False]), np.zeros(3, bool), np.zeros(3, bool))
    assert Count.calls == []


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_an_actor_with_the_device_stack_acts_exactly_as_the_numpy_one(env):
    info = env_info(env)
    config = build_config(False, dict(env=env, hidden="16"), continuous=info.continuous)
    torch.manual_seed(0)
    model = build_model(info, config)
    # The numpy stack; the device stack; the device stack pushed by the graph's static-tensor step.
    actors = [Actor(model, info, 3, torch.device("cpu"), generator=torch.Generator().manual_seed(1), device_stack=flag,
                    graph=graph) for flag, graph in ((False, False), (True, False), (True, True))]
    vec = VecEnv(info, 3, "sync")
    frames, _ = vec.reset(seed=0)
    for actor in actors:
        actor.reset(frames)
    for step in range(30):
        if step % 7 == 3:  # acting twice on one observation: its frames are pushed once
            for actor in actors:
                actor.act()
        (actions, mu), *others = (actor.act() for actor in actors)
        for device_actions, device_mu in others:
            assert np.array_equal(actions, device_actions) and actions.dtype == device_actions.dtype
            assert np.array_equal(mu, device_mu)
        frames, _, terminated, truncated, _ = vec.step(actors[0].distribution.env_actions(actions))
        cut = truncated & ~terminated & vec.final_mask
        values = [actor.final_values(vec.final_frames, cut | vec.final_mask) for actor in actors]
        assert np.array_equal(values[0], values[1]) and np.array_equal(values[0], values[2])
        for actor in actors:
            actor.observe(frames, terminated | truncated, np.zeros(3, bool), np.zeros(3, bool))
    vec.close()


GRAPH_CASES = {  # an MLP; an LSTM, whose state the graph carries; the Gaussian head with a running normalizer
    "mlp": ("CartPole-v1", dict(hidden="16")),
    "lstm": ("CartPole-v1", dict(network="lstm", hidden="16", lstm_size=8)),
    "gaussian-normalized": ("Pendulum-v1", dict(hidden="16", normalize_obs=True)),
}


def graph_and_plain_actors(case: str, device: torch.device, greedy: bool = False, n: int = 3):
    env, settings = GRAPH_CASES[case]
    info = env_info(env)
    config = build_config(False, dict(env=env, **settings), continuous=info.continuous)
    torch.manual_seed(0)
    model = build_model(info, config).to(device)
    twin = build_model(info, config).to(device)
    twin.load_state_dict(model.state_dict())
    actors = [Actor(net, info, n, device, greedy=greedy, generator=torch.Generator(device).manual_seed(1),
                    update_normalizer=True, device_stack=True, graph=graph)
              for net, graph in ((model, False), (twin, True))]
    return info, actors


def play_side_by_side(info, actors, steps: int, check) -> None:
    vec = VecEnv(info, actors[0].num_envs, "sync")
    frames, _ = vec.reset(seed=0)
    for actor in actors:
        actor.reset(frames)
    for step in range(steps):
        (actions, mu), (graph_actions, graph_mu) = (actor.act() for actor in actors)
        check(step, actions, mu, graph_actions, graph_mu)
        for state, graph_state in zip(actors[0].state, actors[1].state, strict=True):
            check(step, state.cpu().numpy(), None, graph_state.cpu().numpy(), None)
        frames, _, terminated, truncated, _ = vec.step(actors[0].distribution.env_actions(actions))
        for actor in actors:  # episode starts reset the state inside the step, as in training
            actor.observe(frames, terminated | truncated, np.zeros(len(actions), bool), np.zeros(len(actions), bool))
    vec.close()


@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_acting_through_the_graphs_static_tensors_is_the_plain_step_exactly(case):
    # Off CUDA, ActingGraph runs its static-tensor step eagerly: the values it copies in and out
    # must be the Actor's own, bit for bit (actions, μ, the recurrent state, the normalizer's moments).
    info, actors = graph_and_plain_actors(case, torch.device("cpu"))
    assert actors[1].graph is not None and not actors[1].graph.captured

    def exactly(step, actions, mu, graph_actions, graph_mu):
        assert np.array_equal(actions, graph_actions) and actions.dtype == graph_actions.dtype, step
        assert mu is None or np.array_equal(mu, graph_mu), step

    play_side_by_side(info, actors, 40, exactly)
    for plain, graphed in zip(actors[0].model.buffers(), actors[1].model.buffers(), strict=True):
        assert torch.equal(plain, graphed)


def test_the_graphs_static_tensors_are_plain_tensors_whatever_the_callers_mode():
    # The capture runs outside inference mode: made inside it, the device generator's seed and
    # offset tensors (made at a process's first capture) would be inference tensors, and every
    # later capture (the update's CUDA graphs) would fail writing them (pytorch#166792). Here, the
    # static tensors it makes: plain, even when the Actor is reset inside inference mode, and
    # written by the steps act() takes inside it.
    info, (_, graphed) = graph_and_plain_actors("lstm", torch.device("cpu"))
    vec = VecEnv(info, graphed.num_envs, "sync")
    frames, _ = vec.reset(seed=0)
    vec.close()
    with torch.inference_mode():
        graphed.reset(frames)
    graph = graphed.graph
    statics = lambda: (graph.first, *graph.state, *parts.parts_of(graph.obs), *parts.parts_of(graphed.stacker.stacked))  # noqa: E731
    assert not any(tensor.is_inference() for tensor in statics())
    graphed.act()
    assert not any(tensor.is_inference() for tensor in statics())


def test_acting_through_a_graph_needs_the_device_stack():
    info = env_info("CartPole-v1")
    model = build_model(info, build_config(False, dict(env="CartPole-v1", hidden="16")))
    with pytest.raises(ValueError, match="device_stack"):
        Actor(model, info, 2, torch.device("cpu"), device_stack=False, graph=True)


@requires_cuda
@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_cuda_acting_replays_one_graph_a_step_and_acts_as_the_eager_step(case):
    # Greedy, so that both act on the same trajectory: the captured graph gives the eager step's
    # actions and μ, its recurrent state and its normalizer's moments (the warm-up's updates undone).
    info, actors = graph_and_plain_actors(case, torch.device("cuda"), greedy=True)

    def close(step, actions, mu, graph_actions, graph_mu):
        np.testing.assert_allclose(graph_actions, actions, rtol=1e-5, atol=1e-6, err_msg=str(step))
        if mu is not None:
            np.testing.assert_allclose(graph_mu, mu, rtol=1e-5, atol=1e-6, err_msg=str(step))

    play_side_by_side(info, actors, 20, close)
    assert actors[1].graph.captured
    for plain, graphed in zip(actors[0].model.buffers(), actors[1].model.buffers(), strict=True):
        torch.testing.assert_close(graphed, plain)


@requires_cuda
def test_cuda_graphed_sampling_is_one_run_per_seed_and_reads_the_weights_in_place():
    info, (_, first) = graph_and_plain_actors("lstm", torch.device("cuda"))
    _, (_, second) = graph_and_plain_actors("lstm", torch.device("cuda"))
    vec = VecEnv(info, 3, "sync")
    frames = vec.reset(seed=0)[0]
    vec.close()
    first.reset(frames)
    second.reset(frames)
    runs = [[first.act()[0] for _ in range(12)], [second.act()[0] for _ in range(12)]]
    assert first.graph.captured and all(np.array_equal(a, b) for a, b in zip(*runs))
    assert len({actions.tobytes() for actions in runs[0]}) > 1  # each replay draws anew
    with torch.no_grad():  # weights written in place (as an update or the acting copy's exchange does)
        for parameter in second.model.parameters():
            parameter.zero_()
    _, mu = second.act()
    np.testing.assert_allclose(mu, 0.5, atol=1e-6)  # a zero net: uniform over CartPole's two actions


def test_acting_captures_with_the_default_generator_set_aside_and_puts_it_back(monkeypatch, caplog):
    # The control flow of default_generator_set_aside (its CUDA effect: the CUDA test below): the
    # default generator holds a private state during the capture, and its own again after it,
    # also when the capture fails; where its state cannot be set aside, the capture goes on.
    from acer_sync.rollout import acting_graph

    class DefaultGenerator:
        def __init__(self, broken=False):
            self.state, self.broken = "own", broken

        def graphsafe_get_state(self):
            if self.broken:
                raise RuntimeError("no graph-safe state here")
            return self.state

        def graphsafe_set_state(self, state):
            self.state = state

    default = DefaultGenerator()
    monkeypatch.setattr(torch.cuda, "default_generators", (default,))
    monkeypatch.setattr(acting_graph.torch, "Generator", lambda device: f"private on {device}")
    cuda = torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="the capture failed"):
        with acting_graph.default_generator_set_aside(cuda, True):
            assert default.state == "private on cuda:0"
            raise RuntimeError("the capture failed")
    assert default.state == "own"
    with acting_graph.default_generator_set_aside(cuda, False):  # acting draws from the default one
        assert default.state == "own"
    monkeypatch.setattr(torch.cuda, "default_generators", (DefaultGenerator(broken=True),))
    ran = []
    with caplog.at_level("WARNING"), acting_graph.default_generator_set_aside(cuda, True):
        ran.append(True)
    assert ran and "keeps the default CUDA generator (RuntimeError: no graph-safe state here)" in caplog.text


def run_in_a_process_of_its_own(script: str, last_line: str) -> None:
    """Run ``script`` in a new Python process (its CUDA captures the process's first) and check
    that it printed ``last_line``; a process that hangs is cut well within the GPU report's time
    for all the CUDA tests (tools/gpu_report.sh), so that their summary still comes back."""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == last_line, result.stderr


CAPTURES_AFTER_ACTINGS = """
import torch
from acer_sync.rollout.acting_graph import ActingGraph

def step(obs, first, state):
    probabilities = torch.softmax(obs, -1)
    return torch.multinomial(probabilities, 1).squeeze(-1), probabilities, state

graph = ActingGraph(step)
with torch.inference_mode():  # acting's capture is the process's first, as at a run's start
    graph.prepare(torch.randn(3, 4, device="cuda"), torch.zeros(3, dtype=torch.bool, device="cuda"), ())
assert graph.captured
x = torch.zeros(4, device="cuda")
later = torch.cuda.CUDAGraph()  # as the update's CUDA graphs are, after it and outside inference mode
with torch.cuda.graph(later):
    y = x * 2 + 1
later.replay()
assert torch.equal(y, torch.ones(4, device="cuda"))
print("recorded")
"""


@requires_cuda
def test_cuda_a_capture_after_actings_is_not_broken_by_inference_mode():
    # Acting's graph is the process's first capture (at the Actor's reset), the update's CUDA
    # graphs come after it, outside inference mode: they must still record (pytorch#166792). In a
    # process of its own, so that acting's is the first capture there.
    run_in_a_process_of_its_own(CAPTURES_AFTER_ACTINGS, "recorded")


REPLAYS_BESIDE_CAPTURES = """
import threading
import torch
from acer_sync.rollout.acting_graph import ActingGraph

generator = torch.Generator("cuda").manual_seed(0)  # the collecting thread's own, as overlap gives it

def step(obs, first, state):
    probabilities = torch.softmax(obs, -1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1), probabilities, state

obs, first = torch.randn(3, 4, device="cuda"), torch.zeros(3, dtype=torch.bool, device="cuda")
default = torch.cuda.default_generators[torch.cuda.current_device()]
before = (default.initial_seed(), default.get_offset())  # after randn's draw
acting_stream = torch.cuda.Stream()
graph = ActingGraph(step, generator)
with torch.cuda.stream(acting_stream), torch.inference_mode():
    graph.prepare(obs, first, ())
assert graph.captured
assert (default.initial_seed(), default.get_offset()) == before  # acting left the default generator alone
errors, stop = [], threading.Event()

def collect():  # acting's replays in the collecting thread, on its own stream, reading each step back
    with torch.cuda.stream(acting_stream), torch.inference_mode():
        while not stop.is_set():
            try:
                graph(obs, first, ())
                acting_stream.synchronize()
            except Exception as error:
                errors.append(repr(error))
                return

thread = threading.Thread(target=collect, daemon=True)  # an error below must not leave the process waiting for it
thread.start()
try:
    x = torch.randn(256, 256, device="cuda") / 16
    side = torch.cuda.Stream()  # the matrix product's and the sampler's first use, before any capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.tanh(x @ x)
        torch.randn(4, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    draws = []
    for _ in range(20):  # the update's CUDA graphs recorded in the learner's thread, drawing from the default generator
        recorded = torch.cuda.CUDAGraph()
        with torch.cuda.graph(recorded, capture_error_mode="thread_local"):
            y = x
            for _ in range(50):
                y = torch.tanh(y @ x)
            noise = torch.randn(4, device="cuda") + 0 * y.sum()
        recorded.replay()
        draws.append(noise.cpu())
finally:
    stop.set()
    thread.join(30)
assert not thread.is_alive(), "acting's thread did not stop"
assert not errors, errors
assert len({draw.numpy().tobytes() for draw in draws}) == len(draws)  # no two updates drew the same numbers
print("replayed")
"""


@requires_cuda
def test_cuda_acting_replays_beside_the_learners_captures():
    # --pipeline overlap --compile graph: acting's graph replays in the collecting thread while the
    # update's CUDA graphs record in the learner's. Under torch 2.11 a replay of a graph registered
    # with the default generator fails while another thread captures, unless acting's capture set
    # the default generator aside (acting_graph.default_generator_set_aside).
    run_in_a_process_of_its_own(REPLAYS_BESIDE_CAPTURES, "replayed")


@requires_cuda
def test_cuda_a_step_that_reads_the_device_back_acts_eagerly_with_one_warning(caplog):
    # A host sync cannot be captured: the warm-up (in sync-debug "error" mode) finds it, and the
    # step runs eagerly from then on, its values as before.
    from acer_sync.rollout.acting_graph import ActingGraph

    def step(obs, first, state):
        scale = 1.0 + 0.0 * obs.sum().item()  # a host read that leaves the values as they are
        return obs.argmax(-1), torch.softmax(obs * scale, -1), state

    obs = torch.randn(3, 4, device="cuda")
    graph = ActingGraph(step)
    with caplog.at_level("WARNING"):
        packed, _ = graph(obs, torch.zeros(3, dtype=torch.bool, device="cuda"), ())
    assert not graph.captured and "acting runs eagerly" in caplog.text
    torch.testing.assert_close(packed[:, 1:], torch.softmax(obs, -1))
    assert torch.cuda.get_sync_debug_mode() == 0  # put back


@requires_cuda
def test_cuda_a_recording_of_actings_graph_that_fails_is_one_line_and_the_run_did_not_start(tmp_path):
    # The failure path of acting's capture (ActingGraph._record): the step's own error named, not
    # the one that ending the broken capture raises, one line, exit 2, the fresh run's directory
    # removed; and the process, whose capture state it broke, exits without hanging.
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", "--device", "cuda", "--compile", "graph",
         "--torso", "user_torsos:SyncsWhileCapturing", "--num-envs", "2", "--vec-env", "sync", "--total-timesteps", "400",
         "--eval-every", "0", "--no-progress", "--run-dir", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    # torch 2.11 calls it an AcceleratorError (a RuntimeError)
    assert re.match(r"train\.py: error: --compile graph: capturing acting's CUDA graph failed \(\w+Error: CUDA error: ", lines[0])
    assert lines[0].endswith("); run with --compile update") and "previous error" not in lines[0]
    assert not run_dir.exists()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_sampling_draws_what_multinomial_draws_without_its_checks_that_break_cuda(device):
    # torch.multinomial checked π with device-side asserts on CUDA: a NaN π broke the CUDA context
    # (every later call failed, the final checkpoint's save too) instead of the run's clean stop
    # (exit 4), as on the CPU; Categorical.sample draws the same actions without them.
    from acer_sync.nets.distributions import Categorical

    categorical = Categorical(6)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
        logits[::7, 2] = -torch.inf  # actions of probability 0 too
        stats = torch.softmax(logits, -1).to(device, dtype)
        ours, theirs = (torch.Generator(device).manual_seed(3) for _ in range(2))
        for _ in range(20):
            drawn = categorical.sample(stats, generator=ours)
            assert torch.equal(drawn, torch.multinomial(stats, 1, generator=theirs).squeeze(-1)), dtype
        assert not (drawn[::7] == 2).any()
        assert torch.equal(categorical.sample(stats[0], generator=ours), torch.multinomial(stats[0], 1, generator=theirs).squeeze(-1))
    stats[5] = torch.nan
    drawn = categorical.sample(stats, generator=ours)
    assert drawn.shape == (64,) and bool(((drawn >= 0) & (drawn < 6)).all())  # an index; the callers check μ on the host
    if device == "cuda":
        torch.cuda.synchronize()  # no device-side assert waiting

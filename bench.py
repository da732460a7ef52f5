"""Measure training speed and memory on the real training path.

``python bench.py --env PongNoFrameskip-v4 [--seconds 60] [--device auto|cpu|cuda] [--num-envs 16] [--network auto|...|cnn_lstm] [--precision fp32|bf16] [--replay-device auto|cpu|cuda] [--json]``

Five measurements after a warm-up, the first two an eighth of ``--seconds`` each and the others
a quarter:

* ``env_steps_per_sec``: the vector env alone, random actions.
* ``collect_steps_per_sec``: collection alone, the Runner's own segments (acting, the env's step,
  the frame stack), with nothing learned or stored: what the envs give with the network choosing
  the actions, the bound of ``--pipeline overlap``'s collecting thread.
* ``learner_steps_per_sec``: the learner alone on buffer data: per N·T agent steps, T acting
  forward passes, one buffer put, and the Trainer's ``learn()``: one on-policy and
  Poisson(``replay_ratio``) off-policy ACER updates (``learner_updates_per_iteration``: how many it
  drew per iteration, 1 + ``replay_ratio`` on average). The segments it puts are random, made
  before the clock starts. ``learner_update_steps_per_sec``: the same iterations' put and
  ``learn()`` alone, without the acting (the learner's own work; under ``--pipeline overlap`` the
  acting is the collecting thread's); ``learner_acting_fraction``: acting's share of the iteration.
* ``raw_learner_steps_per_sec``: the same network passes at the same batch sizes in plain
  PyTorch on random uint8 frames already on the device, with no ACER logic (no Retrace, bias
  correction, trust region, Polyak update, buffer sampling or stack rebuild): the learner's ceiling.
  Under ``--precision bf16`` its passes run in the same bf16 autocast as training's.
  ``raw_update_steps_per_sec``: its update passes alone, without the acting forwards, the ceiling
  of ``learner_update_steps_per_sec`` (their ratio: ``update_efficiency``). Its update passes run
  as the learner's update does (``raw_compile``): compiled whole under ``--compile update``, as a
  CUDA graph too under ``graph``, the network compiled under ``network``, else eager. It is
  measured last, after the trainer has closed, alone on the device; where it fails, its figures
  are None and ``raw_compile`` names the error.
* The efficiencies count the learner's updates at their mean, 1 + ``replay_ratio`` an iteration,
  as the raw passes do: the Poisson draws of a short window are the same in every run (one seed),
  and the learner's update time is scaled by 1 + ``replay_ratio`` over the updates it drew.
  ``bound_steps_per_sec`` is the issue's bound on the loop, min(env alone, learner alone), with
  the learner's own work alone (``learner_update_steps_per_sec``) under ``--pipeline overlap``,
  where acting is the collecting thread's, and ``bound_efficiency`` the loop's share of it;
  ``loop_efficiency`` is the loop against the serial bound 1 / (1/env + 1/learner).
* ``steps_per_sec``: end to end, through :class:`acer_sync.training.trainer.Trainer`'s own
  ``collect()`` and ``learn()``, with replay active from the start over a prefilled buffer, for
  half of its quarter with the phase timer off; then ``steps_per_sec_timed`` and the time spent in
  each phase, with the timer on (on CUDA it synchronizes the device at every phase).
  ``updates_per_iteration``: the updates the untimed half drew per iteration (1 + ``replay_ratio``
  on average). A window of a few iterations (Pong on a CPU: about one a second) draws few, and
  its steps/s moves with them: compare code on the CPU with runs of the same seed and steps
  (``train.py``, whose draws are then the same), not with these windows.

With ``--json`` the last line of stdout is one JSON object with every figure. Like ``train.py``,
bench runs with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets a policy
(:mod:`acer_sync.base.openmp`; the JSON's ``omp_wait_policy``), and with glibc's malloc keeping
freed memory unless the environment tunes it (:mod:`acer_sync.base.malloc`; ``malloc_keeps_freed``).
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from acer_sync.base.openmp import default_wait_policy

default_wait_policy()  # before torch loads OpenMP: bench measures what the entry points run

import numpy as np
import torch

from acer_sync.api.run_metadata import package_versions
from acer_sync.api.runs import check_config
from acer_sync.base.config import (
    COMPILE_MODES,
    NETWORKS,
    PIPELINES,
    PRECISIONS,
    REPLAY_DEVICES,
    build_config,
    compile_mode,
)
from acer_sync.base.errors import UserError, run_cli
from acer_sync.base.malloc import keep_freed_memory
from acer_sync.base.transfer import numpy_dtype
from acer_sync.cli.args import OneLineParser
from acer_sync.math.optim import RMSpropTF
from acer_sync.nets.build import build_model
from acer_sync.nets.precision import autocast, runs_in_bf16, to_float32
from acer_sync.replay.buffer import ReplayBuffer, Segment, empty_segment
from acer_sync.training.acer import compile_whole, is_compile_error
from acer_sync.training.setup import build_trainer
from acer_sync.training.trainer import Trainer
from atari import parts
from atari.envs import VecEnv, choose_backend, env_info
from atari.stacking import FrameStacker

#: Steps per env in the benchmark's replay buffer (the default-size buffer's memory is computed).
BENCH_BUFFER_STEPS = 2_000
#: Random segments the learner's measurement cycles through, made before its clock starts: making
#: one (its frames drawn by numpy) took 2.8 ms at 16 envs and 11.7 ms at 64 on the project's CPU,
#: about 9% and 21% of a learning iteration in the H200's graph rows, time training never spends.
LEARNER_SEGMENTS = 4
PHASES = ("env", "observe", "acting", "collect_wait", "buffer_put", "buffer_get", "on_policy_update", "off_policy_updates", "average_update")
#: The collecting thread's phases (``--pipeline overlap``).
COLLECT_PHASES = ("env", "observe", "acting")


def parse_args(argv: list[str]):
    parser = OneLineParser(prog="bench.py", description="Benchmark the ACER training loop (see the module docstring).")
    parser.add_argument("--env", default="PongNoFrameskip-v4", help="env id (default: PongNoFrameskip-v4)")
    parser.add_argument("--seconds", type=float, default=60.0, help="total measuring time, split over its five measurements (default: 60)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="network device (default: auto)")
    parser.add_argument("--num-envs", type=int, default=None, help="number of envs (default: the env's preset, 16 on Atari)")
    parser.add_argument("--replay-ratio", type=float, default=None, help="off-policy updates per on-policy one (default: preset, 4)")
    parser.add_argument("--compile", nargs="?", const="network", default="off", choices=COMPILE_MODES, metavar="MODE",
                        help="torch.compile, as train.py --compile: off (default: bench measures the mode it is given), auto, network, update or graph (CUDA)")
    parser.add_argument("--network", choices=NETWORKS, default="auto", help="the torso, as train.py --network (default: auto)")
    parser.add_argument("--pipeline", choices=PIPELINES, default="serial",
                        help="as train.py --pipeline: serial (default), overlap (learn while the envs collect in a thread) "
                             "or auto (train.py's default: overlap for Atari on CUDA)")
    parser.add_argument("--replay-device", choices=REPLAY_DEVICES, default="auto",
                        help="as train.py --replay-device: auto (default; the GPU where the buffer fits), cpu or cuda")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="what the networks' passes compute in, as train.py --precision (default: fp32)")
    parser.add_argument("--env-groups", type=int, default=1,
                        help="as train.py --env-groups: step the ale envs in this many groups, one group's actions chosen while the others step (default: 1)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding every figure")
    return parser.parse_args(argv)


def fill_random(rng: np.random.Generator, frames: np.ndarray) -> np.ndarray:
    """``frames`` filled in place with random pixels (uint8) or standard normal values."""
    if frames.dtype == np.uint8:
        frames[...] = rng.integers(0, 256, frames.shape, dtype=np.uint8)
    else:
        frames[...] = rng.standard_normal(frames.shape).astype(frames.dtype)
    return frames


def synthetic_segment(rng: np.random.Generator, info, fields, num_envs: int, nsteps: int) -> Segment:
    """A segment of random frames and a random behaviour policy, shaped like the Runner's."""
    segment = empty_segment(fields, nsteps, num_envs)
    parts.map_parts(lambda frames: fill_random(rng, frames), segment.frames)
    segment.firsts[...] = rng.random((nsteps + 1, num_envs)) < 0.01
    segment.actions[...] = rng.integers(0, info.n_actions, (nsteps, num_envs))
    segment.mu[...] = rng.dirichlet(np.ones(info.n_actions), (nsteps, num_envs))
    segment.rewards[...] = rng.choice([-1.0, 0.0, 1.0], (nsteps, num_envs))
    segment.dones[...] = rng.random((nsteps, num_envs)) < 0.01
    segment.timeout_values[...] = 0.0
    for state in segment.state:
        state[...] = 0.0
    return segment


def machine(device: torch.device) -> dict:
    """What the figures were measured on: the device's name, the CPU's model, its cores (all, and
    those this process may use), so that a line of JSON says where it came from."""
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            cpu_model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model or "cpu",
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
    }


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA; elsewhere nothing is queued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(step, seconds: float, warmup: int = 2) -> tuple[int, float]:
    """Call ``step()`` ``warmup`` times, then until ``seconds`` pass; returns (calls, seconds)."""
    for _ in range(warmup):
        step()
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    return calls, time.perf_counter() - start


def bench_env(info, config, seconds: float) -> float:
    env = VecEnv(info, config.num_envs, choose_backend(info, config.vec_env), timeout=config.env_timeout, groups=config.env_groups)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    try:
        calls, elapsed = timed_loop(lambda: env.step(rng.integers(0, info.n_actions, config.num_envs)), seconds, warmup=5)
    finally:
        env.close()
    return calls * config.num_envs / elapsed


def bench_collect(trainer: Trainer, seconds: float) -> float:
    """The Runner's segments alone (acting, env steps, the frame stack; nothing stored or learned): steps/s."""
    calls, elapsed = timed_loop(trainer.runner.run, seconds, warmup=1)
    return calls * trainer.steps_per_iteration / elapsed


def bench_learner(trainer: Trainer, seconds: float, rng: np.random.Generator) -> tuple[float, float, float]:
    """ACER's learner on buffer data, without the env: acting passes, put, then the Trainer's own
    :meth:`~acer_sync.training.trainer.Trainer.learn` (one on-policy and Poisson(replay_ratio)
    off-policy updates, the replay-state path included). Returns steps/s, the updates per
    iteration it drew (1 + replay_ratio on average; a short window's draws move the figure), and
    steps/s of the put and ``learn()`` alone (on CUDA the device is synchronized after them, as
    acting's first step would wait for them on the same stream)."""
    cfg, info = trainer.config, trainer.info
    actors, fields = trainer.runner.actors, trainer.fields  # one per group of envs (--env-groups)
    def randomize(stacked):  # the numpy stack, or the device stack's tensors (on CUDA)
        if isinstance(stacked, torch.Tensor):
            stacked.copy_(torch.from_numpy(fill_random(rng, np.zeros(tuple(stacked.shape), numpy_dtype(stacked.dtype)))))
        else:
            fill_random(rng, stacked)

    synchronize(trainer.device)  # the collecting stream's last stack update lands before these writes
    for actor in actors:
        parts.map_parts(randomize, actor.observation)
    segments = [synthetic_segment(rng, info, fields, cfg.num_envs, cfg.nsteps) for _ in range(LEARNER_SEGMENTS)]
    learning = {"seconds": 0.0, "calls": 0}

    def iteration():
        for _ in range(cfg.nsteps):
            for actor in actors:
                actor.act()
        start = time.perf_counter()
        trainer.buffer.put(segments[learning["calls"] % len(segments)])
        trainer.learn()
        synchronize(trainer.device)
        learning["seconds"] += time.perf_counter() - start
        learning["calls"] += 1

    for _ in range(2):  # warm-up, as timed_loop's
        iteration()
    updates_before = trainer.updates
    learning["seconds"] = 0.0
    calls, elapsed = timed_loop(iteration, seconds, warmup=0)
    steps = calls * cfg.num_envs * cfg.nsteps
    return steps / elapsed, (trainer.updates - updates_before) / calls, steps / learning["seconds"]


def bench_raw_learner(info, config, device: torch.device, seconds: float) -> tuple[float, float, str]:
    """The same network passes in plain PyTorch on random uint8 frames already on the device:
    steps/s, steps/s of the update passes alone (without the acting forwards), and how the update
    passes ran (``raw_compile``): compiled as the learner's update is under ``--compile update``
    and ``graph`` (one ``torch.compile(fullgraph=True)`` of forward, backward and RMSProp's step,
    as a CUDA graph under ``graph``), the network compiled under ``network``, else eager. A
    compile that fails runs them eagerly, said on stderr."""
    T, N = config.nsteps, config.num_envs
    model = build_model(info, config).to(device)
    mode = compile_mode(config, device.type, runs_in_bf16(model, config.precision))
    if mode == "network":
        model.compile()
    average = build_model(info, config).to(device).requires_grad_(False)
    parameters = list(model.parameters())
    optimizer = RMSpropTF(parameters, lr=config.lr)
    optimizer.init_state()
    rng = np.random.default_rng(0)
    stacked = FrameStacker(N, info.stack, info.frame_layout).stacked  # [N, stack, ...] (a dict of parts)
    acting_obs = parts.map_parts(lambda obs: torch.from_numpy(fill_random(rng, obs)).to(device), stacked)
    batch_obs = parts.map_parts(
        lambda obs: torch.from_numpy(fill_random(rng, np.zeros((T + 1, *obs.shape), obs.dtype))).to(device), stacked
    )
    average_obs = parts.map_parts(lambda obs: obs[:T], batch_obs)
    firsts = torch.zeros(T + 1, N, dtype=torch.bool, device=device)
    state = model.initial_state(N)
    updates = 1 + int(round(config.replay_ratio))
    bf16 = runs_in_bf16(model, config.precision)

    def raw_update() -> torch.Tensor:
        with autocast(device, bf16):
            pi, q = to_float32(model(model.unroll(batch_obs, firsts, state)[0]))
            with torch.no_grad():
                pi_avg = average.policy_of(average.unroll(average_obs, firsts[:T], state)[0])
        loss = -torch.log(pi + 1e-6).mean() + q.pow(2).mean()
        for parameter in parameters:  # zero_grad(set_to_none=True), which Dynamo does not trace
            parameter.grad = None
        loss.backward()
        optimizer.step()
        return pi_avg  # an output, so that a compile keeps the average network's passes

    update, raw_compile = raw_update, "network" if mode == "network" else "off"
    if mode in ("update", "graph"):
        if mode == "graph":  # RMSProp's v changes in place: static, as the learner marks its own
            for values in optimizer.state.values():
                torch._dynamo.mark_static_address(values["square_avg"])
        update = compile_whole(raw_update, mode, model, config.precision)  # as the learner's update compiles
        raw_compile = mode

    updating = {"seconds": 0.0}

    def iteration():
        with torch.inference_mode():
            acting_state = state
            for _ in range(T):
                with autocast(device, bf16):
                    features, acting_state = model.step(acting_obs, acting_state, firsts[0])
                    model.policy_of(features)
        synchronize(device)
        start = time.perf_counter()
        for _ in range(updates):
            update()
        synchronize(device)
        updating["seconds"] += time.perf_counter() - start

    try:
        for _ in range(2):  # warm-up, as timed_loop's (and the compile)
            iteration()
    except Exception as error:
        if update is raw_update or not is_compile_error(error):
            raise
        print(f"bench.py: the raw passes' compile failed ({type(error).__name__}); they run eagerly", file=sys.stderr)
        update, raw_compile = raw_update, "off"
        for _ in range(2):
            iteration()
    updating["seconds"] = 0.0
    calls, elapsed = timed_loop(iteration, seconds, warmup=0)
    return calls * N * T / elapsed, calls * N * T / updating["seconds"], raw_compile


class GpuBusy:
    """The GPU's busy fraction over a window: ``nvidia-smi``'s ``utilization.gpu`` (the share of
    each sample period in which a kernel ran), sampled every ``period`` seconds in a thread.
    :attr:`fraction` is None where there is no CUDA device or no ``nvidia-smi``."""

    def __init__(self, device: torch.device, period: float = 0.5, command: str = "nvidia-smi"):
        self.command = shutil.which(command) if device.type == "cuda" else None
        self.index = device.index or 0
        self.period = period
        self.samples: list[float] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._done.wait(self.period):
            try:
                out = subprocess.run([self.command, "-i", str(self.index), "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                self.samples.append(float(out.stdout.strip().splitlines()[0]) / 100.0)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return

    def __enter__(self):
        if self.command:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        if self._thread is not None:
            self._thread.join(10)
        return False

    @property
    def fraction(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 3) if self.samples else None


def bench_end_to_end(
    trainer: Trainer, seconds: float,
) -> tuple[float, float, dict[str, float], dict[str, float] | None, float | None, float]:
    """The Trainer's own iteration (:meth:`~acer_sync.training.trainer.Trainer.iterate`: collect then
    learn, or both at once with ``--pipeline overlap``): half of ``seconds`` with the phase timer off
    (the headline figure: on CUDA the timer synchronizes the device at every phase), then half with
    it on, for the phases. Overlapped, the env, observe and acting phases run in the collecting
    thread, timed apart (its idle time is its ``other``), and the learner's wait for it is
    ``collect_wait``. Returns both steps/s, untimed and timed, the timed half's phases, the
    collecting thread's (None when serial), the GPU's busy fraction, and the updates per iteration
    of the untimed half."""

    def iteration():
        trainer.iterate()

    # Overlapped, the collecting thread keeps a timer of its own (no device syncs: its acting step
    # ends in a read of the actions anyway); its phases run beside the learner's.
    collect_timer = trainer.runner.timer if trainer.runner.timer is not trainer.timer else None
    timers = [timer for timer in (trainer.timer, collect_timer) if timer is not None]

    def window(timed: bool) -> tuple[float, float, float]:
        for timer in timers:
            timer.reset()
            timer.enabled = timed
        start_steps, start_updates, start = trainer.timesteps, trainer.updates, time.perf_counter()
        while trainer.timesteps == start_steps or time.perf_counter() - start < seconds / 2:
            iteration()
        synchronize(trainer.device)
        elapsed = time.perf_counter() - start
        for timer in timers:
            timer.enabled = False
        iterations = (trainer.timesteps - start_steps) / trainer.steps_per_iteration
        return (trainer.timesteps - start_steps) / elapsed, elapsed, (trainer.updates - start_updates) / iterations

    for _ in range(2):
        iteration()
    with GpuBusy(trainer.device) as busy:
        untimed_sps, _, updates_per_iteration = window(timed=False)
    timed_sps, elapsed, _ = window(timed=True)
    phases = {phase: trainer.timer.seconds.get(phase, 0.0) for phase in PHASES}
    phases["other"] = elapsed - sum(v for k, v in phases.items() if k != "average_update")  # nested in updates
    phases["total"] = elapsed
    collect = None
    if collect_timer is not None:
        collect = {phase: collect_timer.seconds.get(phase, 0.0) for phase in COLLECT_PHASES}
        collect["other"] = elapsed - sum(collect.values())  # idle between segments, or the segment's own bookkeeping
        collect["total"] = elapsed
    return untimed_sps, timed_sps, phases, collect, busy.fraction, updates_per_iteration


def fractions(phases: dict[str, float]) -> dict[str, float]:
    """Each phase's share of the window (``phases["total"]``)."""
    return {k: round(v / phases["total"], 3) for k, v in phases.items() if k != "total"}


def env_in_loop(timed_sps: float, phases: dict[str, float]) -> float | None:
    """The env's own steps/s inside the loop: the steps of the timed window over its ``env`` phase."""
    return round(timed_sps * phases["total"] / phases["env"], 1) if phases["env"] else None


def cudagraph_skips() -> int:
    """How many compiled graphs Inductor ran without a CUDA graph (its log says why at the
    ``perf_hints`` level: a mutated input that is not static, a CPU tensor, ...)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    keeps_freed = keep_freed_memory()
    if not (math.isfinite(args.seconds) and args.seconds > 0):
        raise UserError("--seconds must be a positive number")
    overrides = dict(env=args.env, device=args.device, num_envs=args.num_envs, replay_ratio=args.replay_ratio, compile=args.compile,
                     precision=args.precision, network=args.network, pipeline=args.pipeline,
                     replay_device=args.replay_device, env_groups=args.env_groups,
                     buffer_size=BENCH_BUFFER_STEPS, replay_start=0, eval_every=0, log_interval=10**9, log_seconds=0,
                     checkpoint_every=10**12, total_timesteps=10**12)
    info = env_info(args.env)
    if info.continuous:
        raise UserError(f"bench.py measures discrete-action envs only; {args.env} has continuous actions "
                        "(time a continuous run with train.py, whose progress.csv logs steps/s)")
    config = build_config(info.atari, overrides)
    check_config(config, info)  # train.py's checks: --compile graph and --replay-device cuda need a GPU
    quarter = args.seconds / 4
    rng = np.random.default_rng(0)

    env_sps = bench_env(info, config, quarter / 2)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(config, info, Path(run_dir), builtin=False)
        pipeline = trainer.how_it_runs()["pipeline"]  # --pipeline auto's choice
        collect_sps = bench_collect(trainer, quarter / 2)
        for _ in range(trainer.buffer.nsegments):
            trainer.buffer.put(synthetic_segment(rng, info, trainer.fields, config.num_envs, config.nsteps))
        learner_sps, learner_updates, update_sps = bench_learner(trainer, quarter, rng)
        steps_sps, timed_sps, phases, collect_phases, gpu_busy, loop_updates = bench_end_to_end(trainer, quarter)
        trainer.close()
    # the learner's graphs alone: the raw passes' below are counted in the same process-wide counter
    skips = cudagraph_skips() if trainer.agent.compile_mode == "graph" else None
    # The ceiling last, alone on the device, and apart: a failure of its compile or its CUDA graph
    # (the process's second set of graphs) costs its own figures, not the row's.
    try:
        raw_sps, raw_update_sps, raw_compile = bench_raw_learner(info, config, trainer.device, quarter)
    except Exception as error:  # noqa: BLE001 - reported in the JSON and on stderr
        print(f"bench.py: the raw passes failed ({type(error).__name__}: {str(error).strip()[:200]})", file=sys.stderr)
        raw_sps = raw_update_sps = None
        raw_compile = f"failed ({type(error).__name__})"

    default_bytes = ReplayBuffer.bytes_needed(trainer.fields, config.num_envs, config.nsteps, 50_000, info.stack)
    serial_bound = 1.0 / (1.0 / env_sps + 1.0 / learner_sps)
    # the learner's seconds a step at the mean update count (the raw passes run exactly that many)
    nominal = (1 + round(config.replay_ratio)) / learner_updates
    update_seconds = nominal / update_sps
    learner_seconds = 1.0 / learner_sps - 1.0 / update_sps + update_seconds
    bound = min(env_sps, update_sps if pipeline == "overlap" else learner_sps)
    result = {
        "env": config.env,
        "device": str(trainer.device),
        "machine": machine(trainer.device),
        "num_envs": config.num_envs,
        "nsteps": config.nsteps,
        "replay_ratio": config.replay_ratio,
        "steps_per_sec": round(steps_sps, 1),
        "steps_per_sec_timed": round(timed_sps, 1),
        # the updates per iteration that steps_per_sec's window drew (1 + Poisson(replay_ratio)
        # each): a CPU window of a few Pong iterations may draw 4 or 6 on average, and read 20% off
        "updates_per_iteration": round(loop_updates, 3),
        "gpu_busy_fraction": gpu_busy,
        "frames_per_sec": round(4 * steps_sps if info.atari else steps_sps, 1),
        "env_steps_per_sec": round(env_sps, 1),
        "env_steps_per_sec_in_loop": env_in_loop(timed_sps, collect_phases or phases),
        "collect_steps_per_sec": round(collect_sps, 1),
        "learner_steps_per_sec": round(learner_sps, 1),
        "learner_updates_per_iteration": round(learner_updates, 3),
        "learner_update_steps_per_sec": round(update_sps, 1),
        "learner_acting_fraction": round(1.0 - learner_sps / update_sps, 3),
        "raw_learner_steps_per_sec": round(raw_sps, 1) if raw_sps else None,
        "raw_update_steps_per_sec": round(raw_update_sps, 1) if raw_update_sps else None,
        "serial_bound_steps_per_sec": round(serial_bound, 1),
        "loop_efficiency": round(steps_sps / serial_bound, 3),
        "bound_steps_per_sec": round(bound, 1),
        "bound_efficiency": round(steps_sps / bound, 3),
        "learner_efficiency": round(1.0 / learner_seconds / raw_sps, 3) if raw_sps else None,
        # the updates alone against their plain passes: the overlapped learner's share of its ceiling
        "update_efficiency": round(1.0 / update_seconds / raw_update_sps, 3) if raw_update_sps else None,
        "raw_compile": raw_compile,
        "phase_seconds": {k: round(v, 3) for k, v in phases.items()},
        "phase_fraction": fractions(phases),
        # overlapped: the collecting thread's own phases, beside the learner's (None when serial)
        "collect_thread_fraction": fractions(collect_phases) if collect_phases else None,
        "buffer_bytes_per_transition": round(default_bytes / (config.num_envs * 50_000), 1),
        "default_buffer_gb": round(default_bytes / 1e9, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch_threads": torch.get_num_threads(),
        # how torch's OpenMP threads wait between operators (unset: they spin a while first)
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        # whether glibc's malloc kept freed memory for the next allocation (False: the environment
        # tunes it, or not glibc)
        "malloc_keeps_freed": keeps_freed,
        "compile": trainer.agent.compile_mode,
        # False where a compile was asked for and failed: the update ran eagerly (its warning is on stderr).
        "update_compiled": trainer.agent.compiled,
        # --compile graph: the graphs cudagraph trees skipped (ran without a CUDA graph), 0 where all replayed.
        "cudagraph_skips": skips,
        # --compile graph on CUDA: whether acting replayed its own CUDA graph (False: its step could
        # not be captured, and it acted eagerly; None: not asked for).
        "acting_graphed": trainer.runner.actor.graph.captured if trainer.runner.actor.graph is not None else None,
        "pipeline": pipeline,
        "replay_device": trainer.buffer.device.type,
        "network": trainer.model.spec()["arch"],
        "precision": config.precision,
        "bf16_passes": runs_in_bf16(trainer.model, config.precision),
        "env_backend": choose_backend(info, config.vec_env),
        "env_groups": config.env_groups,
        "versions": package_versions(),
    }
    print(f"end to end      {result['steps_per_sec']:>10.1f} steps/s ({result['frames_per_sec']:.0f} frames/s; "
          f"{result['steps_per_sec_timed']:.1f} with the phase timer on)")
    in_loop = result["env_steps_per_sec_in_loop"]
    in_loop_text = f"{in_loop:.1f}" if in_loop is not None else "not measured"
    print(f"env alone       {result['env_steps_per_sec']:>10.1f} steps/s (in the loop: {in_loop_text})")
    print(f"collect alone   {result['collect_steps_per_sec']:>10.1f} steps/s (acting and the env, nothing learned)")
    print(f"learner alone   {result['learner_steps_per_sec']:>10.1f} steps/s ({result['learner_update_steps_per_sec']:.1f} "
          f"without its acting, {result['learner_acting_fraction']:.0%} of its time)")
    efficiencies = ""  # against the raw passes, where they were measured
    if result["raw_learner_steps_per_sec"] is None:
        print(f"raw learner     not measured: {result['raw_compile']}")
    else:
        print(f"raw learner     {result['raw_learner_steps_per_sec']:>10.1f} steps/s ({result['raw_update_steps_per_sec']:.1f} "
              f"its updates alone)")
        efficiencies = (f", learner efficiency {result['learner_efficiency']:.2f}, its updates {result['update_efficiency']:.2f} "
                        f"(raw passes: --compile {result['raw_compile']})")
    print(f"serial bound    {result['serial_bound_steps_per_sec']:>10.1f} steps/s; loop efficiency {result['loop_efficiency']:.2f}"
          + efficiencies)
    print(f"min(env, learner) {result['bound_steps_per_sec']:>8.1f} steps/s; end to end {result['bound_efficiency']:.2f} of it")
    print("phases          " + ", ".join(f"{k} {v:.0%}" for k, v in result["phase_fraction"].items()))
    if result["collect_thread_fraction"]:
        print("collect thread  " + ", ".join(f"{k} {v:.0%}" for k, v in result["collect_thread_fraction"].items()))
    print(f"memory          {result['buffer_bytes_per_transition']:.0f} bytes/transition, default buffer "
          f"{result['default_buffer_gb']:.2f} GB, peak RSS {result['peak_rss_mb']:.0f} MB")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_cli(main, "bench.py")

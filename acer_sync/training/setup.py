"""Building a run: the process's threads and seeds, the network, the update, the buffer, the envs,
the callbacks, and a checkpoint's state put back, in the one order that keeps a seed's run the same."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from acer_sync.base.config import Config, compile_mode, pipeline_mode
from acer_sync.base.errors import UserError
from acer_sync.base.log import log
from acer_sync.base.timing import PhaseTimer
from acer_sync.math.schedules import learning_rate
from acer_sync.nets.build import build_model, select_device
from acer_sync.nets.distributions import distribution_for
from acer_sync.nets.networks import network_from_spec
from acer_sync.nets.precision import runs_in_bf16, slow_bf16_warning
from acer_sync.replay.buffer import ReplayBuffer, buffer_fields
from acer_sync.rollout.background import ActingCopy, BackgroundCollector
from acer_sync.rollout.runner import Runner
from acer_sync.rollout.video import render_headless
from acer_sync.training.acer import ACER
from acer_sync.training.callbacks import (
    Callback,
    CallbackList,
    CheckpointCallback,
    EvalCallback,
    ProgressBar,
    ProgressCallback,
    ProgressRows,
)
from acer_sync.training.checkpoint import BUFFER_FILE, load_buffer, remove_leftovers, restore
from acer_sync.training.tracking import WandbCallback
from acer_sync.training.trainer import Parts, Trainer
from atari.envs import EnvInfo, VecEnv, check_groups_backend, choose_backend
from atari.episodes import EpisodeTracker


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where that file does not exist."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: The share of a GPU's free memory the replay buffer may take under ``--replay-device auto`` (the
#: networks, their activations and the update's temporaries need the rest).
GPU_BUFFER_SHARE = 0.5


def replay_device(config: Config, device: torch.device, needed: int) -> torch.device:
    """Where the replay buffer lives (``--replay-device``): on the GPU the run trains on where
    ``auto`` finds room for it there (:data:`GPU_BUFFER_SHARE` of its free memory) or ``cuda`` asks
    for it, else in host memory. A UserError where ``cuda`` was asked for and it does not fit."""
    if config.replay_device == "cpu" or device.type != "cuda":
        return torch.device("cpu")
    free, _ = torch.cuda.mem_get_info(device)
    if needed <= GPU_BUFFER_SHARE * free:
        return device
    if config.replay_device == "cuda":
        raise UserError(f"--replay-device cuda: the replay buffer needs {needed / 1e9:.2f} GB and the GPU has "
                        f"{free / 1e9:.2f} GB free; lower --buffer-size or use --replay-device auto")
    return torch.device("cpu")


def check_buffer_fits(config: Config, needed: int) -> None:
    """A UserError naming --buffer-size where a replay buffer of ``needed`` bytes cannot fit in host memory."""
    available = available_memory_bytes()
    if available is not None and needed > 0.9 * available:
        raise UserError(
            f"the replay buffer needs {needed / 1e9:.2f} GB but only {available / 1e9:.2f} GB of memory is "
            f"available; lower --buffer-size (now {config.buffer_size} steps per env) or --num-envs"
        )


@contextlib.contextmanager
def networks_fit():
    """A one-line UserError where building the networks runs out of memory (a typo such as
    --net-arch 1000000,1000000), in place of torch's allocator error: the GPU's where CUDA's
    allocator failed, else the host's (networks are built there, then moved)."""
    try:
        yield
    except (MemoryError, RuntimeError) as error:
        if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "allocate" not in str(error):
            raise
        memory = "GPU" if isinstance(error, torch.OutOfMemoryError) else "host"
        raise UserError(
            f"the network does not fit in the {memory}'s memory ({type(error).__name__}); "
            "lower --net-arch, --lstm-size or the torso's size"
        ) from None


def nothing_to_train_note(total_timesteps: int) -> str:
    """What a resume of a run that has reached its ``total_timesteps`` says."""
    return (f"the run has reached its --total-timesteps {total_timesteps}, so there is nothing to train (a larger "
            "--total-timesteps continues it)")


def remove_cut_writes(run_dir: Path) -> None:
    """Remove the temporary files of writes that a kill cut short from a resumed run (a buffer's can be
    GBs; :func:`acer_sync.training.checkpoint.remove_leftovers`), saying each."""
    for leftover in remove_leftovers(run_dir):
        log.info(f"removed {leftover}, left by a write that was cut short")


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python's, numpy's and torch's global generators; returns the replay sampler's generator."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def run_callbacks(
    config: Config, run_dir: Path, resume_step: int | None, progress_bar: bool, user: Iterable[Callback] = (),
    on_progress: Callable[[dict], None] | None = None, on_checkpoint: Callable[[Path], None] | None = None,
) -> CallbackList:
    """A run's callbacks in the order they run: the built-ins (:mod:`acer_sync.training.callbacks` lists them), with the
    ``on_progress`` shorthand right after the row is written, then the user's (in an iteration the checkpoints come
    after the user's: :class:`CallbackList`)."""
    checkpoints = CheckpointCallback(run_dir, config, on_checkpoint)
    evaluation = EvalCallback(config, checkpoints, run_dir) if config.eval_every else None
    progress = ProgressCallback(run_dir, config, resume_step, evaluation)
    progress_rows = [ProgressRows(on_progress, progress)] if on_progress is not None else []
    tracking = [WandbCallback(run_dir, config, evaluation, progress)] if config.track else []
    bar = [ProgressBar(config.total_timesteps)] if progress_bar else []
    user = list(user)
    callbacks = [
        *([evaluation] if evaluation else []), progress, *progress_rows, *tracking, *bar, checkpoints, *user,
    ]
    return CallbackList(callbacks, user=progress_rows + user)


def build_trainer(
    config: Config, info: EnvInfo, run_dir: Path, resume: dict | None = None, progress_bar: bool = False,
    callbacks: Iterable[Callback] = (), on_progress: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[Path], None] | None = None, timer: PhaseTimer | None = None,
    builtin: bool = True,
) -> Trainer:
    """A :class:`Trainer` of ``config`` on ``info`` writing to ``run_dir``, from a checkpoint's
    ``resume`` payload (:func:`acer_sync.training.checkpoint.load_checkpoint`) or from scratch.

    :param run_dir: must already exist and be writable (:func:`acer_sync.train` makes and checks it).
    :param progress_bar: show a tqdm bar.
    :param callbacks: the user's callbacks, after the built-in ones.
    :param on_progress: called with each progress row after it is written (a shorthand callback).
    :param on_checkpoint: called with the path of ``latest.pt`` after each checkpoint.
    :param timer: times the phases of each iteration (bench.py); off in training.
    :param builtin: install the built-in callbacks (evaluation, progress rows, checkpoints); bench.py
        times the bare iteration without them.
    """
    callbacks = list(callbacks)
    check_groups_backend(config.env_groups, choose_backend(info, config.vec_env))  # before the buffer, which may be large
    if config.capture_video:
        render_headless()  # before an env first imports MuJoCo or pygame
    # torch's thread count is the process's: the Trainer gives the caller's back when it closes
    # (the classic and continuous presets set 1, and a library user's process goes on after the run).
    threads_before = torch.get_num_threads()
    with contextlib.ExitStack() as undo:  # what a start that fails takes back: the threads, the envs
        undo.callback(torch.set_num_threads, threads_before)
        if config.threads:
            torch.set_num_threads(config.threads)
        device = select_device(config.device)
        timer = timer or PhaseTimer(enabled=False, device=device)
        sampler = seed_everything(config.seed)

        with networks_fit():
            # A resume builds the checkpoint's network: the resume checked that it is the one the
            # config gives, or an older spec's form of it (acer_sync.nets.build.in_saved_form).
            model = (network_from_spec(resume["model_spec"]) if resume is not None else build_model(info, config)).to(device)
        fields = buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info), model.state_shapes,
                               frame_parts=info.frame_layout if info.frame_parts else None)
        buffer_bytes = ReplayBuffer.bytes_needed(fields, config.num_envs, config.nsteps, config.buffer_size, info.stack)
        storage = replay_device(config, device, buffer_bytes)
        if storage.type == "cpu":
            check_buffer_fits(config, buffer_bytes)
        compiling = compile_mode(config, device.type, runs_in_bf16(model, config.precision))
        if config.compile == "auto" and compiling != "off":
            log.info(f"--compile auto: the update compiles (a run of {config.total_timesteps:,} steps); its first update "
                     "waits for the compile, 20-35 s on a CPU (--compile off runs it eagerly)")
        if compiling == "network":
            model.compile()  # in place: the state_dict keys stay the same
        with networks_fit():
            agent = ACER(model, config, timer, compile_mode=compiling)  # the average network: a second copy
        warning = slow_bf16_warning(config.precision, device, model)
        if warning is not None:
            log.warning(warning)
        tracker = EpisodeTracker(config.num_envs, life_loss_ends_episode=info.atari, clip_rewards=info.atari)
        steps_per_iteration = config.num_envs * config.nsteps
        counters = restore(resume, model, agent, tracker, sampler, steps_per_iteration) if resume is not None else {}
        schedule_moved = None  # said once the resume is known to go on (its buffer may still refuse it)
        if resume is not None and config.total_timesteps != resume["config"]["total_timesteps"]:
            saved_total, step = resume["config"]["total_timesteps"], counters["timesteps"]
            if config.total_timesteps < step:
                # it trained nothing, said "finished" and saved the smaller total (a run's own total may be below
                # its step: the last iteration goes past it)
                raise UserError(f"--total-timesteps {config.total_timesteps} is below the step the run has reached "
                                f"({step}); give more to train on")
            if config.lr_schedule == "linear":
                before, after = (learning_rate("linear", config.lr, step, total) for total in (saved_total, config.total_timesteps))
                schedule_moved = (f"--total-timesteps {config.total_timesteps} moves the linear learning-rate schedule's end "
                                  f"from step {saved_total}: at step {step} the rate goes from {before:.3g} to {after:.3g}")

        buffer = ReplayBuffer(fields, config.num_envs, config.nsteps, config.buffer_size, info.stack, device=storage)
        per_transition = buffer_bytes / (config.num_envs * buffer.step_capacity)
        where = " on the GPU" if storage.type == "cuda" else ""
        log.info(
            f"replay buffer{where}: {config.num_envs} envs x {buffer.step_capacity} steps = "
            f"{buffer_bytes / 1e9:.2f} GB ({per_transition:.0f} bytes per transition)"
        )
        if resume is not None:
            said = load_buffer(run_dir, buffer, counters["timesteps"], resume["run_key"])
            if schedule_moved is not None:
                log.warning(schedule_moved)
            saved = Path(run_dir) / "checkpoints" / BUFFER_FILE
            if not config.save_buffer and saved.exists():  # nothing removes it: it would stay at this step for good
                said += (f"; --save-buffer is off, so {saved} ({saved.stat().st_size / 1e9:.2f} GB) is not kept up to "
                         "date: remove it to free the disk")
            if counters["timesteps"] >= config.total_timesteps:  # with callbacks, owing an evaluation, or config.json gone
                said += f"; {nothing_to_train_note(config.total_timesteps)}"
            log.info(f"resuming at step {counters['timesteps']}: {said}")
            remove_cut_writes(run_dir)
        backend = choose_backend(info, config.vec_env)
        env = VecEnv(info, config.num_envs, backend, num_threads=config.threads, timeout=config.env_timeout,
                     groups=config.env_groups)
        undo.callback(env.abort)  # a first reset that failed, hung or was cut short: no worker is left behind
        pipelining = pipeline_mode(config, device.type, backend)
        if config.pipeline == "auto" and pipelining == "overlap":
            log.info("--pipeline auto: the learner trains while the envs collect in a thread (Atari on CUDA; "
                     "--pipeline serial alternates them)")
        acting = ActingCopy(model) if pipelining == "overlap" else None
        # Overlapped, the acting thread samples from a generator of its own (the learner keeps the global ones).
        generator = torch.Generator(device).manual_seed(config.seed + counters.get("iterations", 0)) if acting else None
        runner = Runner(  # overlapped, the collecting thread is not timed: the phase timer is the main thread's
            env, acting.model if acting else model, device, config.nsteps, tracker, fields, None if acting else timer,
            reward_scale=config.reward_scale, precision=config.precision, generator=generator,
            stream=acting.stream if acting else None, graph=compiling == "graph" and device.type == "cuda",
        )
        runner.reset(seed=config.seed + counters.get("iterations", 0) * config.num_envs)
        collector = BackgroundCollector(runner.run, info.env_id, env.current_call) if acting else None

        resume_step = counters["timesteps"] if resume is not None else None
        if builtin:
            callback_list = run_callbacks(config, Path(run_dir), resume_step, progress_bar, callbacks, on_progress, on_checkpoint)
        else:
            callback_list = CallbackList(callbacks, user=callbacks)
        if resume is not None:
            callback_list.load_state(resume["callbacks"])
        trainer = Trainer(
            config, info, Path(run_dir),
            Parts(device, model, agent, fields, buffer, env, runner, tracker, sampler, timer, acting, collector),
            callback_list, counters, resume["run_key"] if resume is not None else None, on_close=lambda: torch.set_num_threads(threads_before),
        )
        undo.pop_all()  # started: the Trainer closes them
        return trainer

"""The learn loop: act for one segment, store it, one on-policy and Poisson(replay_ratio) off-policy updates."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from acer_sync.agent import ACER, UPDATE_STATS
from acer_sync.buffer import Batch, Field, ReplayBuffer, buffer_fields, to_batch
from acer_sync.checkpoint import LATEST, atomic_write, save_checkpoint
from acer_sync.config import Config, hidden_sizes
from acer_sync.distributions import distribution_for
from acer_sync.errors import STOP_SIGNALLED, UserError
from acer_sync.evaluation import evaluate
from acer_sync.logger import Logger
from acer_sync.networks import (
    RECURRENT_ARCHS,
    ActorCritic,
    GaussianActorCritic,
    Network,
    RecurrentActorCritic,
    RecurrentGaussianActorCritic,
)
from acer_sync.outcome import Outcome, Stop
from acer_sync.precision import slow_bf16_warning
from acer_sync.profiling import PhaseTimer
from acer_sync.rng_state import capture_rng, restore_rng
from acer_sync.runner import Runner
from acer_sync.schedules import learning_rate
from atari.envs import EnvInfo, EnvWorkerDied, VecEnv, choose_backend
from atari.episodes import EpisodeTracker

BUFFER_FILE = "buffer.npz"
#: Config fields that may differ between a run and its resume.
RESUMABLE_CHANGES = ("total_timesteps", "device", "threads", "precision")


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


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


def check_buffer_fits(config: Config, info: EnvInfo, fields: tuple[Field, ...]) -> int:
    """Bytes the replay buffer needs; a UserError naming --buffer-size if it cannot fit."""
    needed = ReplayBuffer.bytes_needed(fields, config.num_envs, config.nsteps, config.buffer_size, info.stack)
    available = available_memory_bytes()
    if available is not None and needed > 0.9 * available:
        raise UserError(
            f"the replay buffer needs {needed / 1e9:.2f} GB but only {available / 1e9:.2f} GB of memory is "
            f"available; lower --buffer-size (now {config.buffer_size} steps per env) or --num-envs"
        )
    return needed


def resident_memory_mb() -> float:
    """This process's resident memory (RSS) in MB, from /proc/self/statm (NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")


def network_arch(info: EnvInfo, config: Config) -> str:
    """The torso ``config.network`` asks for, ``auto`` resolved (cnn for frames, mlp for vectors),
    or a one-line UserError where it does not fit the observations."""
    arch = info.arch if config.network == "auto" else config.network
    frames = info.arch == "cnn"
    if frames != (arch in ("cnn", "cnn_lstm")):
        fits = "cnn or cnn_lstm for image" if frames else "mlp or lstm for vector"
        raise UserError(f"--network {arch} does not fit {info.env_id}; use {fits} observations")
    if info.continuous and frames:
        raise UserError(f"{info.env_id} has image observations and continuous actions; the Gaussian policy takes vectors")
    return arch


def build_model(info: EnvInfo, config: Config) -> Network:
    """A softmax actor-critic for discrete actions, a Gaussian policy with an SDN for a Box, on the
    torso of ``config.network`` (feed-forward, or with an LSTM)."""
    arch, hidden = network_arch(info, config), hidden_sizes(config)
    recurrent = arch in RECURRENT_ARCHS
    if info.continuous:
        half_width = (np.asarray(info.action_high) - np.asarray(info.action_low)) / 2.0
        init_std = (config.policy_std * half_width).tolist()
        if recurrent:
            return RecurrentGaussianActorCritic(
                info.obs_shape, info.n_actions, arch, hidden, init_std, config.lstm_size, config.normalize_obs
            )
        return GaussianActorCritic(info.obs_shape, info.n_actions, hidden, init_std, config.normalize_obs)
    if recurrent:
        return RecurrentActorCritic(info.obs_shape, info.n_actions, arch, hidden, config.lstm_size, config.normalize_obs)
    return ActorCritic(info.obs_shape, info.n_actions, arch, hidden, config.normalize_obs)


class GracefulStop:
    """Turns the first SIGINT/SIGTERM into a flag the loop checks; a second SIGINT stops at once.

    Python lets only the main thread install signal handlers. Elsewhere (a Ray Tune trial runs the
    Trainer in a worker thread) it installs none and the signals keep their owner's handling.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self.interrupted_twice = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def request(self, reason: str) -> None:
        """Stop as after a first signal, for ``reason``: a driver's stop that no signal carries (a
        sweep's Ctrl-C reaching its trials). Any thread may call it."""
        if self.signal_name is None:
            self.signal_name = reason

    def _handle(self, signum, frame):
        if self.signal_name is not None:
            # Code that the KeyboardInterrupt lands in may turn it into another error (torch.save's
            # zip writer raises a RuntimeError from its __exit__), so remember that it came.
            self.interrupted_twice = True
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        STOP_SIGNALLED.set()  # from here on, the scripts' own handler exits at once (after train() returns, too)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


class Trainer:
    """Owns one run: envs, networks, buffer, logger, checkpoints.

    :param config: the run's settings.
    :param info: what the env looks like (from :func:`atari.envs.env_info`).
    :param run_dir: where outputs go; must already exist and be writable (:func:`acer_sync.train`
        makes and checks it, and writes ``config.json`` beside the outputs).
    :param resume: a loaded checkpoint to continue from, or None.
    :param progress_bar: show a tqdm bar.
    :param timer: times the phases of each iteration (bench.py); off in training.
    :param on_progress: called with each progress row, after it is written to ``progress.csv``.
    :param on_checkpoint: called with the path of ``latest.pt`` after each checkpoint is written.
        These two hooks let a driver such as a Ray Tune trial follow the run; the Trainer knows
        nothing of the driver.
    """

    def __init__(
        self, config: Config, info: EnvInfo, run_dir: Path, resume: dict | None = None, progress_bar: bool = True,
        timer: PhaseTimer | None = None, on_progress: Callable[[dict], None] | None = None,
        on_checkpoint: Callable[[Path], None] | None = None,
    ):
        self.config = config
        self.info = info
        self.run_dir = run_dir
        self.progress_bar = progress_bar
        self.on_progress = on_progress
        self.on_checkpoint = on_checkpoint
        self.stop = GracefulStop()
        # torch's thread count is the process's: close() gives the caller's back (the classic and
        # continuous presets set 1, and a library user's process goes on after the run).
        self.threads_before = torch.get_num_threads()
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = select_device(config.device)
        self.timer = timer or PhaseTimer(enabled=False, device=self.device)
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.sampler = np.random.default_rng(config.seed)

        self.model = build_model(info, config).to(self.device)
        self.fields = buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info), self.model.state_shapes)
        buffer_bytes = check_buffer_fits(config, info, self.fields)
        if config.compile:
            self.model.compile()  # in place: the state_dict keys stay the same
        self.agent = ACER(self.model, config, self.timer)
        warning = slow_bf16_warning(config.precision, self.device, self.model)
        if warning is not None:
            print(warning, file=sys.stderr, flush=True)
        self.timesteps = 0
        self.iterations = 0
        self.updates = 0
        self.time_before = 0.0  # wall time of earlier sessions of this run (resume)
        self.started = time.perf_counter()
        self.eval_env: VecEnv | None = None
        self.eval_generator = torch.Generator(device=self.device).manual_seed(config.seed + 1)
        self.tracker = EpisodeTracker(config.num_envs, life_loss_ends_episode=info.atari, clip_rewards=info.atari)
        if resume is not None:
            self._restore(resume)

        self.buffer = ReplayBuffer(self.fields, config.num_envs, config.nsteps, config.buffer_size, info.stack)
        per_transition = buffer_bytes / (config.num_envs * self.buffer.step_capacity)
        print(
            f"replay buffer: {config.num_envs} envs x {self.buffer.step_capacity} steps = "
            f"{buffer_bytes / 1e9:.2f} GB ({per_transition:.0f} bytes per transition)",
            flush=True,
        )
        if resume is not None:
            print(f"resuming at step {self.timesteps}: {self._load_buffer()}", flush=True)
        self.env = VecEnv(info, config.num_envs, choose_backend(info, config.vec_env), num_threads=config.threads)
        self.runner = Runner(
            self.env, self.model, self.device, config.nsteps, self.tracker, self.fields, self.timer,
            reward_scale=config.reward_scale, precision=config.precision,
        )
        self.runner.reset(seed=config.seed + self.iterations * config.num_envs)
        self.logger = Logger(run_dir, resume_step=self.timesteps if resume is not None else None)
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        self.next_checkpoint = (self.timesteps // config.checkpoint_every + 1) * config.checkpoint_every
        self.next_eval = (self.timesteps // config.eval_every + 1) * config.eval_every if config.eval_every else 0
        self._reset_interval()

    @staticmethod
    def model_spec(info: EnvInfo, config: Config) -> dict:
        """The network spec a run of ``config`` on ``info`` builds; checkpoints must match it."""
        return build_model(info, config).spec()

    def _restore(self, payload: dict) -> None:
        self.model.load_state_dict(payload["model"])
        self.agent.average_model.load_state_dict(payload["average_model"])
        self.agent.optimizer.load_state_dict(payload["optimizer"])
        counters = payload["counters"]
        self.timesteps = int(counters["timesteps"])
        self.iterations = int(counters["iterations"])
        self.updates = int(counters["updates"])
        self.agent.nonfinite_updates = int(counters.get("nonfinite_updates", 0))
        self.time_before = float(counters.get("time_elapsed", 0.0))
        self.tracker.episodes = int(counters["episodes"])
        self.tracker.recent_returns.extend(payload["recent_returns"])
        self.tracker.recent_lengths.extend(payload.get("recent_lengths", []))
        restore_rng(payload["rng"], self.sampler)

    def checkpoint_payload(self) -> dict:
        return {
            "config": dataclasses.asdict(self.config),
            "env_id": self.info.env_id,
            # The Box's bounds, which a Gaussian policy's actions are clipped to (empty for discrete actions).
            "action_low": list(self.info.action_low),
            "action_high": list(self.info.action_high),
            "model_spec": self.model.spec(),
            "model": self.model.state_dict(),
            "average_model": self.agent.average_model.state_dict(),
            "optimizer": self.agent.optimizer.state_dict(),
            "counters": {
                "timesteps": self.timesteps,
                "iterations": self.iterations,
                "updates": self.updates,
                "episodes": self.tracker.episodes,
                "nonfinite_updates": self.agent.nonfinite_updates,
                "time_elapsed": self.time_elapsed(),
            },
            "recent_returns": list(self.tracker.recent_returns),
            "recent_lengths": list(self.tracker.recent_lengths),
            "rng": capture_rng(self.sampler),
        }

    def time_elapsed(self) -> float:
        """Wall-clock seconds of this run, earlier sessions included."""
        return self.time_before + time.perf_counter() - self.started

    def evaluate(self) -> dict[str, float]:
        """Play ``eval_episodes`` full games in separate envs with the evaluation preprocessing."""
        cfg = self.config
        start = time.perf_counter()
        if self.eval_env is None:
            self.eval_env = VecEnv(self.info, min(cfg.eval_episodes, cfg.num_envs), self.env.backend, num_threads=cfg.threads)
        scores = evaluate(
            self.model, self.eval_env, cfg.eval_episodes, self.device, greedy=cfg.eval_greedy,
            seed=cfg.seed + 1_000_003 * (1 + self.timesteps // max(cfg.eval_every, 1)), generator=self.eval_generator,
            precision=cfg.precision,
        )
        return {
            "eval_mean": float(np.mean(scores)),
            "eval_std": float(np.std(scores)),
            "eval_episodes": len(scores),
            "eval_seconds": round(time.perf_counter() - start, 2),
        }

    def save(self, periodic: bool) -> None:
        """Write ``latest.pt`` (and a periodic copy), prune old periodic ones, and the buffer if asked."""
        payload = self.checkpoint_payload()
        directory = self.run_dir / "checkpoints"
        save_checkpoint(directory / LATEST, payload)
        if periodic:
            save_checkpoint(directory / f"step_{self.timesteps:010d}.pt", payload)
            periodic_files = sorted(directory.glob("step_*.pt"))
            for old in periodic_files[: max(0, len(periodic_files) - self.config.keep_checkpoints)]:
                old.unlink()
        if self.config.save_buffer:
            try:
                atomic_write(directory / BUFFER_FILE, lambda handle: np.savez(handle, **self.buffer.state()))
            except OSError as error:
                raise UserError(f"cannot write the replay buffer to {directory / BUFFER_FILE}: {error.strerror or error}") from None
        if self.on_checkpoint is not None:
            self.on_checkpoint(directory / LATEST)

    def _load_buffer(self) -> str:
        """Restore the buffer saved beside the checkpoint, if any; says what happened."""
        path = self.run_dir / "checkpoints" / BUFFER_FILE
        if not path.exists():
            return "no saved replay buffer, so it starts empty on resume"
        try:
            with np.load(path, allow_pickle=False) as arrays:
                self.buffer.load_state(arrays)
        except (OSError, ValueError, KeyError, EOFError) as error:
            raise UserError(f"cannot restore the replay buffer from {path}: {error}") from None
        return f"replay resumes with the saved buffer ({self.buffer.num_steps_stored} steps per env)"

    def train(self) -> Outcome:
        """Run until ``total_timesteps``, a signal, a dead env worker or too many non-finite
        updates; says which (the scripts turn it into an exit code, :mod:`acer_sync.errors`)."""
        cfg = self.config
        self._reset_interval()
        bar = tqdm(total=cfg.total_timesteps, initial=self.timesteps, unit="step", disable=not self.progress_bar, dynamic_ncols=True)
        with self.stop as stop:
            try:
                return self._run_until_done_or_stopped(stop, bar)
            except BaseException as error:
                # A second signal may land anywhere: in an update, in the final save (whose atomic
                # write leaves the previous checkpoint in place) or while the envs close, and what
                # it interrupts may re-raise it as another error. Exit at once without cleaning up;
                # the vector envs' finalizers terminate their workers.
                if not (stop.interrupted_twice or isinstance(error, KeyboardInterrupt)):
                    raise
                return self._outcome(Stop.INTERRUPTED, "second SIGINT: exiting at once; the previous checkpoint is kept")

    def request_stop(self, reason: str) -> None:
        """Finish the current iteration, save a checkpoint and return an INTERRUPTED outcome from
        :meth:`train`, as after SIGINT; ``reason`` names why in the "received: saving" line."""
        self.stop.request(reason)

    def stop_requested(self) -> bool:
        return self.stop.signal_name is not None

    def _run_until_done_or_stopped(self, stop: GracefulStop, bar: tqdm) -> Outcome:
        cfg = self.config
        try:
            while self.timesteps < cfg.total_timesteps and stop.signal_name is None:
                self._iteration(bar)
                if self.agent.nonfinite_streak >= cfg.max_nonfinite:
                    self.close()
                    return self._outcome(
                        Stop.NONFINITE, f"{self.agent.nonfinite_streak} non-finite updates in a row at step "
                        f"{self.timesteps}; stopped, keeping the last good checkpoint",
                    )
        except EnvWorkerDied as error:
            message = f"{error}; saved a checkpoint at step {self.timesteps}"
            try:
                self.save(periodic=False)
            except UserError as save_error:
                raise UserError(f"{error}; and the checkpoint at step {self.timesteps} failed: {save_error}") from None
            self.close()
            return self._outcome(Stop.ENV_DIED, message)
        finally:
            bar.close()
        reason = Stop.FINISHED
        if stop.signal_name is not None:
            print(f"{stop.signal_name} received: saving a checkpoint at step {self.timesteps} and exiting", flush=True)
            reason = Stop.INTERRUPTED
        self.save(periodic=False)
        self.close()
        return self._outcome(reason)

    def _outcome(self, stop: Stop, error: str = "") -> Outcome:
        return Outcome(stop, self.run_dir, self.timesteps, error)

    def _reset_interval(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts = {"on": 0, "off": 0}
        self.interval_start, self.interval_steps = time.perf_counter(), 0

    def _iteration(self, bar: tqdm) -> None:
        """Act for one segment, then one on-policy and Poisson(replay_ratio) off-policy updates."""
        cfg, timer = self.config, self.timer
        steps = cfg.num_envs * cfg.nsteps
        segment = self.runner.run()
        with timer("buffer_put"):
            self.buffer.put(segment)
        lr = learning_rate(cfg.lr_schedule, cfg.lr, self.timesteps, cfg.total_timesteps)
        self.timesteps += steps
        self.iterations += 1
        self.interval_steps += steps

        with timer("buffer_get"):
            batch = self._with_replay_state(to_batch(self.buffer.latest(), self.fields, self.info.stack, self.device))
        with timer("on_policy_update"):
            _accumulate(self.sums, self.agent.update(batch, lr), "")
        self.counts["on"] += 1
        self.updates += 1
        if cfg.replay_ratio > 0 and self.buffer.num_steps_stored >= cfg.replay_start:
            for _ in range(self.sampler.poisson(cfg.replay_ratio)):
                with timer("buffer_get"):
                    batch = self._replay_batch()
                with timer("off_policy_updates"):
                    _accumulate(self.sums, self.agent.update(batch, lr), "off_")
                self.counts["off"] += 1
                self.updates += 1
        bar.update(steps)

        evaluation = {}
        if cfg.eval_every and self.timesteps >= self.next_eval:
            paused = time.perf_counter()
            evaluation = self.evaluate()
            self.interval_start += time.perf_counter() - paused  # fps counts training only
            self.next_eval += cfg.eval_every
        if evaluation or self._row_due():
            elapsed = time.perf_counter() - self.interval_start
            row = self._progress_row(self.sums, self.counts, self.interval_steps / max(elapsed, 1e-9), lr)
            row.update(evaluation)
            self.logger.log(row)
            if self.on_progress is not None:
                self.on_progress(row)
            bar.set_postfix(mean_return=f"{row['mean_episode_reward']:.2f}", episodes=row["episodes"])
            self._reset_interval()
        if self.timesteps >= self.next_checkpoint and self.agent.nonfinite_streak == 0:
            # While updates are non-finite no checkpoint is written: the last good one stays.
            self.save(periodic=True)
            self.next_checkpoint += cfg.checkpoint_every

    def _with_replay_state(self, batch: Batch) -> Batch:
        """``replay_state`` zero: replay a recurrent network from the zero state (Baselines' way)."""
        if self.config.replay_state == "zero" and batch.state:
            batch["state"] = self.model.initial_state(self.config.num_envs)
        return batch

    def _replay_batch(self) -> Batch:
        """One replayed segment per env; with ``replay_state`` burn_in, a recurrent network starts
        it from the state the current weights reach over the previous segment (R2D2's burn-in,
        here T steps from that segment's stored state), where that segment is still stored."""
        index = self.buffer.sample_indices(self.sampler)
        batch = to_batch(self.buffer.gather(index), self.fields, self.info.stack, self.device)
        if self.config.replay_state != "burn_in" or not batch.state:
            return self._with_replay_state(batch)
        previous, available = self.buffer.previous(index)
        previous = to_batch(previous, self.fields, self.info.stack, self.device)
        with torch.no_grad():
            _, burned = self.agent.net.unroll(previous.obs[:-1], previous.firsts[:-1], previous.state)
        use = torch.from_numpy(available).to(self.device).unsqueeze(-1)
        batch["state"] = tuple(torch.where(use, new, stored) for new, stored in zip(burned, batch.state))
        return batch

    def _row_due(self) -> bool:
        """Whether this iteration writes a progress row: every ``log_interval`` iterations, at the
        end, and once ``log_seconds`` of wall time passed since the last row, so that a slow run's
        first row comes after ``log_seconds``, not after ``log_interval`` iterations."""
        cfg = self.config
        if self.iterations % cfg.log_interval == 0 or self.timesteps >= cfg.total_timesteps:
            return True
        return cfg.log_seconds > 0 and time.perf_counter() - self.interval_start >= cfg.log_seconds

    def _progress_row(self, sums: dict, counts: dict, fps: float, lr: float) -> dict:
        row: dict[str, float] = {
            "total_timesteps": self.timesteps,
            "iterations": self.iterations,
            "updates": self.updates,
            "time_elapsed": round(self.time_elapsed(), 1),
            "fps": round(fps, 1),
            "episodes": self.tracker.episodes,
            "mean_episode_reward": self.tracker.mean_return(),
            "mean_episode_length": float(np.mean(self.tracker.recent_lengths)) if self.tracker.recent_lengths else float("nan"),
            "lr": lr,
            "off_policy_updates": counts["off"],
            "nonfinite_updates": self.agent.nonfinite_updates,
            "rss_mb": round(resident_memory_mb(), 1),
            "eval_mean": float("nan"),
            "eval_std": float("nan"),
            "eval_episodes": 0,
            "eval_seconds": 0.0,
        }
        for prefix, count in (("", counts["on"]), ("off_", counts["off"])):
            for name in UPDATE_STATS:
                if name != "nonfinite":
                    total = sums.get(prefix + name)
                    row[prefix + name] = float(total) / count if total is not None and count else float("nan")
        return row

    def close(self) -> None:
        torch.set_num_threads(self.threads_before)
        self.logger.close()
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()


def _accumulate(sums: dict, stats: dict, prefix: str) -> None:
    for name, value in stats.items():
        key = prefix + name
        sums[key] = sums[key] + value.detach() if key in sums else value.detach().clone()


"""The library's door for training: ``acer_sync.train(env, **settings)``.

``train.py`` and the sweep trials run through [`run`][], so a run started from Python is the same as
one started from the command line: a run directory with ``config.json``, ``progress.csv``, ``tb/``
and ``checkpoints/``. Everything is checked before anything is written ([`check_config`][] is the
one check of a run's settings, for flags, config files, sweep files and the API alike); a mistake is
one [`UserError`][atari.errors.UserError] with a one-line message, and leaves no directory behind.
The library never exits and never prints an ``error:`` line: a run returns an ``Outcome``
(``acer_sync.base.outcome``), which the scripts turn into exit codes (``acer_sync.base.errors``) and
[`train`][] into a return value or a [`TrainingStopped`][].

An env is an id, as for ``--env``, or a zero-argument callable that returns a gymnasium env. A
callable is registered with gymnasium under ``acer_sync-callable/<module>.<name>`` (what
``config.json`` and the checkpoints record as the env), so that every env the run builds, for
training and for evaluation, comes from it.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import gymnasium as gym
import numpy as np

from acer_sync.api.env_callables import (
    callable_env_id,
    callable_is_shared,
    is_callable_env,
    register_callable,
)
from acer_sync.api.run_metadata import CONFIG_FILE, read_config, record_resume, write_config
from acer_sync.base.config import (
    RESUMABLE_CHANGES,
    Config,
    build_config,
    given_twice,
    saved_config,
    setting_name,
    validate,
)
from acer_sync.base.config_file import check_setting, env_settings_line, field_types, load_env_settings
from acer_sync.base.errors import UserError, WriteFailed, env_stop, names_a_path
from acer_sync.base.log import console, log
from acer_sync.base.malloc import freed_memory_kept
from acer_sync.base.outcome import Outcome, Stop
from acer_sync.base.run_lock import RunLock
from acer_sync.nets.build import (
    build_model,
    image_rule_hint,
    in_saved_form,
    model_spec,
    network_arch,
    saved_env_info,
    select_device,
)
from acer_sync.nets.torsos import TorsoError, torso_name
from acer_sync.rollout.video import check_renders
from acer_sync.training.callbacks import (
    Callback,
    CallbackList,
    EvalCallback,
    check_callbacks,
    evaluation_owed,
    saved_next_eval,
)
from acer_sync.training.checkpoint import (
    LATEST,
    check_saved_state,
    copy_hint,
    has_checkpoint,
    latest_checkpoint,
    load_run_checkpoint,
)
from acer_sync.training.logger import check_progress
from acer_sync.training.setup import build_trainer, nothing_to_train_note, remove_cut_writes
from acer_sync.training.tracking import check_wandb
from acer_sync.training.trainer import Trainer
from atari.envs import EnvInfo, env_info
from atari.errors import EnvFailed

EnvSource = str | Callable[[], gym.Env]


class TrainingStopped(RuntimeError):
    """A run that stopped before ``total_timesteps`` and not by a callback: interrupted (SIGINT or
    SIGTERM, after saving its checkpoint), an env that failed or hung, a file that could not be
    written (a full disk), or too many non-finite updates in a row.

    ``outcome`` says which (an ``Outcome`` of ``acer_sync.base.outcome``: ``outcome.stop``), and
    ``outcome.run_dir`` holds the checkpoint: ``acer_sync.train(resume=outcome.run_dir)`` continues the run
    (unless the run never started: an env that failed at its first reset, a config that could not be
    written; the message says so).
    """

    def __init__(self, outcome: Outcome):
        reason = outcome.error or f"{outcome.message or outcome.stop.value} at step {outcome.timesteps}"
        if has_checkpoint(outcome.run_dir):  # not a run that never started
            reason += f"; continue it with acer_sync.train(resume={str(outcome.run_dir)!r})"
        super().__init__(reason)
        self.outcome = outcome


def train(
    env: EnvSource | None = None, *, run_dir: str | Path | None = None, resume: str | Path | None = None,
    callbacks: Iterable[Callback] = (), verbose: int = 1, progress_bar: bool = True,
    on_progress: Callable[[dict], None] | None = None, on_checkpoint: Callable[[Path], None] | None = None,
    **settings,
) -> Path:
    """Train ACER on ``env`` as ``train.py`` does, and return the run directory.

    :param env: an env id, as for ``train.py --env`` (Atari ids get DeepMind preprocessing and the
        Atari preset), or a zero-argument callable that returns a gymnasium env (the classic or,
        for Box actions, the continuous preset, and the ``sync`` backend unless ``vec_env`` says
        otherwise: ``subproc`` needs worker processes made by fork). Optional with ``resume``.
    :param run_dir: the run directory (default: ``runs/<env>__<seed>__<time>``); it must not
        already hold a run.
    :param resume: continue the run in this directory from its latest checkpoint instead;
        ``settings`` may then change only those in ``acer_sync.base.config.RESUMABLE_CHANGES``
        (the run's length, where and how fast it runs, what it reports and keeps; the Training page
        lists them), and ``env`` (needed again for a run of a callable) must be the run's own.
    :param callbacks: [`Callback`][acer_sync.training.callbacks.Callback] instances, called around each
        iteration after the built-in evaluation, progress row and bar, and before the periodic
        checkpoint, which then holds their state (the final checkpoint comes before their
        ``on_training_end``); one that returns False stops the run (a checkpoint is saved, and
        ``train`` returns); an exception raised in one saves a checkpoint, then propagates.
    :param verbose: 1 shows what the run says (the run directory, the buffer's size, resuming) on
        standard output and its warnings on standard error, through the ``acer_sync`` logger
        (``acer_sync.base.log``); 0 shows nothing but warnings and errors, and no progress bar.
    :param progress_bar: show a tqdm bar (with ``verbose`` 1).
    :param on_progress: called with each progress row, after it is written to ``progress.csv``.
    :param on_checkpoint: called with the path of ``latest.pt`` after each checkpoint.
    :param settings: [`Config`][acer_sync.base.config.Config] fields by name (``train.py``'s flags with
        ``_`` for ``-``), over the env's preset.
    :raises UserError: for bad input (one line; nothing is written).
    :raises TrainingStopped: when the run stopped before ``total_timesteps``, and not by a callback.
    """
    outcome = run(
        env, run_dir=run_dir, resume=resume, callbacks=callbacks, verbose=verbose, progress_bar=progress_bar,
        on_progress=on_progress, on_checkpoint=on_checkpoint, **settings,
    )
    if not outcome.finished:
        raise TrainingStopped(outcome)
    return outcome.run_dir


def run(
    env: EnvSource | None = None, *, run_dir: str | Path | None = None, resume: str | Path | None = None,
    callbacks: Iterable[Callback] = (), verbose: int = 1, progress_bar: bool = True,
    on_progress: Callable[[dict], None] | None = None, on_checkpoint: Callable[[Path], None] | None = None,
    command: list[str] | None = None, commit: str | None = None, on_start: Callable[[Trainer], None] | None = None,
    **settings,
) -> Outcome:
    """[`train`][], returning the run's ``Outcome`` however it ended
    (the scripts turn it into an exit code). ``command`` is what ``config.json`` records as the
    command line (default: the call itself), ``commit`` the code's git commit (default: asked of
    git here; a sweep's trials get the driver's). ``on_start`` is called with the Trainer before
    it trains (a sweep trial wires its stop request to it)."""
    if not isinstance(verbose, int):
        raise UserError(f"verbose must be a whole number (0: warnings and errors only, 1: progress), got {verbose!r}")
    # glibc's malloc keeps the large blocks an update frees, instead of faulting them in again each
    # update; what lies free at the end goes back to the kernel
    with console(verbose), freed_memory_kept():
        return _run(
            env, run_dir, resume, callbacks, verbose >= 1 and progress_bar, on_progress, on_checkpoint, command,
            commit, on_start, settings,
        )


def _run(env, run_dir, resume, callbacks, progress_bar, on_progress, on_checkpoint, command, commit, on_start,
         settings) -> Outcome:
    callbacks = check_callbacks(callbacks)  # before anything is built or written
    CallbackList(callbacks).check_state()
    if isinstance(settings.get("torso"), type):
        settings["torso"] = torso_name(settings["torso"])  # a class: recorded as module:Class
    elif not isinstance(settings.get("torso", ""), str):
        given = settings["torso"]
        what = "None (leave it out for the built-in network)" if given is None else \
            f"an instance of {type(given).__name__} (pass its class, and its arguments as torso_kwargs)"
        raise UserError(f"acer_sync.train: torso takes an nn.Module class or 'module:Class', got {what}")
    twice = given_twice(settings)
    if twice:
        raise UserError(f"acer_sync.train: gives the setting {twice[0]} twice, as {twice[1]} and {twice[2]}")
    settings = {
        setting_name(str(name)): check_setting(str(name), _plain(value), "acer_sync.train") for name, value in settings.items()
    }
    command = command or [call_text(env, settings if resume is None else {"resume": str(resume), **settings})]
    if run_dir is not None:
        run_dir = path_argument(run_dir, "--run-dir")
    if resume is not None:
        resume = path_argument(resume, "--resume")
        if run_dir is not None and run_dir != resume:
            raise UserError("give either --resume RUN_DIR or --run-dir, not both")
        refuse_traversal(resume, "--resume")
        if not resume.is_dir():
            raise UserError(f"--resume {resume}: no such run directory")
        try:
            lock = RunLock.acquire(resume)  # before the checkpoint is read: another writer may be saving it
        except WriteFailed as error:
            return Outcome(Stop.WRITE_FAILED, resume, 0, f"{error}; the run was not resumed")
        try:
            config, info, payload = resumed_run(resume, env, settings)
            check_saved_state(payload, config.num_envs * config.nsteps)  # its counters are read next
            finished = None if callbacks else _left_as_it_was(resume, config, payload, lock)  # callbacks get their start and end
        except BaseException:
            lock.release(remove=lock.made_file)  # --resume of a directory that holds no run writes nothing
            raise
        if finished is not None:
            return finished
        run_dir, created = resume, []
    else:
        if env is None:
            raise UserError("acer_sync.train needs an env: an env id such as 'CartPole-v1', or a callable that returns a gymnasium env")
        env_id = env_id_of(env)
        env_file, env_settings = (None, {}) if is_callable_env(env_id) else load_env_settings(env_id)
        info = env_info(env_id, settings.get("env_kwargs", env_settings.get("env_kwargs")))
        if is_callable_env(env_id) and not settings.get("vec_env"):
            settings = {**settings, "vec_env": "sync"}  # subproc workers reach a callable only where forked
        config = build_config(
            info.atari, {**settings, "env": env_id}, continuous=info.continuous, env_settings=env_settings
        )
        if env_file is not None:
            log.info(env_settings_line(env_id, env_file, env_settings, settings))
        check_config(config, info)
        if config.torso_kwargs and not config.torso:  # (a resumed run of an older version may hold such, unused)
            raise UserError("--torso-kwargs are for a --torso class, and none is given")
        baseline = build_config(info.atari, {"env": env_id}, continuous=info.continuous, env_settings=env_settings)
        unused = unused_settings({name: value for name, value in settings.items() if getattr(baseline, name, None) != value},
                                 config, info)
        if unused:
            log.warning("this run does not use " + ", ".join(f"--{name.replace('_', '-')} ({why})" for name, why in unused.items()))
        run_dir = run_dir if run_dir is not None else default_run_dir(config)
        created = prepare_run_dir(run_dir)
        try:
            lock = RunLock.acquire(run_dir)
        except WriteFailed as error:
            _remove_empty(created)
            return Outcome(Stop.WRITE_FAILED, run_dir, 0, f"{error}; the run did not start")
        payload = None
    try:
        if payload is None:
            refuse_a_run(run_dir)  # again, under the lock: another process may have started one since
        trainer = build_trainer(
            config, info, run_dir, resume=payload, progress_bar=progress_bar, callbacks=callbacks,
            on_progress=on_progress, on_checkpoint=on_checkpoint,
        )
    except BaseException as error:
        lock.release(remove=bool(created))
        _remove_empty(created)
        if isinstance(error, WriteFailed):  # a full disk, say, while the run's files were being made
            started = payload["counters"]["timesteps"] if payload is not None else 0
            return Outcome(Stop.WRITE_FAILED, run_dir, started,
                           f"{error}; the run did not " + ("resume" if payload is not None else "start"))
        if not isinstance(error, EnvFailed):
            raise
        # The first reset failed or hung: an outcome like a failure later on (TrainingStopped, exit 3 or 6).
        if payload is None:
            return Outcome(env_stop(error), run_dir, 0, f"{error}; the run did not start")
        step = payload["counters"]["timesteps"]
        return Outcome(env_stop(error), run_dir, step, f"{error}; checkpoints/latest.pt still holds step {step}")
    log.info(f"run directory: {run_dir}")  # once it holds a run: a start that fails removes what it made
    ran = trainer.how_it_runs()
    try:
        if payload is None:
            try:
                write_config(run_dir, config, command, ran, commit=commit)
            except WriteFailed as error:
                trainer.close()
                _remove_empty([run_dir / "checkpoints"])  # the run never started: its directory holds no run
                lock.release(remove=bool(created))
                _remove_empty(created)
                return Outcome(Stop.WRITE_FAILED, run_dir, 0, f"{error}; the run did not start")
        elif not (run_dir / CONFIG_FILE).exists():  # removed by hand: the run's record of its settings
            try:
                write_config(run_dir, config, command, ran, commit=commit)
                log.info(f"{CONFIG_FILE} was missing: written again from the checkpoint's settings")
            except WriteFailed as error:
                log.warning(f"{error}; the run goes on without it")
        else:
            try:
                record_resume(run_dir, saved_config(payload["config"]), config, command, payload["counters"]["timesteps"], ran,
                              commit=commit)
            except WriteFailed as error:
                log.warning(f"{error}; the run goes on without this session in it")
        if on_start is not None:
            on_start(trainer)
        outcome = trainer.train()
        if payload is None and trainer.checkpoint_step is None:
            _remove_a_run_that_wrote_nothing(run_dir)
        return outcome
    finally:
        lock.release()


def _left_as_it_was(run_dir: Path, config: Config, payload: dict, lock: RunLock) -> Outcome | None:
    """The outcome of a resume that has nothing to do (:func:`nothing_to_train`), the run left as it
    was and its lock released (built, it loaded the buffer, trained nothing and wrote the run's files
    again); None where it has something to do, or a removed config.json to write again from the built run."""
    step = payload["counters"]["timesteps"]
    if not (run_dir / CONFIG_FILE).exists() or not nothing_to_train(
            step, saved_config(payload["config"]).total_timesteps, config, payload["callbacks"]):
        return None
    remove_cut_writes(run_dir)
    lock.release(remove=lock.made_file)
    log.info(f"resuming at step {step}: {nothing_to_train_note(config.total_timesteps)}; the run is left as it was")
    return Outcome(Stop.FINISHED, run_dir, step, checkpoint_step=step)


def nothing_to_train(step: int, saved_total: int, config: Config, callback_states: dict) -> bool:
    """Whether a resume at ``step`` of a run saved with ``saved_total`` steps, with ``config``, has
    nothing to do: the run has reached ``config.total_timesteps`` (its last iteration may go past
    it), and owes no evaluation (one a stop skipped in its last iteration, which the resume plays
    into the final row: :class:`acer_sync.training.callbacks.EvalCallback`). A changed total below
    the step is an error, :func:`acer_sync.training.setup.build_trainer`'s."""
    total = config.total_timesteps
    if not (step >= total and (total == saved_total or total == step)):
        return False
    next_eval = saved_next_eval(callback_states.get(EvalCallback.__name__))  # a dict: check_saved_state checked it
    return not (config.eval_every and evaluation_owed(next_eval, step, config.num_envs * config.nsteps))


def _remove_a_run_that_wrote_nothing(run_dir: Path) -> None:
    """A new run that ended without a checkpoint or a progress row (its TensorBoard folder could not
    be made, its disk is full): its config.json and empty folders go, so that the same command may
    start it there again (a run directory with checkpoints/ is refused as a run without a checkpoint)."""
    progress = run_dir / "progress.csv"
    if progress.exists() and progress.stat().st_size > 0:
        return
    for path in (progress, run_dir / CONFIG_FILE):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            return
    _remove_empty([run_dir / "checkpoints"])


def unused_settings(given: dict, config: Config, info: EnvInfo) -> dict[str, str]:
    """The settings the user gave (``given``: flags, a config file's, keywords; those at the values
    the run has without them, such as a preset file's, left out) that this run does not use, each
    with why: an LSTM's with a network without memory, a Gaussian policy's with discrete actions,
    the trust region's without it."""
    recurrent = network_arch(info, config).endswith("lstm")
    why = {
        **dict.fromkeys(("lstm_size", "lstm_norm", "replay_state"), "the network has no LSTM" if not recurrent else None),
        **dict.fromkeys(("policy_std", "sdn_samples", "action_scale"), "the actions are discrete" if not info.continuous else None),
        "delta": "--no-trust-region" if not config.trust_region else None,
    }
    return {name: why[name] for name in given if why.get(name)}


def check_config(config: Config, info: EnvInfo, device_type: str | None = None, resumed: bool = False) -> None:
    """The one check of a run's settings on its env, for the flags, config files, sweep files and
    the API: every problem ``acer_sync.base.config.validate`` finds, observation normalization on
    Atari frames, and a network that does not fit the observations, as a one-line UserError.
    ``device_type`` is the type of the device it trains on, where not this machine's
    ``config.device`` (a sweep's trial, on a node of the GPUs it reserved)."""
    problems = validate(config, resumed)
    if problems:
        raise UserError("; ".join(problems))
    if info.arch != "mlp" and config.normalize_obs:
        raise UserError("--normalize-obs is for vector observations; image frames are scaled by 1/255 instead")
    network_arch(info, config)
    device_type = device_type or select_device(config.device).type
    if config.replay_device == "cuda" and device_type != "cuda":
        raise UserError(f"--replay-device cuda keeps the replay buffer on the GPU the run trains on, and this run's "
                        f"device is {device_type}")
    if config.compile == "graph" and device_type != "cuda":
        raise UserError(f"--compile graph runs the update as a CUDA graph, and this run's device is "
                        f"{device_type} (--compile update compiles it without the graph)")
    if config.torso:
        build_model(info, config)  # imports the torso class and checks its contract, in one line each
    if config.track:
        check_wandb()
    if config.capture_video:
        check_renders(info, config.env_timeout)  # a missing package or no headless OpenGL, before the run starts
    if is_callable_env(config.env) and config.vec_env == "subproc" and multiprocessing.get_start_method() != "fork":
        raise UserError(
            f"vec_env subproc runs {config.env} in worker processes, which reach an env callable only when Python "
            f"forks them (here it starts them by {multiprocessing.get_start_method()}); use vec_env='sync'"
        )


def env_id_of(env: EnvSource) -> str:
    """The env id of ``env``: an id as it is, a callable registered with gymnasium first."""
    if isinstance(env, str):
        return env
    if not callable(env):
        raise UserError(f"env must be an env id or a callable that returns a gymnasium env, got {env!r}")
    return register_callable(env)


def default_run_dir(config: Config) -> Path:
    name = config.env.replace("/", "-").replace(":", "-")
    return Path("runs") / f"{name}__{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def refuse_traversal(path: Path, flag: str) -> None:
    if ".." in path.parts:
        raise UserError(f"{flag} {path} contains '..'; give the run directory without parent references")


def refuse_a_run(run_dir: Path) -> None:
    """A UserError where ``run_dir`` already holds a run, or a ``config.json`` a run would
    overwrite (a run writes it only beside its ``progress.csv``, so that one is someone else's)."""
    if (run_dir / "progress.csv").exists() or (run_dir / "checkpoints").exists():
        if not has_checkpoint(run_dir):
            hint = copy_hint(latest_checkpoint(run_dir))
            way_out = hint.removeprefix("; ") if hint else (
                "nothing to resume: remove the directory to start there again, or pick another --run-dir")
            raise UserError(f"{run_dir} holds a run without a checkpoint ({LATEST} is missing: it stopped before its "
                            f"first, or it was removed); {way_out}")
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick another --run-dir")
    if (run_dir / CONFIG_FILE).exists():
        raise UserError(f"{run_dir} already holds a {CONFIG_FILE}, which a run would overwrite; pick another --run-dir")


def path_argument(value, flag: str) -> Path:
    """``value`` (a str or a path) as a Path; a UserError where it is empty or not a path (``Path('')``
    would be the current directory)."""
    if not names_a_path(value):
        raise UserError(f"{flag} must name a directory, got {value!r}")
    return Path(value)


def prepare_run_dir(run_dir: Path) -> list[Path]:
    """Make ``run_dir`` and check that it is writable and holds no run; returns the directories
    it made, innermost first (removed again if the run cannot start)."""
    refuse_traversal(run_dir, "--run-dir")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} exists and is not a directory")
    holder = RunLock.holder(run_dir)  # before the lock is taken: then the lock itself names whoever came since
    if holder is not None:
        raise UserError(f"{run_dir} is in use by {holder}, which is training it; pick another --run-dir")
    refuse_a_run(run_dir)
    created = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # A probe of its own: two runs started at once on one directory must not delete each other's.
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=run_dir)
        try:
            os.write(fd, b"\n")  # an empty file needs no space: a full disk fails only a write
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as error:
        _remove_empty(created)
        raise UserError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
    return created


def resumed_run(run_dir: Path, env: EnvSource | None, settings: dict) -> tuple[Config, EnvInfo, dict]:
    """The saved run's config with what a resume may change, its env and its checkpoint; a
    UserError for settings that conflict with the run, or a checkpoint that does not fit."""
    payload = load_run_checkpoint(run_dir)
    for name, value in payload["config"].items():  # a value of the wrong type was a traceback where it was used
        if name in field_types():  # (a name it does not know: saved_config's TypeError, below)
            check_setting(name, value, f"the checkpoint in {run_dir}")
    try:
        saved = saved_config(payload["config"])  # a run from before --pipeline ran serial
    except (KeyError, TypeError):
        raise UserError(f"the checkpoint in {run_dir} carries no valid config") from None
    overrides = dict(settings) if env is None else {**settings, "env": env_id_of(env)}
    conflicts = [
        f"--{name.replace('_', '-')} {value} (the run used {getattr(saved, name)})"
        for name, value in overrides.items()
        if name not in RESUMABLE_CHANGES and value != getattr(saved, name)
    ]
    if conflicts:
        raise UserError("--resume conflicts with the saved config: " + "; ".join(conflicts))
    config = dataclasses.replace(saved, **{name: value for name, value in overrides.items() if name in RESUMABLE_CHANGES})
    if is_callable_env(config.env) and (config.env not in gym.registry or env is None and callable_is_shared(config.env)):
        name = config.env.split("/", 1)[1]
        shared = (f"; this process registered several callables named {name} (partials, lambdas and the instances of "
                  "one class share a name), so pass the run's own" if config.env in gym.registry else "")
        raise UserError(
            f"{run_dir} was trained on the env that the Python callable {name} makes{shared}; resume it from Python "
            f"with acer_sync.train({name.rsplit('.', 1)[-1]}, resume={str(run_dir)!r})"
        )
    check_recorded_config(run_dir, saved)
    progress = run_dir / "progress.csv"
    if progress.exists() and progress.stat().st_size > 0:
        check_progress(progress)
    info = saved_env_info(payload["model_spec"], config.env, config.env_kwargs, config)
    try:
        check_config(config, info, resumed=True)
    except TorsoError as error:  # the run's own torso, which a resume names no flag for
        raise UserError(error.of_run(run_dir)) from None
    expected = in_saved_form(payload["model_spec"], model_spec(info, config))
    if payload["model_spec"] != expected or payload["env_id"] != config.env:
        raise UserError(
            f"the checkpoint in {run_dir} was made for {payload['env_id']} with network "
            f"{payload['model_spec']}, not {config.env} with {expected}{image_rule_hint(payload['model_spec'], expected)}"
        )
    return config, info, payload


def check_recorded_config(run_dir: Path, saved: Config) -> None:
    """A UserError where the checkpoint's settings are not those the run's ``config.json``
    recorded (a checkpoint copied in from another run), but for what a resume may change."""
    recorded = read_config(run_dir)
    if recorded is None:
        return
    differing = [
        f"{name} {value} (config.json: {recorded[name]})"
        for name, value in dataclasses.asdict(saved).items()
        if name not in RESUMABLE_CHANGES and name in recorded and json.loads(json.dumps(value, default=str)) != recorded[name]
    ]
    if differing:
        more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
        raise UserError(
            f"the checkpoint in {run_dir} is not this run's: it has {'; '.join(differing[:3])}{more}; "
            "put the run's own checkpoint back, or resume the run it came from"
        )


def call_text(env: EnvSource | None, settings: dict) -> str:
    """How ``config.json`` records a run started from Python: the call, e.g.
    ``acer_sync.train('CartPole-v1', total_timesteps=20000)``."""
    arguments = [] if env is None else [repr(env) if isinstance(env, str) else callable_env_id(env).split("/", 1)[1]]
    arguments += [f"{name}={value!r}" for name, value in settings.items()]
    return f"acer_sync.train({', '.join(arguments)})"


def _plain(value):
    """A numpy scalar as the Python number it holds (settings are checked by Python type)."""
    return value.item() if isinstance(value, np.generic) else value


def _remove_empty(directories: list[Path]) -> None:
    """Remove the directories a failed start made, innermost first, where they are still empty."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return


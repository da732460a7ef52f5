"""Running a sweep on Ray Tune: start or join Ray, set up the Tuner (or restore it), report trials.

Layout under ``runs/<sweep>/``: one run directory per trial (``<trial>/``, as ``train.py`` writes
it), ``sweep.json`` (the expanded sweep, to tell a rerun of the same sweep from another one),
``tune/`` (Tune's experiment state, which ``Tuner.restore`` continues from) and ``summary.md``.

On a cluster (``--address``) the code is shipped to the nodes (Ray's ``working_dir``, without the
run directories), and before any trial starts every node that can run one must see ``--runs-dir``
at the same path: trials write their run directories there and resume from them on any node.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from ray import tune
from ray.tune import CLIReporter, FailureConfig, RunConfig, TuneConfig, Tuner
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from acer_sync.api.run_metadata import git_commit
from acer_sync.base.config import FORMER_DEFAULTS, build_config, current_value, setting_defaults
from acer_sync.base.config_file import load_env_settings
from acer_sync.base.errors import UserError, delivered_again
from acer_sync.sweeps.spec import RECORD_FILE, Sweep, sweep_record
from acer_sync.sweeps.trial import LINE_PREFIX, DriverContext, StopRequest, run_trial
from acer_sync.training.checkpoint import atomic_write
from atari.envs import env_info

REPO_ROOT = Path(__file__).resolve().parents[2]
TUNE_DIR = "tune"
#: Not shipped to the cluster's nodes with ``--address`` (the sweep's own directory is left out too,
#: wherever it is): runs, git's data (a file in a git worktree), environments, pictures.
#: docs/ holds the docs site's figures, videos and reference runs: no trial reads them, and they would
#: count against Ray's upload limit (tests/test_cluster.py lowers it to 1 MiB; the Breakout video is 1.2 MB).
CODE_EXCLUDES = ["runs/", ".git", ".venv/", "*.png", "__pycache__/", "/docs/"]
#: The name of the sweep's :class:`~acer_sync.sweeps.trial.StopRequest` actor.
STOP_REQUEST = "acer_sync-sweep-stop"
STATUS_SECONDS = 30
STORAGE_CHECK_SECONDS = 120
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed)\b.*?: .+")
PACKAGE_TOO_LARGE = re.compile(r"Package size \((?P<size>[\d.]+ ?MiB)\) exceeds the maximum size of (?P<limit>[\d.]+ ?MiB)")
MAX_ERROR_CHARS = 300
#: How a machine gets the cluster's authentication token (docs/many-runs.md says more).
TOKEN_FIX = "copy the head's ~/.ray/auth_token to ~/.ray/auth_token on this machine, or set RAY_AUTH_TOKEN to it"


@dataclass(frozen=True)
class TrialOutcome:
    """How a trial ended in this run of the sweep: ``finished``, ``failed`` (with why) or ``unfinished``."""

    name: str
    status: str
    error: str = ""


def one_line(error_text: str) -> str:
    """The line of a Ray/Tune error report that says what went wrong (the last ``XError: message``),
    without the module path of this package's own :class:`TrialFailed`."""
    lines = [line.strip() for line in str(error_text).splitlines() if line.strip()]
    matches = [line for line in lines if ERROR_LINE.match(line)]
    line = matches[-1] if matches else (lines[0] if lines else "unknown error")
    return line.removeprefix("acer_sync.sweeps.trial.TrialFailed: ")[:MAX_ERROR_CHARS]


def failure_cause(trial) -> str:
    """``: CAUSE`` of a trial that failed, from the error file Tune wrote of it; empty where none is."""
    path = getattr(trial, "error_file", None)
    try:
        return f": {one_line(Path(path).read_text())}" if path else ""
    except OSError:
        return ""


def quiet_ray() -> None:
    """Keep Ray's and Tune's own reports off the terminal: :class:`TrialLines` says, in one line
    each, what they would say in many (a dead worker's exit details, a failed trial's traceback)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's classic status table (CLIReporter)
    for name in ("ray", "ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # The driver prints the workers' output and the raylet's error messages ("A worker died or was
    # killed ...", many lines) through one printer; this turns it off, as Ray's own debugger
    # (ray.util.rpdb) does. The trials' own lines come through forward_trial_lines instead.
    ray._private.worker._worker_logs_enabled = False


def print_trial_lines(data: dict) -> None:
    """Print the lines of a batch of worker output that trials print for this terminal."""
    for line in data.get("lines", []):
        if line.startswith(LINE_PREFIX):
            print(line, flush=True)


@contextmanager
def forward_trial_lines():
    """While open, the trials' one-line events (``[trial NAME] ...``) appear on this terminal.

    Ray sends each worker's output to the driver (``log_to_driver``) through one dispatcher;
    this adds a handler to it that keeps only those lines.
    """
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    global_worker_stdstream_dispatcher.add_handler("acer_sync_trial_lines", print_trial_lines)
    try:
        yield
    finally:
        global_worker_stdstream_dispatcher.remove_handler("acer_sync_trial_lines")


@contextmanager
def native_stderr_captured():
    """Send this process's file descriptor 2 to a temporary file while open; yields the file.

    Ray's C++ client writes a warning there for each refused connection attempt. Captured, they
    tell an authentication failure from an unreachable cluster, and stay off the terminal.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield capture
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def token_mode() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def connection_problem(address: str, error: BaseException, native_log: str) -> str:
    """One line for a failed ``ray.init(address=...)``: what went wrong and how to fix it."""
    text = f"{error}\n{error.__cause__ or ''}\n{native_log}"
    if isinstance(error, ray.exceptions.AuthenticationError):
        reason = str(error.message).split(". ")[0].rstrip(".")
        return f"Ray token authentication is on (RAY_AUTH_MODE=token) but {reason}; {TOKEN_FIX}"
    if "InvalidAuthToken" in text or "Unauthenticated" in text:
        if token_mode():
            return f"the Ray cluster at {address} refused this machine's authentication token; {TOKEN_FIX}"
        return (f"the Ray cluster at {address} uses token authentication and this machine sent no token; "
                f"set RAY_AUTH_MODE=token and {TOKEN_FIX}")
    package = PACKAGE_TOO_LARGE.search(text)
    if package:
        return (f"the code sent to the cluster (Ray's working_dir: {REPO_ROOT}, without {', '.join(CODE_EXCLUDES)} and "
                f"what .gitignore names) is {package['size']}, over Ray's limit of {package['limit']}; move large files "
                "out of it or list them in .gitignore or .rayignore")
    return f"cannot reach a Ray cluster at --address {address}: {one_line(str(error))}"


def code_excludes(runs_dir: Path) -> list[str]:
    """What is not shipped to a cluster: :data:`CODE_EXCLUDES`, and ``--runs-dir`` where it lies
    inside the repository (every run's checkpoints would count against Ray's limit); where it is
    the repository itself, the sweeps' directories cannot be told from the code, so none is left out."""
    try:
        inside = runs_dir.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return list(CODE_EXCLUDES)
    return list(CODE_EXCLUDES) if inside == Path(".") else [*CODE_EXCLUDES, f"/{inside.as_posix()}/"]


def code_to_ship(runs_dir: Path) -> dict:
    """Ray's ``runtime_env`` for the code the trials run: from a clone, the clone (``working_dir``,
    without :func:`code_excludes`); from an installed acer_sync (``pip install .``), where the
    folder above the package is site-packages, its two packages alone (``py_modules``)."""
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "sweep.py").is_file():
        return {"working_dir": str(REPO_ROOT), "excludes": code_excludes(runs_dir)}
    return {"py_modules": [str(REPO_ROOT / "acer_sync"), str(REPO_ROOT / "atari")]}


def start_ray(address: str | None, runs_dir: Path) -> None:
    """Join the Ray cluster at ``address``, or start a local Ray with this machine's cores.

    Every failure to join is one :class:`UserError` line: a refused or missing authentication
    token, code over Ray's upload limit, or a cluster that is not there.
    """
    options = dict(log_to_driver=True, include_dashboard=False, configure_logging=True, logging_level=logging.ERROR)
    if address is None:
        ray.init(num_cpus=os.cpu_count(), **options)
    else:
        runtime_env = code_to_ship(runs_dir)
        print(f"joining the Ray cluster at {address}", flush=True)
        failure = None
        with native_stderr_captured() as native_log:
            try:
                ray.init(address=address, runtime_env=runtime_env, **options)
            except (ConnectionError, ValueError, RuntimeError, ray.exceptions.RayError) as error:
                failure = error
            native_log.seek(0)
            native_text = native_log.read().decode(errors="replace")
        if failure is not None:
            ray.shutdown()
            raise UserError(connection_problem(address, failure, native_text)) from None
    quiet_ray()


def node_storage_problem(sweep_dir: str, probe_name: str, token: str) -> str | None:
    """Run on one node: None when it sees the driver's probe file in ``sweep_dir`` and can write
    there, else what it lacks."""
    probe = Path(sweep_dir) / probe_name
    try:
        if probe.read_text() != token:
            return f"sees another {probe} than the one sweep.py wrote"
    except OSError as error:
        return f"cannot read {probe}, which sweep.py wrote ({error.strerror or error})"
    own = probe.with_name(f"{probe_name}-{os.getpid()}")
    try:
        own.write_text(token)
        own.unlink()
    except OSError as error:
        return f"cannot write in {sweep_dir} ({error.strerror or error})"
    return None


def check_a_trial_fits(sweep: Sweep) -> None:
    """Refuse a sweep whose trials ask for more CPUs or GPUs than the local Ray that
    :func:`start_ray` starts will have (this machine's cores and torch's CUDA devices): Tune would
    keep them pending, without an error. A cluster's (``--address``) may add nodes as they are asked for."""
    cpus, gpus = os.cpu_count() or 1, torch.cuda.device_count()
    if sweep.cpus > cpus or sweep.gpus > gpus:
        raise UserError(
            f"a trial asks for {sweep.cpus} CPUs and {sweep.gpus:g} GPUs (trial: in the sweep file), and this machine has "
            f"{cpus:g} CPUs and {gpus:g} GPUs; lower them, or give --address of a cluster that has them"
        )


def check_storage_on_every_node(runs_dir: Path, sweep_dir: Path) -> None:
    """Refuse, before any trial starts, a ``--runs-dir`` that some node able to run a trial does not
    see at the same path: a trial there would fail only at its first checkpoint, or resume on
    another node without its run directory."""
    token = secrets.token_hex(16)
    probe = sweep_dir / f".storage-check-{token[:8]}"
    probe.write_text(token)
    try:
        nodes = [node for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0]
        check = ray.remote(num_cpus=0)(node_storage_problem)
        answers = {
            node["NodeID"]: check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
            .remote(str(sweep_dir), probe.name, token)
            for node in nodes
        }
        for node in nodes:
            try:
                problem = ray.get(answers[node["NodeID"]], timeout=STORAGE_CHECK_SECONDS)
            except (ray.exceptions.RayError, TimeoutError) as error:
                problem = f"did not answer the storage check ({one_line(str(error))})"
            if problem:
                raise UserError(
                    f"--runs-dir {runs_dir}: the node at {node['NodeManagerAddress']} (node id {node['NodeID'][:12]}) "
                    f"{problem}; on a cluster --runs-dir must be a directory that every node mounts at the same path"
                )
    finally:
        probe.unlink(missing_ok=True)


def check_same_sweep(sweep: Sweep, sweep_dir: Path) -> Sweep:
    """Refuse to continue ``sweep_dir`` with a sweep file that expands to other trials or resources.
    The sweep to run: ``sweep``, with the trials of one recorded before a default became ``auto``
    keeping the former default they ran with where the file now gives ``auto`` (:data:`FORMER_DEFAULTS`;
    a record names the defaults it was written under)."""
    record_path = sweep_dir / RECORD_FILE
    record = json.loads(json.dumps(sweep_record(sweep), default=str))
    kept: dict[str, dict] = {}
    if record_path.is_file():
        try:
            saved = json.loads(record_path.read_text())
        except (OSError, ValueError) as error:
            raise UserError(f"cannot read {record_path} ({type(error).__name__}): restore it, or move it away") from None
        if not isinstance(saved, dict):
            raise UserError(f"{record_path} is not a sweep's record: restore it, or move it away")
        # A setting added to Config since the sweep was started was not in its file, which could not
        # name it: it compares at what the trial's other settings, its env's preset and the env's file
        # give it now (precision fp32; action_scale box on a continuous env), so a file that sets it
        # is a changed file.
        trials = saved.get("trials")
        if isinstance(trials, dict):
            saved["trials"] = trials = {name: completed_record(config) if isinstance(config, dict) else config
                                        for name, config in trials.items()}
        else:
            trials = {}
        # A record without "defaults" (written before they became auto) gave a trial that named no
        # such setting its former default, where the file now gives auto: the trial keeps what it
        # ran with. A record that names its defaults held another mode only where the file set it.
        recorded_defaults = saved.get("defaults")
        recorded_defaults = {**FORMER_DEFAULTS, **(recorded_defaults if isinstance(recorded_defaults, dict) else {})}
        for name, config in record["trials"].items():
            former = {key: value for key, value in recorded_defaults.items()
                      if config.get(key) == "auto" != value and isinstance(trials.get(name), dict) and trials[name].get(key) == value}
            if former:
                kept[name] = former
                config.update(former)
        if "defaults" not in saved:
            del record["defaults"]
        if saved != record:
            changed = sorted(key for key in record if saved.get(key) != record[key])
            settings = sorted({key for name, config in record["trials"].items() if isinstance(trials.get(name), dict)
                               for key, value in config.items() if trials[name].get(key) != value})
            raise UserError(
                f"{sweep_dir} holds sweep {saved.get('name')!r} run from a different file (its {', '.join(changed)} differ"
                + (f": {', '.join(settings)}" if settings else "") + "); "
                "give the sweep another name, or restore the file it was started with"
            )
    else:
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            text = json.dumps(record, indent=2)
            atomic_write(record_path, lambda handle: handle.write(text.encode()))  # never half a record (a full disk)
        except OSError as error:
            raise UserError(f"cannot write the sweep's directory {sweep_dir}: {error.strerror or error}") from None
    trials = tuple(dataclasses.replace(trial, config=dataclasses.replace(trial.config, **kept[trial.name]))
                   if trial.name in kept else trial for trial in sweep.trials)
    return dataclasses.replace(sweep, trials=trials)


def completed_record(config: dict) -> dict:
    """A trial's recorded settings with those it lacks (added to Config since it was recorded) at the
    values its preset and env file give along with the others (at a former default where the
    default became ``auto`` since, as the trial ran); at their defaults where the record cannot be
    built (an env not on this machine)."""
    defaults = json.loads(json.dumps(setting_defaults(), default=str))
    config = {name: current_value(name, value) for name, value in config.items()}  # compile: false, as first recorded
    try:
        env = str(config["env"])
        info = env_info(env, config.get("env_kwargs") or {})
        built = build_config(info.atari, {**config, "env": env}, continuous=info.continuous,
                             env_settings=load_env_settings(env)[1])
    except (KeyError, TypeError, ValueError, UserError):
        return {**defaults, **config}
    return {**json.loads(json.dumps(dataclasses.asdict(built), default=str)), **FORMER_DEFAULTS, **config}


def trial_name(trial) -> str:
    return trial.config["trial"]["name"]


class TrialLines(tune.Callback):
    """Prints one line per finished, restarted or failed trial."""

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        steps, mean = result.get("total_timesteps"), result.get("mean_episode_reward")
        detail = f": {steps} steps, final 100-episode mean {mean:.2f}" if isinstance(mean, float) else ""
        print(f"finished {trial_name(trial)}{detail}", flush=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        print(f"trial {trial_name(trial)} failed{failure_cause(trial)} (failure {trial.num_failures}; restarts allowed: "
              f"{trial.max_failures}); restarting it from its last checkpoint, if it has one", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"trial {trial_name(trial)} failed for good; sweep.py names its error at the end", flush=True)


#: How long sweep.py's first Ctrl-C waits, by default, for the running trials to save before Tune
#: stops them (``sweep.py --stop-wait``): a training iteration takes seconds, one with an Atari
#: evaluation or a --save-buffer save of gigabytes may take longer.
STOP_WAIT_SECONDS = 30.0


def request_stop(wait_seconds: float, resent: threading.Event) -> None:
    """Set the sweep's stop request, wait until every training trial has saved (at most
    ``wait_seconds``), then send SIGINT again to the main thread (``resent`` says so first), where
    Tune's handler then runs. From a thread: Ray calls do not belong in a signal handler."""
    try:
        if ray.is_initialized():
            stop_request = ray.get_actor(STOP_REQUEST)
            ray.get(stop_request.set.remote(), timeout=30)
            deadline = time.monotonic() + wait_seconds
            while ray.get(stop_request.waiting_for.remote(), timeout=30) and time.monotonic() < deadline:
                time.sleep(0.2)
    except (ray.exceptions.RayError, ValueError, TimeoutError):
        pass  # Ray is going: the trials' processes go with it, and their last checkpoints stay
    resent.set()
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


class StopTrialsOnInterrupt(tune.Callback):
    """Makes sweep.py's first Ctrl-C ask every running trial to save a checkpoint before Tune stops it.

    Tune catches the first SIGINT of ``fit()`` itself: it ends its loop, saves its state and then
    stops the trials' processes, giving each a few seconds. This wraps Tune's handler (installed
    once the loop runs): the first SIGINT only sets the trials' stop request, and Tune's handler
    runs on the SIGINT that :func:`request_stop` sends once the trials have saved (or
    ``wait_seconds`` passed), or on a second Ctrl-C. (Tune stopping a trial that had not yet heard of the request would end it unsaved.)
    The first SIGINT delivered twice (GNU ``timeout``: :data:`~acer_sync.base.errors.REPEAT_SECONDS`)
    is no second Ctrl-C.
    """

    #: How long the first Ctrl-C waits for the trials to save: this sweep.py's ``--stop-wait``. A
    #: class attribute, set by the constructor and, for a continued sweep, by :func:`make_tuner`:
    #: its callback is the first run's, which Tune restores without calling the constructor.
    wait_now: float = 0.0

    def __init__(self, wait_seconds: float):
        StopTrialsOnInterrupt.wait_now = wait_seconds

    def on_step_begin(self, iteration, trials, **info):
        if threading.current_thread() is not threading.main_thread():
            return
        tune_handler = signal.getsignal(signal.SIGINT)
        if getattr(tune_handler, "stops_trials", False) or not callable(tune_handler):
            return
        asked, resent = [], threading.Event()

        def stop_trials_then_tune(signum, frame):
            if not asked:
                asked.append((signum, time.monotonic()))
                threading.Thread(target=request_stop, args=(StopTrialsOnInterrupt.wait_now, resent), daemon=True).start()
            elif resent.is_set() or not delivered_again(asked[0], signum):
                tune_handler(signum, frame)

        stop_trials_then_tune.stops_trials = True
        signal.signal(signal.SIGINT, stop_trials_then_tune)

    def _not_training(self, trial) -> None:
        """A trial whose process ended (died with its node, failed or finished) saves nothing more."""
        try:
            ray.get_actor(STOP_REQUEST).done.remote(trial_name(trial))
        except (ray.exceptions.RayError, ValueError):
            pass

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._not_training(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._not_training(trial)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._not_training(trial)


def final_steps(run_dir: Path) -> int:
    """The step count of the last row of a run's ``progress.csv`` (0 if it has none)."""
    try:
        with open(run_dir / "progress.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        return int(float(rows[-1]["total_timesteps"])) if rows else 0
    except (OSError, KeyError, ValueError):
        return 0


def make_tuner(sweep: Sweep, sweep_file: Path, sweep_dir: Path, driver: DriverContext, stop_wait: float) -> Tuner:
    """A new Tuner for ``sweep``, or the saved one restored when ``sweep_dir`` already holds it."""
    trainable = tune.with_resources(tune.with_parameters(run_trial, driver=driver), {"cpu": sweep.cpus, "gpu": sweep.gpus})
    experiment = sweep_dir / TUNE_DIR
    if Tuner.can_restore(str(experiment)):
        StopTrialsOnInterrupt.wait_now = stop_wait  # the restored Tuner brings back the first run's callback
        print(f"continuing the sweep in {sweep_dir}: finished trials are kept, unfinished ones resume", flush=True)
        return Tuner.restore(str(experiment), trainable, resume_unfinished=True, resume_errored=True)
    trials = [
        {"name": trial.name, "run_dir": str(sweep_dir / trial.name), "sweep_file": str(sweep_file), "config": dataclasses.asdict(trial.config)}
        for trial in sweep.trials
    ]
    reporter = CLIReporter(
        metric_columns={"total_timesteps": "steps", "checkpoint_timesteps": "saved at", "mean_episode_reward": "mean return",
                        "fps": "steps/s"},
        parameter_columns={f"trial/config/{name}": name for name in ("seed", *sweep.grid_axes)},
        max_report_frequency=STATUS_SECONDS, max_column_length=40,
    )
    return Tuner(
        trainable,
        param_space={"trial": tune.grid_search(trials)},
        tune_config=TuneConfig(trial_name_creator=trial_name, trial_dirname_creator=trial_name),
        run_config=RunConfig(
            name=TUNE_DIR,
            storage_path=str(sweep_dir),
            failure_config=FailureConfig(max_failures=sweep.failures),
            progress_reporter=reporter,
            callbacks=[TrialLines(), StopTrialsOnInterrupt(stop_wait)],
            verbose=1,
        ),
    )


def run_sweep(
    sweep: Sweep, sweep_file: Path, runs_dir: Path, address: str | None, stop_wait: float | None = None,
    report: Callable[[list[TrialOutcome]], object] | None = None,
) -> list[TrialOutcome]:
    """Run (or continue) ``sweep`` under ``runs_dir/<name>/``; how each trial ended. A Ctrl-C waits
    up to ``stop_wait`` seconds (default :data:`STOP_WAIT_SECONDS`) for the running trials to save.

    ``report`` is called with the outcomes when Tune's ``fit()`` returns, before ``ray.shutdown()``,
    so what it writes and prints survives a crash in Ray's teardown (a segfault inside
    ``ray.shutdown()``, seen once after a node was lost)."""
    sweep_dir = (runs_dir / sweep.name).resolve()
    if address is None:
        check_a_trial_fits(sweep)  # before the sweep's directory records it
    sweep = check_same_sweep(sweep, sweep_dir)
    quiet_ray()
    start_ray(address, runs_dir)
    # Ray's core installs a handler that answers SIGTERM (a cluster's scheduler ending the job, a
    # `timeout`) with a native stack dump and an abort, the trials unsaved: it is a Ctrl-C here.
    sigterm_handler = signal.signal(signal.SIGTERM, sigterm_as_sigint)
    try:
        with forward_trial_lines():
            if address is not None:
                check_storage_on_every_node(runs_dir, sweep_dir)
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            stop_request = StopRequest.options(name=STOP_REQUEST, scheduling_strategy=here).remote()
            ray.get(stop_request.__ray_ready__.remote())
            driver = DriverContext(git_commit=git_commit(), stop_request=STOP_REQUEST)
            sigint_handler = signal.getsignal(signal.SIGINT)
            try:
                results = make_tuner(
                    sweep, sweep_file.resolve(), sweep_dir, driver, STOP_WAIT_SECONDS if stop_wait is None else stop_wait,
                ).fit()
            finally:
                signal.signal(signal.SIGINT, sigint_handler)  # Tune's (and StopTrialsOnInterrupt's) end with fit()
            errors = {result.config["trial"]["name"]: result.error for result in results if result.error is not None}
        outcomes = []
        for trial in sweep.trials:
            if trial.name in errors:
                outcomes.append(TrialOutcome(trial.name, "failed", one_line(str(errors[trial.name]))))
            elif final_steps(sweep_dir / trial.name) >= trial.config.total_timesteps:
                outcomes.append(TrialOutcome(trial.name, "finished"))
            else:
                outcomes.append(TrialOutcome(trial.name, "unfinished"))
        if report is not None:
            report(outcomes)
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, sigterm_handler)
    return outcomes


def sigterm_as_sigint(signum, frame) -> None:
    """SIGTERM taken as SIGINT, sweep.py's Ctrl-C: the trials save, then Tune stops them."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

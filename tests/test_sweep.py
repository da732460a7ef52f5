"""sweep.py on a local Ray limited to this machine's cores, sweep files, and train.py --config.

One sweep of 2 CartPole trials (seeds 0 and 1) serves several tests (a module-scoped fixture):
seed 1's trial is killed with SIGKILL once it has a checkpoint, and Tune restarts it; once seed 0
has finished, the sweep is interrupted with SIGINT (seed 1's restarted trial is held with SIGSTOP
meanwhile, so it is sure to be unfinished), and the same command is run again to the end. The
trials' processes are found by the line each trial prints first, which sweep.py forwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from acer_sync.base.config import Config, build_config
from acer_sync.base.config_file import load_config_file, load_env_settings
from acer_sync.base.errors import UserError
from acer_sync.sweeps.spec import load_sweep
from acer_sync.training.checkpoint import load_checkpoint
from helpers import ROOT, one_line_error, read_progress, trial_processes, trial_resume_steps
from helpers import wait_for as wait_for_condition

TOTAL_STEPS = 16_000
STEPS_PER_ROW = 4 * 20 * 5  # num_envs x nsteps x log_interval
SWEEP_YAML = f"""\
name: pair
envs: [CartPole-v1]
seeds: [0, 1]
settings:
  total_timesteps: {TOTAL_STEPS}
  num_envs: 4
  vec_env: sync
  log_interval: 5
  checkpoint_every: 800
  eval_every: 8000
  eval_episodes: 2
trial: {{cpus: 1, gpus: 0}}
"""
SEED0, SEED1 = "CartPole-v1_seed0", "CartPole-v1_seed1"
WAIT_SECONDS = 180


def wait_for(condition, what: str, process: subprocess.Popen, log: Path):
    """:func:`helpers.wait_for` with this file's time limit."""
    return wait_for_condition(condition, what, process, log, WAIT_SECONDS)


def start_sweep(sweep_file: Path, runs_dir: Path, log: Path, *extra: str) -> subprocess.Popen:
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "sweep.py"), str(sweep_file), "--runs-dir", str(runs_dir), *extra],
            cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, text=True,
        )


@pytest.fixture(scope="module")
def sweep_scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    sweep_file, runs_dir, log = root / "pair.yaml", root / "runs", root / "first.log"
    sweep_file.write_text(SWEEP_YAML)
    sweep_dir = runs_dir / "pair"
    # Seed 1's trial is frozen (SIGSTOP) when the sweep is interrupted, so it never saves: a short
    # --stop-wait lets Tune stop it soon.
    process = start_sweep(sweep_file, runs_dir, log, "--stop-wait", "5")
    held_pid = None
    try:
        killed_pid = wait_for(
            lambda: (sweep_dir / SEED1 / "checkpoints" / "latest.pt").is_file() and trial_processes(log.read_text(), SEED1),
            "seed 1 has a checkpoint", process, log,
        )[0][0]
        steps_before_kill = int(read_progress(sweep_dir / SEED1)[-1]["total_timesteps"])
        os.kill(killed_pid, signal.SIGKILL)
        held_pid = wait_for(
            lambda: [pid for pid, _ in trial_processes(log.read_text(), SEED1) if pid != killed_pid], "seed 1 restarted", process, log,
        )[0]
        resume_step = wait_for(lambda: trial_resume_steps(log.read_text(), SEED1), "seed 1 resumed", process, log)[0]
        os.kill(held_pid, signal.SIGSTOP)
        wait_for(lambda: f"finished {SEED0}" in log.read_text(), "seed 0 finished", process, log)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if held_pid is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(held_pid, sig)
                except ProcessLookupError:
                    pass
    seed0_after_first = (sweep_dir / SEED0 / "progress.csv").read_bytes()
    seed1_steps_after_first = int(read_progress(sweep_dir / SEED1)[-1]["total_timesteps"])
    second = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), str(sweep_file), "--runs-dir", str(runs_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    return dict(
        sweep_dir=sweep_dir, first_code=process.returncode, first_log=log.read_text(), second=second,
        killed_pid=killed_pid, steps_before_kill=steps_before_kill, resume_step=resume_step, seed0_after_first=seed0_after_first,
        seed1_steps_after_first=seed1_steps_after_first,
    )


def test_sweep_runs_to_the_end_as_normal_runs_that_plot_draws(sweep_scenario, tmp_path):
    second, sweep_dir = sweep_scenario["second"], sweep_scenario["sweep_dir"]
    assert second.returncode == 0, second.stdout + second.stderr
    for trial in (SEED0, SEED1):
        run_dir = sweep_dir / trial
        for name in ("config.json", "progress.csv", "tb", "checkpoints/latest.pt"):
            assert (run_dir / name).exists(), (trial, name)
        assert int(read_progress(run_dir)[-1]["total_timesteps"]) == TOTAL_STEPS
        assert json.loads((run_dir / "config.json").read_text())["config"]["threads"] == 1
    summary = (sweep_dir / "summary.md").read_text()
    assert "## CartPole-v1" in summary and "CartPole-v1_seeds: mean of 2 seeds" in summary
    assert summary in second.stdout
    out = tmp_path / "curves.png"
    paths = sorted(str(path) for path in sweep_dir.glob("*"))  # as the shell expands runs/pair/*
    plotted = subprocess.run([sys.executable, "plot.py", *paths, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plotted.returncode == 0, plotted.stderr
    assert out.stat().st_size > 0
    assert "CartPole-v1 (2 seeds)" in plotted.stdout


def test_killed_trial_restarts_from_its_checkpoint_and_keeps_counting(sweep_scenario):
    log = sweep_scenario["first_log"]
    assert f"trial {SEED1} failed" in log and "(failure 1; " in log and "restarting it from its last checkpoint" in log
    # The restarted process continues from the checkpoint, not from step 0.
    assert 0 < sweep_scenario["resume_step"] <= sweep_scenario["steps_before_kill"]
    assert sweep_scenario["resume_step"] % 800 == 0
    steps = [int(row["total_timesteps"]) for row in read_progress(sweep_scenario["sweep_dir"] / SEED1)]
    assert steps == list(range(STEPS_PER_ROW, TOTAL_STEPS + 1, STEPS_PER_ROW)), steps  # no step twice, none missing


def test_interrupted_sweep_continues_without_rerunning_finished_trials(sweep_scenario):
    assert sweep_scenario["first_code"] == 130, sweep_scenario["first_log"]
    assert "run the same command again to continue" in sweep_scenario["first_log"]
    second, sweep_dir = sweep_scenario["second"], sweep_scenario["sweep_dir"]
    assert "continuing the sweep" in second.stdout
    assert f"finished {SEED0}" not in second.stdout and f"finished {SEED1}" in second.stdout
    assert (sweep_dir / SEED0 / "progress.csv").read_bytes() == sweep_scenario["seed0_after_first"]
    assert sweep_scenario["seed1_steps_after_first"] < TOTAL_STEPS


def test_no_traceback_reaches_the_terminal(sweep_scenario):
    assert "Traceback" not in sweep_scenario["first_log"]
    assert "Traceback" not in sweep_scenario["second"].stdout + sweep_scenario["second"].stderr


def test_the_trials_one_line_events_reach_sweep_pys_terminal(sweep_scenario):
    log = sweep_scenario["first_log"]
    assert f"[trial {SEED1}] resuming at step {sweep_scenario['resume_step']}: " in log
    assert f"[trial {SEED0}] replay buffer: " in log
    assert len(trial_processes(log, SEED0)) == 1 and len(trial_processes(log, SEED1)) == 2


#: sweep.py with ``ray.shutdown`` ending the process once Ray is down, as a segfault inside it did
#: once (exit -11 after a lost node, tests/test_cluster.py): nothing the driver does after it runs.
DIES_IN_RAY_SHUTDOWN = """\
import os, sys
import ray
shut_down = ray.shutdown
def shutdown_then_die(*args, **kwargs):
    shut_down(*args, **kwargs)
    sys.stdout.flush()
    os._exit(139)
ray.shutdown = shutdown_then_die
from acer_sync.__main__ import run_command
run_command("sweep", sys.argv[1:], "sweep.py")
"""


def test_the_summary_is_written_before_ray_shuts_down(sweep_scenario):
    second, sweep_dir = sweep_scenario["second"], sweep_scenario["sweep_dir"]
    assert second.returncode == 0, second.stdout + second.stderr  # finished: this run trains nothing
    summary_file = sweep_dir / "summary.md"
    written = summary_file.read_text()
    summary_file.unlink()
    try:
        result = subprocess.run(
            [sys.executable, "-c", DIES_IN_RAY_SHUTDOWN, str(sweep_dir.parent.parent / "pair.yaml"),
             "--runs-dir", str(sweep_dir.parent)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 139, result.stdout + result.stderr
        assert summary_file.is_file(), result.stdout + result.stderr
        assert summary_file.read_text() == written
        assert f"wrote {summary_file}" in result.stdout
    finally:
        if not summary_file.is_file():  # for the other tests of the scenario
            summary_file.write_text(written)


STOP_YAML = """\
name: stop
envs: [CartPole-v1]
seeds: [0, 1]
settings: {total_timesteps: 1000000, num_envs: 4, vec_env: sync, log_interval: 5, checkpoint_every: 1000000, eval_every: 0,
           compile: "off"}
trial: {cpus: 1, gpus: 0}
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_saves_a_checkpoint_of_each_running_trial(tmp_path, signum):
    """As train.py does on SIGINT: no periodic checkpoint comes before the stop here, so the trials'
    checkpoints can only be the ones saved at the stop. SIGTERM to sweep.py is a Ctrl-C too: Ray's
    handler had answered it with a native stack dump and exit 134, nothing saved. (One sent to the
    whole process group reaches Ray's own processes as well, which end at once: docs/many-runs.md.)"""
    sweep_file, runs_dir, log = tmp_path / "stop.yaml", tmp_path / "runs", tmp_path / "stop.log"
    sweep_file.write_text(STOP_YAML)
    run_dirs = [runs_dir / "stop" / name for name in (SEED0, SEED1)]
    process = start_sweep(sweep_file, runs_dir, log)
    try:
        wait_for(lambda: all((run_dir / "progress.csv").is_file() and read_progress(run_dir) for run_dir in run_dirs),
                 "both trials logged a row", process, log)
        process.send_signal(signum)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, log.read_text()
    for run_dir in run_dirs:
        saved_step = load_checkpoint(run_dir)["counters"]["timesteps"]
        assert saved_step >= int(read_progress(run_dir)[-1]["total_timesteps"]) > 0
        assert saved_step % (4 * 20) == 0


def test_a_ctrl_c_delivered_twice_asks_the_trials_to_save_once_before_tune_stops_them(monkeypatch):
    # GNU timeout sends its SIGINT to sweep.py and again to its process group. Taken for a second
    # Ctrl-C, the copy ran Tune's handler at once, which stops trials that may not have saved.
    import threading
    import time

    from acer_sync.sweeps import launch

    tune_calls, saved, started, sent = [], threading.Event(), threading.Event(), threading.Event()

    def trials_save_then_resend(wait_seconds, resent):  # request_stop, with Ray's part held until `saved`
        started.set()
        saved.wait(10)
        resent.set()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        sent.set()

    monkeypatch.setattr(launch, "request_stop", trials_save_then_resend)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: tune_calls.append(signum))  # Tune's handler
    try:
        launch.StopTrialsOnInterrupt(wait_seconds=30).on_step_begin(0, [])
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the copy: each os.kill runs the handler before the next line
        assert started.wait(10) and tune_calls == []
        saved.set()
        deadline = time.monotonic() + 10
        while not tune_calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tune_calls == [signal.SIGINT]  # once the trials have saved
    finally:
        saved.set()
        sent.wait(10)
        time.sleep(0.05)  # the resent SIGINT reaches the test's handler, not pytest's
        signal.signal(signal.SIGINT, previous)


def test_a_continued_sweep_waits_its_own_stop_wait_not_the_first_runs(monkeypatch):
    # Tune restores the first run's callbacks from its pickled state, their values with them.
    import pickle
    import threading

    from acer_sync.sweeps import launch

    restored = pickle.loads(pickle.dumps(launch.StopTrialsOnInterrupt(wait_seconds=30)))
    monkeypatch.setattr(launch.StopTrialsOnInterrupt, "wait_now", 120)  # make_tuner, for the continued sweep's --stop-wait 120
    waits, asked = [], threading.Event()
    monkeypatch.setattr(launch, "request_stop", lambda wait_seconds, resent: (waits.append(wait_seconds), asked.set()))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # Tune's handler
    try:
        restored.on_step_begin(0, [])
        os.kill(os.getpid(), signal.SIGINT)
        assert asked.wait(10) and waits == [120]
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\nenvs: [CartPole-v1]\nseeds: [0]\ngrid: {lr: [1]}\n", "unknown key 'grid'"),
        ("name: x\nenvs: [CartPole-v1]\nseeds: [0]\nsettings: {replay_ratio: lots}\n", "replay_ratio must be a number, got 'lots'"),
        # Refused before Ray starts, not by the trial (which Tune would retry).
        ("name: x\nenvs: [PongNoFrameskip-v4]\nseeds: [0]\nsettings: {normalize_obs: true}\n", "--normalize-obs is for vector observations"),
        (None, "no such file"),
    ],
)
def test_bad_sweep_file_is_a_one_line_error(tmp_path, text, message):
    path = tmp_path / "sweep.yaml"
    if text is not None:
        path.write_text(text)
    result = subprocess.run([sys.executable, str(ROOT / "sweep.py"), str(path), "--runs-dir", str(tmp_path / "runs")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert line.startswith("sweep.py: error: ") and message in line, line
    assert not (tmp_path / "runs").exists()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


BASE = "name: s\nenvs: [CartPole-v1]\nseeds: [0, 1]\n"


def test_sweep_file_expands_env_seed_and_grid_axes_into_named_trials(tmp_path):
    sweep = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 5000, replay_ratio: [1, 4], lr: 0.002}\ntrial: {cpus: 2, gpus: 0.25}\n"))
    assert [trial.name for trial in sweep.trials] == [
        "CartPole-v1_seed0_replay_ratio1", "CartPole-v1_seed0_replay_ratio4",
        "CartPole-v1_seed1_replay_ratio1", "CartPole-v1_seed1_replay_ratio4",
    ]
    first = sweep.trials[0].config
    assert (first.env, first.seed, first.replay_ratio, first.lr, first.total_timesteps, first.threads) == ("CartPole-v1", 0, 1.0, 0.002, 5000, 2)
    assert first.num_envs == build_config(False, {}).num_envs  # the classic preset under the settings
    assert (sweep.cpus, sweep.gpus, sweep.failures, sweep.grid_axes) == (2, 0.25, 3, ("replay_ratio",))


@pytest.mark.parametrize(
    "text, message",
    [
        (BASE + "settings: {seed: 3}\n", "settings.seed is set by the sweep's seeds"),
        (BASE + "settings: {threads: 3}\n", "settings.threads is set by the sweep's trial"),
        (BASE + "settings: {learning_rate: 0.1}\n", "unknown setting 'learning_rate'"),
        (BASE + "settings: {num_envs: [4, 4.5]}\n", "num_envs must be an integer, got 4.5"),
        (BASE + "settings: {total_timesteps: true}\n", "total_timesteps must be an integer, got True"),
        (BASE + "settings: {gamma: 1.5}\n", "trial CartPole-v1_seed0: --gamma must be in (0, 1]"),
        (BASE + "settings: {vec_env: fast}\n", "vec_env must be one of ale, subproc, sync"),
        (BASE + "settings: {network: [mlp, cnn]}\n", "trial CartPole-v1_seed0_networkcnn: --network cnn does not fit CartPole-v1"),
        ("name: s\nenvs: [PongNoFrameskip-v4]\nseeds: [0]\nsettings: {normalize_obs: true}\n",
         "trial PongNoFrameskip-v4_seed0: --normalize-obs is for vector observations"),
        (BASE + "trial: {cpus: 0}\n", "trial.cpus must be a whole number >= 1"),
        (BASE + "trial: {cpus: 2000}\n", "trial.cpus must be <= 1024, got 2000"),
        (BASE + "trial: {gpus: 1.5}\n", "trial.gpus must be a fraction in [0, 1] or a whole number"),
        (BASE + "settings: {compile: graph}\n", "--compile graph runs the update as a CUDA graph, and this run's device is cpu"),
        (BASE + "trial: {memory: 3}\n", "unknown key trial.memory"),
        ("name: s\nenvs: [CartPol-v1]\nseeds: [0]\n", "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
        ("name: s\nenvs: [CartPole-v1]\nseeds: [0, 0]\n", "seeds lists 0 twice"),
        # two trials of one run directory, one of them failing ("in use by process"): refused before Ray starts
        (BASE + "settings: {lr: [0.001, 1.0e-3]}\n", "settings.lr lists 0.001 twice"),
        (BASE + "settings: {replay_ratio: [1, 1.0]}\n", "settings.replay_ratio lists 1.0 twice"),
        (BASE + "settings: {lr: [0.0007, 0.00070000001]}\n", "two trials would both be named CartPole-v1_seed0_lr0.0007"),
        # an alias beside its setting: one won in silence, and the trials' names misreported it
        (BASE + "settings: {hidden: ['32'], net_arch: ['16', '8']}\n", "gives the setting hidden twice, as hidden and net_arch"),
        ("name: s\nenvs: []\nseeds: [0]\n", "envs must be a non-empty list"),
        ("name: ../up\nenvs: [CartPole-v1]\nseeds: [0]\n", "name must be a directory name"),
        ("envs: [CartPole-v1]\nseeds: [0]\n", "missing key 'name'"),
        ("name: s\nenvs: [CartPole-v1\n", "not valid YAML at line"),
        ("- 1\n", "expected a mapping"),
    ],
)
def test_sweep_file_mistakes_are_one_line_user_errors(tmp_path, text, message):
    with pytest.raises(UserError) as error:
        load_sweep(write(tmp_path, text))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_sweep_is_checked_on_the_devices_its_trials_reserve_not_on_this_machines(tmp_path):
    # A Ray head without a GPU loads a sweep whose trials run on GPU shares of other nodes.
    text = BASE + "settings: {compile: graph, replay_device: cuda}\ntrial: {cpus: 1, gpus: 0.5}\n"
    assert {trial.config.compile for trial in load_sweep(write(tmp_path, text)).trials} == {"graph"}


def test_shipped_sweep_files_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name in ("atari.yaml", "classic.yaml", "continuous.yaml"):
            continue
        assert load_sweep(path).trials, path
    assert len(load_sweep(ROOT / "configs" / "cartpole-rr.yaml").trials) == 4


def test_shipped_preset_files_hold_the_presets():
    assert build_config(True, load_config_file(ROOT / "configs" / "atari.yaml")) == build_config(True, {})
    assert build_config(False, load_config_file(ROOT / "configs" / "classic.yaml")) == build_config(False, {})
    continuous = build_config(False, {}, continuous=True)
    assert build_config(False, load_config_file(ROOT / "configs" / "continuous.yaml"), continuous=True) == continuous
    for name, preset in (("atari.yaml", build_config(True, {})), ("classic.yaml", build_config(False, {})),
                         ("continuous.yaml", continuous)):
        # Every value a preset changes is written in its file, not only left to the preset.
        written = load_config_file(ROOT / "configs" / name)
        changed = {key for key, value in dataclasses.asdict(preset).items() if value != getattr(Config(), key)}
        assert changed <= set(written), (name, changed - set(written))


def test_sweep_trials_take_the_preset_of_their_env_kind(tmp_path):
    """Then the env's tuned settings (acer_sync/data/envs/Pendulum-v1.yaml), as train.py applies them."""
    sweep = load_sweep(write(tmp_path, "name: s\nenvs: [CartPole-v1, Pendulum-v1]\nseeds: [0]\n"))
    cartpole, pendulum = (trial.config for trial in sweep.trials)
    assert cartpole == build_config(False, dict(env="CartPole-v1", seed=0, threads=1))
    assert pendulum == build_config(
        False, dict(env="Pendulum-v1", seed=0, threads=1), continuous=True, env_settings=load_env_settings("Pendulum-v1")[1]
    )
    assert pendulum.normalize_obs and not cartpole.normalize_obs


def test_train_config_file_overrides_the_preset_and_a_flag_overrides_the_file(tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text("lr: 0.002\nnum_envs: 2\nnsteps: 5\ntotal_timesteps: 40\nvec_env: sync\neval_every: 0\nlog_interval: 1\n")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train.py", "--env", "CartPole-v1", "--config", str(config_file), "--lr", "0.003",
         "--run-dir", str(run_dir), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["lr"] == 0.003  # the flag beats the file
    assert config["num_envs"] == 2 and config["nsteps"] == 5  # the file beats the preset
    assert config["buffer_size"] == build_config(False, {}).buffer_size  # the preset where neither speaks


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr: fast\n", "lr must be a number, got 'fast'"),
        ("learning_rate: 0.1\n", "unknown setting 'learning_rate'"),
        ("run_dir: runs/mine\n", "run_dir is train.py's flag --run-dir, not a setting"),
        ("lr: .nan\n", "lr must be a finite number"),
        ("[1, 2]\n", "expected a mapping of settings"),
        ("lr: 0.001\nlr: 0.002\n", "not valid YAML at line 2: 'lr' is given twice"),  # the last one won, in silence
        ("lr: 1" + "0" * 400 + "\n", "lr must be a finite number, got an integer too large for one"),  # a traceback
    ],
)
def test_bad_config_file_is_a_one_line_user_error(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match="^" + str(path).replace(".", r"\.")) as error:
        load_config_file(path)
    assert message in str(error.value)


def test_a_config_file_takes_numbers_written_with_an_exponent_and_no_dot(tmp_path):
    # YAML 1.1 reads 1e-3 as a string (a float needs a dot: 1.0e-3), and lr: 1e-3 was refused as not a number.
    path = tmp_path / "exponents.yaml"
    path.write_text("lr: 1e-3\nrms_eps: 1E-5\nenv_kwargs: {scale: 2e2}\n")
    assert load_config_file(path) == {"lr": 0.001, "rms_eps": 1e-5, "env_kwargs": {"scale": 200.0}}


def test_a_config_file_with_yaml_merge_keys_loads_and_its_own_keys_override_the_merged_ones(tmp_path):
    # the duplicate-key check read the merge key "<<" as a key, and refused every file with one
    path = tmp_path / "merged.yaml"
    path.write_text("env_kwargs: {<<: {length: 12, hard: true}, hard: false}\nlr: 0.002\n")
    assert load_config_file(path) == {"env_kwargs": {"length": 12, "hard": False}, "lr": 0.002}


def test_train_with_a_missing_config_file_is_a_one_line_error(tmp_path):
    result = subprocess.run([sys.executable, "train.py", "--config", str(tmp_path / "none.yaml")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert "none.yaml: no such file" in one_line_error(result)


def test_trainer_hooks_see_every_row_and_checkpoint_in_a_worker_thread(tmp_path):
    """As in a Tune trial: the Trainer runs outside the main thread, where it installs no signal
    handlers, and its hooks receive each progress row and each checkpoint's path."""
    import threading

    import torch

    from acer_sync.training.setup import build_trainer
    from atari.envs import env_info

    config = build_config(False, dict(env="CartPole-v1", num_envs=2, nsteps=5, total_timesteps=100, vec_env="sync",
                                      log_interval=2, checkpoint_every=40, eval_every=0, threads=1))
    rows, checkpoints, outcome = [], [], {}
    threads_before = torch.get_num_threads()

    def train():
        trainer = build_trainer(config, env_info(config.env), tmp_path, progress_bar=False,
                          on_progress=rows.append, on_checkpoint=checkpoints.append)
        outcome["finished"] = trainer.train().finished

    worker = threading.Thread(target=train)
    worker.start()
    worker.join(timeout=120)
    torch.set_num_threads(threads_before)
    assert outcome == {"finished": True}
    assert [row["total_timesteps"] for row in rows] == [int(row["total_timesteps"]) for row in read_progress(tmp_path)]
    assert rows[-1]["total_timesteps"] == 100
    assert checkpoints == [tmp_path / "checkpoints" / "latest.pt"] * 3  # at 40 and 80 steps, and at the end


def test_interim_summary_marks_unfinished_trials_and_leaves_them_out_of_the_means(tmp_path):
    from acer_sync.sweeps.launch import TrialOutcome
    from acer_sync.sweeps.summary import summary_markdown

    sweep = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 2000}\n"))
    for name, last_step, final_mean in ((SEED0, 2000, 100.0), (SEED1, 400, 10.0)):
        (tmp_path / name).mkdir()
        rows = [f"{step},{final_mean}" for step in range(200, last_step + 1, 200)]
        (tmp_path / name / "progress.csv").write_text("total_timesteps,mean_episode_reward\n" + "\n".join(rows) + "\n")
    summary = summary_markdown(sweep, tmp_path, [TrialOutcome(SEED0, "finished"), TrialOutcome(SEED1, "unfinished")])
    assert f"| {SEED0} | finished | 2,000 | 100.00 |" in summary
    assert f"| {SEED1} | unfinished | 400 of 2,000 | 10.00 |" in summary
    assert "**CartPole-v1_seeds: mean of 1 of 2 seeds: those not finished are left out** |  |  | 100.00 |" in summary
    # a failed trial's row said "failed" and not why
    failed = summary_markdown(sweep, tmp_path, [TrialOutcome(SEED0, "finished"), TrialOutcome(SEED1, "failed", "RuntimeError: torso bug")])
    assert f"| {SEED1} | failed | 400 of 2,000 | 10.00 |" in failed
    assert failed.endswith(f"## Failed trials\n\n- {SEED1}: RuntimeError: torso bug\n")
    assert "Failed trials" not in summary


def test_a_summary_that_cannot_be_written_is_a_write_failed_naming_it(tmp_path, capsys):
    from acer_sync.base.errors import WriteFailed
    from acer_sync.sweeps.launch import TrialOutcome
    from acer_sync.sweeps.summary import write_summary

    sweep = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 2000}\n"))
    with pytest.raises(WriteFailed, match=r"cannot write .*gone/summary.md: No such file or directory"):
        write_summary(sweep, tmp_path / "gone", [TrialOutcome(SEED0, "unfinished"), TrialOutcome(SEED1, "unfinished")])
    assert f"| {SEED0} | unfinished |" in capsys.readouterr().out  # printed all the same


def test_address_without_a_runs_dir_is_refused_before_joining(tmp_path):
    """The default runs/ is on this machine only; a trial on another node would write elsewhere."""
    path = write(tmp_path, BASE)
    result = subprocess.run([sys.executable, str(ROOT / "sweep.py"), str(path), "--address", "127.0.0.1:1"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert "with --address, give --runs-dir a directory that every node of the cluster mounts at the same path" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_stop_wait_is_refused_before_ray_starts(tmp_path, value):
    path = write(tmp_path, BASE)
    result = subprocess.run([sys.executable, str(ROOT / "sweep.py"), str(path), "--stop-wait", value],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert f"--stop-wait must be a number of seconds >= 0, got {float(value)}" in one_line_error(result)
    assert not (tmp_path / "runs").exists()


def test_a_node_that_cannot_see_the_drivers_probe_says_so(tmp_path):
    from acer_sync.sweeps.launch import node_storage_problem

    (tmp_path / ".probe").write_text("token")
    assert node_storage_problem(str(tmp_path), ".probe", "token") is None
    assert "sees another" in node_storage_problem(str(tmp_path), ".probe", "other token")
    assert "cannot read" in node_storage_problem(str(tmp_path / "elsewhere"), ".probe", "token")
    assert list(tmp_path.iterdir()) == [tmp_path / ".probe"]  # its own probe is gone again


def test_a_trial_records_the_git_commit_sweep_py_gives_it(tmp_path, monkeypatch):
    """The code a cluster's node runs is a copy without .git, where the trial finds no commit; a
    trial's run takes sweep.py's (acer_sync/acer_sync/sweeps/trial.py passes DriverContext.git_commit to api.run)."""
    from acer_sync.api import run_metadata
    from acer_sync.api import runs as api

    monkeypatch.setattr(run_metadata, "git_commit", lambda: "unknown")
    outcome = api.run(
        "CartPole-v1", run_dir=tmp_path / "t", commit="0123abcd", progress_bar=False, total_timesteps=16, num_envs=2,
        nsteps=8, vec_env="sync", eval_every=0, threads=1,
    )
    assert outcome.finished
    assert json.loads((tmp_path / "t" / "config.json").read_text())["git_commit"] == "0123abcd"
    # a resumed trial's session records what run_trial now passes on a resume too (it recorded "unknown", and a
    # call of 19 settings)
    command = ["sweep.py", "pair.yaml", "(trial t)"]
    assert api.run(resume=tmp_path / "t", command=command, commit="4567cdef", progress_bar=False, total_timesteps=32).finished
    [session] = json.loads((tmp_path / "t" / "config.json").read_text())["resumes"]
    assert (session["git_commit"], session["command"], session["changed"]) == ("4567cdef", command, {"total_timesteps": [16, 32]})


def test_run_directories_inside_the_repository_stay_out_of_the_upload():
    from acer_sync.sweeps.launch import CODE_EXCLUDES, REPO_ROOT, code_excludes

    # Every sweep under a --runs-dir inside the repository, not only this one's.
    assert code_excludes(REPO_ROOT / "myruns") == [*CODE_EXCLUDES, "/myruns/"]
    assert code_excludes(REPO_ROOT / "out" / "runs") == [*CODE_EXCLUDES, "/out/runs/"]
    assert code_excludes(Path("/somewhere/else/runs")) == list(CODE_EXCLUDES)
    assert code_excludes(REPO_ROOT) == list(CODE_EXCLUDES)


def test_a_sweep_recorded_before_a_setting_existed_continues_and_a_changed_one_names_the_setting(tmp_path):
    from acer_sync.sweeps.launch import RECORD_FILE, check_same_sweep

    sweep = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 5000}\ntrial: {cpus: 1}\n"))
    sweep_dir = tmp_path / "runs" / sweep.name
    check_same_sweep(sweep, sweep_dir)  # records the sweep
    record = json.loads((sweep_dir / RECORD_FILE).read_text())
    for config in record["trials"].values():
        del config["precision"]  # written before --precision existed: those trials ran in fp32
    (sweep_dir / RECORD_FILE).write_text(json.dumps(record))
    check_same_sweep(sweep, sweep_dir)
    for config in record["trials"].values():
        config["lr"] = 0.5
    (sweep_dir / RECORD_FILE).write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"run from a different file \(its trials differ: lr\)"):
        check_same_sweep(sweep, sweep_dir)
    # a setting a preset now sets away from its default (action_scale box on continuous envs): the
    # same file was refused as "a different file (its trials differ: action_scale)"
    pendulum = load_sweep(write(tmp_path, "name: pend\nenvs: [Pendulum-v1]\nseeds: [0]\n"))
    pendulum_dir = tmp_path / "runs" / pendulum.name
    check_same_sweep(pendulum, pendulum_dir)
    record = json.loads((pendulum_dir / RECORD_FILE).read_text())
    for config in record["trials"].values():
        assert config.pop("action_scale") == "box"
    (pendulum_dir / RECORD_FILE).write_text(json.dumps(record))
    check_same_sweep(pendulum, pendulum_dir)
    # ... but a file that now sets such a setting itself is a changed file (it was taken for the same)
    changed = load_sweep(write(tmp_path, "name: pend\nenvs: [Pendulum-v1]\nseeds: [0]\nsettings: {action_scale: none}\n"))
    with pytest.raises(UserError, match=r"its trials differ: action_scale"):
        check_same_sweep(changed, pendulum_dir)


def test_a_sweep_from_before_the_auto_defaults_continues_with_the_modes_its_trials_ran_with(tmp_path):
    # Its record holds compile "off" and pipeline "serial" (their defaults then), or no pipeline at
    # all (before the setting): the same file now gives "auto" to both, and was refused as "a
    # different file (its trials differ: compile, pipeline)". Its trials keep what they ran with.
    from acer_sync.sweeps.launch import RECORD_FILE, check_same_sweep

    sweep = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 5000}\ntrial: {cpus: 1}\n"))
    assert {(trial.config.compile, trial.config.pipeline) for trial in sweep.trials} == {("auto", "auto")}
    sweep_dir = tmp_path / "runs" / sweep.name
    assert check_same_sweep(sweep, sweep_dir) == sweep  # a new sweep: recorded as it is
    record = json.loads((sweep_dir / RECORD_FILE).read_text())
    assert record.pop("defaults") == {"compile": "auto", "pipeline": "auto"}  # records before them had none
    for index, config in enumerate(record["trials"].values()):
        if index == 0:  # compile as the first sweeps recorded it, a bool
            config["compile"], config["pipeline"] = False, "serial"
        else:
            config["compile"] = "off"
            del config["pipeline"]
    (sweep_dir / RECORD_FILE).write_text(json.dumps(record))
    continued = check_same_sweep(sweep, sweep_dir)
    assert {(trial.config.compile, trial.config.pipeline) for trial in continued.trials} == {("off", "serial")}
    assert [trial.name for trial in continued.trials] == [trial.name for trial in sweep.trials]
    # A file that now names another mode is another file.
    overlapped = load_sweep(write(tmp_path, BASE + "settings: {total_timesteps: 5000, pipeline: overlap}\ntrial: {cpus: 1}\n"))
    with pytest.raises(UserError, match=r"its trials differ: pipeline"):
        check_same_sweep(overlapped, sweep_dir)
    # A sweep recorded under the auto defaults whose file named serial, then named nothing: its
    # file changed (it was taken for the same sweep, whose trials kept serial).
    explicit = load_sweep(write(tmp_path, BASE.replace("name: ", "name: explicit-") +
                                "settings: {total_timesteps: 5000, pipeline: serial}\ntrial: {cpus: 1}\n"))
    explicit_dir = tmp_path / "runs" / explicit.name
    check_same_sweep(explicit, explicit_dir)
    plain = load_sweep(write(tmp_path, BASE.replace("name: ", "name: explicit-") + "settings: {total_timesteps: 5000}\ntrial: {cpus: 1}\n"))
    with pytest.raises(UserError, match=r"its trials differ: pipeline"):
        check_same_sweep(plain, explicit_dir)
    assert check_same_sweep(explicit, explicit_dir) == explicit
    # Tune's own saved trials (a continued sweep restores them) of a sweep from before --pipeline
    from acer_sync.sweeps.trial import start_run

    saved = dataclasses.asdict(sweep.trials[0].config)
    del saved["pipeline"]
    config, _ = start_run({"config": saved, "run_dir": str(tmp_path / "trial")}, [])
    assert config.pipeline == "serial"


def test_a_cluster_gets_the_clone_or_an_installed_acer_syncs_two_packages(tmp_path, monkeypatch):
    from acer_sync.sweeps import launch

    shipped = launch.code_to_ship(ROOT / "runs")
    assert shipped["working_dir"] == str(ROOT) and "/runs/" in shipped["excludes"]
    site_packages = tmp_path / "site-packages"  # pip install .: the package's parent holds every other package
    monkeypatch.setattr(launch, "REPO_ROOT", site_packages)
    assert launch.code_to_ship(tmp_path / "runs") == {
        "py_modules": [str(site_packages / "acer_sync"), str(site_packages / "atari")]}


def test_a_sweep_record_the_disk_refuses_leaves_no_half_file(tmp_path, monkeypatch):
    # A full disk after part of it was written: a half sweep.json made every later run of the
    # sweep an error ("cannot read it: restore it"), with nothing to restore.
    import errno

    from acer_sync.sweeps.launch import RECORD_FILE, check_same_sweep

    sweep = load_sweep(write(tmp_path, BASE))
    fsync = os.fsync

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(UserError, match=r"cannot write the sweep's directory .*: No space left on device"):
        check_same_sweep(sweep, tmp_path / "sweep")
    assert list((tmp_path / "sweep").iterdir()) == []
    monkeypatch.setattr(os, "fsync", fsync)
    check_same_sweep(sweep, tmp_path / "sweep")  # the disk has room again: the sweep starts
    assert json.loads((tmp_path / "sweep" / RECORD_FILE).read_text())["name"] == "s"


def test_a_trial_larger_than_this_machine_is_refused_before_ray_starts(tmp_path):
    """Tune would keep such a trial pending for ever, without a word."""
    path = write(tmp_path, BASE + "trial: {cpus: 1000}\n")
    result = subprocess.run([sys.executable, str(ROOT / "sweep.py"), str(path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert f"a trial asks for 1000 CPUs and 0 GPUs (trial: in the sweep file), and this machine has {os.cpu_count()} CPUs" \
        in one_line_error(result)
    assert not (tmp_path / "runs").exists()  # nothing recorded: the corrected file starts the sweep afresh


def test_a_runs_dir_under_a_file_is_a_one_line_error(tmp_path):
    path = write(tmp_path, BASE)
    (tmp_path / "afile").write_text("")
    result = subprocess.run([sys.executable, str(ROOT / "sweep.py"), str(path), "--runs-dir", str(tmp_path / "afile")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "cannot write the sweep's directory" in one_line_error(result)
    assert (tmp_path / "afile").read_text() == ""


def test_a_trial_that_died_before_its_first_checkpoint_starts_afresh(tmp_path):
    """Tune restarts it in the same directory: what the dead start wrote, its config.json too, goes."""
    from acer_sync.api.runs import prepare_run_dir
    from acer_sync.sweeps.trial import discard_unsaved_start

    run_dir = tmp_path / "trial"
    (run_dir / "tb").mkdir(parents=True)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "progress.csv").write_text("total_timesteps\n")
    discard_unsaved_start(run_dir)
    assert list(run_dir.iterdir()) == []
    prepare_run_dir(run_dir)  # the restarted trial's run starts there


def test_a_trial_whose_latest_checkpoint_was_lost_fails_keeping_its_step_copies(tmp_path):
    """Not a start that died before its first checkpoint: train.py --resume refuses it the same way."""
    from acer_sync.sweeps.trial import TrialFailed, start_run

    run_dir = tmp_path / "trial"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_0000000200.pt").write_bytes(b"a checkpoint")
    (run_dir / "progress.csv").write_text("total_timesteps\n200\n")
    trial = {"config": dataclasses.asdict(build_config(False, {"env": "CartPole-v1"})), "run_dir": str(run_dir)}
    with pytest.raises(TrialFailed, match=r"holds no latest.pt; step_0000000200.pt beside it holds step 200: copy it"):
        start_run(trial, [])
    assert (run_dir / "checkpoints" / "step_0000000200.pt").exists() and (run_dir / "progress.csv").exists()


def test_a_trial_does_not_clear_a_run_directory_another_process_trains(tmp_path):
    """A second sweep.py of the sweep, or Tune restarting a trial whose old process still runs."""
    from acer_sync.base.run_lock import RunLock
    from acer_sync.sweeps.trial import TrialFailed, start_run

    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    (run_dir / "progress.csv").write_text("total_timesteps\n200\n")
    trial = {"config": dataclasses.asdict(build_config(False, {"env": "CartPole-v1"})), "run_dir": str(run_dir)}
    held = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from acer_sync.base.run_lock import RunLock
RunLock.acquire({str(run_dir)!r}); print("locked", flush=True); time.sleep(60)"""], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "locked"
        with pytest.raises(TrialFailed, match=r"is in use by process \d+ on "):
            start_run(trial, [])
        assert (run_dir / "progress.csv").exists()
    finally:
        held.kill()
        held.wait()
    start_run(trial, [])  # the holder is gone: the unsaved start is cleared
    assert not (run_dir / "progress.csv").exists() and RunLock.holder(run_dir) is None


def test_a_trial_that_reserved_no_gpu_runs_auto_on_the_cpu(tmp_path):
    # Ray shows every GPU to a task that reserved none: device auto must not take one.
    from acer_sync.sweeps.trial import start_run

    def trial(device):
        config = dataclasses.asdict(build_config(False, {"env": "CartPole-v1", "device": device}))
        return {"config": config, "run_dir": str(tmp_path / device)}

    assert start_run(trial("auto"), [])[0].device == "cpu"
    assert start_run(trial("auto"), ["0"])[0].device == "auto"  # a share of GPU 0 (gpus: 0.25)
    assert start_run(trial("cpu"), ["0"])[0].device == "cpu"


def test_a_flag_overrides_a_config_files_setting_given_by_its_alias(tmp_path):
    # file net_arch "64,64" and --net-arch 32: "gives the setting hidden twice" (it ran with 32 before)
    from acer_sync.cli import train

    path = tmp_path / "netarch.yaml"
    path.write_text('net_arch: "64,64"\n')
    assert train.main(["--env", "CartPole-v1", "--config", str(path), "--net-arch", "32", "--total-timesteps", "40",
                       "--run-dir", str(tmp_path / "run"), "--no-progress", "--num-envs", "2"]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["hidden"] == "32"


def test_a_setting_and_its_alias_together_are_refused_in_a_config_file_and_from_python(tmp_path):
    # net_arch '32,32' beside hidden '16' trained with 16, and said nothing
    path = tmp_path / "both.yaml"
    path.write_text("net_arch: '32,32'\nhidden: '16'\n")
    with pytest.raises(UserError, match="gives the setting hidden twice, as net_arch and hidden"):
        load_config_file(path)
    import acer_sync

    with pytest.raises(UserError, match="gives the setting hidden twice, as hidden and net_arch"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", hidden="16", net_arch="32,32", total_timesteps=40)
    assert not (tmp_path / "run").exists()


def test_a_sweep_started_before_a_check_existed_continues_its_started_trials(tmp_path, monkeypatch):
    # --replay-ratio is at most 100 for new runs. A sweep of 150 from before the cap could not be
    # continued: every trial was checked as a new run, though a resume of each is allowed.
    from acer_sync.sweeps.spec import RECORD_FILE

    path = write(tmp_path, BASE + "settings: {total_timesteps: 5000, replay_ratio: 150}\n")
    runs_dir = tmp_path / "runs"
    with pytest.raises(UserError, match=r"trial CartPole-v1_seed0: --replay-ratio must be from 0 to 100"):
        load_sweep(path, runs_dir)  # a new sweep
    (runs_dir / "s").mkdir(parents=True)
    (runs_dir / "s" / RECORD_FILE).write_text("{}")  # the sweep ran before (launch.check_same_sweep compares the record)
    checkpoints = runs_dir / "s" / "CartPole-v1_seed0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest.pt").touch()
    # Its started trial resumes; the other, not started when it stopped, starts as a new run, where the cap refuses it.
    assert [trial.config.replay_ratio for trial in load_sweep(path, runs_dir).trials] == [150, 150]
    with pytest.raises(UserError, match="--replay-ratio must be from 0 to 100"):
        load_sweep(path)  # no runs directory: a new sweep
    # sweep.py reads the file with its --runs-dir
    from acer_sync.cli import sweep as sweep_cli
    from acer_sync.sweeps import launch

    loaded = []
    monkeypatch.setattr(launch, "run_sweep", lambda sweep, *args: loaded.append(sweep) or [])
    monkeypatch.setattr("acer_sync.sweeps.summary.write_summary", lambda *args: None)
    assert sweep_cli.main([str(path), "--runs-dir", str(runs_dir)]) == 0
    assert [trial.config.replay_ratio for trial in loaded[0].trials] == [150, 150]


def test_a_trials_exception_crosses_to_sweep_py_as_its_type_message_and_checkpoint(tmp_path):
    # A torso's KeyboardInterrupt was reported as "ray.exceptions.TaskCancelledError: Task ... was
    # cancelled", an exception of two arguments as a TypeError of unpickling, a SystemExit as the
    # actor's; a failure Tune recovered from was never named ("trial ... died"), and the final line
    # began "acer_sync.sweeps.trial.TrialFailed: ".
    import types

    from acer_sync.sweeps.launch import failure_cause, one_line
    from acer_sync.sweeps.trial import TrialFailed, failure_text

    error = RuntimeError("torso bug")
    error.add_note("acer_sync: the run in /runs/a stopped at step 7600; checkpoints/latest.pt holds step 7600")
    said = failure_text(error)
    assert said == "RuntimeError: torso bug (the run in /runs/a stopped at step 7600; checkpoints/latest.pt holds step 7600)"
    assert failure_text(SystemExit(3)) == "SystemExit: 3" and failure_text(KeyboardInterrupt()) == "KeyboardInterrupt: "
    report = f"Traceback (most recent call last):\n  File \"x.py\", line 1\nacer_sync.sweeps.trial.TrialFailed: {said}\n"
    assert one_line(report) == said
    (tmp_path / "error.txt").write_text(report)
    assert failure_cause(types.SimpleNamespace(error_file=str(tmp_path / "error.txt"))) == f": {said}"
    assert failure_cause(types.SimpleNamespace(error_file=None)) == ""
    assert issubclass(TrialFailed, RuntimeError)


def test_a_trial_reports_the_step_its_checkpoint_holds_when_its_buffer_is_written_later(monkeypatch):
    # With save_buffer, a periodic checkpoint's on_checkpoint comes once its buffer is written, a
    # few iterations on: Tune's "saved at" column showed the step the run had reached by then.
    from types import SimpleNamespace

    from acer_sync.sweeps import trial as trial_module

    reported = []
    monkeypatch.setattr(trial_module.tune, "report", reported.append)
    reporter = trial_module.TuneReporter()
    reporter.trainer = SimpleNamespace(timesteps=400, checkpoint_step=160)
    reporter.on_checkpoint(Path("latest.pt"))
    assert reported[0]["checkpoint_timesteps"] == 160

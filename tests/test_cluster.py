"""sweep.py on a real Ray cluster: a head and one worker node on this machine, on loopback only.

The cluster (``tests/ray_cluster.py``, in a process of its own) has token authentication on, as
Ray 2.60 has wherever ``~/.ray/auth_token`` exists, with its own home, temporary directory and
ports; every node has 1 CPU. sweep.py joins it with ``--address`` as a user would, and its code
reaches the nodes as Ray's ``working_dir``. The cluster and everything it started are shut down
at the end of the module, even when a test fails.

The main scenario runs 2 CartPole trials, one on each node, kills the worker node (its trial's
process included, with SIGKILL) once its trial has a checkpoint, and checks that the trial
resumes on the head from that checkpoint, that no ``progress.csv`` repeats or goes back, and
that the summary is right. Its ``--runs-dir`` lies inside the repository and holds a file
larger than the upload limit the driver is given, which only run directories kept out of the
upload let through.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from acer_sync.training.checkpoint import load_checkpoint
from helpers import ROOT, one_line_error, read_progress, trial_processes, trial_resume_steps
from helpers import wait_for as wait_for_condition

TOTAL_STEPS = 6400
STEPS_PER_ROW = 4 * 20 * 5  # num_envs x nsteps x log_interval
CHECKPOINT_EVERY = 800
SWEEP_YAML = f"""\
name: lost-node
envs: [CartPole-v1]
seeds: [0, 1]
settings: {{total_timesteps: {TOTAL_STEPS}, num_envs: 4, vec_env: sync, log_interval: 5, checkpoint_every: {CHECKPOINT_EVERY},
            eval_every: 0}}
trial: {{cpus: 1, gpus: 0}}
failures: 2
"""
TRIALS = ("CartPole-v1_seed0", "CartPole-v1_seed1")
#: The driver's upload limit in the main scenario (Ray's RAY_max_grpc_message_size), and the size
#: of a file in its runs directory that would go over it. The code itself (tests/data's checkpoints
#: included) is about 1 MiB, so the limit leaves it room.
UPLOAD_LIMIT = 4 << 20
LARGE_FILE = 8 << 20
WAIT_SECONDS = 240


@dataclass
class RunningCluster:
    address: str
    head_node: str
    worker_node: str
    env: dict
    root: Path
    helper: subprocess.Popen

    def kill_worker_node(self) -> None:
        self.helper.stdin.write("kill-worker\n")
        self.helper.stdin.flush()
        assert self.helper.stdout.readline().strip() == "killed"


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="acer-ray-", dir="/tmp"))  # short: Ray's socket paths must be
    (root / "home").mkdir()
    (root / "token").write_text(secrets.token_hex(32))
    # Ray takes 127.0.0.1 in an address for "this machine" and connects to its outward address
    # instead; this Ray setting, meant for one-machine clusters elsewhere, keeps it on loopback.
    env = {**os.environ, "HOME": str(root / "home"), "RAY_TMPDIR": str(root), "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(root / "token"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    with open(root / "cluster.log", "w") as log:
        helper = subprocess.Popen([sys.executable, str(ROOT / "tests" / "ray_cluster.py")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True)
    try:
        line = helper.stdout.readline()
        assert line, (root / "cluster.log").read_text()
        info = json.loads(line)
        yield RunningCluster(info["address"], info["head_node"], info["worker_node"], env, root, helper)
    finally:
        try:
            helper.communicate("stop\n", timeout=60)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            pass
        try:
            os.killpg(helper.pid, signal.SIGKILL)  # anything of the cluster's still there
        except ProcessLookupError:
            pass
        helper.wait()
        shutil.rmtree(root, ignore_errors=True)


def sweep_command(sweep_file: Path, runs_dir: Path, address: str) -> list[str]:
    return [sys.executable, str(ROOT / "sweep.py"), str(sweep_file), "--address", address, "--runs-dir", str(runs_dir)]


def wait_for(condition, what: str, process: subprocess.Popen, log: Path):
    """:func:`helpers.wait_for` with this file's time limit."""
    return wait_for_condition(condition, what, process, log, WAIT_SECONDS)


@pytest.fixture(scope="module")
def lost_node(cluster):
    """The main scenario; what the tests below check, gathered once."""
    runs_dir = ROOT / f".test-cluster-runs-{secrets.token_hex(4)}"
    sweep_dir = runs_dir / "lost-node"
    try:
        # Another sweep's run under the same --runs-dir: all of it stays out of the upload.
        (runs_dir / "an-earlier-sweep").mkdir(parents=True)
        (runs_dir / "an-earlier-sweep" / "large.bin").write_bytes(os.urandom(LARGE_FILE))
        sweep_file, log = cluster.root / "lost-node.yaml", cluster.root / "lost-node.log"
        sweep_file.write_text(SWEEP_YAML)
        env = {**cluster.env, "RAY_max_grpc_message_size": str(UPLOAD_LIMIT)}
        with open(log, "w") as handle:
            process = subprocess.Popen(sweep_command(sweep_file, runs_dir, cluster.address), cwd=ROOT, env=env,
                                       stdout=handle, stderr=subprocess.STDOUT, text=True)
        try:
            def started_on_worker():
                output = log.read_text()
                return [name for name in TRIALS
                        if any(node.startswith(cluster.worker_node[:12]) for _, node in trial_processes(output, name))]

            moved = wait_for(started_on_worker, "a trial started on the worker node", process, log)[0]
            wait_for(lambda: (sweep_dir / moved / "checkpoints" / "latest.pt").is_file(), "its first checkpoint", process, log)
            cluster.kill_worker_node()
            checkpoint_at_kill = load_checkpoint(sweep_dir / moved)["counters"]["timesteps"]
            steps_at_kill = int(read_progress(sweep_dir / moved)[-1]["total_timesteps"])
            process.wait(timeout=WAIT_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        yield dict(
            code=process.returncode, output=log.read_text(), moved=moved, checkpoint_at_kill=checkpoint_at_kill,
            steps_at_kill=steps_at_kill, sweep_dir=sweep_dir,
            rows={name: read_progress(sweep_dir / name) for name in TRIALS},
            configs={name: json.loads((sweep_dir / name / "config.json").read_text()) for name in TRIALS},
            summary=(sweep_dir / "summary.md").read_text() if (sweep_dir / "summary.md").is_file() else "",
        )
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)


def test_a_trial_on_a_lost_node_resumes_on_the_other_node_from_its_checkpoint(cluster, lost_node):
    output, moved = lost_node["output"], lost_node["moved"]
    assert lost_node["code"] == 0, output
    assert f"trial {moved} failed" in output and "(failure 1; restarts allowed: " in output
    starts = trial_processes(output, moved)
    assert [node for _, node in starts] == [cluster.worker_node[:12], cluster.head_node[:12]], output
    assert 0 < lost_node["checkpoint_at_kill"] <= lost_node["steps_at_kill"] < TOTAL_STEPS
    assert trial_resume_steps(output, moved) == [lost_node["checkpoint_at_kill"]], output
    other = next(name for name in TRIALS if name != moved)
    assert [node for _, node in trial_processes(output, other)] == [cluster.head_node[:12]]
    assert "Traceback" not in output


def test_no_progress_csv_repeats_or_goes_back(lost_node):
    for name, rows in lost_node["rows"].items():
        steps = [int(row["total_timesteps"]) for row in rows]
        assert steps == list(range(STEPS_PER_ROW, TOTAL_STEPS + 1, STEPS_PER_ROW)), (name, steps)
        for column in ("episodes", "updates", "time_elapsed"):
            values = [float(row[column]) for row in rows]
            assert values == sorted(values), (name, column)


def test_the_summary_is_right(lost_node):
    summary, rows = lost_node["summary"], lost_node["rows"]
    finals = {name: float(rows[name][-1]["mean_episode_reward"]) for name in TRIALS}
    for name in TRIALS:
        assert f"| {name} | finished | {TOTAL_STEPS:,} | {finals[name]:.2f} | n/a |" in summary, summary
    group_mean = math.fsum(finals.values()) / len(finals)
    assert f"| **CartPole-v1_seeds: mean of 2 seeds** |  |  | {group_mean:.2f} | n/a |" in summary, summary
    assert summary in lost_node["output"]


def test_trials_record_the_drivers_git_commit(lost_node):
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert commit
    for config in lost_node["configs"].values():
        assert config["git_commit"] == commit


def test_a_driver_without_the_clusters_token_is_told_how_to_give_it(cluster, tmp_path):
    env = {key: value for key, value in cluster.env.items() if not key.startswith("RAY_AUTH_")}
    env.update(HOME=str(tmp_path), RAY_NUM_REDIS_GET_RETRIES="2")  # no ~/.ray/auth_token; fail fast
    (tmp_path / "sweep.yaml").write_text(SWEEP_YAML)
    result = subprocess.run(sweep_command(tmp_path / "sweep.yaml", tmp_path / "runs", cluster.address), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert f"the Ray cluster at {cluster.address} uses token authentication and this machine sent no token; set RAY_AUTH_MODE=token" in line


def test_a_driver_with_another_token_is_told_it_was_refused(cluster, tmp_path):
    (tmp_path / "token").write_text(secrets.token_hex(32))
    env = {**cluster.env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token"), "RAY_NUM_REDIS_GET_RETRIES": "2"}
    (tmp_path / "sweep.yaml").write_text(SWEEP_YAML)
    result = subprocess.run(sweep_command(tmp_path / "sweep.yaml", tmp_path / "runs", cluster.address), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert f"the Ray cluster at {cluster.address} refused this machine's authentication token" in line


def test_code_over_rays_upload_limit_is_one_line_and_exit_2(cluster, tmp_path):
    large = ROOT / f".test-large-{secrets.token_hex(4)}"
    try:
        large.mkdir()
        (large / "data.bin").write_bytes(os.urandom(LARGE_FILE))
        (tmp_path / "sweep.yaml").write_text(SWEEP_YAML)
        env = {**cluster.env, "RAY_max_grpc_message_size": str(UPLOAD_LIMIT)}
        result = subprocess.run(sweep_command(tmp_path / "sweep.yaml", tmp_path / "runs", cluster.address), cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(large, ignore_errors=True)
    line = one_line_error(result)
    assert "the code sent to the cluster" in line and f"over Ray's limit of {UPLOAD_LIMIT / (1 << 20):.2f}MiB" in line, line


def test_a_runs_dir_that_a_node_does_not_see_is_refused_before_any_trial_starts(cluster, tmp_path):
    """The driver sees its own runs directory (a private mount, as on a machine where --runs-dir is
    a local directory), the nodes another one at the same path."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no unprivileged mount namespaces here (unshare -Urm) to hide the driver's runs directory")
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    (tmp_path / "sweep.yaml").write_text(SWEEP_YAML)
    private_mount = 'mount -t tmpfs none "$0" && exec "$@"'
    result = subprocess.run(["unshare", "-Urm", "sh", "-c", private_mount, str(runs_dir),
                             *sweep_command(tmp_path / "sweep.yaml", runs_dir, cluster.address)],
                            cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert f"--runs-dir {runs_dir}: the node at 127.0.0.1" in line and "cannot read" in line, line
    assert "every node mounts at the same path" in line
    assert list(runs_dir.iterdir()) == []  # nothing ran: the nodes' view of it is empty


def test_token_mode_without_a_token_is_one_line_before_any_connection(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}
    (tmp_path / "sweep.yaml").write_text(SWEEP_YAML)
    result = subprocess.run(sweep_command(tmp_path / "sweep.yaml", tmp_path / "runs", "127.0.0.1:1"), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    line = one_line_error(result)
    assert "Ray token authentication is on (RAY_AUTH_MODE=token) but RAY_AUTH_TOKEN_PATH is set but file cannot be opened" in line
    assert "copy the head's ~/.ray/auth_token to ~/.ray/auth_token on this machine, or set RAY_AUTH_TOKEN" in line

"""train.py and play.py end to end (through subprocesses), and their handling of bad input (most of it in this
process, through :func:`helpers.run_here`: the same error lines and exit codes without a Python that imports torch
each time)."""

import csv
import json
import os
import pickle
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import pytest
import torch

import acer_sync
from acer_sync.base.errors import UserError
from acer_sync.training.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from helpers import ROOT, one_line_error, read_progress, run_here, start_long_cartpole_run

SMALL_PONG = [
    "--env", "PongNoFrameskip-v4", "--num-envs", "4", "--buffer-size", "400", "--replay-start", "100",
    "--log-interval", "5", "--log-seconds", "0", "--checkpoint-every", "1000", "--device", "cpu", "--no-progress",
]


def run(script: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / script), *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="module")
def pong_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "pong"
    result = run("train.py", *SMALL_PONG, "--total-timesteps", "2000", "--run-dir", run_dir)
    assert result.returncode == 0, result.stderr
    assert "replay buffer:" in result.stdout
    return run_dir


def test_train_writes_config_progress_tensorboard_and_checkpoints(pong_run):
    config = json.loads((pong_run / "config.json").read_text())
    assert config["config"]["env"] == "PongNoFrameskip-v4" and config["config"]["num_envs"] == 4
    assert config["config"]["gamma"] == 0.99 and "torch" in config["versions"] and config["git_commit"]
    rows = read_progress(pong_run)
    assert rows and int(rows[-1]["total_timesteps"]) == 2000
    for column in ("total_timesteps", "fps", "episodes", "mean_episode_reward", "loss_policy", "loss_q",
                   "entropy", "explained_variance", "avg_norm_k", "avg_norm_adj", "off_rho_mean"):
        assert column in rows[0]
    assert any(float(row["off_policy_updates"]) > 0 for row in rows)  # replay started
    assert list((pong_run / "tb").glob("events.out.tfevents.*"))
    checkpoints = sorted(p.name for p in (pong_run / "checkpoints").iterdir())
    assert "latest.pt" in checkpoints and "step_0000001040.pt" in checkpoints
    payload = load_checkpoint(pong_run)
    assert payload["counters"]["timesteps"] == 2000 and payload["env_id"] == "PongNoFrameskip-v4"


def test_play_plays_the_checkpoint_and_writes_a_video_and_its_steps(pong_run, tmp_path):
    video, actions = tmp_path / "pong.mp4", tmp_path / "steps.csv"
    result = run("play.py", pong_run, "--episodes", "1", "--video", video, "--actions", actions)
    assert result.returncode == 0, result.stderr
    assert "episode 1: score" in result.stdout and "mean score over 1 episode:" in result.stdout
    capture = cv2.VideoCapture(str(video))
    frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    ok, frame = capture.read()
    capture.release()
    assert ok and frame.shape == (210, 160, 3) and frames > 100
    # One row per agent step, the video's frames after the reset's; Pong loses no lives, so
    # nothing is forced, and the rewards add up to the score printed.
    with open(actions, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(frames - 1))
    assert {row["game"] for row in rows} == {"1"} and [row["game_over"] for row in rows].count("1") == 1
    assert rows[-1]["game_over"] == "1" and all(row["forced"] == "0" for row in rows)
    assert {row["action_name"] for row in rows} <= {"NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"}
    score = float(result.stdout.split("episode 1: score ")[1].split()[0])
    assert sum(float(row["reward"]) for row in rows) == score


def test_play_logs_box_actions_and_rewards_exactly():
    """--actions keeps every digit that reads back as the same float (a MuJoCo reward is float64,
    a Box action float32), and writes whole numbers without a trailing .0."""
    import io

    import numpy as np

    from acer_sync.cli import play
    from acer_sync.rollout.evaluation import EnvStep

    handle = io.StringIO()
    log = play.StepLog(handle, [])
    log(None)
    box = np.array([[0.3, -1.0]], np.float32)
    log(EnvStep(box, np.zeros(1, bool), np.array([0.98765432]), np.zeros(1, np.int64), np.array([False])))
    log(EnvStep(box, np.zeros(1, bool), np.array([1234567.0]), np.zeros(1, np.int64), np.array([True])))
    assert handle.getvalue().splitlines() == [
        "game,step,action,action_name,forced,reward,lives,game_over",
        "1,0,0.3 -1,,0,0.98765432,0,0",
        "1,1,0.3 -1,,0,1234567,0,1",
    ]


def test_play_names_the_actions_of_a_discrete_space_with_a_start():
    # Discrete(3, start=-3): the env's action -2 is the second name; the names were indexed by the
    # env's action (a wrong name, or an IndexError traceback for a negative one)
    import io

    import numpy as np

    from acer_sync.cli import play
    from acer_sync.rollout.evaluation import EnvStep

    handle = io.StringIO()
    log = play.StepLog(handle, ["BAD", "GOOD", "WORSE"], action_start=-3)
    for action in (-2, -3, -1):
        log(EnvStep(np.array([action]), np.zeros(1, bool), np.array([0.0]), np.zeros(1, np.int64), np.array([False])))
    assert [line.split(",")[2:4] for line in handle.getvalue().splitlines()[1:]] == [["-2", "GOOD"], ["-3", "BAD"], ["-1", "WORSE"]]


def test_play_accepts_a_checkpoint_file_and_logs_the_steps_of_a_game_on_the_runs_backend(pong_run, tmp_path):
    actions = tmp_path / "steps.csv"
    result = run("play.py", pong_run / "checkpoints" / "latest.pt", "--episodes", "1", "--greedy", "--actions", actions)
    assert result.returncode == 0, result.stderr
    # on ale-py's backend, whose env play.py cannot reach for the action names (it refused, exit 2)
    with open(actions, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {row["action_name"] for row in rows} <= {"NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"}
    score = float(result.stdout.split("episode 1: score ")[1].split()[0])
    assert sum(float(row["reward"]) for row in rows) == score


def test_the_action_names_of_a_users_env_label_plays_steps():
    # play.py asked env 0 for them (refused on ale-py's backend); taken with the env's info, only
    # Atari's were kept for a while: a user's env with get_action_meanings() lost them.
    import gymnasium as gym
    from gymnasium.envs.classic_control import CartPoleEnv

    from atari.envs import env_info

    class Named(CartPoleEnv):
        def get_action_meanings(self):
            return ["PUSH_LEFT", "PUSH_RIGHT"]

    gym.register("NamedCartPoleForPlay-v0", entry_point=Named)
    try:
        assert env_info("NamedCartPoleForPlay-v0").action_names == ("PUSH_LEFT", "PUSH_RIGHT")
        assert env_info("CartPole-v1").action_names == ()
        assert env_info("PongNoFrameskip-v4").action_names == ("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE")
    finally:
        gym.registry.pop("NamedCartPoleForPlay-v0")


def test_play_plays_one_atari_game_on_the_runs_backend_as_its_evaluations():
    # One env played on the sync backend: gymnasium's 1 to 30 no-ops, not ale-py's 0 to 29 and
    # FIRE that the run's evaluations started from, so play.py's scores came from other starts.
    from acer_sync.cli.play import play_backend
    from atari.envs import env_info

    pong, cartpole = env_info("PongNoFrameskip-v4"), env_info("CartPole-v1")
    assert play_backend(pong, "", 1, render=False) == play_backend(pong, "", 4, render=False) == "ale"
    assert play_backend(pong, "subproc", 1, render=False) == "sync"  # the same games in this process
    assert play_backend(pong, "", 1, render=True) == "sync"  # drawn on screen by gymnasium's env
    assert play_backend(cartpole, "", 1, render=False) == "sync" and play_backend(cartpole, "", 2, render=False) == "subproc"


def test_play_plays_its_games_in_several_envs_at_once(pong_run, tmp_path):
    # in this process (run_here), but one error line as the script runs: 48 s of subprocesses before
    result = run_here("play.py", pong_run, "--episodes", "3", "--num-envs", "2", "--greedy", "--seed", "1000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["episode 1", "episode 2", "episode 3"]
    assert lines[-1].startswith("mean score over 3 episodes: ")
    assert one_line_error(run("play.py", pong_run, "--num-envs", "0")) == "play.py: error: --num-envs must be >= 1"
    for flag in (["--video", tmp_path / "games.mp4"], ["--actions", tmp_path / "steps.csv"], ["--render"]):
        line = one_line_error(run_here("play.py", pong_run, "--num-envs", "2", *flag))
        assert line == f"play.py: error: {flag[0]} records one env and cannot be combined with --num-envs 2"
    # exit 3 before, as an env's failure: "raised Error in reset: Seed must be greater or equal to zero"
    assert one_line_error(run_here("play.py", pong_run, "--seed", "-5")) == "play.py: error: --seed must be >= 0"
    # these failed only after the games were played (an IsADirectoryError traceback), or overflowed torch's generator
    (tmp_path / "folder.mp4").mkdir()
    (tmp_path / "folder.csv").mkdir()
    for flag, target in (("--video", "folder.mp4"), ("--actions", "folder.csv")):
        line = one_line_error(run_here("play.py", pong_run, flag, tmp_path / target))
        assert line == f"play.py: error: {flag} {tmp_path / target} is a directory (or another kind of file); give the name of a file to write"
    assert "--seed must be <= 4294967295" in one_line_error(run_here("play.py", pong_run, "--seed", str(2**64)))
    for script, arguments in (("play.py", [""]), ("plot.py", [""]), ("sweep.py", ["", "--runs-dir", tmp_path])):
        assert "an empty path names no file" in one_line_error(run_here(script, *arguments))  # it read the current directory
    long = "x" * 300  # OSError: [Errno 36] File name too long, a traceback from each
    for script, arguments in (("train.py", ["--env", "CartPole-v1", "--run-dir", long]), ("train.py", ["--resume", long]),
                              ("play.py", [long]), ("plot.py", [long])):
        assert "a file name is longer than the file system takes: xxx" in one_line_error(run_here(script, *arguments))


def test_resume_continues_the_run(pong_run, tmp_path):
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(pong_run, resumed)
    before = load_checkpoint(resumed)
    result = run("train.py", "--resume", resumed, "--total-timesteps", "2800", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "starts empty on resume" in result.stdout
    steps = [int(row["total_timesteps"]) for row in read_progress(resumed)]
    assert steps == sorted(set(steps)) and steps[-1] == 2800
    assert all(b - a == 400 for a, b in zip(steps, steps[1:]))  # every 5 iterations of 4x20 steps
    after = load_checkpoint(resumed)
    assert after["counters"]["timesteps"] == 2800
    assert after["counters"]["iterations"] == before["counters"]["iterations"] + 10
    assert after["config"]["total_timesteps"] == 2800


def test_resume_refuses_conflicting_flags(pong_run):
    result = run("train.py", "--resume", pong_run, "--nsteps", "5", "--env", "BreakoutNoFrameskip-v4")
    assert result.returncode == 2
    assert "--nsteps 5 (the run used 20)" in result.stderr and "--env BreakoutNoFrameskip-v4" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "Pongg-v4"], "unknown env id"),
        (["--normalize-obs"], "--normalize-obs is for vector observations"),
        (["--sdn-samples", "0"], "--sdn-samples must be >= 1"),
        (["--nsteps", "0"], "--nsteps must be >= 1"),
        (["--num-envs", "0"], "--num-envs must be >= 1"),
        (["--lr", "-1"], "--lr must be"),
        (["--lr", "nan"], "invalid finite number value"),
        (["--gamma", "1.5"], "--gamma must be in (0, 1]"),
        (["--replay-ratio", "-1"], "--replay-ratio must be"),
        (["--replay-ratio", "1e6"], "--replay-ratio must be from 0 to 100"),  # accepted; a Ctrl-C then waited hours
        (["--delta", "0"], "--delta must be"),
        (["--buffer-size", "10"], "--buffer-size (10) must hold at least one segment"),
        # the buffer holds whole segments: 110 steps hold 100, and replay never started
        (["--buffer-size", "110", "--replay-start", "110"], "exceeds what --buffer-size (110) holds in whole segments of --nsteps (100)"),
        (["--buffer-size", "100000000"], "lower --buffer-size"),
        (["--num-envs", "many"], "invalid int value"),
        (["--num-env", "4"], "unrecognized arguments: --num-env 4"),  # argparse took it for --num-envs
        (["--total", "1000"], "unrecognized arguments: --total 1000"),  # it ran 1,000 steps as --total-timesteps
    ],
)
def test_bad_train_flags_get_one_line_errors(args, message, tmp_path):
    args = args if "--env" in args else ["--env", "PongNoFrameskip-v4", *args]
    line = one_line_error(run_here("train.py", *args, "--run-dir", tmp_path / "run"))
    assert message in line
    assert not (tmp_path / "run").exists()  # nothing written, not even config.json


@pytest.mark.parametrize("env, settings, message", [
    # sizes past what torch, setitimer or memory can take: tracebacks before
    ("CartPole-v1", dict(env_timeout=1e10), "--env-timeout must be <= 1e+09 seconds (0: no limit)"),
    ("CartPole-v1", dict(network="lstm", lstm_size=10**30), "--lstm-size must be <= 2147483647"),
    ("CartPole-v1", dict(hidden="64," + "9" * 20), "--hidden's layer sizes must be <= 2147483647"),
    ("Pendulum-v1", dict(sdn_samples=10**9), "--sdn-samples must be <= 1000"),
    # dropped in silence before
    ("CartPole-v1", dict(torso_kwargs={"a": 1}), "--torso-kwargs are for a --torso class, and none is given"),
])
def test_settings_out_of_every_range_are_user_errors_that_write_nothing(tmp_path, env, settings, message):
    with pytest.raises(acer_sync.UserError, match=re.escape(message)):
        acer_sync.train(env, run_dir=tmp_path / "run", **settings)
    assert not (tmp_path / "run").exists()


UNSUPPORTED_ACTIONS = """
import sys
sys.path.insert(0, {root!r})
import gymnasium as gym, numpy as np
from acer_sync.base.errors import run_cli
from acer_sync.cli import train

class MultiDiscreteEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

gym.register("MultiDiscreteTest-v0", entry_point=MultiDiscreteEnv)
run_cli(lambda: train.main(sys.argv[1:]), "train.py")
"""


def test_unsupported_action_space_gets_a_one_line_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", UNSUPPORTED_ACTIONS.format(root=str(ROOT)), "--env", "MultiDiscreteTest-v0",
         "--run-dir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert "MultiDiscrete action space; acer_sync supports Discrete and Box actions only" in one_line_error(result)


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_line_error(run_here("train.py", "--env", "CartPole-v1", "--run-dir", blocker / "run"))
    assert "cannot write to run directory" in line
    line = one_line_error(run_here("train.py", "--env", "CartPole-v1", "--run-dir", blocker))
    assert "not a directory" in line


def test_missing_checkpoints(tmp_path):
    assert "does not exist" in one_line_error(run_here("play.py", tmp_path / "nothing.pt"))
    line = one_line_error(run_here("play.py", tmp_path / "nothing.pt", "--actions", tmp_path / "no" / "steps.csv"))
    assert "cannot write" in line and "does not exist" in line
    assert "no such run directory" in one_line_error(run_here("train.py", "--resume", tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    assert "holds no checkpoint" in one_line_error(run_here("play.py", tmp_path / "empty"))
    # the docs wrote step_<N>.pt, and a step copy's N has 10 digits (play.py says so through resolve_checkpoint)
    (tmp_path / "step_0000016000.pt").write_bytes(b"")
    with pytest.raises(UserError) as error:
        resolve_checkpoint(tmp_path / "step_16000.pt")
    assert str(error.value).endswith(f"does not exist; did you mean {tmp_path / 'step_0000016000.pt'}?")


@pytest.mark.parametrize("flag, name, limit, said", [
    ("--video", "pong.mp4", 30_000, "only "),  # "only N of its M frames reached the file"
    ("--actions", "steps.csv", 20_000, "File too large"),  # a game of Pong logs some 800 rows, 40 kB and more
])
def test_play_on_a_full_disk_leaves_no_half_written_file_and_exits_5(pong_run, tmp_path, flag, name, limit, said):
    def full_after_limit() -> None:  # writes past the limit fail (EFBIG), as on a full disk (ENOSPC)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    target = tmp_path / name
    result = subprocess.run([sys.executable, str(ROOT / "play.py"), str(pong_run), "--episodes", "1", flag, str(target)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=full_after_limit)
    assert result.returncode == 5, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"play.py: error: cannot write {target}: {said}"), result.stderr
    assert list(tmp_path.iterdir()) == []  # neither a broken file nor its temporary one


def test_checkpoint_for_another_architecture_is_refused(pong_run, tmp_path):
    payload = load_checkpoint(pong_run)
    payload["model_spec"]["n_actions"] = 4
    payload["model"]["head.pi.weight"] = payload["model"]["head.pi.weight"][:4]
    payload["model"]["head.pi.bias"] = payload["model"]["head.pi.bias"][:4]
    payload["model"]["head.q.weight"] = payload["model"]["head.q.weight"][:4]
    payload["model"]["head.q.bias"] = payload["model"]["head.q.bias"][:4]
    save_checkpoint(tmp_path / "other.pt", payload)
    assert "does not fit its env PongNoFrameskip-v4: n_actions 4 (the env gives 6)" in one_line_error(run_here("play.py", tmp_path / "other.pt"))


@pytest.mark.parametrize("flag, name, message", [
    ("--actions", "checkpoints/latest.pt", "--actions writes a CSV of its own"),
    ("--actions", "progress.csv", "--actions writes a CSV of its own"),
    ("--actions", "PROGRESS.CSV", "--actions writes a CSV of its own"),  # the same file where names ignore case
    ("--video", "steps.csv", "--video writes an mp4"),
])
def test_play_writes_no_file_but_its_own_kind_over_a_runs_files(pong_run, flag, name, message):
    # os.replace put the steps over the run's checkpoint, or its progress.csv, or the video.
    target = pong_run / name
    before = target.read_bytes() if target.exists() else None
    assert message in one_line_error(run_here("play.py", pong_run, "--episodes", "1", flag, target))
    assert (target.read_bytes() if target.exists() else None) == before


def test_render_without_display_says_so(pong_run):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "play.py"), str(pong_run), "--render"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=120,
    )
    assert "needs a display" in one_line_error(result)


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/acer_sync_pickle_payload_ran")


def test_a_pickle_with_a_code_payload_is_refused_and_never_runs(tmp_path):
    MARKER.unlink(missing_ok=True)
    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "model": Payload()}, evil)
    with pytest.raises(UserError, match=r"not a plain-data checkpoint \(it holds a posix\.system, which only running code could build\)$"):
        load_checkpoint(evil)
    with open(evil, "wb") as handle:
        pickle.dump(Payload(), handle)
    with pytest.raises(UserError):
        load_checkpoint(evil)
    assert not MARKER.exists()


def test_truncated_checkpoint_gets_a_clear_message(pong_run, tmp_path):
    data = (pong_run / "checkpoints" / "latest.pt").read_bytes()
    broken = tmp_path / "broken.pt"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupt or truncated"):
        load_checkpoint(broken)
    assert "corrupt or truncated" in one_line_error(run_here("play.py", broken))


def test_resume_restores_models_optimizer_counters_and_rngs(pong_run):
    from acer_sync.base.config import Config
    from acer_sync.training.checkpoint import trainer_payload
    from acer_sync.training.setup import build_trainer
    from atari.envs import env_info

    payload = load_checkpoint(pong_run)
    config = Config(**payload["config"])
    trainer = build_trainer(config, env_info(config.env), pong_run, resume=payload, progress_bar=False)
    try:
        for name, tensor in payload["model"].items():
            assert torch.equal(trainer.model.state_dict()[name], tensor)
        for name, tensor in payload["average_model"].items():
            assert torch.equal(trainer.agent.average_model.state_dict()[name], tensor)
        assert not all(torch.equal(payload["model"][n], payload["average_model"][n]) for n in payload["model"])
        restored = trainer.agent.optimizer.state_dict()
        for index, state in payload["optimizer"]["state"].items():
            assert torch.equal(restored["state"][index]["square_avg"], state["square_avg"])
        assert trainer.timesteps == payload["counters"]["timesteps"]
        assert trainer.tracker.episodes == payload["counters"]["episodes"]
        assert torch.equal(torch.get_rng_state(), payload["rng"]["torch"])
        again = trainer_payload(trainer)
        assert again["rng"]["sampler"] == payload["rng"]["sampler"]
        assert torch.equal(again["rng"]["numpy"][1], payload["rng"]["numpy"][1])
    finally:
        trainer.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, signum):
    run_dir = tmp_path / "run"
    process = start_long_cartpole_run(run_dir, num_envs=2)
    try:
        sent = time.time()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert time.time() - sent < 15
    assert f"{signal.Signals(signum).name} received" in stdout and "Traceback" not in stderr
    payload = load_checkpoint(run_dir)
    assert payload["counters"]["timesteps"] > 0
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) <= payload["counters"]["timesteps"]


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    result = run("train.py", "--env", "CartPole-v1", "--vec-env", "sync", "--num-envs", "2", "--total-timesteps", "200",
                 "--eval-every", "0", "--no-progress", "--run-dir", run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir


def test_play_says_each_score_as_its_game_ends_and_their_mean_when_interrupted(cartpole_run):
    # It said nothing until every game was played, and Ctrl-C lost the games played.
    process = subprocess.Popen([sys.executable, str(ROOT / "play.py"), str(cartpole_run), "--episodes", "1000000"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, process.kill)  # a play.py that says nothing before its end would never let readline return
    watchdog.start()
    first = process.stdout.readline()
    watchdog.cancel()
    assert first.startswith("episode 1: score ")
    process.send_signal(signal.SIGINT)
    rest, err = process.stdout.read(), process.stderr.read()  # not communicate(): it reads past what readline buffered
    process.wait(timeout=60)
    lines = [first, *rest.splitlines()]
    assert process.returncode == 130 and err == "play.py: interrupted\n"
    assert all(line.startswith(f"episode {index}: score ") for index, line in enumerate(lines[:-1], 1))
    mean = re.fullmatch(r"mean score over (\d+) episodes?: \S+ \(std \S+\) \(interrupted; 1000000 asked for\)", lines[-1])
    assert mean and int(mean[1]) == len(lines) - 1


@pytest.mark.parametrize("script", ["train.py", "play.py"])
def test_a_reader_that_goes_away_ends_nothing_and_prints_no_traceback(cartpole_run, tmp_path, script):
    # `train.py ... | head -1`: a "--- Logging error --- BrokenPipeError" for each line, then a traceback and exit 1.
    args = ["--env", "CartPole-v1", "--vec-env", "sync", "--num-envs", "2", "--total-timesteps", "2000", "--eval-every", "0",
            "--no-progress", "--run-dir", str(tmp_path / "run")] if script == "train.py" else [str(cartpole_run), "--episodes", "50"]
    process = subprocess.Popen([sys.executable, str(ROOT / script), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    process.wait(timeout=120)
    assert err == ""
    if script == "train.py":  # the run finished, and says so in its code
        assert process.returncode == 0 and load_checkpoint(tmp_path / "run")["counters"]["timesteps"] == 2000
    else:
        assert process.returncode == 141  # as a pipe's other tools end (yes | head -1)

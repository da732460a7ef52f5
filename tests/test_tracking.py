"""``--track`` (Weights & Biases, offline here), ``--capture-video``, and play.py's recording of envs
drawn by pygame without a display."""

import dataclasses
import os
import subprocess
import sys
import types

import cv2
import pytest

from acer_sync.base.config import Config, build_config
from acer_sync.base.outcome import Stop
from acer_sync.cli.args import FLAG_GROUPS
from acer_sync.sweeps.spec import load_sweep
from acer_sync.training.checkpoint import load_checkpoint
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from helpers import ROOT, one_line_error, read_progress, stop_in_the_iteration_ending_at

CARTPOLE = ["--env", "CartPole-v1", "--eval-every", "800", "--eval-episodes", "2", "--no-progress"]
#: An interpreter in which some packages cannot be imported, as where they are not installed.
WITHOUT = """
import sys
sys.path.insert(0, {root!r})
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ImportError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Missing())
from acer_sync.__main__ import run_command
run_command({command!r}, sys.argv[1:], {command!r} + ".py")
"""


def run(args: list, cwd=ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def without(missing: list[str], command: str, *args) -> list:
    return ["-c", WITHOUT.format(root=str(ROOT), missing=missing, command=command), *args]


def mp4_frames(path) -> int:
    capture = cv2.VideoCapture(str(path))
    frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    capture.release()
    return frames


def test_track_writes_an_offline_wandb_run_with_rows_config_and_videos_and_resumes_into_it(tmp_path):
    run_dir = tmp_path / "run"
    offline = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    result = run([ROOT / "train.py", *CARTPOLE, "--total-timesteps", "1600", "--capture-video", "--track",
                  "--wandb-project", "acer-tests", "--run-dir", run_dir], env=offline)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # nothing from W&B, SDL or ALSA
    assert "W&B run " in result.stdout and "wandb sync" in result.stdout
    first = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(first) == 1
    records = next(first[0].glob("run-*.wandb")).read_bytes()
    for name in (b"mean_episode_reward", b"loss_q", b"eval_mean", b"eval_video", b"acer-tests", b"replay_ratio"):
        assert name in records  # the rows, the video's key, the project and the config
    videos = sorted((run_dir / "videos").glob("step_*.mp4"))
    assert [path.name for path in videos] == ["step_0000000800.mp4", "step_0000001600.mp4"]
    assert all(mp4_frames(path) > 5 for path in videos)
    assert len(list((first[0] / "files" / "media" / "videos").glob("*.mp4"))) == 2
    # a resume logs on into the same W&B run
    resumed = run([ROOT / "train.py", "--resume", run_dir, "--total-timesteps", "2400", "--no-progress"], env=offline)
    assert resumed.returncode == 0, resumed.stderr
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and runs[0].name.split("-")[-1] == runs[1].name.split("-")[-1]


def test_without_a_wandb_login_the_run_warns_in_one_line_and_trains_on(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc: no API key
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *CARTPOLE, "--total-timesteps", "800", "--track",
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 1 and "--track: W&B did not start (UsageError: " in warnings[0]
    assert "training goes on without it" in warnings[0]
    assert int(read_progress(tmp_path / "run")[-1]["total_timesteps"]) == 800


def test_videos_leave_the_evaluation_scores_as_they_were(tmp_path):
    import acer_sync

    plain, filmed = tmp_path / "plain", tmp_path / "filmed"
    for run_dir, capture in ((plain, False), (filmed, True)):
        acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=1600, eval_every=800, eval_episodes=2,
                        capture_video=capture, verbose=0)
    columns = ("total_timesteps", "eval_mean", "eval_std", "mean_episode_reward", "loss_q")
    assert [[row[c] for c in columns] for row in read_progress(plain)] == [[row[c] for c in columns] for row in read_progress(filmed)]
    assert not (plain / "videos").exists() and len(list((filmed / "videos").iterdir())) == 2


@pytest.mark.parametrize(
    "args, missing, message",
    [
        (["--track"], ["wandb"], "--track logs to Weights & Biases, which is not installed: pip install wandb"),
        (["--capture-video", "--eval-every", "0"], [], "--capture-video records a game at each evaluation: give --eval-every > 0"),
        (["--capture-video"], ["pygame"], "rendering CartPole-v1 needs a missing package"),
    ],
)
def test_tracking_and_video_mistakes_are_one_line_errors_before_anything_is_written(args, missing, message, tmp_path):
    result = run(without(missing, "train", "--env", "CartPole-v1", *args, "--run-dir", tmp_path / "run"))
    assert message in one_line_error(result)
    assert not (tmp_path / "run").exists()


def test_play_records_a_pygame_env_without_a_display_quietly_and_leaves_nothing_when_it_cannot(tmp_path):
    run_dir = tmp_path / "run"
    trained = run([ROOT / "train.py", "--env", "CartPole-v1", "--total-timesteps", "400", "--no-progress", "--run-dir", run_dir])
    assert trained.returncode == 0, trained.stderr
    video, actions = tmp_path / "cartpole.mp4", tmp_path / "steps.csv"
    env = {name: "" for name in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR")}
    played = run([ROOT / "play.py", run_dir, "--episodes", "1", "--video", video, "--actions", actions], env=env)
    assert played.returncode == 0 and played.stderr == ""  # no "XDG_RUNTIME_DIR is invalid", no ALSA lines
    assert mp4_frames(video) == len(actions.read_text().splitlines())  # the reset's frame, then one a step
    video.unlink()
    actions.unlink()
    failed = run(without(["pygame"], "play", run_dir, "--video", video, "--actions", actions))
    assert "rendering CartPole-v1 needs a missing package" in one_line_error(failed)
    assert list(tmp_path.iterdir()) == [run_dir]  # no video, and no --actions file of only its header


def test_sweeps_pass_track_to_their_trials(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: s\nenvs: [CartPole-v1]\nseeds: [0, 1]\nsettings: {track: true, wandb_project: p}\n")
    trials = load_sweep(path).trials
    assert [(trial.config.track, trial.config.wandb_project) for trial in trials] == [(True, "p"), (True, "p")]
    assert build_config(False, {}).track is False and Config().wandb_project == "acer_sync"
    assert {"track", "wandb_project", "wandb_entity", "capture_video"} <= set(FLAG_GROUPS["run and logging"])


class FakeRun:
    """A W&B run as its online runs answer: the steps logged to it (a step it has passed is
    ignored, as W&B does: the rows' keys in ``rows``), and ``step``, the next log()'s."""

    url, dir, settings = "https://wandb.ai/fake", "/nonexistent/files", types.SimpleNamespace(mode="online")

    def __init__(self, run_id: str, logged: list[int], rows: list[dict]):
        self.id, self.logged, self.rows = run_id, logged, rows

    @property
    def step(self) -> int:
        return self.logged[-1] + 1 if self.logged else 0

    def log(self, row: dict, step: int) -> None:
        if step >= self.step:
            self.logged.append(step)
            self.rows.append(row)

    def finish(self, exit_code: int) -> None:
        pass


class FakeOfflineRun(FakeRun):
    """A W&B run as its offline runs answer: ``step`` counts this session's rows only (an offline
    run opened again starts at 0), and every row is kept (``wandb sync`` uploads them in order, and
    W&B then ignores those at steps it has passed)."""

    settings = types.SimpleNamespace(mode="offline")

    def __init__(self, run_id: str, logged: list[int], rows: list[dict]):
        super().__init__(run_id, logged, rows)
        self.session: list[int] = []

    @property
    def step(self) -> int:
        return self.session[-1] + 1 if self.session else 0

    def log(self, row: dict, step: int) -> None:
        self.session.append(step)
        self.logged.append(step)
        self.rows.append(row)


class FakeWandb:
    """``wandb.init``: each run's id, and what each run logged."""

    def __init__(self, offline: bool = False):
        self.logged: dict[str, list[int]] = {}
        self.rows: dict[str, list[dict]] = {}
        self.ids: list[str | None] = []
        self.run_class = FakeOfflineRun if offline else FakeRun

    def init(self, id=None, **settings):
        self.ids.append(id)
        run_id = id or f"run{len(self.ids)}"
        return self.run_class(run_id, self.logged.setdefault(run_id, []), self.rows.setdefault(run_id, []))


def test_tracking_logs_the_final_row_keeps_its_run_through_an_untracked_session_and_says_what_w_and_b_drops(
        tmp_path, monkeypatch, caplog):
    import wandb

    fake = FakeWandb()
    monkeypatch.setattr(wandb, "init", fake.init)
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=400, eval_every=0, log_interval=4, threads=1, track=True))
    info = env_info("CartPole-v1")
    trainer = build_trainer(config, info, tmp_path, progress_bar=False)
    stop_in_the_iteration_ending_at(trainer, 70)
    assert trainer.train().stop is Stop.INTERRUPTED
    assert [int(row["total_timesteps"]) for row in read_progress(tmp_path)] == [40, 70]
    assert fake.logged == {"run1": [40, 70]}  # the row written at the stop too
    # a session with --track off (a resume may change it) keeps the W&B run's id for a later one
    untracked = dataclasses.replace(config, track=False, total_timesteps=100)
    assert build_trainer(untracked, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    assert load_checkpoint(tmp_path)["callbacks"]["WandbCallback"] == {"run_id": "run1"}
    tracked = dataclasses.replace(config, total_timesteps=200)
    assert build_trainer(tracked, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    assert fake.ids == [None, "run1"] and fake.logged["run1"][-1] == 200
    # a resume from a checkpoint behind what W&B holds (the session after it was killed) says that
    # W&B drops the rows to the step it reached
    payload = load_checkpoint(tmp_path)
    fake.logged["run1"].append(240)
    with caplog.at_level("WARNING"):
        assert build_trainer(dataclasses.replace(config, total_timesteps=280), info, tmp_path, resume=payload).train().finished
    assert "W&B run run1 holds rows to step 240, past the checkpoint's 200" in caplog.text
    assert caplog.text.count("W&B ignores rows") == 1


@pytest.mark.parametrize("offline", [False, True])
def test_an_evaluation_owed_at_the_total_that_w_and_b_cannot_take_is_said_in_one_warning(tmp_path, monkeypatch, caplog,
                                                                                         offline):
    # The stop's row at the total reached W&B; the resume's evaluation at that step cannot. Offline,
    # the W&B run opened again answered step 0, and the row was logged a second time without a word.
    import wandb

    fake = FakeWandb(offline)
    monkeypatch.setattr(wandb, "init", fake.init)
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=200, eval_every=100, eval_episodes=2, log_interval=4, threads=1,
                                      track=True))
    info = env_info("CartPole-v1")
    trainer = build_trainer(config, info, tmp_path, progress_bar=False)
    stop_in_the_iteration_ending_at(trainer, 200)
    assert trainer.train().stop is Stop.INTERRUPTED
    assert fake.logged["run1"][-1] == 200 and "eval_mean" not in fake.rows["run1"][-1]
    with caplog.at_level("WARNING"):
        assert build_trainer(config, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    last = read_progress(tmp_path)[-1]
    assert int(last["total_timesteps"]) == 200 and int(last["eval_episodes"]) == 2
    assert "W&B run run1 has a row at step 200 already and keeps it" in caplog.text


def test_a_video_that_cannot_be_opened_stops_the_run_as_a_failed_write(tmp_path):
    # Not an exit 2 that skipped the run's end: one line naming the file, exit 5, the last checkpoint kept.
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=200, eval_every=100, eval_episodes=1, checkpoint_every=50,
                                      log_interval=1, threads=1, capture_video=True))
    # where opencv would write the step-100 video, a folder: it cannot open an mp4 there
    (tmp_path / "videos" / f".step_0000000100.mp4.{os.getpid()}.tmp.mp4").mkdir(parents=True)
    outcome = build_trainer(config, env_info("CartPole-v1"), tmp_path, progress_bar=False).train()
    assert outcome.stop is Stop.WRITE_FAILED and outcome.timesteps == 100
    assert "step_0000000100.mp4: opencv cannot open an mp4 there" in outcome.error
    assert outcome.error.endswith("checkpoints/latest.pt holds step 50")


def test_plot_and_sweep_without_their_extras_are_one_line_errors(tmp_path):
    # after pip install . without [plot] or [sweep]: tracebacks ("No module named 'matplotlib'", 'ray')
    run_dir = tmp_path / "run"
    trained = run([ROOT / "train.py", "--env", "CartPole-v1", "--total-timesteps", "400", "--no-progress", "--run-dir", run_dir])
    assert trained.returncode == 0, trained.stderr
    plotted = run(without(["matplotlib"], "plot", run_dir, "--out", tmp_path / "out.png"))
    assert 'matplotlib, which is not installed: pip install matplotlib (or the plot extra: pip install ".[plot]")' in one_line_error(plotted)
    swept = run(without(["ray"], "sweep", ROOT / "configs" / "cartpole-rr.yaml", "--runs-dir", tmp_path / "sweeps"))
    assert 'Ray Tune, which is not installed' in one_line_error(swept) and not (tmp_path / "sweeps").exists()


def tracked_cartpole(monkeypatch, offline: bool, total_timesteps: int):
    """A fake W&B (:class:`FakeWandb`) in ``wandb.init``, and a tracked CartPole config checkpointing every 100 steps."""
    import wandb

    fake = FakeWandb(offline)
    monkeypatch.setattr(wandb, "init", fake.init)
    config = build_config(False, dict(env="CartPole-v1", vec_env="sync", device="cpu", num_envs=2, nsteps=5,
                                      total_timesteps=total_timesteps, eval_every=0, log_interval=4, threads=1, track=True,
                                      checkpoint_every=100))
    return fake, config, env_info("CartPole-v1")


def test_an_offline_w_and_b_run_resumed_behind_its_rows_says_so_as_an_online_one(tmp_path, monkeypatch, caplog):
    # A rollback to a step copy (or a session killed after its checkpoint): the offline W&B run held
    # rows past the checkpoint, but answered step 0 when opened again, and the resume said nothing
    # of the rows that W&B will keep over this session's.
    import shutil

    fake, config, info = tracked_cartpole(monkeypatch, offline=True, total_timesteps=200)
    assert build_trainer(config, info, tmp_path, progress_bar=False).train().finished
    assert fake.logged["run1"][-1] == 200
    checkpoints = tmp_path / "checkpoints"
    shutil.copyfile(checkpoints / "step_0000000100.pt", checkpoints / "latest.pt")
    with caplog.at_level("WARNING"):
        assert build_trainer(config, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    assert "W&B run run1 holds rows to step 200, past the checkpoint's 100" in caplog.text
    assert caplog.text.count("W&B ignores rows") == 1


@pytest.mark.parametrize("offline", [False, True])
def test_rows_of_an_untracked_session_are_not_taken_for_w_and_bs(tmp_path, monkeypatch, caplog, offline):
    # Tracked to 100, untracked to 200, back to the step copy at 100 and tracked again: W&B holds rows
    # to 100 only, and a first fix (progress.csv's rows past the checkpoint) said it held them to 200.
    import shutil

    fake, config, info = tracked_cartpole(monkeypatch, offline, total_timesteps=100)
    assert build_trainer(config, info, tmp_path, progress_bar=False).train().finished
    untracked = dataclasses.replace(config, track=False, total_timesteps=200)
    assert build_trainer(untracked, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    checkpoints = tmp_path / "checkpoints"
    shutil.copyfile(checkpoints / "step_0000000100.pt", checkpoints / "latest.pt")
    with caplog.at_level("WARNING"):
        tracked = dataclasses.replace(config, total_timesteps=200)
        assert build_trainer(tracked, info, tmp_path, resume=load_checkpoint(tmp_path)).train().finished
    assert "W&B" not in caplog.text
    assert fake.logged["run1"][-1] == 200 and fake.logged["run1"].count(200) == 1

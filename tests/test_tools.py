"""tools/: reading Baselines' benchmark curves off its SVG plots, the share of forced steps in a saved buffer,
and the frames of a played game around a lost life."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from acer_sync.base.config import build_config
from acer_sync.training.setup import build_trainer
from atari.envs import env_info
from tools import baselines_curve, forced_steps, life_loss_frames, mutants
from helpers import ROOT

CURVE_STEPS = np.linspace(0, 10_000_000, 100)  # as the benchmark page draws each algorithm


def pong_like(steps: np.ndarray) -> np.ndarray:
    return -20 + 40 * (steps / 1e7) ** 2


def breakout_like(steps: np.ndarray) -> np.ndarray:
    return 450 * np.sin(steps / 1e7 * np.pi / 2)


def svg_plot(title: str, curves: dict[str, np.ndarray], grid: bool) -> str:
    """One matplotlib SVG plot as the page has them: a shaded band and a line per colour, text as <text>."""
    with plt.rc_context({"svg.fonttype": "none"}):
        figure, panel = plt.subplots(figsize=(8, 2))
        for color, returns in curves.items():
            panel.fill_between(CURVE_STEPS, returns - 5, returns + 5, color=color, alpha=0.3)
            panel.plot(CURVE_STEPS, returns, color=color)
        panel.set_title(title)
        panel.grid(grid)
        text = io.StringIO()
        figure.savefig(text, format="svg")
        plt.close(figure)
    return text.getvalue()


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """A page of two plots like benchmarks_atari10M.htm's, one with grid lines (as the page's) and one without."""
    acer, a2c = baselines_curve.ALGORITHM_COLORS["acer"], baselines_curve.ALGORITHM_COLORS["a2c"]
    pong = svg_plot("Pong", {acer: pong_like(CURVE_STEPS), a2c: -pong_like(CURVE_STEPS)}, grid=True)
    breakout = svg_plot("Breakout", {a2c: breakout_like(CURVE_STEPS) / 2, acer: breakout_like(CURVE_STEPS)}, grid=False)
    return f"<html><body><h3>Learning Curves</h3>\n{pong}\n{breakout}\n</body></html>"


@pytest.mark.parametrize("game, algo, truth", [
    ("Pong", "acer", pong_like), ("Pong", "a2c", lambda steps: -pong_like(steps)),
    ("Breakout", "acer", breakout_like), ("Breakout", "a2c", lambda steps: breakout_like(steps) / 2),
])
def test_a_line_is_read_through_the_axis_ticks_and_interpolated(page, game, algo, truth):
    steps = baselines_curve.DEFAULT_STEPS
    read = baselines_curve.read_curve(page, game, baselines_curve.ALGORITHM_COLORS[algo], steps)
    # The drawn line joins the 100 points with straight segments: so does the reading.
    expected = np.interp(steps, CURVE_STEPS, truth(CURVE_STEPS))
    span = np.ptp(truth(CURVE_STEPS))
    np.testing.assert_allclose(read, expected, atol=1e-4 * span)


def test_the_script_prints_the_json_of_atari_scores(tmp_path, page):
    path = tmp_path / "page.htm"
    path.write_text(page)
    result = subprocess.run([sys.executable, "tools/baselines_curve.py", str(path), "Breakout", "--steps", "1000000", "5000000"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    curve = json.loads(result.stdout)
    assert curve["steps"] == [1_000_000, 5_000_000]
    assert curve["returns"] == [round(float(breakout_like(np.array(step))), 1) for step in (1_000_000, 5_000_000)]


@pytest.mark.parametrize("game, message", [
    ("Seaquest", "has no plot titled 'Seaquest'; it has Breakout, Pong"),
    (None, "No such file or directory"),
])
def test_a_missing_plot_or_page_is_one_line(tmp_path, page, game, message):
    path = tmp_path / "page.htm"
    if game is not None:
        path.write_text(page)
    result = subprocess.run([sys.executable, "tools/baselines_curve.py", str(path), game or "Pong"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("baselines_curve.py: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def write_buffer(path: Path, mu: np.ndarray, nsegments: int, segments_stored: int, steps_written: int) -> Path:
    """A buffer.npz with the arrays --save-buffer writes (frames and the rest tiny: they are not read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    steps, num_envs = mu.shape[:2]
    np.savez(path, frames=np.zeros((steps + 4, num_envs, 2, 2), np.uint8), firsts=np.zeros((steps + 4, num_envs), bool),
             actions=mu.argmax(-1).astype(np.uint8), mu=mu, rewards=np.zeros((steps, num_envs), np.float32),
             dones=np.zeros((steps, num_envs), bool), timeout_values=np.zeros((steps, num_envs), np.float32),
             segment_start=np.zeros(nsegments, np.int64), counters=np.array([steps_written, segments_stored], np.int64))
    return path


def test_forced_steps_counts_one_hot_mu_of_the_stored_segments_only(tmp_path, capsys):
    """3 segments of 4 steps, 2 envs, 4 actions; 2 segments stored (16 steps). Their one-hot μ:
    NOOP twice, FIRE once, action 2 once, action 3 once; a μ of 1 − 1e-7 is not one-hot, and the
    one-hot rows of the unstored third segment do not count."""
    mu = np.full((12, 2, 4), 0.25, dtype=np.float32)
    one_hot = np.eye(4, dtype=np.float32)
    mu[0, 0], mu[1, 0], mu[2, 0], mu[5, 1], mu[6, 1] = one_hot[[0, 1, 2, 0, 3]]
    mu[7, 1] = [1 - 1e-7, 1e-7, 0, 0]
    mu[3, 1] = 0  # no action with probability 1
    mu[8:] = one_hot[0]  # the third segment: never stored
    write_buffer(tmp_path / "run" / "checkpoints" / "buffer.npz", mu, nsegments=3, segments_stored=2, steps_written=8)
    np.testing.assert_array_equal(forced_steps.forced_counts(mu[:8]), [2, 1, 1, 1])
    assert forced_steps.main([str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("buffer.npz: 16 stored steps (2 envs x 8, the newest of 8 per env)")
    assert lines[1:] == [
        "one-hot mu (forced after a lost life): 31.25% (5 steps)",
        "  NOOP (action 0): 12.50% (2)", "  FIRE (action 1): 6.25% (1)", "  action 2: 6.25% (1)",
        "  actions above 2: 6.25% (1)",
    ]


@pytest.mark.parametrize("content, message", [
    (None, "does not exist (the run needs --save-buffer)"),
    (b"not a zip", "buffer.npz: "),
    ({"mu": np.zeros((4, 1, 3), np.float32)}, "has no segment_start array"),
])
def test_forced_steps_bad_input_is_one_line(tmp_path, content, message):
    buffer_file = tmp_path / "run" / "checkpoints" / "buffer.npz"
    buffer_file.parent.mkdir(parents=True)
    if isinstance(content, bytes):
        buffer_file.write_bytes(content)
    elif content is not None:
        np.savez(buffer_file, **content)
    result = subprocess.run([sys.executable, "tools/forced_steps.py", str(tmp_path / "run")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("forced_steps.py: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("env, forced", [("BreakoutNoFrameskip-v4", True), ("PongNoFrameskip-v4", False)])
def test_a_short_atari_run_stores_forced_steps_only_where_lives_are_lost(tmp_path, env, forced):
    """400 steps of 2 envs with --save-buffer: Breakout (5 lives, FIRE) stores NOOP, FIRE, action 2
    after each lost life, equally often; Pong (a FIRE game without lives) never loses one."""
    config = build_config(True, dict(env=env, vec_env="sync", num_envs=2, total_timesteps=400, buffer_size=200,
                                     replay_ratio=0, eval_every=0, threads=1, save_buffer=True))
    assert build_trainer(config, env_info(env), tmp_path, progress_bar=False).train().finished
    mu, stored, written = forced_steps.stored_mu(tmp_path / forced_steps.BUFFER_PATH)
    assert stored == written == 200 and mu.shape == (200, 2, env_info(env).n_actions)
    counts = forced_steps.forced_counts(mu)
    if forced:
        assert counts[0] > 0 and counts[0] == counts[1] == counts[2] and counts[3:].sum() == 0
    else:
        assert counts.sum() == 0


#: A --actions log by hand: game 1 loses a life after step 2 and ends at step 6 (whose lives are
#: already game 2's, as the vector env resets in the same step); game 2 loses one after step 8.
STEP_LOG = [  # game, lives, game_over
    (1, 3, 0), (1, 3, 0), (1, 2, 0), (1, 2, 0), (1, 2, 0), (1, 2, 0), (1, 3, 1),
    (2, 3, 0), (2, 2, 0), (2, 2, 0),
]


def write_game(tmp_path: Path, frames: int = len(STEP_LOG) + 1) -> tuple[Path, Path]:
    """An mp4 whose frame k is grey level 20 k, and STEP_LOG as play.py --actions writes it."""
    import cv2

    video, actions = tmp_path / "game.mp4", tmp_path / "steps.csv"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 30, (32, 48))
    for k in range(frames):
        writer.write(np.full((48, 32, 3), 20 * k, np.uint8))
    writer.release()
    lines = ["game,step,action,action_name,forced,reward,lives,game_over"]
    for step, (game, lives, over) in enumerate(STEP_LOG):
        forced = int(step in (3, 4, 5, 9))
        lines.append(f"{game},{step},{[0, 1, 2][step - 3] if step in (3, 4, 5) else 3},,{forced},0,{lives},{over}")
    actions.write_text("\n".join(lines) + "\n")
    return video, actions


def test_life_loss_frames_finds_the_lives_lost_with_the_game_going_on_and_draws_their_frames(tmp_path, capsys):
    video, actions = write_game(tmp_path)
    rows = life_loss_frames.read_rows(actions)
    assert life_loss_frames.life_losses(rows) == [2, 8]  # not step 6: the game ended there
    frames = life_loss_frames.read_frames(video, [1, 4, 10])
    for index, frame in frames.items():  # the frame after step s is the video's frame s + 1
        assert frame.shape == (48, 32, 3) and abs(float(frame.mean()) - 20 * index) < 4
    assert life_loss_frames.main([str(video), str(actions), "--out", str(tmp_path / "one.png")]) == 0
    assert capsys.readouterr().out.endswith("one.png: steps 1-7 (video frames 2-8)\n")
    assert life_loss_frames.main([str(video), str(actions), "--life", "2", "--out", str(tmp_path / "two.png")]) == 0
    assert capsys.readouterr().out.endswith("two.png: steps 7-9 (video frames 8-10)\n")  # the log ends at step 9
    assert plt.imread(tmp_path / "one.png").shape[1] > plt.imread(tmp_path / "two.png").shape[1]


@pytest.mark.parametrize("problem, message", [
    ("third life", "has 2 lives lost with the game going on, not a life 3"),
    ("no video", "game.mp4 does not exist"),
    ("a folder for the video", "game.mp4 is not a file"),
    ("not a video", "game.mp4 is not a video that OpenCV can read"),
    ("another game's video", "game.mp4 has 5 frames, but the 10 steps of"),
    ("not a log", "steps.csv: is not a play.py --actions log (missing game, step, action_name, forced, lives)"),
    ("a row cut short", "steps.csv: line 11 is cut short or has a game, lives or forced that is not a whole number"),
    ("no out folder", "cannot write"),
])
def test_life_loss_frames_bad_input_is_one_line(tmp_path, problem, message):
    video, actions = write_game(tmp_path, frames=5 if problem == "another game's video" else len(STEP_LOG) + 1)
    out = tmp_path / ("no" if problem == "no out folder" else "") / "out.png"
    if problem in ("no video", "a folder for the video", "not a video"):
        video.unlink()
    if problem == "a folder for the video":
        video.mkdir()
    if problem == "not a video":
        video.write_bytes(b"not an mp4")
    if problem == "not a log":
        actions.write_text("action,reward\n0,1\n")
    if problem == "a row cut short":  # as a play.py killed while writing would leave it
        actions.write_text(actions.read_text()[:-12])
    result = subprocess.run([sys.executable, "tools/life_loss_frames.py", str(video), str(actions), "--out", str(out),
                             "--life", "3" if problem == "third life" else "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("life_loss_frames.py: error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # FFmpeg's own complaints silenced too
    assert not out.exists()


def test_the_gpu_report_dry_run_on_the_cpu_writes_a_bench_line_and_skips_what_the_budget_leaves_out(tmp_path):
    # The report tools/gpu_report.sh runs first on a lent GPU, tried here as its dry run: the first
    # setting fits the budget (bench.py --device cpu; the budget counts from the script's start, its
    # imports too), those with --compile (90 s to set up) do not and are recorded as skipped. How many
    # plain ones (30 s to set up) fit after the first is the machine's speed: each setting's line says
    # the second it started at, and each must have run exactly when its setup and 2 s fitted then.
    budget, seconds = 44, 2
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_report.sh"), "--env", "CartPole-v1", "--device", "cpu",
                             "--seconds", str(seconds), "--budget", str(budget), "--out", str(tmp_path), "--commit", "abc1234",
                             "--python", sys.executable], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (report,) = tmp_path.glob("cpu-*.jsonl")
    assert report.name == "cpu-abc1234.jsonl"  # the commit given: the device machine's git HEAD was a stale one
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert lines[0]["report"] == "--num-envs 16" and lines[0]["num_envs"] == 16 and lines[0]["device"] == "cpu"
    assert lines[0]["env"] == "CartPole-v1"  # Pong's bench line: tests/test_bench.py
    # The baseline, then the CUDA tests (whatever the timings take), then the other settings.
    assert lines[1] == {"report": "cuda tests", "summary": "no CUDA: the CUDA-only tests were not run"}
    assert len(lines) == 14  # 12 settings, the tests and the env groups' probe
    settings = [lines[0], *lines[2:]]
    started = [line["started_s"] for line in settings]
    assert started == sorted(started) and started[0] >= 0
    for line in settings:
        if line["report"].startswith("env groups"):  # tools/env_groups.py steps ALE's vector env
            assert line["skipped"] == "the probe steps ALE's vector env: Atari games only", line
            continue
        if "graph" in line["report"]:
            assert line["skipped"] == "--compile graph needs CUDA", line
            continue
        fits = line["started_s"] + seconds + (90 if "--compile" in line["report"] else 30) <= budget
        assert ("skipped" not in line) == fits, line
        assert fits or line["skipped"] == f"the time budget of {budget} s", line
    assert "skipped" not in lines[0]
    assert sum(line.get("skipped", "").startswith("the time budget") for line in settings) >= 2  # --compile update
    graph = "--pipeline overlap --compile graph"
    assert [line["report"] for line in settings] == [  # most telling first: the CUDA graph at 16, 64 and 32 envs, and in bf16
        "--num-envs 16", f"--num-envs 16 {graph}", f"--num-envs 16 {graph} --env-groups 2", f"--num-envs 64 {graph}",
        "env groups --num-envs 16 --groups 2 --acting-ms 0.1,0.3 --seconds 5", f"--num-envs 32 {graph}",
        f"--num-envs 16 {graph} --precision bf16", "--num-envs 16 --pipeline overlap --compile update",
        "--num-envs 64 --pipeline overlap --compile update", f"OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000 --num-envs 16 {graph}",
        "--num-envs 16 --pipeline overlap", f"--num-envs 16 {graph} --replay-device cpu", "--num-envs 64",
    ]
    assert "== bench.py --num-envs 16" in report.with_suffix(".log").read_text()


def test_the_env_groups_probe_times_both_shapes_for_each_acting_time():
    # tools/env_groups.py, which the GPU report runs: one JSON line per acting time, the envs as one
    # group and as groups stepping at the same time; a bad split is one line and exit 2.
    command = [sys.executable, str(ROOT / "tools" / "env_groups.py"), "--num-envs", "4", "--groups", "2"]
    result = subprocess.run([*command, "--acting-ms", "0,0.2", "--seconds", "0.3"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["acting_ms"] for line in lines] == [0.0, 0.2]
    for line in lines:
        assert line["probe"] == "env_groups" and line["env"] == "PongNoFrameskip-v4" and line["groups"] == 2
        assert line["one_group_steps_per_sec"] > 0 and line["groups_steps_per_sec"] > 0
        assert line["ratio"] == pytest.approx(line["groups_steps_per_sec"] / line["one_group_steps_per_sec"], abs=2e-3)
    result = subprocess.run([*command[:-1], "3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "must split into --groups (3) of equal size" in result.stderr.splitlines()[-1]


def test_every_cuda_only_test_is_in_the_gpu_reports_files_and_named_for_its_selection(request):
    # The GPU report runs `pytest $CUDA_TEST_FILES -k cuda`: a CUDA-only test in another file, or
    # whose id lacks "cuda", would never run on a lent GPU. Every file that uses requires_cuda must
    # be listed; every CUDA-only test collected in this session (all of them in .ci/run) must be
    # in a listed file and selected by -k cuda.
    script = (ROOT / "tools" / "gpu_report.sh").read_text()
    listed = set(re.search(r'^CUDA_TEST_FILES="([^"]+)"', script, re.MULTILINE).group(1).split())
    name = "requires" + "_cuda"  # as a decorator or a parameter's mark (spelled apart: this file uses neither)
    using = {f"tests/{path.name}" for path in (ROOT / "tests").glob("test_*.py")
             if re.search(rf"^\s*@{name}$|marks={name}\b", path.read_text(), re.MULTILINE)}
    assert using <= listed, f"CUDA-only tests outside the GPU report's files: {sorted(using - listed)}"
    assert all((ROOT / name).is_file() for name in listed)
    cuda_only = [item for item in request.session.items
                 if any("needs CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))]
    for item in cuda_only:
        assert f"tests/{item.path.name}" in listed and "cuda" in item.nodeid.lower(), item.nodeid


def report_with_a_hanging_bench(tmp_path: Path, bench_line: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The GPU report's dry run (CartPole, --cut 2) with a python that runs the bash line
    ``bench_line`` for bench.py (one that hangs), and the report's JSON lines."""
    python = fake_python(tmp_path / "python", f'[ "$1" = bench.py ] && {{ {bench_line}; }}')
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_report.sh"), "--env", "CartPole-v1", "--device", "cpu",
                             "--seconds", "1", "--budget", "45", "--cut", "2", "--out", str(tmp_path / "report"),
                             "--python", str(python)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (report,) = (tmp_path / "report").glob("cpu-*.jsonl")
    return result, [json.loads(line) for line in report.read_text().splitlines()]


def test_the_gpu_report_cuts_a_setting_that_hangs_and_goes_on(tmp_path):
    # A setting that hangs (here a bench.py that sleeps) must not hold the device call: it is cut
    # at --cut seconds and recorded as failed, and the report goes on to the next.
    _, lines = report_with_a_hanging_bench(tmp_path, "exec sleep 600")
    assert lines[0] == {"report": "--num-envs 16", "started_s": lines[0]["started_s"], "failed": "cut at 2 s (exit 124)"}
    assert 0 <= lines[0]["started_s"] <= 45
    assert lines[1]["report"] == "cuda tests" and len(lines) == 14


def test_the_gpu_report_keeps_the_figures_of_a_setting_whose_exit_hangs(tmp_path):
    # On the H200 a bench.py printed its JSON line, then waited at exit for Inductor's compile
    # workers (pytorch/pytorch#162199) until it was cut: its figures are whole and the line keeps
    # them, saying that its exit was cut.
    result, lines = report_with_a_hanging_bench(
        tmp_path, 'echo "end to end 1.0 steps/s"; echo \'{"steps_per_sec": 1.5, "env": "CartPole-v1"}\'; exec sleep 600')
    assert lines[0] == {"report": "--num-envs 16", "started_s": lines[0]["started_s"],
                        "cut_after_its_figures": "cut at 2 s (exit 124): its exit hung", "steps_per_sec": 1.5,
                        "env": "CartPole-v1"}
    assert "  done: --num-envs 16 (" in result.stdout and "; its exit hung and was cut at 2 s)" in result.stdout
    assert lines[1]["report"] == "cuda tests" and len(lines) == 14


def gpu_tools_copy(tmp_path: Path, wheels: list[str] | None = None) -> Path:
    """A copy of tools/ in a folder of its own, for the GPU scripts, which work in their checkout's
    root: there it holds the ``.whl`` of ``wheels`` (empty files so named), or none, whatever this
    checkout holds (tools/gpu_wheels.sh may have filled its .whl)."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    if wheels is not None:
        (root / ".whl").mkdir()
        for name in wheels:
            (root / ".whl" / name).write_bytes(b"")
    return root


def fake_python(path: Path, first_line: str) -> Path:
    """A python that runs the bash line ``first_line`` before it hands its arguments to this one."""
    path.write_text(f'#!/bin/bash\n{first_line}\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def run_gpu_script_without_gymnasium(tmp_path: Path, root: Path, script: str) -> subprocess.CompletedProcess:
    """``tools/<script>`` of the copy ``root``, its output in tmp_path/out, with a python whose
    ``import gymnasium`` fails, as on the lent GPU machine's image."""
    python = fake_python(tmp_path / "python", '[[ "$*" == *"import gymnasium"* ]] && exit 1')
    return subprocess.run(["bash", str(root / "tools" / script), "--device", "cpu", "--out", str(tmp_path / "out"),
                           "--python", str(python)], cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script", ["gpu_report.sh", "gpu_pong.sh", "gpu_share.sh"])
def test_the_gpu_scripts_say_in_one_line_that_gymnasium_is_missing_before_they_start(tmp_path, script):
    # Without .whl carried to a machine whose image lacks gymnasium, the report went on: every bench
    # line "printed no JSON line", and the tests failed at their imports, the device time spent.
    result = run_gpu_script_without_gymnasium(tmp_path, gpu_tools_copy(tmp_path), script)
    assert result.returncode == 2 and result.stderr == (
        f"{script}: error: gymnasium or ale-py does not import here; run tools/gpu_wheels.sh on the CPU machine and carry .whl\n")
    assert not list((tmp_path / "out").glob("*.jsonl"))


def test_an_empty_whl_is_one_line(tmp_path):
    result = run_gpu_script_without_gymnasium(tmp_path, gpu_tools_copy(tmp_path, []), "gpu_report.sh")
    assert result.returncode == 2
    assert result.stderr == "gpu_report.sh: error: .whl holds no wheels; run tools/gpu_wheels.sh on the CPU machine and carry .whl\n"


@pytest.mark.parametrize("script", ["gpu_report.sh", "gpu_pong.sh", "gpu_share.sh"])
def test_wheels_for_another_python_are_one_line_naming_the_python_and_the_command_that_fetches_its_own(tmp_path, script):
    # tools/gpu_wheels.sh fetches wheels for the device image's Python 3.12; an image with another
    # Python cannot install them, and pip's reason came on a line of its own above the script's.
    root = gpu_tools_copy(tmp_path, ["gymnasium-1.4.0-py3-none-any.whl", "ale_py-0.12.1-cp399-cp399-manylinux_2_28_x86_64.whl"])
    result = run_gpu_script_without_gymnasium(tmp_path, root, script)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert result.returncode == 2 and result.stderr == (
        f"{script}: error: the wheels in .whl did not install on this Python {version} (ale_py-0.12.1-cp399-cp399-"
        f"manylinux_2_28_x86_64.whl is not a supported wheel on this platform); run tools/gpu_wheels.sh {version} on the "
        f"CPU machine and carry .whl\n")
    assert not list((tmp_path / "out").glob("*.jsonl"))


def test_gpu_wheels_takes_a_python_version_and_leaves_the_wheels_there_were_where_it_cannot_fetch(tmp_path):
    # Refused before anything is touched: a version that is not one, and (with no package index to
    # ask, as here, or no wheel for that Python) a download that fails, which keeps the .whl there was.
    root = gpu_tools_copy(tmp_path, ["gymnasium-1.4.0-py3-none-any.whl"])
    result = subprocess.run(["bash", str(root / "tools" / "gpu_wheels.sh"), "python3.12"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr == "gpu_wheels.sh: error: the device's Python version must be like 3.12, got python3.12\n"
    pip = fake_python(tmp_path / "pip_python",  # a python whose pip cannot reach an index
                      '[ "$1 $2" = "-m pip" ] && { echo "ERROR: No matching distribution found for ale-py==0.12.1" >&2; exit 1; }')
    result = subprocess.run(["bash", str(root / "tools" / "gpu_wheels.sh"), "3.13"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHON": str(pip)})
    assert result.returncode == 2 and result.stderr == (
        "gpu_wheels.sh: error: the wheels for Python 3.13 did not download (No matching distribution found for ale-py==0.12.1); "
        ".whl is unchanged\n")
    assert sorted(path.name for path in (root / ".whl").iterdir()) == ["gymnasium-1.4.0-py3-none-any.whl"]
    assert not (root / ".whl.new").exists()
    bare = fake_python(tmp_path / "bare_python", '[ "$1" = "-c" ] && exit 1')  # without the packages whose versions it pins
    result = subprocess.run(["bash", str(root / "tools" / "gpu_wheels.sh")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHON": str(bare)})
    assert result.returncode == 2
    assert result.stderr == f"gpu_wheels.sh: error: {bare} has no gymnasium to take its version from (PYTHON names another python)\n"
    assert sorted(path.name for path in (root / ".whl").iterdir()) == ["gymnasium-1.4.0-py3-none-any.whl"]


@pytest.mark.parametrize("option, value", [("--cut", "2.5"), ("--seconds", "0"), ("--budget", "")])
def test_the_gpu_report_takes_whole_seconds_only(tmp_path, option, value):
    # --cut 2.5 failed the budget's bash arithmetic ("integer expression expected") and was
    # silently replaced by the rest of the budget
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_report.sh"), "--device", "cpu", option, value, "--out",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (
        2, f"gpu_report.sh: error: {option} must be a positive whole number of seconds, got {value}\n")


def test_the_gpu_report_refuses_a_commit_name_that_is_not_one(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_report.sh"), "--device", "cpu", "--commit", "a/b c", "--out",
                             str(tmp_path), "--python", sys.executable], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (
        2, "gpu_report.sh: error: --commit takes a commit's name (letters, digits, . _ -), got a/b c\n")


def test_the_gpu_report_says_in_one_line_that_there_is_no_cuda(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_report.sh"), "--out", str(tmp_path), "--python", sys.executable],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "torch sees no CUDA device" not in result.stderr:
        pytest.skip("this machine has CUDA")
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_the_torch_check_asks_for_a_version_in_one_line():
    # tools/torch_check.sh builds a virtualenv with another torch (gigabytes): only its usage here.
    result = subprocess.run(["bash", str(ROOT / "tools" / "torch_check.sh")], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "usage: tools/torch_check.sh" in result.stderr


def test_the_gpu_sharing_script_rejects_an_unknown_option_in_one_line(tmp_path):
    # tools/gpu_share.sh runs K train.py processes at once on the lent GPU; its dry run on the CPU
    # (--device cpu --env CartPole-v1) takes a minute, so only its option check runs here.
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_share.sh"), "--gpus", "2", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "unknown option --gpus" in result.stderr


def test_gpu_pong_trains_in_pieces_that_resume_and_stops_once_the_target_is_reached(tmp_path):
    # tools/gpu_pong.sh takes Pong to 20 on the lent GPU across device calls; its dry run on CartPole:
    # a piece cut by time (SIGINT, a checkpoint), a resume that reaches the target, and a call after.
    run_dir, outs = tmp_path / "run", [tmp_path / f"out{i}" for i in range(3)]

    def piece(out, reward, seconds, *options):
        command = ["bash", str(ROOT / "tools" / "gpu_pong.sh"), "--device", "cpu", "--env", "CartPole-v1", "--reward",
                   str(reward), "--seconds", str(seconds), "--run-dir", str(run_dir), "--out", str(out), "--python",
                   sys.executable, *options, "--", "--compile", "off", "--eval-every", "2000", "--eval-episodes", "100"]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    # A call that ended before its first checkpoint (its first compile cut, a crash) left a run
    # that cannot resume: the next call moves it aside, with its line carried on, and starts afresh.
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "progress.csv").write_text("total_timesteps,episodes\n")
    failed = {"segment": "fresh", "exit_code": 137, "steps": 0, "reached": None, "eval_reached": None}
    (run_dir / "segments.jsonl").write_text(json.dumps(failed) + "\n")
    (tmp_path / "compile_cache" / "triton").mkdir(parents=True)  # torch.compile's caches, as an earlier call packed them
    (tmp_path / "compile_cache" / "triton" / "kernel").write_text("cached")
    with tarfile.open(run_dir / "compile_cache.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "compile_cache", arcname="compile_cache")
    # CartPole's most is 500: cut by time. train.py starts in about 2 s here (imports, envs); a
    # SIGINT before its training begins ends it without a checkpoint, so the cut leaves it 10 s.
    # A device call brings back files of at most 16 MiB (Pong's latest.pt is about 23 MB): a larger
    # one goes out in parts, here CartPole's (about 140 kB) in parts of 60 kB.
    first = piece(outs[0], 1000, 10, "--part-bytes", "60000")
    assert first.returncode == 0, first.stderr
    assert "held no checkpoint to resume" in first.stdout and "restored torch.compile's caches" in first.stdout
    (aside,) = tmp_path.glob("run.failed-*")
    assert (aside / "progress.csv").read_text() == "total_timesteps,episodes\n"
    # what comes back from a device call: at most 8 files, 2 folders down; the rest stays in the run
    assert {p.name for p in outs[0].iterdir()} == {"config.json", "progress.csv", "segments.jsonl", "checkpoints",
                                                   "compile_cache.tar.gz"}
    with tarfile.open(outs[0] / "compile_cache.tar.gz") as archive:  # the caches go on with the run
        assert archive.extractfile("compile_cache/triton/kernel").read() == b"cached"
    parts = sorted(p.name for p in (outs[0] / "checkpoints").iterdir())
    assert len(parts) >= 2 and parts == [f"latest.pt.part-a{letter}" for letter in "abcdefgh"[:len(parts)]], first.stdout
    assert b"".join((outs[0] / "checkpoints" / part).read_bytes() for part in parts) == (
        run_dir / "checkpoints" / "latest.pt").read_bytes()
    assert (run_dir / "train.log").exists() and (run_dir / "tb").is_dir()
    before, cut = [json.loads(line) for line in (outs[0] / "segments.jsonl").read_text().splitlines()]
    assert before == failed
    assert cut["segment"] == "fresh" and cut["exit_code"] == 124 and cut["reached"] is None and cut["steps"] > 0
    # the next call trains in the previous call's OUT_DIR, carried back: the parts are joined first
    run_dir = tmp_path / "carried"
    shutil.copytree(outs[0], run_dir)
    second = piece(outs[1], 10, 60)
    joined = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert "latest.pt" in joined and not [name for name in joined if ".part-" in name], joined
    assert second.returncode == 0, second.stderr
    segments = [json.loads(line) for line in (outs[1] / "segments.jsonl").read_text().splitlines()]
    assert [line["segment"] for line in segments] == ["fresh", "fresh", "resume"] and segments[2]["exit_code"] == 0
    assert segments[2]["steps"] > cut["steps"] and segments[2]["mean_return_100"] >= 10  # resumed, then stopped
    assert 0 < segments[2]["reached"]["steps"] <= segments[2]["steps"]  # the first row at 10 or more
    assert cut["eval_reached"] is None and segments[2]["eval_reached"]["eval_mean"] >= 10  # 100 games a random CartPole
    third = piece(outs[2], 10, 60)
    assert third.returncode == 0 and "reached its target already" in third.stdout and not outs[2].exists()
    # with evaluation on, the run stops at an evaluation's mean: that too ends the series
    run_dir = tmp_path / "evaluated"
    run_dir.mkdir()
    (run_dir / "segments.jsonl").write_text(json.dumps({**failed, "eval_reached": {"steps": 9, "eval_mean": 20.5}}) + "\n")
    fourth = piece(outs[2], 10, 60)
    assert fourth.returncode == 0 and "reached its target already" in fourth.stdout and not outs[2].exists()
    # past the first checkpoint's step without latest.pt: lost on the way, not a failed start; nothing moved
    run_dir = tmp_path / "uncarried"
    run_dir.mkdir()
    (run_dir / "progress.csv").write_text("total_timesteps,episodes\n200000,300\n")
    fifth = piece(outs[2], 10, 60)
    assert fifth.returncode == 2 and fifth.stderr.strip() == (
        f"gpu_pong.sh: error: {run_dir} trained to step 200000 but holds no checkpoints/latest.pt (was it carried?); nothing moved")
    assert (run_dir / "progress.csv").exists() and not list(tmp_path.glob("uncarried.failed-*"))


def test_a_gpu_pong_call_cut_by_the_devices_limit_brings_back_its_rows_and_last_checkpoint(tmp_path):
    # The device kills a call that runs past its limit and brings back what $OUT holds: OUT_DIR got its files only
    # after train.py had stopped, so such a call brought back nothing. Now they are copied out while it trains.
    run_dir = tmp_path / "run"

    def command(run, seconds):
        return [*(["timeout", "-s", "KILL", "14"] if run == run_dir else []), "bash", str(ROOT / "tools" / "gpu_pong.sh"),
                "--device", "cpu", "--env", "CartPole-v1", "--reward", "1000", "--seconds", str(seconds), "--run-dir",
                str(run), "--out", str(tmp_path / f"{run.name}_out"), "--python", sys.executable, "--part-bytes", "60000",
                "--", "--compile", "off", "--checkpoint-every", "500"]

    environment = {**os.environ, "GPU_PONG_WATCH_SECONDS": "1"}
    cut = subprocess.run(command(run_dir, 60), cwd=ROOT, capture_output=True, text=True, timeout=60, env=environment)
    assert cut.returncode == -signal.SIGKILL or cut.returncode == 137, (cut.returncode, cut.stderr)
    # the device kills every process of the call; the KILL reached the script's process group, and gpu_pong.sh's own
    # timeout put train.py in a group of its own
    for process in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() in (process / "cmdline").read_bytes():
                os.kill(int(process.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    out = tmp_path / "run_out"
    assert {p.name for p in out.iterdir()} >= {"config.json", "progress.csv", "checkpoints"} and not (out / "segments.jsonl").exists()
    assert [p.name for p in sorted((out / "checkpoints").iterdir())][:2] == ["latest.pt.part-aa", "latest.pt.part-ab"]
    rows = (out / "progress.csv").read_text().splitlines()
    assert len(rows) >= 2 and rows[0].startswith("total_timesteps,")
    # the next call carries it back and goes on from its checkpoint
    carried = tmp_path / "carried"
    shutil.copytree(out, carried)
    resumed = subprocess.run(command(carried, 8), cwd=ROOT, capture_output=True, text=True, timeout=60, env=environment)
    assert resumed.returncode == 0, resumed.stderr
    (line,) = [json.loads(text) for text in (carried / "segments.jsonl").read_text().splitlines()]
    assert line["segment"] == "resume" and line["exit_code"] == 124 and line["steps"] > 500, line


def test_lstm_probe_measures_the_memory_of_a_recurrent_checkpoint(tmp_path):
    import acer_sync

    recurrent = acer_sync.train("CartPole-v1", run_dir=tmp_path / "lstm", network="lstm", lstm_size=8, hidden="8",
                                total_timesteps=80, num_envs=2, nsteps=10, eval_every=0, verbose=0)
    probe = [sys.executable, str(ROOT / "tools" / "lstm_probe.py")]
    result = subprocess.run([*probe, str(recurrent), "--steps", "30", "--envs", "2"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{recurrent}: 30 steps of 2 envs"
    assert [line.split()[0] for line in lines[1:6]] == ["features", "h", "c", "pi", "q"]
    assert "π's entropy" in lines[6] and "(uniform: 0.6931)" in lines[6]
    assert all(" constant " in line for line in lines[1:6])
    # --states-from: another checkpoint plays and this one is probed on its states (here the same one,
    # so the figures are its own), and a checkpoint of another env is refused in one line.
    played = subprocess.run([*probe, str(recurrent), "--steps", "30", "--envs", "2", "--states-from", str(recurrent)],
                            capture_output=True, text=True, timeout=120)
    assert played.returncode == 0, played.stderr
    assert played.stdout.splitlines()[0] == f"{recurrent}: 30 steps of 2 envs played by {recurrent}"
    assert played.stdout.splitlines()[1:6] == lines[1:6]
    other = acer_sync.train("Acrobot-v1", run_dir=tmp_path / "acrobot", total_timesteps=40, num_envs=2, nsteps=10,
                            eval_every=0, verbose=0)
    refused = subprocess.run([*probe, str(recurrent), "--states-from", str(other)], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1 and refused.stderr.strip() == f"{other} plays Acrobot-v1, {recurrent} CartPole-v1"
    flat = acer_sync.train("CartPole-v1", run_dir=tmp_path / "mlp", total_timesteps=80, num_envs=2, nsteps=10,
                           eval_every=0, verbose=0)
    result = subprocess.run([*probe, str(flat)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.strip() == f"{flat}: the network has no memory to probe"


def test_lstm_probe_steps_through_the_observation_normalizer(tmp_path):
    # A --normalize-obs recurrent network acts on normalized observations: the probe's features are the
    # torso's on those, as acting computes them, not on the raw observations.
    import torch

    import acer_sync
    from tools.lstm_probe import probe_step

    run = acer_sync.train("CartPole-v1", run_dir=tmp_path / "norm", network="lstm", lstm_size=8, hidden="8",
                          normalize_obs=True, total_timesteps=80, num_envs=2, nsteps=10, eval_every=0, verbose=0)
    model = acer_sync.load(run).model.eval()
    assert model.normalizer is not None and float(model.normalizer.var.sub(1).abs().max()) > 0.01
    obs = np.array([[0.5, -1.0, 0.1, 2.0], [-0.3, 0.4, -0.05, -1.5]], dtype=np.float32)
    first = torch.ones(2, dtype=torch.bool)
    with torch.no_grad():
        features, state, pi, q = probe_step(model, "fp32", obs, first, model.initial_state(2))
        normalized = model.torso(model.normalizer(torch.as_tensor(obs)))
        raw = model.torso(torch.as_tensor(obs))
        h_out, stepped = model.step(torch.as_tensor(obs), model.initial_state(2), first)
        expected_pi, expected_q = model(h_out)
    assert torch.equal(features, normalized) and not torch.allclose(features, raw)
    assert all(torch.equal(part, expected) for part, expected in zip(state, stepped))
    assert torch.equal(pi, expected_pi) and torch.equal(q, expected_q)


def test_every_mutant_of_the_math_still_applies_and_one_is_killed(monkeypatch, capsys):
    # tools/mutants.py changes the committed source by exact text: a mutant whose line moved is named.
    listed = subprocess.run([sys.executable, str(ROOT / "tools" / "mutants.py"), "--list"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 46
    monkeypatch.setattr(mutants, "TESTS", ["tests/test_losses.py"])  # the baseline and the mutant, in seconds
    assert mutants.main(["--json", "L16"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    assert record["killed"] and record["by"].startswith("tests/test_losses.py::test_trust_region")
    monkeypatch.setattr(mutants, "TESTS", ["tests/no_such_file.py"])  # tests that cannot run kill nothing
    assert mutants.main(["L16"]) == 2 and "do not pass on the unchanged tree" in capsys.readouterr().err

"""plot.py and acer_sync.api.scores: the curves PNG, seed grouping, reference scores, one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest

from acer_sync.api.scores import baselines_curve, game_name, human_normalized, published_acer
from acer_sync.base.errors import UserError
from acer_sync.cli import plot

REPO_ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS_PER_ROW = 32_000


def write_run(run_dir: Path, env: str = "PongNoFrameskip-v4", seed: int = 0, lr: float = 7e-4,
              rows: int = 30, timed: bool = True, evaluated: bool = True, updates: bool = False, **extra_config) -> Path:
    """A synthetic run directory: reward = -20 + row/2 + seed (NaN in the first row), eval every
    10th row, and with ``updates`` 500 gradient updates per row."""
    run_dir.mkdir(parents=True)
    config = {"env": env, "seed": seed, "total_timesteps": 10_000_000, "device": "cpu", "lr": lr, "nsteps": 20, **extra_config}
    payload = {"config": config, "versions": {"python": "3.11"}, "git_commit": "0" * 40, "command": ["train.py", "--env", env]}
    (run_dir / "config.json").write_text(json.dumps(payload))
    header = ["total_timesteps", "fps"] + (["time_elapsed"] if timed else []) + ["mean_episode_reward"]
    header += ["eval_mean", "eval_std", "eval_episodes"] if evaluated else []
    header += ["updates"] if updates else []
    lines = [",".join(header)]
    for row in range(rows):
        cells = [str((row + 1) * STEPS_PER_ROW), "500"] + ([str(60.0 * (row + 1))] if timed else [])
        cells.append("nan" if row == 0 else str(-20 + row / 2 + seed))
        if evaluated:
            cells += [str(-10 + row + seed), "1.5", "10"] if row % 10 == 9 else ["", "", ""]
        cells += [str(500 * (row + 1))] if updates else []
        lines.append(",".join(cells))
    (run_dir / "progress.csv").write_text("\n".join(lines) + "\n")
    return run_dir


def pong_runs(tmp_path: Path) -> list[Path]:
    """Three seeds of one config (one with another device and length), and one run with another lr;
    at the Atari preset's constant learning rate, as their config.json record it."""
    return [
        write_run(tmp_path / "pong_s0", seed=0, lr_schedule="constant"),
        write_run(tmp_path / "pong_s1", seed=1, device="cuda", lr_schedule="constant"),
        write_run(tmp_path / "pong_s2", seed=2, total_timesteps=5_000_000, lr_schedule="constant"),
        write_run(tmp_path / "pong_lr", seed=0, lr=1e-3, evaluated=False, lr_schedule="constant"),
    ]


def test_plot_writes_png_with_one_panel_per_env_and_summary(tmp_path, capsys):
    run_dirs = pong_runs(tmp_path) + [write_run(tmp_path / "cartpole", env="CartPole-v1", timed=False)]
    out = tmp_path / "curves.png"
    assert plot.main([*map(str, run_dirs), "--out", str(out), "--smooth", "3", "--x", "frames"]) == 0

    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 5_000
    image = matplotlib.image.imread(out)
    panel_width, panel_height = plot.PANEL_INCHES
    assert image.shape[:2] == (round(panel_height * plot.DPI), round(2 * panel_width * plot.DPI))

    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {out}"
    summaries = lines[:-1]
    assert len(summaries) == 3
    three_seeds = next(line for line in summaries if "(3 seeds)" in line)
    assert three_seeds.startswith("PongNoFrameskip-v4 lr=0.0007 (3 seeds):")
    assert "final 100-episode mean -4.50" in three_seeds  # last rewards -5.5, -4.5, -3.5
    assert "best eval 21.00" in three_seeds and "steps 960,000" in three_seeds and "wall 0.50 h" in three_seeds
    assert "human-normalized 0.540" in three_seeds  # (-4.5 + 20.7) / (9.3 + 20.7)
    assert any(line.startswith("PongNoFrameskip-v4 lr=0.001 (1 seed):") for line in summaries)
    cartpole = next(line for line in summaries if line.startswith("CartPole-v1 (1 seed)"))
    assert "wall n/a" in cartpole and "human-normalized" not in cartpole


def test_runs_differing_only_in_seed_device_or_length_form_one_group(tmp_path):
    groups = plot.group_runs([plot.load_run(path) for path in pong_runs(tmp_path)])
    assert [len(group.runs) for group in groups] == [3, 1]
    assert [plot.distinguishing_text(group, groups) for group in groups] == ["lr=0.0007", "lr=0.001"]


def test_under_a_linear_learning_rate_runs_of_another_length_are_not_one_group(tmp_path):
    # the schedule falls to 0 at total_timesteps: at step 1,600 a 2,000-step run's rate was 0.00028,
    # a 20,000-step run's 0.000928, and plot.py averaged them as two seeds of one config
    runs = [write_run(tmp_path / "short", env="CartPole-v1", total_timesteps=2_000, lr_schedule="linear"),
            write_run(tmp_path / "long", env="CartPole-v1", seed=1, total_timesteps=20_000, lr_schedule="linear"),
            write_run(tmp_path / "long_s2", env="CartPole-v1", seed=2, total_timesteps=20_000, lr_schedule="linear")]
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert [len(group.runs) for group in groups] == [1, 2]
    assert [plot.distinguishing_text(group, groups) for group in groups] == ["total_timesteps=2000", "total_timesteps=20000"]


def test_the_summary_takes_every_seeds_mean_where_the_shortest_seed_ends(tmp_path):
    # it averaged seed 0 at its last row with seed 1 at its own, and named the longest seed's steps
    runs = [write_run(tmp_path / "s0", rows=30, lr_schedule="constant"),
            write_run(tmp_path / "s1", seed=1, rows=20, lr_schedule="constant")]
    group, = plot.group_runs([plot.load_run(path) for path in runs])
    line = plot.summary_line(group, "")
    shortest_end = 20 * STEPS_PER_ROW
    # reward = -20 + row/2 + seed: at row 19, -10.5 and -9.5
    assert "final 100-episode mean -10.00" in line
    assert f"steps {shortest_end:,} (where every seed has rows; the longest {30 * STEPS_PER_ROW:,})" in line


def test_greedy_and_sampled_evaluations_are_not_one_group(tmp_path):
    runs = [write_run(tmp_path / "sampled"), write_run(tmp_path / "greedy", seed=1, eval_greedy=True)]
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert [plot.distinguishing_text(group, groups) for group in groups] == ["eval_greedy=False", "eval_greedy=True"]


def test_a_last_row_cut_short_is_left_out_as_the_trainer_leaves_it_out(tmp_path):
    run = write_run(tmp_path / "run", rows=5)
    with open(run / "progress.csv", "a") as handle:
        handle.write(f"{6 * STEPS_PER_ROW},500,360.0,2")  # row 6, cut inside its reward by a kill (or being written)
    columns = plot.read_progress(run / "progress.csv")
    assert columns["total_timesteps"].tolist() == [step * STEPS_PER_ROW for step in range(1, 6)]
    assert columns["mean_episode_reward"][-1] == -18.0  # row 5's, not the cut "2"


def test_a_step_cell_that_is_no_number_is_a_user_error(tmp_path):
    run = write_run(tmp_path / "run", rows=3)
    lines = (run / "progress.csv").read_text().splitlines()
    lines[2] = "," + lines[2].split(",", 1)[1]
    (run / "progress.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match="column total_timesteps holds a cell that is empty or not finite"):
        plot.read_progress(run / "progress.csv")


def test_a_run_of_a_glob_that_has_no_row_yet_is_skipped_not_an_error(tmp_path, capsys):
    done = write_run(tmp_path / "sweep" / "a_done")
    for name, text in (("b_started", ""), ("c_header", "total_timesteps,mean_episode_reward\n"),
                       ("d_cut", "total_timesteps,mean_episode_reward\n32000,-2")):
        # the logger makes it at the start, the header comes with the first row, which a kill may cut
        (write_run(tmp_path / "sweep" / name) / "progress.csv").write_text(text)
    assert plot.run_directories(sorted((tmp_path / "sweep").glob("*"))) == [done]
    assert "skipped 3 run(s) with no row yet: b_started, c_header, d_cut" in capsys.readouterr().out


def test_without_evaluations_eval_greedy_splits_no_group(tmp_path):
    runs = [write_run(tmp_path / "a", eval_every=0, evaluated=False),
            write_run(tmp_path / "b", seed=1, eval_every=0, eval_greedy=True, evaluated=False)]
    assert [len(group.runs) for group in plot.group_runs([plot.load_run(path) for path in runs])] == [2]
    # runs started without evaluations and resumed with them (--eval-every may change on a resume;
    # a config.json written before it recorded resumes keeps the start's 0): greedy and sampled
    # scores were drawn as one group
    runs = [write_run(tmp_path / "c", eval_every=0), write_run(tmp_path / "d", seed=1, eval_every=0, eval_greedy=True)]
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert [plot.distinguishing_text(group, groups) for group in groups] == ["eval_greedy=False", "eval_greedy=True"]


def test_memory_settings_label_only_runs_with_memory(tmp_path):
    runs = [write_run(tmp_path / "cnn"), write_run(tmp_path / "lstm", network="cnn_lstm", precision="bf16"),
            write_run(tmp_path / "ln", network="cnn_lstm", precision="bf16", lstm_norm="layer", track=True)]
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert [plot.distinguishing_text(group, groups) for group in groups] == [
        "network=auto precision=fp32", "lstm_norm=none network=cnn_lstm precision=bf16",
        "lstm_norm=layer network=cnn_lstm precision=bf16",
    ]


def test_a_setting_missing_from_an_older_config_counts_as_its_default(tmp_path):
    """Seed 0 of docs/runs/pong_defaults predates ``reward_scale`` and ``normalize_obs``; seed 1
    records their defaults. They are one config, two seeds; a non-default value is not."""
    runs = [
        write_run(tmp_path / "old_s0", seed=0),
        write_run(tmp_path / "new_s1", seed=1, reward_scale=1.0, normalize_obs=False),
        write_run(tmp_path / "scaled", seed=0, reward_scale=0.1),
    ]
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert [len(group.runs) for group in groups] == [2, 1]
    assert [plot.distinguishing_text(group, groups) for group in groups] == ["reward_scale=1", "reward_scale=0.1"]


def test_pipeline_auto_counts_as_the_mode_the_run_ran(tmp_path):
    # --pipeline auto is serial on a CPU and overlaps Atari on CUDA: config.json's ran says which.
    # A run from before the setting ran serial.
    runs = [write_run(tmp_path / "before", seed=0), write_run(tmp_path / "serial", seed=1, pipeline="serial"),
            write_run(tmp_path / "auto_cpu", seed=2, pipeline="auto"), write_run(tmp_path / "auto_cuda", seed=3, pipeline="auto")]
    for run_dir, mode in ((runs[2], "serial"), (runs[3], "overlap")):
        payload = json.loads((run_dir / "config.json").read_text())
        payload["ran"] = {"device": "cpu", "compile": "off", "pipeline": mode, "replay_device": "cpu"}
        (run_dir / "config.json").write_text(json.dumps(payload))
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert sorted(sorted(run.path.name for run in group.runs) for group in groups) == [["auto_cpu", "before", "serial"], ["auto_cuda"]]
    assert sorted(plot.distinguishing_text(group, groups) for group in groups) == ["pipeline=overlap", "pipeline=serial"]


def test_a_lone_group_is_labelled_by_its_env(tmp_path):
    groups = plot.group_runs([plot.load_run(write_run(tmp_path / "run"))])
    assert plot.distinguishing_text(groups[0], groups) == ""
    assert plot.summary_line(groups[0], "").startswith("PongNoFrameskip-v4 (1 seed):")


def test_two_runs_of_one_seed_are_not_called_two_seeds(tmp_path):
    runs = [write_run(tmp_path / "first"), write_run(tmp_path / "again"), write_run(tmp_path / "other", seed=1)]
    groups = plot.group_runs([plot.load_run(path) for path in runs[:2]])
    assert plot.seeds_text(groups[0]) == "(2 runs, 1 seed)"
    assert plot.summary_line(groups[0], "").startswith("PongNoFrameskip-v4 (2 runs, 1 seed):")
    groups = plot.group_runs([plot.load_run(path) for path in runs])
    assert plot.seeds_text(groups[0]) == "(3 runs, 2 seeds)"
    groups = plot.group_runs([plot.load_run(path) for path in runs[1:]])
    assert plot.seeds_text(groups[0]) == "(2 seeds)"


def test_seed_band_is_mean_min_and_max_across_seeds(tmp_path):
    runs = [plot.load_run(write_run(tmp_path / f"s{seed}", seed=seed)) for seed in (0, 1, 2)]
    grid, mean, low, high = plot.seed_band(plot.group_runs(runs)[0], "steps", 1)
    base = -20 + np.arange(1, 30) / 2
    np.testing.assert_array_equal(grid, np.arange(2, 31) * STEPS_PER_ROW)
    np.testing.assert_allclose(mean, base + 1)
    np.testing.assert_allclose(low, base)
    np.testing.assert_allclose(high, base + 2)


def test_x_axis_frames_count_four_per_atari_step_and_hours_use_time_elapsed(tmp_path):
    pong = plot.load_run(write_run(tmp_path / "pong", rows=3))
    cartpole = plot.load_run(write_run(tmp_path / "cartpole", env="CartPole-v1", rows=3))
    np.testing.assert_array_equal(plot.x_values(pong, "frames"), [128_000, 256_000, 384_000])
    np.testing.assert_array_equal(plot.x_values(cartpole, "frames"), [32_000, 64_000, 96_000])
    np.testing.assert_allclose(plot.x_values(pong, "hours"), [1 / 60, 2 / 60, 3 / 60])


def test_smooth_is_a_trailing_mean_that_skips_nan():
    smoothed = plot.smooth(np.array([math.nan, 1.0, 2.0, 3.0, 4.0]), 2)
    np.testing.assert_array_equal(smoothed, [math.nan, 1.0, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(plot.smooth(np.array([1.0, 5.0]), 1), [1.0, 5.0])


def test_updates_axis_places_rows_by_gradient_updates(tmp_path):
    run = plot.load_run(write_run(tmp_path / "pong", rows=3, updates=True))
    np.testing.assert_array_equal(plot.x_values(run, "updates"), [500, 1000, 1500])
    out = tmp_path / "by_updates.png"
    assert plot.main([str(run.path), "--out", str(out), "--x", "updates"]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_updates_axis_without_an_updates_column_is_a_user_error(tmp_path):
    run_dir = write_run(tmp_path / "old")
    with pytest.raises(UserError, match="no updates column, so --x updates cannot place it"):
        plot.main([str(run_dir), "--out", str(tmp_path / "c.png"), "--x", "updates"])


def test_baselines_pong_curve_is_kept_with_its_source():
    steps, returns = baselines_curve("PongNoFrameskip-v4")
    assert steps == [step * 250_000 for step in range(2, 21)] + [step * 1_000_000 for step in range(6, 11)]
    assert len(returns) == len(steps)
    by_step = dict(zip(steps, returns))
    # The table, at 1M to 10M steps.
    assert [by_step[step * 1_000_000] for step in (1, 2, 3, 4, 6, 10)] == [-20.0, -15.9, 1.5, 12.7, 18.3, 19.5]
    # The steep part, between the table's points: linear interpolation would put 3.5M at +7.1.
    assert [by_step[step] for step in (2_500_000, 2_750_000, 3_250_000, 3_500_000)] == [-10.3, -4.6, 5.7, 8.8]
    assert baselines_curve("SeaquestNoFrameskip-v4") is None and baselines_curve("CartPole-v1") is None
    sources = json.loads((files("acer_sync") / "data" / "atari_scores.json").read_text())["sources"]
    assert "benchmarks_atari10M" in sources["baselines_curve"]


def test_baselines_breakout_curve_is_kept_with_its_source():
    steps, returns = baselines_curve("BreakoutNoFrameskip-v4")
    assert steps == [step * 250_000 for step in range(1, 21)] + [step * 1_000_000 for step in range(6, 11)]
    assert len(returns) == len(steps)
    by_step = dict(zip(steps, returns))
    # The points: about 3 at 1M, 17 at 2M, 360 at 5M, 442 at 10M.
    assert [by_step[step * 1_000_000] for step in (1, 2, 5, 10)] == [3.0, 16.7, 359.5, 442.2]
    # The targets' steps (2M and 5M) and the steep part between them.
    assert [by_step[step] for step in (3_000_000, 3_750_000, 4_000_000, 4_500_000)] == [53.9, 116.3, 162.7, 277.7]
    source = json.loads((files("acer_sync") / "data" / "atari_scores.json").read_text())["sources"]["baselines_curve"]
    assert "Breakout" in source and "#e78ac3" in source and "tools/baselines_curve.py" in source


def test_a_breakout_run_gets_baselines_breakout_curve(tmp_path):
    """Baselines' curve is looked up by the run's game: a Breakout run up to 960k steps gets
    Breakout's points at 0.25M, 0.5M and 0.75M, and a Pong run beside it Pong's own."""
    runs = [plot.load_run(write_run(tmp_path / "breakout", env="BreakoutNoFrameskip-v4")),
            plot.load_run(write_run(tmp_path / "pong"))]
    figure = plot.build_figure(plot.group_runs(runs), ["", ""], "steps", 1)
    try:
        panels = {panel.get_title(): panel for panel in figure.axes if panel.get_visible()}
        breakout = next(line for line in panels["BreakoutNoFrameskip-v4"].lines if line.get_label() == plot.BASELINES_LABEL)
        np.testing.assert_array_equal(breakout.get_xdata(), [250_000, 500_000, 750_000])
        np.testing.assert_array_equal(breakout.get_ydata(), [1.5, 2.0, 2.2])
        np.testing.assert_array_equal(reference_lines(panels["PongNoFrameskip-v4"])[plot.BASELINES_LABEL], [500_000, 750_000])
    finally:
        plt.close(figure)


def reference_lines(panel) -> dict[str, np.ndarray]:
    """The x data of the reference lines drawn on ``panel``, by label."""
    labels = (plot.PUBLISHED_LABEL, plot.BASELINES_LABEL)
    return {line.get_label(): np.asarray(line.get_xdata(), dtype=float) for line in panel.lines if line.get_label() in labels}


@pytest.mark.parametrize("axis, per_step", [("steps", 1), ("frames", 4)])
def test_a_short_run_is_framed_by_its_own_range(tmp_path, axis, per_step):
    """A 96k-step Pong run fills its panel: Baselines' curve (0.5M to 10M steps) has no point in
    its range and is left out, so the x axis ends near 96k steps, not at 10M (40M frames)."""
    groups = plot.group_runs([plot.load_run(write_run(tmp_path / "short", rows=3))])
    figure = plot.build_figure(groups, [""], axis, 1)
    try:
        panel = figure.axes[0]
        assert plot.BASELINES_LABEL not in reference_lines(panel)
        assert plot.PUBLISHED_LABEL in reference_lines(panel)  # a horizontal line: it sets no x range
        assert panel.get_xlim()[1] <= 1.1 * 3 * STEPS_PER_ROW * per_step
    finally:
        plt.close(figure)


@pytest.mark.parametrize("rows, marker", [(2, "o"), (5, "None")])  # write_run's first row is NaN
def test_a_run_of_one_row_is_drawn_as_a_point(tmp_path, rows, marker):
    """A line through one point draws nothing: a run's first row (its first mean of 100 games) is a marker."""
    groups = plot.group_runs([plot.load_run(write_run(tmp_path / "run", rows=rows, evaluated=False))])
    figure = plot.build_figure(groups, [""], "steps", 1)
    try:
        curve = next(line for line in figure.axes[0].get_lines() if line.get_label().startswith("PongNoFrameskip-v4"))
        assert np.isfinite(curve.get_ydata()).sum() == rows - 1 and curve.get_marker() == marker
    finally:
        plt.close(figure)


def test_baselines_curve_is_clipped_to_the_runs_x_range(tmp_path):
    """Two seeds up to 960k steps: Baselines' points at 0.5M and 0.75M are drawn, none beyond."""
    groups = plot.group_runs([plot.load_run(write_run(tmp_path / f"s{seed}", seed=seed)) for seed in (0, 1)])
    figure = plot.build_figure(groups, [""], "steps", 1)
    try:
        panel = figure.axes[0]
        np.testing.assert_array_equal(reference_lines(panel)[plot.BASELINES_LABEL], [500_000, 750_000])
        assert panel.get_xlim()[1] <= 1.1 * 30 * STEPS_PER_ROW
    finally:
        plt.close(figure)


def test_no_reference_leaves_out_the_published_score_and_baselines_curve(tmp_path):
    run_dir = write_run(tmp_path / "pong", rows=30)
    groups = plot.group_runs([plot.load_run(run_dir)])
    figure = plot.build_figure(groups, [""], "steps", 1, reference=False)
    try:
        assert reference_lines(figure.axes[0]) == {}
    finally:
        plt.close(figure)
    out = tmp_path / "c.png"
    assert plot.main([str(run_dir), "--out", str(out), "--no-reference"]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_hours_axis_without_time_elapsed_is_a_user_error(tmp_path):
    run_dir = write_run(tmp_path / "untimed", timed=False)
    with pytest.raises(UserError, match="no time_elapsed column"):
        plot.main([str(run_dir), "--out", str(tmp_path / "c.png"), "--x", "hours"])


@pytest.mark.parametrize(
    "env_id, game",
    [
        ("PongNoFrameskip-v4", "Pong"),
        ("ALE/Pong-v5", "Pong"),
        ("BreakoutDeterministic-v4", "Breakout"),
        ("SpaceInvadersNoFrameskip-v4", "SpaceInvaders"),
        ("ALE/MsPacman-v5", "MsPacman"),
        ("CartPole-v1", None),
        ("LunarLander-v3", None),
    ],
)
def test_game_name(env_id, game):
    assert game_name(env_id) == game


def test_published_acer_scores_of_ppo_paper_table_6():
    assert published_acer("PongNoFrameskip-v4") == 20.7
    assert published_acer("BreakoutNoFrameskip-v4") == 456.4
    assert published_acer("ALE/Qbert-v5") == 15316.6
    assert published_acer("EnduroNoFrameskip-v4") == 0.0
    assert published_acer("CartPole-v1") is None


def test_human_normalized_scores():
    assert human_normalized("PongNoFrameskip-v4", 9.3) == 1.0
    assert human_normalized("PongNoFrameskip-v4", -20.7) == 0.0
    assert human_normalized("BreakoutNoFrameskip-v4", 31.8) == 1.0
    assert human_normalized("BreakoutNoFrameskip-v4", 16.75) == pytest.approx(0.5, abs=1e-12)  # 15.05 / 30.1
    assert human_normalized("SeaquestNoFrameskip-v4", 10125.2) == pytest.approx(0.5, abs=1e-12)  # 10056.8 / 20113.6
    assert human_normalized("CartPole-v1", 500.0) is None


def test_score_file_cites_its_sources():
    data = json.loads((files("acer_sync") / "data" / "atari_scores.json").read_text())
    assert {"acer_published", "random", "human"} <= set(data["sources"])
    assert "1707.06347" in data["sources"]["acer_published"] and "nature14236" in data["sources"]["human"]


def _empty_progress(tmp_path: Path) -> Path:
    run_dir = write_run(tmp_path / "empty")
    (run_dir / "progress.csv").write_text("")
    return run_dir


def _header_only_progress(tmp_path: Path) -> Path:
    run_dir = write_run(tmp_path / "header_only")
    (run_dir / "progress.csv").write_text("total_timesteps,mean_episode_reward\n")
    return run_dir


def _no_progress(tmp_path: Path) -> Path:
    run_dir = tmp_path / "no_progress"
    run_dir.mkdir()
    return run_dir


@pytest.mark.parametrize(
    "make_run_dir, message",
    [
        (lambda tmp_path: tmp_path / "missing", "no such run directory"),
        (_no_progress, "has no progress.csv"),
        (_empty_progress, "has no rows yet"),
        (_header_only_progress, "has no rows yet"),
    ],
)
def test_bad_run_dir_is_one_line_error_with_exit_code_2(tmp_path, make_run_dir, message):
    run_dir = make_run_dir(tmp_path)
    result = subprocess.run(
        [sys.executable, "plot.py", str(run_dir), "--out", str(tmp_path / "c.png")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("plot.py: error: ")
    assert message in result.stderr
    assert not (tmp_path / "c.png").exists()


def test_a_glob_of_a_sweep_directory_skips_what_is_not_a_run(tmp_path, capsys):
    runs = [write_run(tmp_path / "sweep" / f"CartPole-v1_seed{seed}", env="CartPole-v1", seed=seed) for seed in (0, 1)]
    (tmp_path / "sweep" / "summary.md").write_text("| env |\n")
    (tmp_path / "sweep" / "tune").mkdir()
    paths = sorted((tmp_path / "sweep").glob("*"))
    assert plot.run_directories(paths) == runs
    assert "skipped 2 path(s) that are not run directories: summary.md, tune" in capsys.readouterr().out
    with pytest.raises(UserError, match="none of the 2 paths given is a run directory"):
        plot.run_directories([tmp_path / "sweep" / "summary.md", tmp_path / "sweep" / "tune"])
    with pytest.raises(UserError, match="has no progress.csv"):
        plot.load_run(plot.run_directories([tmp_path / "sweep" / "tune"])[0])


def test_out_must_be_a_png_so_a_runs_own_files_are_never_written_over(tmp_path):
    run = write_run(tmp_path / "run", env="CartPole-v1", seed=0)
    before = (run / "progress.csv").read_bytes()
    result = subprocess.run([sys.executable, "plot.py", str(run), "--out", str(run / "progress.csv")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "plot.py writes a PNG; give a file name ending in .png" in result.stderr
    assert (run / "progress.csv").read_bytes() == before


def test_the_summary_says_a_final_mean_of_under_100_episodes_is_one(tmp_path):
    # "final 100-episode mean -1298.59" of a Pendulum run of 15 episodes, where train.py said "means of under 100 episodes"
    run_dir = write_run(tmp_path / "few", env="Pendulum-v1", rows=3, evaluated=False)
    lines = (run_dir / "progress.csv").read_text().splitlines()
    rows = [lines[0] + ",episodes"] + [line + f",{5 * index}" for index, line in enumerate(lines[1:], 1)]
    (run_dir / "progress.csv").write_text("\n".join(rows) + "\n")
    group, = plot.group_runs([plot.load_run(run_dir)])
    assert "final mean -19.00 (of under 100 episodes)" in plot.summary_line(group, "")

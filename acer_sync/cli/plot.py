"""Plot learning curves: ``python plot.py RUN_DIR [RUN_DIR ...] --out curves.png --x frames --smooth 5``.

Runs of one env whose configs differ only in ``seed``, ``total_timesteps`` or bookkeeping form a group,
drawn as the seed mean with a min-max band, eval means as markers, one panel per env, a dashed
line at ACER's published score and Baselines' curve where there is one (:mod:`acer_sync.api.scores`). The
panel is framed by the runs: Baselines' curve is drawn only within their x range, and
``--no-reference`` leaves both references out. One summary line per group is printed.

Of several paths, those that are not run directories (no ``progress.csv``) are skipped, so
``plot.py runs/<sweep>/*`` passes over the sweep's ``summary.md`` and Ray Tune's own files.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from acer_sync.api.scores import baselines_curve, game_name, human_normalized, published_acer
from acer_sync.base.config import setting_defaults
from acer_sync.base.errors import UserError
from acer_sync.cli.args import OneLineParser, path

#: Settings that do not change what is learned: the seed, the run length (with a constant learning
#: rate: a schedule is stretched over it, see :func:`group_runs`), and bookkeeping.
IGNORED_FOR_GROUPING = (
    "seed", "total_timesteps", "device", "vec_env", "env_groups", "threads", "compile", "replay_device", "log_interval", "log_seconds",
    "checkpoint_every", "keep_checkpoints", "save_buffer", "max_nonfinite", "env_timeout", "eval_every", "eval_episodes",
    "capture_video", "track", "wandb_project", "wandb_entity",
)  # not eval_greedy: a greedy evaluation's scores are not a sampled one's
#: Settings only a network with memory uses: a feed-forward run's say nothing of it.
MEMORY_SETTINGS = ("lstm_size", "lstm_norm", "replay_state")
#: What a setting that a config.json lacks was: a run written before the setting existed behaved as
#: its default does (``reward_scale`` 1, no observation normalization, ...).
SETTING_DEFAULTS = setting_defaults()
REQUIRED_COLUMNS = ("total_timesteps", "mean_episode_reward")
USED_COLUMNS = (*REQUIRED_COLUMNS, "time_elapsed", "eval_mean", "updates", "episodes")
PUBLISHED_LABEL = "published ACER (PPO paper Table 6, 10M steps)"
BASELINES_LABEL = "Baselines ACER (Atari10M benchmark, 6 runs)"
FRAMES_PER_ATARI_STEP = 4
#: Baselines' gradient updates per agent step: 1 on-policy + 4 replayed per segment of 16 envs x 20
#: steps (the paper's 16 actors and replay ratio 4), to place its curve on the ``updates`` axis.
BASELINES_UPDATES_PER_STEP = (1 + 4) / (16 * 20)
X_LABELS = {
    "steps": "environment steps", "frames": "frames (4 per step on Atari)", "hours": "wall time (hours)",
    "updates": "gradient updates (on- and off-policy)",
}
#: The progress.csv column each x axis other than steps and frames needs.
X_COLUMNS = {"hours": "time_elapsed", "updates": "updates"}
PANEL_INCHES = (8.0, 5.0)
DPI = 100


@dataclass(frozen=True)
class Run:
    """One run directory: its env id, its config, and the progress.csv columns the plot uses."""

    path: Path
    env: str
    config: dict
    columns: dict[str, np.ndarray]


@dataclass(frozen=True)
class Group:
    """Runs of one env whose configs agree on everything but :data:`IGNORED_FOR_GROUPING`."""

    env: str
    settings: dict
    runs: tuple[Run, ...]


def parse_args(argv: list[str], prog: str = "plot.py"):
    parser = OneLineParser(prog=prog, description="Plot learning curves of one or more runs, seeds averaged.")
    parser.add_argument("run_dirs", type=path, nargs="+", metavar="RUN_DIR", help="run directories (config.json and progress.csv)")
    parser.add_argument("--out", type=path, default=Path("curves.png"), help="PNG file to write (default: curves.png)")
    parser.add_argument("--x", choices=tuple(X_LABELS), default="steps", help="x axis (default: steps)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N", help="trailing moving average over N logged points (default: 1, none)")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="leave out the published ACER score and Baselines' curve (drawn by default, clipped to the runs' x range)")
    return parser.parse_args(argv)


def parse_number(text: str) -> float:
    """A CSV cell as a float; an empty cell is NaN."""
    return float(text) if text.strip() else math.nan


def read_progress(csv_path: Path) -> dict[str, np.ndarray]:
    """The columns of ``progress.csv`` that the plot uses; cells missing from a short row are NaN. A
    last line without its newline, a row that a kill cut short (or one being written), is left out,
    as the trainer leaves it out."""
    try:
        with open(csv_path, newline="") as handle:
            lines = handle.read().splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]
        header, *rows = [row for row in csv.reader(lines) if row] or [[]]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(f"cannot read {csv_path}: {getattr(error, 'strerror', None) or error}") from None
    if not rows:
        raise UserError(f"{csv_path} has no rows yet")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise UserError(f"{csv_path} has no {', '.join(missing)} column")
    columns = {}
    for name in (name for name in USED_COLUMNS if name in header):
        index = header.index(name)
        try:
            columns[name] = np.array([parse_number(row[index]) if index < len(row) else math.nan for row in rows])
        except ValueError:
            raise UserError(f"{csv_path}: column {name} holds a value that is not a number") from None
    if not np.isfinite(columns["total_timesteps"]).all():
        raise UserError(f"{csv_path}: column total_timesteps holds a cell that is empty or not finite")
    return columns


def read_config(config_path: Path) -> dict:
    """The ``config`` object of ``config.json``, which must name the env; ``--pipeline auto`` as
    the mode the run's latest session ran (``ran``), which changes what it learns."""
    try:
        payload = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise UserError(f"{config_path.parent} has no config.json") from None
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {config_path}: {getattr(error, 'strerror', None) or error}") from None
    config = payload.get("config") if isinstance(payload, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("env"), str):
        raise UserError(f"{config_path} has no config with an env id")
    ran = payload.get("ran")
    if config.get("pipeline") == "auto" and isinstance(ran, dict) and ran.get("pipeline") in ("serial", "overlap"):
        config = {**config, "pipeline": ran["pipeline"]}
    return config


def load_run(path: Path) -> Run:
    """Read one run directory, with a one-line :class:`UserError` for anything missing or unreadable."""
    if not path.is_dir():
        raise UserError(f"{path} is not a directory" if path.exists() else f"{path}: no such run directory")
    if not (path / "progress.csv").is_file():
        raise UserError(f"{path} has no progress.csv (is it a run directory?)")
    columns = read_progress(path / "progress.csv")
    config = read_config(path / "config.json")
    return Run(path, config["env"], config, columns)


def run_directories(paths: list[Path]) -> list[Path]:
    """``paths`` as given when there is one; of several (a shell glob such as ``runs/<sweep>/*``),
    the run directories, those holding a ``progress.csv``. None among several is a UserError."""
    if len(paths) == 1:
        return paths
    runs = [path for path in paths if (path / "progress.csv").is_file()]
    if not runs:
        raise UserError(f"none of the {len(paths)} paths given is a run directory (with a progress.csv)")
    skipped = [path.name for path in paths if path not in runs]
    if skipped:
        print(f"skipped {len(skipped)} path(s) that are not run directories: {', '.join(skipped)}")
    # a run that has just started (or died before its first row) has its progress.csv without a whole row
    starting = [path for path in runs if not has_a_row(path / "progress.csv")]
    if starting:
        print(f"skipped {len(starting)} run(s) with no row yet: {', '.join(path.name for path in starting)}")
        runs = [path for path in runs if path not in starting]
        if not runs:
            raise UserError(f"none of the {len(paths)} paths given is a run with a row yet")
    return runs


def has_a_row(csv_path: Path) -> bool:
    """Whether ``progress.csv`` holds a whole row under its header (an unreadable one is left for
    :func:`read_progress` to name)."""
    try:
        with open(csv_path, newline="") as handle:
            return sum(1 for line in handle if line.endswith("\n") and line.strip()) >= 2
    except (OSError, UnicodeDecodeError):
        return True


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by env and config, ignoring :data:`IGNORED_FOR_GROUPING` (but not the run's
    length under a learning-rate schedule, which it stretches), and :data:`MEMORY_SETTINGS` for
    networks without memory; first-seen order.
    A setting a config lacks counts as its default (:data:`SETTING_DEFAULTS`)."""
    groups: dict[str, Group] = {}
    for run in runs:
        config = {**SETTING_DEFAULTS, **run.config}
        evaluated = bool(np.isfinite(run.columns.get("eval_mean", np.array([]))).any())  # --eval-every may change on a resume
        ignored = (*IGNORED_FOR_GROUPING, "env", *(() if config["network"] in ("lstm", "cnn_lstm") else MEMORY_SETTINGS),
                   *(() if config["eval_every"] or evaluated else ("eval_greedy",)))  # it means nothing without evaluations
        if config["lr_schedule"] != "constant":  # the rate at each step depends on the run's length
            ignored = tuple(name for name in ignored if name != "total_timesteps")
        settings = {key: value for key, value in config.items() if key not in ignored}
        key = json.dumps([run.env, settings], sort_keys=True, default=str)
        previous = groups.get(key)
        groups[key] = Group(run.env, settings, (previous.runs if previous else ()) + (run,))
    return list(groups.values())


def distinguishing_text(group: Group, groups: list[Group]) -> str:
    """``key=value`` for each config key on which ``group`` differs from another group of its env."""
    rivals = [other.settings for other in groups if other.env == group.env]
    # group_runs fills in every Config setting; any other key a config lacks distinguishes nothing.
    keys = sorted({key for other in rivals for key in other.keys() & group.settings.keys() if other[key] != group.settings[key]})
    return " ".join(f"{key}={format_value(group.settings.get(key))}" for key in keys)


def format_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def seeds_text(group: Group) -> str:
    """``(2 seeds)``; ``(2 runs, 1 seed)`` where runs share a seed (a rerun, or a copy of a run)."""
    seeds = len({run.config.get("seed", SETTING_DEFAULTS["seed"]) for run in group.runs})
    text = f"{seeds} seed{'' if seeds == 1 else 's'}"
    return f"({text})" if seeds == len(group.runs) else f"({len(group.runs)} runs, {text})"


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` is an Atari game (4 frames per agent step)."""
    return "NoFrameskip" in env_id or env_id.startswith("ALE/") or game_name(env_id) is not None


def x_values(run: Run, axis: str) -> np.ndarray:
    """The x coordinate of each logged row: steps, frames (x4 on Atari), wall-clock hours or updates."""
    if axis == "hours":
        return run.columns["time_elapsed"] / 3600
    if axis == "updates":
        return run.columns["updates"]
    steps = run.columns["total_timesteps"]
    return steps * FRAMES_PER_ATARI_STEP if axis == "frames" and is_atari_id(run.env) else steps


def eval_means(run: Run) -> np.ndarray:
    """The eval_mean column, all NaN when the run never evaluated."""
    return run.columns.get("eval_mean", np.full(len(run.columns["total_timesteps"]), math.nan))


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` points, skipping NaNs; NaN where the window has no number."""
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - window, 0)
    in_window = counts[end] - counts[start]
    return np.where(in_window > 0, (sums[end] - sums[start]) / np.maximum(in_window, 1), math.nan)


def seed_band(group: Group, axis: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """x grid, mean, min and max across seeds of the smoothed training curve, on the x range all seeds cover."""
    curves = []
    for run in group.runs:
        x, y = x_values(run, axis), smooth(run.columns["mean_episode_reward"], window)
        keep = np.isfinite(x) & np.isfinite(y)
        order = np.argsort(x[keep], kind="stable")
        if order.size:
            curves.append((x[keep][order], y[keep][order]))
    if not curves:
        return None
    start, end = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    grid = grid[(grid >= start) & (grid <= end)]
    if grid.size == 0:
        return None
    values = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def last_finite(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def summary_line(group: Group, text: str) -> str:
    """Final 100-episode mean (mean over seeds, each at the last step every seed reached, where the
    curve ends; said to be of fewer episodes where a seed had fewer), best eval mean, steps and
    wall time (longest seed)."""
    ends = [int(np.nanmax(run.columns["total_timesteps"])) for run in group.runs]
    common = min(ends)
    finals = np.array([last_finite(run.columns["mean_episode_reward"][run.columns["total_timesteps"] <= common])
                       for run in group.runs])
    # the episodes behind each final mean: under 100 is a mean of those (train.py's summary says so too)
    episodes = [last_finite(run.columns["episodes"][run.columns["total_timesteps"] <= common]) if "episodes" in run.columns
                else math.inf for run in group.runs]
    fewer = any(count < 100 for count, value in zip(episodes, finals) if math.isfinite(value))
    finals = finals[np.isfinite(finals)]
    final = float(np.mean(finals)) if finals.size else math.nan
    evals = np.concatenate([eval_means(run) for run in group.runs])
    best_eval = float(np.max(evals[np.isfinite(evals)])) if np.isfinite(evals).any() else math.nan
    hours = [last_finite(run.columns["time_elapsed"]) / 3600 for run in group.runs if "time_elapsed" in run.columns]
    parts = [
        (f"final mean {final:.2f} (of under 100 episodes)" if fewer else f"final 100-episode mean {final:.2f}") if finals.size
        else "final 100-episode mean n/a",
        f"best eval {best_eval:.2f}" if math.isfinite(best_eval) else "best eval n/a",
        f"steps {common:,}" + ("" if common == max(ends) else f" (where every seed has rows; the longest {max(ends):,})"),
        f"wall {max(hours):.2f} h" if hours and math.isfinite(max(hours)) else "wall n/a",
    ]
    if is_atari_id(group.env):
        normalized = human_normalized(group.env, final) if finals.size else None
        parts.append(f"human-normalized {normalized:.3f}" if normalized is not None else "human-normalized n/a")
    return f"{' '.join(filter(None, (group.env, text, seeds_text(group))))}: {', '.join(parts)}"


def x_range(runs: list[Run], axis: str) -> tuple[float, float] | None:
    """The smallest and largest x of any logged row of ``runs``, or None if none has a finite x."""
    xs = np.concatenate([x_values(run, axis) for run in runs])
    xs = xs[np.isfinite(xs)]
    return (float(xs.min()), float(xs.max())) if xs.size else None


def baselines_reference(env: str, axis: str, within: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Baselines' curve for ``env`` on ``axis``, only its points inside ``within`` (the runs' x range),
    so that a short run is not drawn squeezed against a 10M-step reference; None if nothing is left."""
    reference = baselines_curve(env)
    if reference is None or axis == "hours" or within is None:
        return None
    scale = {"steps": 1, "frames": FRAMES_PER_ATARI_STEP, "updates": BASELINES_UPDATES_PER_STEP}[axis]
    x, y = np.array(reference[0], dtype=float) * scale, np.array(reference[1], dtype=float)
    inside = (x >= within[0]) & (x <= within[1])
    return (x[inside], y[inside]) if inside.any() else None


def build_figure(groups: list[Group], texts: list[str], axis: str, window: int, reference: bool = True):
    """One panel per env: seed-mean curves with min-max bands, eval markers and, with ``reference``,
    the published ACER line and Baselines' curve within the runs' x range."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("plot.py draws with matplotlib, which is not installed: pip install matplotlib "
                        "(or the plot extra: pip install \".[plot]\")") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(group.env for group in groups))
    ncols = min(len(envs), 2)
    nrows = math.ceil(len(envs) / ncols)
    figure, axes = plt.subplots(nrows, ncols, figsize=(PANEL_INCHES[0] * ncols, PANEL_INCHES[1] * nrows), dpi=DPI, squeeze=False)
    for unused in axes.flat[len(envs):]:
        unused.set_visible(False)
    panels = dict(zip(envs, axes.flat))
    for index, (group, text) in enumerate(zip(groups, texts)):
        panel, color, label = panels[group.env], f"C{index % 10}", f"{text or group.env} {seeds_text(group)}"
        band = seed_band(group, axis, window)
        if band is not None:
            grid, mean, low, high = band
            lone = np.isfinite(mean).sum() == 1  # a run of one row so far: a line of one point draws nothing
            panel.plot(grid, mean, color=color, label=label, marker="o" if lone else None, markersize=4)
            panel.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
        eval_x = np.concatenate([x_values(run, axis)[np.isfinite(eval_means(run))] for run in group.runs])
        eval_y = np.concatenate([eval_means(run)[np.isfinite(eval_means(run))] for run in group.runs])
        if eval_y.size:
            panel.plot(eval_x, eval_y, "o", color=color, markersize=4, label=f"{label} eval")
    for env, panel in panels.items():
        published = published_acer(env) if reference else None
        if published is not None:
            panel.axhline(published, color="gray", linestyle="--", linewidth=1, label=PUBLISHED_LABEL)
        within = x_range([run for group in groups if group.env == env for run in group.runs], axis)
        curve = baselines_reference(env, axis, within) if reference else None
        if curve is not None:
            panel.plot(*curve, "s--", color="black", markersize=3, linewidth=0.8, label=BASELINES_LABEL)
        panel.set(title=env, xlabel=X_LABELS[axis], ylabel="episode return (train: mean of last 100)")
        panel.grid(alpha=0.3)
        panel.legend(fontsize="small")
    figure.tight_layout()
    return figure


def draw(groups: list[Group], texts: list[str], axis: str, window: int, out: Path, reference: bool = True) -> None:
    """Write :func:`build_figure`'s figure to ``out`` as a PNG."""
    figure = build_figure(groups, texts, axis, window, reference)  # a one-line error without matplotlib
    import matplotlib.pyplot as plt

    try:
        figure.savefig(out, format="png")
    except (OSError, ValueError) as error:
        raise UserError(f"cannot write {out}: {getattr(error, 'strerror', None) or error}") from None
    finally:
        plt.close(figure)


def main(argv: list[str] | None = None, prog: str = "plot.py") -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    if args.smooth < 1:
        raise UserError("--smooth must be >= 1")
    if args.out.suffix.lower() != ".png":  # never a run's progress.csv or config.json, written over
        raise UserError(f"--out {args.out}: plot.py writes a PNG; give a file name ending in .png")
    if not args.out.parent.is_dir():
        raise UserError(f"cannot write {args.out}: folder {args.out.parent} does not exist")
    runs = [load_run(path) for path in run_directories(args.run_dirs)]
    column = X_COLUMNS.get(args.x)
    lacking = [run for run in runs if column is not None and column not in run.columns]
    if lacking:
        raise UserError(f"{lacking[0].path}/progress.csv has no {column} column, so --x {args.x} cannot place it; use --x steps")
    groups = group_runs(runs)
    texts = [distinguishing_text(group, groups) for group in groups]
    draw(groups, texts, args.x, args.smooth, args.out, args.reference)
    for group, text in zip(groups, texts):
        print(summary_line(group, text))
    print(f"wrote {args.out}")
    return 0


"""The end-of-sweep summary: a Markdown table per env, printed and written as ``summary.md``.

For each trial: its final 100-episode mean (the last logged ``mean_episode_reward``) and its best
evaluation; for each setting of the grid, the mean across seeds; on Atari, the human-normalized
score of each (Mnih et al. 2015's random and human scores, :mod:`acer_sync.api.scores`). A trial that
did not finish (an interrupted sweep's interim summary, or a failed trial) shows how far it got,
and is left out of the means: its scores are from fewer steps than its seeds'.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from acer_sync.api.scores import human_normalized
from acer_sync.sweeps.launch import TrialOutcome
from acer_sync.sweeps.spec import Sweep
from acer_sync.training.checkpoint import atomic_write_text

SUMMARY_FILE = "summary.md"


@dataclass(frozen=True)
class TrialScores:
    name: str
    env: str
    seed: int
    steps: int
    total_steps: int
    final_mean: float
    best_eval: float
    status: str


def finite_values(rows: list[dict], column: str) -> list[float]:
    values = []
    for row in rows:
        try:
            value = float(row.get(column) or "nan")
        except ValueError:
            continue
        if math.isfinite(value):
            values.append(value)
    return values


def trial_scores(run_dir: Path, name: str, env: str, seed: int, total_steps: int, status: str) -> TrialScores:
    """Scores from the trial's ``progress.csv``; NaN where it logged none."""
    try:
        with open(run_dir / "progress.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        rows = []
    steps, means, evals = finite_values(rows, "total_timesteps"), finite_values(rows, "mean_episode_reward"), finite_values(rows, "eval_mean")
    return TrialScores(
        name, env, seed, int(steps[-1]) if steps else 0, total_steps, means[-1] if means else math.nan,
        max(evals) if evals else math.nan, status,
    )


def number(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}"


def normalized(env: str, score: float) -> str:
    value = human_normalized(env, score) if math.isfinite(score) else None
    return "n/a" if value is None else f"{value:.3f}"


def mean(values: list[float]) -> float:
    finite = [value for value in values if math.isfinite(value)]
    return sum(finite) / len(finite) if finite else math.nan


def summary_markdown(sweep: Sweep, sweep_dir: Path, outcomes: list[TrialOutcome]) -> str:
    """One table per env: a row per trial, then per grid setting the mean across seeds; then why
    each failed trial failed."""
    status = {outcome.name: outcome.status for outcome in outcomes}
    scores = [
        trial_scores(sweep_dir / trial.name, trial.name, trial.config.env, trial.config.seed, trial.config.total_timesteps,
                     status.get(trial.name, "unfinished"))
        for trial in sweep.trials
    ]
    lines = [f"# Sweep {sweep.name}", ""]
    for env in dict.fromkeys(score.env for score in scores):
        atari = human_normalized(env, 0.0) is not None
        header = ["trial", "status", "steps", "final 100-episode mean", "best eval"] + (["human-normalized"] if atari else [])
        lines += [f"## {env}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        groups: dict[str, list[TrialScores]] = {}
        for score in (score for score in scores if score.env == env):
            steps = f"{score.steps:,}" if score.status == "finished" else f"{score.steps:,} of {score.total_steps:,}"
            cells = [score.name, score.status, steps, number(score.final_mean), number(score.best_eval)]
            lines.append("| " + " | ".join(cells + ([normalized(env, score.final_mean)] if atari else [])) + " |")
            groups.setdefault(score.name.replace(f"_seed{score.seed}", "_seeds"), []).append(score)
        for group, members in groups.items():
            finished = [m for m in members if m.status == "finished"]
            final, best = mean([m.final_mean for m in finished]), mean([m.best_eval for m in finished])
            label = f"mean of {len(finished)} seeds"
            if len(finished) < len(members):
                label = f"mean of {len(finished)} of {len(members)} seeds: those not finished are left out"
            cells = [f"**{group}: {label}**", "", "", number(final), number(best)]
            lines.append("| " + " | ".join(cells + ([normalized(env, final)] if atari else [])) + " |")
        lines.append("")
    failed = [outcome for outcome in outcomes if outcome.status == "failed" and outcome.error]
    if failed:  # why, where the table says only "failed"
        lines += ["## Failed trials", "", *(f"- {outcome.name}: {outcome.error}" for outcome in failed), ""]
    return "\n".join(lines)


def write_summary(sweep: Sweep, sweep_dir: Path, outcomes: list[TrialOutcome]) -> Path:
    """Print the summary and write it as ``summary.md`` beside the trials (atomically; a
    :class:`WriteFailed` if it cannot); returns its path."""
    text = summary_markdown(sweep, sweep_dir, outcomes)
    print(text, flush=True)
    path = sweep_dir / SUMMARY_FILE
    atomic_write_text(path, text)
    return path

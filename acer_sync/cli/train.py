"""Train ACER: ``python train.py --env PongNoFrameskip-v4``. See ``--help`` for every flag."""

from __future__ import annotations

import math
import shlex
import sys

from acer_sync.api import runs as api
from acer_sync.base.config_file import load_config_file
from acer_sync.base.errors import UserError, exit_code, say
from acer_sync.base.outcome import Outcome, Stop
from acer_sync.cli.args import OneLineParser, add_config_flags, config_overrides, finite_float, path
from acer_sync.cli.plot import read_progress
from acer_sync.training.callbacks import StopTrainingOnReward
from acer_sync.training.checkpoint import has_checkpoint, latest_checkpoint

#: What ``train.py`` without ``--env`` says.
ENV_REQUIRED = (
    "--env is required: a gymnasium id such as --env CartPole-v1 (or PongNoFrameskip-v4, or module:EnvId for "
    "your own); --resume RUN_DIR continues a run instead"
)


def build_parser(prog: str = "train.py") -> OneLineParser:
    """train's parser: every flag in its ``--help`` group (the docs' flag tables are drawn from it)."""
    parser = OneLineParser(
        prog=prog, usage="%(prog)s --env ENV [flags], or %(prog)s --resume RUN_DIR [flags]",
        description="Train ACER (Wang et al. 2017) on a gymnasium env, or on your own with --env "
        "module:EnvId. Atari ids get Baselines' defaults; other envs (CartPole-v1, Acrobot-v1, "
        "LunarLander-v3 with pip install \"gymnasium[box2d]\", ...) get the classic-control preset. "
        "acer_sync/data/envs/<EnvId>.yaml overrides the preset, --config FILE.yaml overrides both, and every "
        "flag overrides all three. Example: %(prog)s --env CartPole-v1",
    )
    groups = add_config_flags(parser)
    run = groups["run and logging"]
    run.add_argument("--config", type=path, default=None, metavar="FILE.yaml", help="settings by their config names, as in configs/*.yaml (a flag overrides the file)")
    run.add_argument("--run-dir", default=None, help="output directory (default: runs/<env>__<seed>__<time>)")
    run.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--stop-at-reward", type=finite_float, default=None, metavar="X",
        help="stop with a checkpoint, and exit 0, once the mean return reaches X: the evaluation mean where the run "
        "evaluates (--eval-every), else the mean of the last 100 training episodes (raw scores)",
    )
    return parser


def parse_args(argv: list[str], prog: str = "train.py"):
    return build_parser(prog).parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "train.py") -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv, prog)
    settings = config_overrides(args)
    if args.config is not None:
        settings = {**load_config_file(args.config), **settings}
    env = settings.pop("env", None)
    if env is None and args.resume is None:
        raise UserError(ENV_REQUIRED)
    callbacks = [StopTrainingOnReward(args.stop_at_reward)] if args.stop_at_reward is not None else []
    outcome = api.run(
        env, run_dir=args.run_dir, resume=args.resume, progress_bar=not args.no_progress, callbacks=callbacks,
        command=[prog, *argv], **settings,
    )
    line = summary_line(outcome, prog)
    if line:
        say(line)
    return exit_code(outcome, prog)


def summary_line(outcome: Outcome, prog: str) -> str:
    """The line a run ends with: how it ended, its steps and wall time, the final and best 100-episode
    means of ``progress.csv``, and the checkpoint to play or continue; empty where no checkpoint was
    written (the run did not start)."""
    if not has_checkpoint(outcome.run_dir):
        return ""
    checkpoint = latest_checkpoint(outcome.run_dir)
    try:
        columns = read_progress(outcome.run_dir / "progress.csv")
    except UserError:  # no row was written (a run stopped before its first)
        columns = {}
    rewards = columns.get("mean_episode_reward", [])
    episodes = columns.get("episodes", [math.inf] * len(rewards))  # a progress.csv without the column: taken as full
    means = [value for value in rewards if math.isfinite(value)]
    full = [value for value, count in zip(rewards, episodes) if math.isfinite(value) and count >= 100]
    times = [value for value in columns.get("time_elapsed", []) if math.isfinite(value)]
    parts = [f"{outcome.timesteps:,} steps" + (f" in {format_seconds(times[-1])}" if times else "")]
    if full:  # the episode count only grows: the last row is one of them
        parts.append(f"mean return {full[-1]:.2f} at the end, best {max(full):.2f} (100-episode means)")
    elif means:
        parts.append(f"mean return {means[-1]:.2f} at the end, best {max(means):.2f} (means of under 100 episodes)")
    else:
        parts.append("no episode ended")
    evals = [value for value in columns.get("eval_mean", []) if math.isfinite(value)]
    if evals:
        parts.append(f"best evaluation {max(evals):.2f}")
    how = "finished" if outcome.finished else (outcome.message if outcome.stop is Stop.INTERRUPTED and outcome.message
                                               else outcome.stop.value)
    run_dir = shlex.quote(str(outcome.run_dir))  # a command to paste: a directory of "my run" quoted
    then = (f"play it: {prog.replace('train', 'play')} {run_dir}" if outcome.finished
            else f"continue it: {prog} --resume {run_dir}")
    held = outcome.checkpoint_step
    of_step = f", of step {held:,}" if held is not None and held != outcome.timesteps else ""  # a second signal: the last one saved
    return f"{prog}: {how}: {'; '.join(parts)}; checkpoint {checkpoint}{of_step} ({then})"


def format_seconds(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s`` or ``2 h 07 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"

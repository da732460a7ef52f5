"""Train ACER: ``python train.py --env PongNoFrameskip-v4``. See ``--help`` for every flag."""

from __future__ import annotations

import sys
from pathlib import Path

from acer_sync.api import runs as api
from acer_sync.api.cli import OneLineParser, add_config_flags, config_overrides, finite_float
from acer_sync.base.config import Config
from acer_sync.base.config_file import load_config_file
from acer_sync.base.errors import exit_code, run_cli
from acer_sync.training.callbacks import StopTrainingOnReward


def parse_args(argv: list[str]):
    parser = OneLineParser(
        prog="train.py",
        description="Train ACER (Wang et al. 2017) on a gymnasium env, or on your own with --env "
        "module:EnvId. Atari ids get Baselines' defaults; other envs (CartPole-v1, Acrobot-v1, "
        "LunarLander-v3 with pip install \"gymnasium[box2d]\", ...) get the classic-control preset. "
        "configs/envs/<EnvId>.yaml overrides the preset, --config FILE.yaml overrides both, and every "
        "flag overrides all three.",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="FILE.yaml", help="settings by their config names, as in configs/*.yaml (a flag overrides the file)")
    parser.add_argument("--run-dir", type=Path, default=None, help="output directory (default: runs/<env>__<seed>__<time>)")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--stop-at-reward", type=finite_float, default=None, metavar="X",
        help="stop with a checkpoint, and exit 0, once the mean return reaches X: the evaluation mean where the run "
        "evaluates (--eval-every), else the mean of the last 100 training episodes (raw scores)",
    )
    add_config_flags(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    settings = config_overrides(args)
    if args.config is not None:
        settings = {**load_config_file(args.config), **settings}
    env = settings.pop("env", None if args.resume is not None else Config.env)
    callbacks = [StopTrainingOnReward(args.stop_at_reward)] if args.stop_at_reward is not None else []
    outcome = api.run(
        env, run_dir=args.run_dir, resume=args.resume, progress_bar=not args.no_progress, callbacks=callbacks,
        command=["train.py", *argv], **settings,
    )
    return exit_code(outcome, "train.py")


if __name__ == "__main__":
    run_cli(main, "train.py")

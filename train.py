"""Train ACER: ``python train.py --env PongNoFrameskip-v4``. See ``--help`` for every flag."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from acer_sync.checkpoint import load_checkpoint
from acer_sync.cli import OneLineParser, add_config_flags, config_overrides
from acer_sync.config import Config, build_config, validate
from acer_sync.config_file import load_config_file
from acer_sync.errors import UserError, exit_code, run_cli
from acer_sync.learn import RESUMABLE_CHANGES, Trainer, network_arch
from acer_sync.networks import canonical_spec
from acer_sync.run_metadata import write_config
from atari.envs import env_info


def parse_args(argv: list[str]):
    parser = OneLineParser(
        prog="train.py",
        description="Train ACER (Wang et al. 2017) on a gymnasium env. Atari ids get Baselines' "
        "defaults; other envs (CartPole-v1, Acrobot-v1, LunarLander-v3, ...) get the classic-control "
        "preset. --config FILE.yaml overrides the preset, and every flag overrides both.",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="FILE.yaml", help="settings by their config names, as in configs/*.yaml (a flag overrides the file)")
    parser.add_argument("--run-dir", type=Path, default=None, help="output directory (default: runs/<env>__<seed>__<time>)")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_config_flags(parser)
    return parser.parse_args(argv)


def default_run_dir(config: Config) -> Path:
    name = config.env.replace("/", "-")
    return Path("runs") / f"{name}__{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def refuse_traversal(path: Path, flag: str) -> None:
    if ".." in path.parts:
        raise UserError(f"{flag} {path} contains '..'; give the run directory without parent references")


def prepare_run_dir(run_dir: Path) -> Path:
    refuse_traversal(run_dir, "--run-dir")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} exists and is not a directory")
    if (run_dir / "progress.csv").exists() or (run_dir / "checkpoints").exists():
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick another --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UserError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
    return run_dir


def resumed_config(run_dir: Path, overrides: dict) -> tuple[Config, dict]:
    refuse_traversal(run_dir, "--resume")
    if not run_dir.is_dir():
        raise UserError(f"--resume {run_dir}: no such run directory")
    payload = load_checkpoint(run_dir)
    try:
        saved = Config(**payload["config"])
    except (KeyError, TypeError):
        raise UserError(f"the checkpoint in {run_dir} carries no valid config") from None
    conflicts = [
        f"--{name.replace('_', '-')} {value} (the run used {getattr(saved, name)})"
        for name, value in overrides.items()
        if name not in RESUMABLE_CHANGES and value != getattr(saved, name)
    ]
    if conflicts:
        raise UserError("--resume conflicts with the saved config: " + "; ".join(conflicts))
    allowed = {name: value for name, value in overrides.items() if name in RESUMABLE_CHANGES}
    return dataclasses.replace(saved, **allowed), payload


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    overrides = config_overrides(args)
    if args.config is not None:
        overrides = {**load_config_file(args.config), **overrides}
    if args.resume is not None:
        if args.run_dir is not None and args.run_dir != args.resume:
            raise UserError("give either --resume RUN_DIR or --run-dir, not both")
        config, payload = resumed_config(args.resume, overrides)
        run_dir = args.resume
        info = env_info(config.env)
    else:
        info = env_info(overrides.get("env", Config.env))
        config = build_config(info.atari, overrides, continuous=info.continuous)
        payload = None
    problems = validate(config)
    if problems:
        raise UserError("; ".join(problems))
    if info.atari and config.normalize_obs:
        raise UserError("--normalize-obs is for vector observations; Atari frames are scaled by 1/255 instead")
    network_arch(info, config)
    if payload is not None:
        expected = Trainer.model_spec(info, config)
        try:
            saved_spec = canonical_spec(payload.get("model_spec"))
        except (KeyError, TypeError, ValueError, AttributeError):
            saved_spec = payload.get("model_spec")
        if saved_spec != expected or payload.get("env_id") != config.env:
            raise UserError(
                f"the checkpoint in {run_dir} was made for {payload.get('env_id')} with network "
                f"{payload.get('model_spec')}, not {config.env} with {expected}"
            )
    else:
        run_dir = prepare_run_dir(args.run_dir or default_run_dir(config))
        write_config(run_dir, config, ["train.py", *argv])
    print(f"run directory: {run_dir}", flush=True)
    trainer = Trainer(config, info, run_dir, resume=payload, progress_bar=not args.no_progress)
    return exit_code(trainer.train(), "train.py")


if __name__ == "__main__":
    run_cli(main, "train.py")

"""Watch or record a trained agent: ``python play.py RUN_DIR_OR_CHECKPOINT --episodes 5 --video pong.mp4``.

``--num-envs 20 --episodes 100`` plays the games 20 at a time, in the vector env the run trained
in, each env a fixed share of the games, as training's evaluation plays them (their scores are
printed in the order the games end).

``--actions steps.csv`` logs every agent step: the game, the step (counted from 0 over all the
games played; the video's frame ``step + 1`` is the one after it, frame 0 the reset's), the action
the env was given and its name, whether it was forced after a lost life rather than chosen by the
agent, the raw reward, the lives left, and whether the game ended there (on that step, the lives are
the next game's: the vector env resets in the same step).
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from acer_sync.api.env_callables import is_callable_env
from acer_sync.api.policy import Policy, load
from acer_sync.base.config import MAX_SEED, PRECISIONS
from acer_sync.base.errors import UserError, WriteFailed
from acer_sync.base.log import number_text
from acer_sync.cli.args import OneLineParser, path
from acer_sync.rollout import evaluation
from acer_sync.rollout.evaluation import EnvStep, evaluate
from acer_sync.rollout.video import VideoRecorder, check_renders, render_headless, video_env
from acer_sync.training.signals import GracefulStop
from atari.envs import EnvInfo, VecEnv, choose_backend, env_info


def parse_args(argv: list[str], prog: str = "play.py"):
    parser = OneLineParser(prog=prog, description="Play full games with a checkpoint and print the raw scores.")
    parser.add_argument("checkpoint", type=path, help="a run directory (its latest checkpoint) or a checkpoint file")
    parser.add_argument("--episodes", type=int, default=5, help="full games to play (default: 5)")
    parser.add_argument("--num-envs", type=int, default=1,
                        help="envs playing the games at once, in the run's vector env, each a fixed share of them, as "
                             "training's evaluation plays (default: 1; --video, --actions and --render need one)")
    parser.add_argument("--video", type=path, default=None, help="write an mp4 of every game played to this file (FILE.mp4)")
    parser.add_argument("--actions", type=path, default=None,
                        help="write one CSV row per agent step to this file (FILE.csv: game, step, action, forced, reward, lives, ...)")
    parser.add_argument("--greedy", action="store_true", help="take argmax actions instead of sampling from the policy")
    parser.add_argument("--render", action="store_true", help="show the game in a window (needs a display)")
    parser.add_argument("--seed", type=int, default=0, help="env seed (default: 0)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu", help="where the network runs (default: cpu)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="what the network computes in (default: the run's, as it acted in training)")
    return parser.parse_args(argv)


def play_backend(info: EnvInfo, vec_env: str, num_envs: int, render: bool) -> str:
    """The backend play.py plays on: the run's, as its evaluations did (for Atari, ale-py's, whose
    no-op starts differ from gymnasium's); one env of another backend, or one rendered on screen,
    in this process (``sync``: the same games, without a worker process to start)."""
    backend = choose_backend(info, vec_env)
    return "sync" if num_envs == 1 and (backend != "ale" or render) else backend


def policy_env(policy: Policy, checkpoint: Path) -> EnvInfo:
    """The env the policy was trained on."""
    if is_callable_env(policy.env_id):
        raise UserError(
            f"{checkpoint} was trained on an env that a Python callable makes ({policy.env_id.split('/', 1)[1]}), "
            "which play.py cannot build; play it from Python with acer_sync.load(RUN_DIR).predict(observation)"
        )
    return env_info(policy.env_id, policy.env_kwargs, policy.legacy_images)  # acer_sync.load checked that the network fits it


def exact(value: np.floating) -> str:
    """The shortest decimal that reads back as ``value`` in its own precision (``1`` for 1.0)."""
    return np.format_float_positional(value, trim="-")


class StepLog:
    """``--actions``: one CSV row per agent step of play.py's one env (:class:`EnvStep`)."""

    COLUMNS = ("game", "step", "action", "action_name", "forced", "reward", "lives", "game_over")

    def __init__(self, handle, action_names: list[str], action_start: int = 0):
        self.writer = csv.writer(handle)
        self.writer.writerow(self.COLUMNS)
        self.action_names = action_names
        self.action_start = action_start  # Discrete(n, start): the env's action a is the names' a - start
        self.game, self.steps = 1, 0

    def __call__(self, step: EnvStep | None) -> None:
        if step is None:  # the reset
            return
        action = step.actions[0]
        if np.ndim(action):  # a Box action
            text, name = " ".join(exact(value) for value in action), ""
        else:
            text, index = str(int(action)), int(action) - self.action_start
            name = self.action_names[index] if 0 <= index < len(self.action_names) else ""
        self.writer.writerow([self.game, self.steps, text, name, int(step.forced[0]), exact(step.raw_rewards[0]),
                              int(step.lives[0]), int(step.game_over[0])])
        self.steps += 1
        self.game += int(step.game_over[0])


def main(argv: list[str] | None = None, prog: str = "play.py") -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    if args.episodes < 1:
        raise UserError("--episodes must be >= 1")
    if args.num_envs < 1:
        raise UserError("--num-envs must be >= 1")
    if args.seed < 0:
        raise UserError("--seed must be >= 0")
    if args.seed > MAX_SEED:  # torch's generator overflowed at 2**64, a traceback
        raise UserError(f"--seed must be <= {MAX_SEED} (2**32 - 1, as for train.py)")
    recording = [flag for flag, value in (("--video", args.video), ("--actions", args.actions), ("--render", args.render)) if value]
    if args.num_envs > 1 and recording:
        raise UserError(f"{recording[0]} records one env and cannot be combined with --num-envs {args.num_envs}")
    if args.render and sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise UserError("--render needs a display, and none was found (DISPLAY is not set); record with --video FILE instead")
    # Only files of their own kinds: never a run's checkpoint, progress.csv or config.json, or each other.
    if args.video is not None and args.video.suffix.lower() != ".mp4":
        raise UserError(f"--video writes an mp4: give a file name ending in .mp4, got {args.video}")
    if args.actions is not None and (args.actions.suffix.lower() != ".csv" or args.actions.name.lower() == "progress.csv"):
        raise UserError(f"--actions writes a CSV of its own: give a file name ending in .csv other than a run's "
                        f"progress.csv, got {args.actions}")
    for flag, target in (("--video", args.video), ("--actions", args.actions)):
        if target is not None and target.exists() and not target.is_file():  # found out only after every game
            raise UserError(f"{flag} {target} is a directory (or another kind of file); give the name of a file to write")
    if args.video is not None and not args.video.parent.is_dir():
        raise UserError(f"cannot write video {args.video}: folder {args.video.parent} does not exist")
    if args.actions is not None and not args.actions.parent.is_dir():
        raise UserError(f"cannot write {args.actions}: folder {args.actions.parent} does not exist")
    if args.video is not None and not args.render:
        render_headless()  # before the env below first imports MuJoCo
    policy = load(args.checkpoint, args.device, args.precision)
    info = policy_env(policy, args.checkpoint)
    model, device = policy.model, policy.device

    if args.video is not None:
        check_renders(info)  # a missing package or no headless OpenGL, in one line with what to install
        env = video_env(info)
    else:
        try:
            num_envs = min(args.num_envs, args.episodes)  # an env with no game to play is not started
            env = VecEnv(info, num_envs, play_backend(info, policy.vec_env, num_envs, args.render),
                         render_mode="human" if args.render else None)
        except gym.error.DependencyNotInstalled as error:
            raise UserError(f"rendering {info.env_id} needs a missing package: {error}") from None
    recorder = None if args.video is None else VideoRecorder(env, args.video)
    # The steps are written beside their file and renamed over it once every game was played, as
    # the video is: a failed play leaves neither, and whatever was there before stays.
    actions_part = None if args.actions is None else args.actions.with_name(f".{args.actions.name}.{os.getpid()}.tmp")
    log_file = None
    scores: list[float] = []
    try:
        listeners = [recorder] if recorder is not None else []
        if actions_part is not None:
            try:
                log_file = open(actions_part, "w", newline="")
            except OSError as error:
                raise UserError(f"cannot write {args.actions}: {error.strerror}") from None
            listeners.append(StepLog(log_file, list(info.action_names), info.action_start))

        def on_step(step: EnvStep | None) -> None:
            try:
                for listener in listeners:
                    listener(step)
            except OSError as error:
                raise WriteFailed(args.actions, error) from None

        def on_score(score: float) -> None:  # said as each game ends: a 100-game Pong evaluation takes minutes
            scores.append(score)
            print_line(f"episode {len(scores)}: score {number_text(float(score))}")

        # A first SIGINT or SIGTERM ends the games after the env step it came in, as it ends a
        # training's iteration, so the games said are the games counted (a KeyboardInterrupt raised
        # where it came could fall between a game's count and its line); a second one interrupts at once.
        with GracefulStop() as stop:
            evaluate(
                model, env, args.episodes, device, greedy=args.greedy, seed=args.seed,
                generator=torch.Generator(device=device).manual_seed(args.seed),
                on_step=on_step if listeners else None, precision=policy.precision, on_score=on_score,
                cancelled=lambda: stop.stopped() is not None,
            )
        if stop.stopped() is not None:
            raise KeyboardInterrupt  # the games said are the ones counted: their mean, then "interrupted"
        if recorder is not None:
            recorder.finish()
        if log_file is not None:
            try:
                log_file.close()
                os.replace(actions_part, args.actions)
            except OSError as error:
                raise WriteFailed(args.actions, error) from None
    except KeyboardInterrupt:  # the games played so far are not lost: their mean, then "interrupted"
        if scores:
            print_line(mean_line(scores) + f" (interrupted; {args.episodes} asked for)")
        raise
    finally:
        if recorder is not None:
            recorder.discard()
        if log_file is not None and not log_file.closed:
            try:
                log_file.close()
            except OSError:
                pass
        if actions_part is not None:
            actions_part.unlink(missing_ok=True)
        env.close()
    cut = (f" (a game went on for {evaluation.MAX_GAME_STEPS:,} steps, its score so far counted, and ended the games; "
           f"{args.episodes} asked for)") if len(scores) < args.episodes else ""
    print_line(mean_line(scores) + cut)
    if args.video is not None:
        print_line(f"video: {args.video} ({recorder.frames} frames at {recorder.fps:g} fps)")
    if args.actions is not None:
        print_line(f"actions: {args.actions} (one row per agent step)")
    return 0


def print_line(line: str) -> None:
    """A line of play.py's, flushed (scores come as games end), in one write: a Ctrl-C lands between
    two (``print`` writes the line and its newline apart, and the line after ran on from it). Where
    its reader went away (``| head``), the BrokenPipeError ends play.py as the pipe's other tools end
    (exit 141, as ``run_cli`` ends it)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def mean_line(scores: list[float]) -> str:
    """``mean score over N episodes: MEAN (std STD)``."""
    games = f"{len(scores)} episode{'s' if len(scores) != 1 else ''}"
    return f"mean score over {games}: {number_text(float(np.mean(scores)))} (std {number_text(float(np.std(scores)))})"


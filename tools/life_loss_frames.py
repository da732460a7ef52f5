"""A picture of a played game's frames around a lost life, each labelled with its step's action.

play.py records a game and logs its steps (``--video`` and ``--actions``); this draws the frames
from the step before the K-th life lost (one the game goes on after) to five steps after it, and
titles each with the action the env was given and whether it was forced after the lost life
(:class:`atari.episodes.LifeLossActions`) or chosen by the agent::

    python play.py runs/<run> --episodes 1 --video game.mp4 --actions steps.csv
    python tools/life_loss_frames.py game.mp4 steps.csv --life 2 --out life_loss.png

The frame after step ``s`` is the video's frame ``s + 1`` (frame 0 is the reset's).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import numpy as np

STEPS_BEFORE, STEPS_AFTER = 1, 5
COLUMNS = ("game", "step", "action", "action_name", "forced", "lives")


def life_losses(rows: list[dict[str, str]]) -> list[int]:
    """The steps after which a life was lost and the same game went on (``--actions`` rows)."""
    losses = []
    for previous, row, following in zip(rows, rows[1:], rows[2:]):
        same_game = previous["game"] == row["game"] == following["game"]
        if same_game and int(row["lives"]) < int(previous["lives"]):
            losses.append(int(row["step"]))
    return losses


def open_video(video: Path):
    """An OpenCV capture of ``video``, FFmpeg's own messages silenced (the error is ours, in one line)."""
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    import cv2

    capture = cv2.VideoCapture(str(video))
    if not capture.isOpened():
        raise ValueError(f"{video} is not a video that OpenCV can read")
    return capture


def frame_count(video: Path) -> int:
    import cv2

    capture = open_video(video)
    try:
        return int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    finally:
        capture.release()


def read_frames(video: Path, indices: list[int]) -> dict[int, np.ndarray]:
    """The video's frames at ``indices`` (RGB), read in order from the start."""
    capture = open_video(video)
    frames, index, wanted = {}, 0, set(indices)
    try:
        while len(frames) < len(wanted):
            ok, frame = capture.read()
            if not ok:
                break
            if index in wanted:
                frames[index] = frame[..., ::-1]
            index += 1
    finally:
        capture.release()
    if len(frames) < len(wanted):
        raise ValueError(f"{video} has {index} readable frames; frame {max(wanted)} is needed")
    return frames


def draw(video: Path, rows: list[dict[str, str]], life: int, out: Path) -> list[int]:
    """Write the picture for the ``life``-th life lost to ``out``; return the steps it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = life_losses(rows)
    if not 1 <= life <= len(losses):
        raise ValueError(f"the game logged has {len(losses)} lives lost with the game going on, not a life {life}")
    loss = losses[life - 1]
    steps = [step for step in range(loss - STEPS_BEFORE, loss + STEPS_AFTER + 1) if 0 <= step < len(rows)]
    frames = read_frames(video, [step + 1 for step in steps])
    fig, axes = plt.subplots(1, len(steps), figsize=(1.9 * len(steps), 3.3))
    for ax, step in zip(np.atleast_1d(axes), steps):
        row = rows[step]
        ax.imshow(frames[step + 1])
        ax.set_xticks([])
        ax.set_yticks([])
        action = f"{row['action_name']} ({row['action']})" if row["action_name"] else row["action"]
        who = "forced" if row["forced"] == "1" else "agent"
        lost = ", life lost" if step == loss else ""
        ax.set_title(f"step {step}: {action}\n{who}, lives {row['lives']}{lost}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90, format="png")
    plt.close(fig)
    return steps


def read_rows(actions: Path) -> list[dict[str, str]]:
    """The rows of a play.py ``--actions`` log, checked: every column there, whole numbers where
    they must be, and the steps counting up from 0."""
    with open(actions, newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = [column for column in COLUMNS if rows and column not in rows[0]]
    if not rows or missing:
        raise ValueError(f"is not a play.py --actions log (missing {', '.join(missing) or 'every row'})")
    for number, row in enumerate(rows, 2):  # line 1 is the header
        try:
            int(row["game"]), int(row["lives"]), int(row["forced"])
        except (TypeError, ValueError):  # TypeError: a short row, whose missing fields are None
            raise ValueError(f"line {number} is cut short or has a game, lives or forced that is not a whole number") from None
        if row["step"] != str(number - 2):
            raise ValueError(f"line {number} has step {row['step']}, not {number - 2}: the steps must count up from 0")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="life_loss_frames.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("video", type=Path, help="the mp4 that play.py --video wrote")
    parser.add_argument("actions", type=Path, help="the CSV that play.py --actions wrote for the same games")
    parser.add_argument("--life", type=int, default=1, help="which life lost to show, from 1 (default: 1)")
    parser.add_argument("--out", type=Path, default=Path("life_loss.png"), help="PNG to write (default: life_loss.png)")
    args = parser.parse_args(argv)
    for path in (args.video, args.actions):
        if not path.is_file():
            print(f"{parser.prog}: error: {path} {'is not a file' if path.exists() else 'does not exist'}", file=sys.stderr)
            return 2
    try:
        rows = read_rows(args.actions)
    except (OSError, ValueError, csv.Error) as error:
        print(f"{parser.prog}: error: {args.actions}: {getattr(error, 'strerror', None) or error}", file=sys.stderr)
        return 2
    try:
        frames = frame_count(args.video)
        if frames != len(rows) + 1:
            raise ValueError(f"{args.video} has {frames} frames, but the {len(rows)} steps of {args.actions} need "
                             f"{len(rows) + 1} (the reset's and one per step): are they from the same play.py run?")
        steps = draw(args.video, rows, args.life, args.out)
    except OSError as error:
        print(f"{parser.prog}: error: cannot write {args.out}: {error.strerror}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"{args.out}: steps {steps[0]}-{steps[-1]} (video frames {steps[0] + 1}-{steps[-1] + 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

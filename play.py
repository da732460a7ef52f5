"""Watch or record a trained agent: ``python play.py RUN_DIR_OR_CHECKPOINT --episodes 5 --video pong.mp4``.

A thin script for a clone: the same as ``python -m acer_sync play`` (:mod:`acer_sync.cli.play`)."""

import sys

from acer_sync.__main__ import run_command

if __name__ == "__main__":
    run_command("play", sys.argv[1:], "play.py")

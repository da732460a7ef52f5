"""Train ACER: ``python train.py --env PongNoFrameskip-v4``. See ``--help`` for every flag.

A thin script for a clone: the same as ``python -m acer_sync train`` (:mod:`acer_sync.cli.train`)."""

import sys

from acer_sync.__main__ import run_command

if __name__ == "__main__":
    run_command("train", sys.argv[1:], "train.py")

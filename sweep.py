"""Run many trainings as one sweep on Ray Tune: ``python sweep.py configs/pong-seeds.yaml``.

A thin script for a clone: the same as ``python -m acer_sync sweep`` (:mod:`acer_sync.cli.sweep`)."""

import sys

from acer_sync.__main__ import run_command

if __name__ == "__main__":
    run_command("sweep", sys.argv[1:], "sweep.py")

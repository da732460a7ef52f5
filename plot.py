"""Plot learning curves: ``python plot.py RUN_DIR [RUN_DIR ...] --out curves.png --x frames --smooth 5``.

A thin script for a clone: the same as ``python -m acer_sync plot`` (:mod:`acer_sync.cli.plot`)."""

import sys

from acer_sync.__main__ import run_command

if __name__ == "__main__":
    run_command("plot", sys.argv[1:], "plot.py")

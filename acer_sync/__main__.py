"""``python -m acer_sync train|play|plot|sweep ARGS``, and the console scripts of ``pip install .``:
``acer-sync COMMAND ARGS`` the same, and ``acer-train``, ``acer-play``, ``acer-plot``, ``acer-sweep``
one command each. Each does what its script in a clone does (``python train.py ARGS``, ...)."""

from __future__ import annotations

import importlib
import os
import sys

from acer_sync.base.errors import EXIT_USER_ERROR, run_cli
from acer_sync.base.openmp import default_wait_policy

#: Each command and what it does, as the usage line lists them.
COMMANDS = {
    "train": "train ACER on an env (--env is required; see train --help)",
    "play": "play full games with a trained agent, watch or record them",
    "plot": "plot learning curves of run directories",
    "sweep": "run a sweep of trainings on Ray Tune",
}


def usage(prog: str) -> str:
    lines = [f"usage: {prog} {{{','.join(COMMANDS)}}} ...", "", "commands:"]
    lines += [f"  {name:<7}{text}" for name, text in COMMANDS.items()]
    lines += ["", f"'{prog} COMMAND --help' lists a command's flags."]
    return "\n".join(lines)


def run_command(command: str, argv: list[str], prog: str) -> None:
    """Run one command's ``main`` under :func:`run_cli` (exits with its code), with OpenMP's
    threads sleeping between operators unless the user chose otherwise (:mod:`acer_sync.base.openmp`).
    The command's module is imported under run_cli too: a Ctrl-C in its imports (torch's take a
    second or two) is one line, not a traceback."""
    default_wait_policy()
    run_cli(lambda: importlib.import_module(f"acer_sync.cli.{command}").main(argv, prog), prog)


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """``python -m acer_sync`` and ``acer-sync``: the first argument names the command."""
    argv = sys.argv[1:] if argv is None else argv
    if prog is None:
        name = os.path.basename(sys.argv[0])
        prog = "python -m acer_sync" if name == "__main__.py" else name
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else EXIT_USER_ERROR)
    command, *rest = argv
    if command not in COMMANDS:
        print(f"{prog}: error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    run_command(command, rest, f"{prog} {command}")


def train() -> None:
    """The console script ``acer-train``."""
    run_command("train", sys.argv[1:], "acer-train")


def play() -> None:
    """The console script ``acer-play``."""
    run_command("play", sys.argv[1:], "acer-play")


def plot() -> None:
    """The console script ``acer-plot``."""
    run_command("plot", sys.argv[1:], "acer-plot")


def sweep() -> None:
    """The console script ``acer-sweep``."""
    run_command("sweep", sys.argv[1:], "acer-sweep")


if __name__ == "__main__":
    main()

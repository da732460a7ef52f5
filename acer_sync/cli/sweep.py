"""Run many trainings as one sweep on Ray Tune: ``python sweep.py configs/pong-seeds.yaml``.

The YAML file names the sweep, its envs, seeds, settings (a list is a grid axis) and the resources
of one trial (see :mod:`acer_sync.sweeps.spec` and ``configs/``). Every trial is a normal run in
``runs/<sweep>/<trial>/``. Running the same command again continues the sweep: finished trials
are kept, unfinished ones resume from their checkpoints. ``--address auto`` joins an existing Ray
cluster instead of starting Ray on this machine; ``--runs-dir`` must then name a directory that
every node mounts at the same path.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from acer_sync.base.errors import EXIT_INTERRUPTED, EXIT_TRIAL_FAILED, UserError, print_error
from acer_sync.cli.args import OneLineParser, path
from acer_sync.sweeps.spec import load_sweep

DEFAULT_RUNS_DIR = Path("runs")


def parse_args(argv: list[str], prog: str = "sweep.py"):
    parser = OneLineParser(
        prog=prog,
        description="Run a sweep of ACER trainings (envs x seeds x a grid of settings) on Ray Tune. "
        "Run the same command again to continue an interrupted sweep.",
    )
    parser.add_argument("sweep_file", type=path, metavar="FILE.yaml", help="the sweep file (see configs/cartpole-rr.yaml)")
    parser.add_argument("--address", default=None, help="join the Ray cluster at this address ('auto': the one this machine belongs to); default: start Ray here")
    parser.add_argument("--runs-dir", type=path, default=None,
                        help="trials go to RUNS_DIR/<sweep>/<trial>/ (default: runs); with --address, a directory "
                        "every node mounts at the same path, such as an NFS mount")
    parser.add_argument("--stop-wait", type=float, default=None, metavar="SECONDS",
                        help="how long the first Ctrl-C waits for the running trials to save a checkpoint before "
                        "Tune stops them (default: 30); a second Ctrl-C, a second or more after the first, stops them at once")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "sweep.py") -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    if args.runs_dir is None:
        if args.address is not None:
            raise UserError("with --address, give --runs-dir a directory that every node of the cluster mounts at the "
                            "same path (the default runs/ is on this machine only)")
        args.runs_dir = DEFAULT_RUNS_DIR
    if args.stop_wait is not None and not args.stop_wait >= 0:
        raise UserError(f"--stop-wait must be a number of seconds >= 0, got {args.stop_wait}")
    if ".." in args.runs_dir.parts:
        raise UserError(f"--runs-dir {args.runs_dir} contains '..'; give the directory without parent references")
    sweep = load_sweep(args.sweep_file, args.runs_dir)
    try:
        from acer_sync.sweeps.launch import run_sweep
    except ImportError as error:
        missing = error.name or (re.findall(r"No module named '([^']+)'", str(error)) or [""])[0]
        if missing.split(".")[0] != "ray":
            raise
        raise UserError("sweep.py runs its trials on Ray Tune, which is not installed: pip install \"ray[tune]==2.60.0\" "
                        "(or the sweep extra: pip install \".[sweep]\")") from None
    print(f"sweep {sweep.name}: {len(sweep.trials)} trials, {sweep.cpus} CPU and {sweep.gpus:g} GPU each, "
          f"in {args.runs_dir / sweep.name}", flush=True)

    from acer_sync.sweeps.summary import write_summary

    def report(outcomes):  # while Ray is still up: its teardown has crashed the driver
        summary = write_summary(sweep, (args.runs_dir / sweep.name).resolve(), outcomes)
        print(f"wrote {summary}", flush=True)
        for outcome in outcomes:
            if outcome.status == "failed":
                print_error(prog, f"trial {outcome.name} failed: {outcome.error}")
        unfinished = sum(outcome.status == "unfinished" for outcome in outcomes)
        if unfinished:
            print(f"{prog}: interrupted with {unfinished} trial(s) unfinished; run the same command again to continue",
                  file=sys.stderr, flush=True)

    statuses = {outcome.status for outcome in run_sweep(sweep, args.sweep_file, args.runs_dir, args.address, args.stop_wait, report)}
    if "unfinished" in statuses:
        return EXIT_INTERRUPTED
    return EXIT_TRIAL_FAILED if "failed" in statuses else 0


"""Measure what a sweep gains: 2 CartPole trials in one sweep, 1 CPU each, against the same 2 runs one after the other.

``python bench_sweep.py [--steps 30000] [--json]``

Both ways train the same two configs (seeds 0 and 1, the classic-control preset with one torch
thread, the envs stepped in the trainer's own process (``vec_env: sync``, so that a 1-CPU trial is
one process) and no evaluation) through the real training path: :class:`acer_sync.training.trainer.Trainer`, in
this process one run after the other, or in Ray Tune trials started by :func:`acer_sync.sweeps.launch.run_sweep`.

* ``training_steps_per_sec``: steps of both runs over their training time, as each run's
  ``progress.csv`` measures it (``time_elapsed``, from the Trainer's start to its last row): the
  longer of the two in the sweep, where they train side by side; their sum one after the other.
* ``wall_steps_per_sec``: the same steps over the whole wall time, Ray's start and shutdown included.
* ``ratio``: sweep over one-after-the-other, for both; the target is 1.7x on 2 cores.

With ``--json`` the last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import csv
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from acer_sync.api.run_metadata import package_versions
from acer_sync.base.errors import UserError, run_cli
from acer_sync.cli.args import OneLineParser
from acer_sync.sweeps.spec import load_sweep
from acer_sync.training.setup import build_trainer
from atari.envs import env_info

BENCH_SWEEP = """\
name: bench
envs: [CartPole-v1]
seeds: [0, 1]
settings:
  total_timesteps: {steps}
  vec_env: sync
  eval_every: 0
  checkpoint_every: 100000000
trial: {{cpus: 1, gpus: 0}}
"""


def parse_args(argv: list[str]):
    parser = OneLineParser(prog="bench_sweep.py", description="Benchmark a 2-trial sweep against 2 runs in a row (see the module docstring).")
    parser.add_argument("--steps", type=int, default=30_000, help="agent steps per run (default: 30000)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding every figure")
    return parser.parse_args(argv)


def training_seconds(run_dir: Path) -> float:
    """The run's ``time_elapsed`` at its last progress row."""
    with open(run_dir / "progress.csv", newline="") as handle:
        return float(list(csv.DictReader(handle))[-1]["time_elapsed"])


def one_after_the_other(sweep, root: Path) -> tuple[list[float], float]:
    """Train each trial's config in this process in turn; each run's training seconds, and the wall time."""
    start = time.perf_counter()
    seconds = []
    for trial in sweep.trials:
        run_dir = root / "sequential" / trial.name
        run_dir.mkdir(parents=True)
        trainer = build_trainer(trial.config, env_info(trial.config.env, trial.config.env_kwargs), run_dir)
        if not trainer.train().finished:
            raise UserError(f"the sequential run {trial.name} did not finish")
        seconds.append(training_seconds(run_dir))
    return seconds, time.perf_counter() - start


def in_one_sweep(sweep, sweep_file: Path, root: Path) -> tuple[list[float], float]:
    """Run the sweep on a local Ray; each trial's training seconds, and the wall time."""
    from acer_sync.sweeps.launch import run_sweep

    start = time.perf_counter()
    outcomes = run_sweep(sweep, sweep_file, root / "sweep", address=None)
    wall = time.perf_counter() - start
    unfinished = [outcome.name for outcome in outcomes if outcome.status != "finished"]
    if unfinished:
        raise UserError(f"the sweep did not finish {', '.join(unfinished)}")
    return [training_seconds(root / "sweep" / sweep.name / trial.name) for trial in sweep.trials], wall


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1000:
        raise UserError("--steps must be >= 1000")
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as directory:
        root = Path(directory)
        sweep_file = root / "bench.yaml"
        sweep_file.write_text(BENCH_SWEEP.format(steps=args.steps))
        sweep = load_sweep(sweep_file)
        total_steps = sum(trial.config.total_timesteps for trial in sweep.trials)
        sequential_seconds, sequential_wall = one_after_the_other(sweep, root)
        sweep_seconds, sweep_wall = in_one_sweep(sweep, sweep_file, root)

    sequential_sps = total_steps / sum(sequential_seconds)
    sweep_sps = total_steps / max(sweep_seconds)
    result = {
        "env": sweep.trials[0].config.env,
        "runs": len(sweep.trials),
        "steps_per_run": args.steps,
        "cpus": os.cpu_count(),
        "cpus_per_trial": sweep.cpus,
        "vec_env": sweep.trials[0].config.vec_env,
        "num_envs": sweep.trials[0].config.num_envs,
        "sequential_training_steps_per_sec": round(sequential_sps, 1),
        "sweep_training_steps_per_sec": round(sweep_sps, 1),
        "training_ratio": round(sweep_sps / sequential_sps, 3),
        "sequential_wall_seconds": round(sequential_wall, 1),
        "sweep_wall_seconds": round(sweep_wall, 1),
        "sequential_wall_steps_per_sec": round(total_steps / sequential_wall, 1),
        "sweep_wall_steps_per_sec": round(total_steps / sweep_wall, 1),
        "wall_ratio": round(sequential_wall / sweep_wall, 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "versions": package_versions(),
    }
    print(f"one after the other  {result['sequential_training_steps_per_sec']:>9.1f} steps/s training, "
          f"{result['sequential_wall_seconds']:.1f} s wall")
    print(f"in one sweep         {result['sweep_training_steps_per_sec']:>9.1f} steps/s training, "
          f"{result['sweep_wall_seconds']:.1f} s wall (Ray's start included)")
    print(f"ratio                {result['training_ratio']:>9.2f}x training, {result['wall_ratio']:.2f}x wall "
          f"(target 1.7x); load average {result['load_average_1min']}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_cli(main, "bench_sweep.py")

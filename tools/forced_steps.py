"""The share of a run's stored steps that were forced after a lost life (NOOP, FIRE, action 2).

In a FIRE game (Breakout), Baselines plays NOOP, FIRE and action 2 after each lost life before
the agent acts again; acer_sync's Runner stores those steps with their action and a one-hot μ
(:class:`atari.episodes.LifeLossActions`). This reads the replay buffer a run saved with
``--save-buffer`` (``checkpoints/buffer.npz``: the newest ``--buffer-size`` steps of each env) and
counts the stored steps whose μ is one-hot: exactly one probability 1.0, all others 0. Only ``mu``
and the small bookkeeping arrays are read, never the frames::

    python tools/forced_steps.py runs/<run>

A policy whose softmax saturated to exactly 1.0 would also give a one-hot μ, on any action: the
line for actions above 2 shows whether that happened.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

import numpy as np

BUFFER_PATH = Path("checkpoints") / "buffer.npz"
ACTION_NAMES = ("NOOP (action 0)", "FIRE (action 1)", "action 2")


def stored_mu(buffer_file: Path) -> tuple[np.ndarray, int, int]:
    """``(mu [stored steps, N, A], stored steps per env, steps written per env)`` from a saved buffer.

    The ring fills from slot 0, so the stored segments are its first ``segments_stored`` ones.
    """
    with np.load(buffer_file) as arrays:  # an NpzFile reads each array only when asked for it
        for name in ("mu", "segment_start", "counters"):
            if name not in arrays.files:
                raise ValueError(f"has no {name} array; is it a buffer.npz that --save-buffer wrote?")
        steps_written, segments_stored = (int(value) for value in arrays["counters"])
        nsegments = len(arrays["segment_start"])
        mu = arrays["mu"]
    if mu.ndim != 3 or nsegments == 0:
        raise ValueError(f"its mu is {list(mu.shape)} for {nsegments} segments, not [steps, envs, actions]")
    stored = segments_stored * (mu.shape[0] // nsegments)
    return mu[:stored], stored, steps_written


def forced_counts(mu: np.ndarray) -> np.ndarray:
    """How many steps of ``mu`` ``[..., A]`` have a one-hot μ, per action: ``[A]``."""
    one_hot = ((mu == 1).sum(axis=-1) == 1) & ((mu == 0).sum(axis=-1) == mu.shape[-1] - 1)
    return np.bincount(mu[one_hot].argmax(axis=-1), minlength=mu.shape[-1])


def report(buffer_file: Path) -> list[str]:
    """The lines :func:`main` prints: the stored steps, the forced share, and its split by action."""
    mu, stored, written = stored_mu(buffer_file)
    num_envs, n_actions = mu.shape[1], mu.shape[2]
    total = stored * num_envs
    if total == 0:
        raise ValueError("holds no stored step")
    counts = forced_counts(mu)
    lines = [
        f"{buffer_file}: {total:,} stored steps ({num_envs} envs x {stored:,}, the newest of {written:,} per env)",
        f"one-hot mu (forced after a lost life): {counts.sum() / total:.2%} ({counts.sum():,} steps)",
    ]
    for action, name in enumerate(ACTION_NAMES[:n_actions]):
        lines.append(f"  {name}: {counts[action] / total:.2%} ({counts[action]:,})")
    if n_actions > len(ACTION_NAMES):
        other = counts[len(ACTION_NAMES):].sum()
        lines.append(f"  actions above 2: {other / total:.2%} ({other:,})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="forced_steps.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory trained with --save-buffer")
    args = parser.parse_args(argv)
    buffer_file = args.run_dir / BUFFER_PATH
    if not buffer_file.is_file():
        print(f"{parser.prog}: error: {buffer_file} does not exist (the run needs --save-buffer)", file=sys.stderr)
        return 2
    try:
        lines = report(buffer_file)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        print(f"{parser.prog}: error: {buffer_file}: {getattr(error, 'strerror', None) or error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

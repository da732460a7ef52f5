"""Would env groups stepping at the same time hide acting? A probe of the collecting thread's shape
(issue 35; docs/performance.md, "Since the third report").

The collecting thread steps its envs, then waits for acting (on a GPU: a CUDA graph's replay and
the copy back, some 0.2-0.4 ms whatever the number of envs), one after the other. With the envs in
``--groups`` groups and ALE's ``send``/``recv`` in a fixed order (receive group g's step, act for g,
send g's actions, go on to the next group), each group's acting runs while the other groups' envs
step. This probe measures both shapes on the machine it runs on, with acting stood in for by a
wait of ``--acting-ms`` that spins on a core, as a CUDA sync does by default (CUDA spins while it
has fewer contexts than cores), and random actions; no network, no learner. It prints one JSON line per acting time::

    python tools/env_groups.py --num-envs 16 --groups 2 --acting-ms 0.1,0.3,0.6 --seconds 5

``one_group_steps_per_sec`` is the Runner's shape today; ``groups_steps_per_sec`` the grouped one
(each group's acting the same wait: acting's cost barely grows with the envs). Their ratio is what
building the groups into the Runner could give, at most, on that machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atari.envs import VecEnv, env_info  # noqa: E402


def steps_per_sec(env: VecEnv, acting_seconds: float, seconds: float, rng: np.random.Generator) -> float:
    """Agent steps/s of ``env`` (reset; its groups, or its one group) stepped in the Runner's fixed
    order (:meth:`VecEnv.send`, :meth:`VecEnv.recv`), each group's actions chosen after a wait of
    ``acting_seconds`` once its step is received; one group is the plain step-then-act loop."""
    n_actions, size = env.env.single_action_space.n, env.group_size
    for group in range(env.groups):  # every group's first step in flight
        env.send(group, rng.integers(0, n_actions, size=size))
    steps, start = 0, time.perf_counter()
    while True:
        for group in range(env.groups):
            env.recv(group)
            acted = time.perf_counter() + acting_seconds
            while time.perf_counter() < acted:  # acting's wait for the device, spinning
                pass
            env.send(group, rng.integers(0, n_actions, size=size))
            steps += size
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    for group in range(env.groups):  # the last steps sent, received before the envs close
        env.recv(group)
    return steps / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--acting-ms", default="0.1,0.3,0.6", help="acting's wait per group and step, in ms (a comma list)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per shape and acting time")
    args = parser.parse_args(argv)
    try:
        acting_ms = [float(value) for value in args.acting_ms.split(",")]
    except ValueError:
        parser.error(f"--acting-ms takes numbers separated by commas, got {args.acting_ms}")
    if args.groups < 2 or args.num_envs % args.groups:
        parser.error(f"--num-envs ({args.num_envs}) must split into --groups ({args.groups}) of equal size, at least 2")
    if any(value < 0 for value in acting_ms) or args.seconds <= 0:
        parser.error("--acting-ms must not be negative and --seconds must be positive")
    rng = np.random.default_rng(0)
    shapes = {"one_group": VecEnv(env_info(args.env), args.num_envs, "ale", num_threads=args.num_envs),
              "groups": VecEnv(env_info(args.env), args.num_envs, "ale", num_threads=args.num_envs, groups=args.groups)}
    try:
        for env in shapes.values():
            env.reset(seed=0)
        for wait in acting_ms:
            figures = {name: steps_per_sec(env, wait / 1000, args.seconds, rng) for name, env in shapes.items()}
            print(json.dumps({
                "probe": "env_groups", "env": args.env, "num_envs": args.num_envs, "groups": args.groups,
                "acting_ms": wait, "one_group_steps_per_sec": round(figures["one_group"], 1),
                "groups_steps_per_sec": round(figures["groups"], 1),
                "ratio": round(figures["groups"] / figures["one_group"], 3), "cpu_count": os.cpu_count(),
            }), flush=True)
    finally:
        for env in shapes.values():
            env.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

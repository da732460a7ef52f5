"""Is a recurrent checkpoint's memory saturated? Plays its env with the policy and prints, over the
states visited, how large the torso's features, the LSTM's h and c, π and Q are, and how much they
vary from state to state.

    python tools/lstm_probe.py runs/pong_cnn_lstm_5M/checkpoints/latest.pt --steps 400 --envs 8
    python tools/lstm_probe.py runs/pong_cnn_lstm_5M/checkpoints/latest.pt --fresh   # the same net, untrained
    python tools/lstm_probe.py runs/RUN/checkpoints/step_0005000960.pt --states-from runs/RUN/checkpoints/step_0004901120.pt

A memory whose h hardly varies across states (std near 0, many |h| near 1) gives the heads nothing
to act on: π stays uniform and Q constant (docs/recurrent.md, Pong with cnn_lstm). "constant" is the
share of units that hold one value over all the states visited: a ReLU feature that never fires.
``--states-from`` plays another checkpoint's policy and probes this one on the states it visits, so
that two checkpoints of a run (before and after a collapse) are compared on the same frames.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import acer_sync  # noqa: E402
from acer_sync.nets.networks import network_from_spec  # noqa: E402
from acer_sync.nets.precision import autocast  # noqa: E402


def probe_step(model, precision: str, obs: np.ndarray, first: torch.Tensor, state: tuple) -> tuple:
    """One step of ``model`` on observations ``[n, ...]``, through ``model.step`` as acting takes it
    (observation normalizer, torso, memory): the torso's features, caught on their way, the next
    state, π and Q (float32)."""
    caught = []
    hook = model.torso.register_forward_hook(lambda module, inputs, output: caught.append(output))
    try:
        with autocast(torch.device("cpu"), precision == "bf16"):
            h_out, state = model.step(torch.as_tensor(obs), state, first)
            pi, q = model(h_out)
    finally:
        hook.remove()
    return caught[0].float(), tuple(part.float() for part in state), pi.float(), q.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a run directory or a checkpoint file of a recurrent network")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--fresh", action="store_true", help="probe a freshly initialised network of the same spec")
    parser.add_argument("--states-from", type=Path, metavar="CHECKPOINT",
                        help="play this checkpoint's policy (of the same env) and probe the first on the states it visits")
    args = parser.parse_args()

    policy = acer_sync.load(args.checkpoint)
    model = policy.model.eval()
    if args.fresh:
        torch.manual_seed(0)
        model = network_from_spec(model.spec()).eval()
    if not model.state_shapes:
        sys.exit(f"{args.checkpoint}: the network has no memory to probe")
    player = None if args.states_from is None else acer_sync.load(args.states_from)
    if player is not None and player.env_id != policy.env_id:
        sys.exit(f"{args.states_from} plays {player.env_id}, {args.checkpoint} {policy.env_id}")
    envs = [acer_sync.make_env(policy.env_id) for _ in range(args.envs)]
    obs = np.stack([env.reset(seed=3 + index)[0] for index, env in enumerate(envs)])
    state = model.initial_state(args.envs)
    player_state = None if player is None else player.model.initial_state(args.envs)
    first = torch.ones(args.envs, dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    seen = {"features": [], "h": [], "c": [], "pi": [], "q": []}
    with torch.no_grad():
        for _ in range(args.steps):
            features, state, pi, q = probe_step(model, policy.precision, obs, first, state)
            for name, value in zip(seen, (features, state[0], state[1], pi, q)):
                seen[name].append(value)
            if player is not None:
                _, player_state, pi, _ = probe_step(player.model, player.precision, obs, first, player_state)
            actions = torch.multinomial(pi, 1, generator=generator).squeeze(1).tolist()
            stepped, done = [], []
            for env, action in zip(envs, actions):
                observation, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    observation, _ = env.reset()
                stepped.append(observation)
                done.append(terminated or truncated)
            obs, first = np.stack(stepped), torch.as_tensor(done)
    for env in envs:
        env.close()
    played = f" played by {args.states_from}" if args.states_from is not None else ""
    print(f"{args.checkpoint}{' (fresh)' if args.fresh else ''}: {args.steps} steps of {args.envs} envs{played}")
    for name, values in seen.items():
        x = torch.cat(values)
        print(f"  {name:8s} mean |x| {x.abs().mean():8.4f}   std over states {x.std(0).mean():8.4f}   "
              f"share |x| > 0.95 {(x.abs() > 0.95).float().mean():.3f}   constant {(x.amax(0) == x.amin(0)).float().mean():.3f}")
    pi = torch.cat(seen["pi"])
    print(f"  π's entropy {-(pi * pi.clamp_min(1e-8).log()).sum(1).mean():.4f} (uniform: {np.log(pi.shape[1]):.4f})")


if __name__ == "__main__":
    main()

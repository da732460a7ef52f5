"""Mutation check of the ACER math's tests: would they catch a plausible mistake?

Each mutant below is one small change a developer could make by mistake (Retrace's truncation,
the bias correction's weight, the trust region's sign, a state replayed from zeros, a time limit
treated as a terminal, ...). For each, this copies the committed tree (``git archive HEAD``) into a
scratch directory, applies the change there, runs the fast tests of the math, and reports whether
some test failed (the mutant is *killed*) or all passed (it *survived*: the tests would not have
noticed the mistake). The working tree is never touched::

    python tools/mutants.py                 # all of them: 7 minutes on 2 cores beside a training
    python tools/mutants.py L23 A3          # some
    python tools/mutants.py --list          # what each changes

It runs the tests on the unchanged tree first: they must pass there, or no kill would mean anything.
A mutant counts as killed only where a test failed (pytest's exit 1 with a FAILED line), not where
the tests could not run. It exits 1 if a mutant survived, 2 if the tests fail unchanged or a
mutant's line is no longer in the committed source (the code moved: update its entry). The learning tests are left out (tens of seconds each, and a learning curve is
not where a sign error should first be seen); ``EQUIVALENT`` names the mutants that change no
behaviour a test could see. The audit that wrote this (2026-11-26) found 7 of 46 surviving and
added a test for each: see docs/development.md.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

LOSSES = "acer_sync/math/losses.py"
ACER = "acer_sync/training/acer.py"
NETWORKS = "acer_sync/nets/networks.py"
MEMORY = "acer_sync/nets/memory.py"
RUNNER = "acer_sync/rollout/runner.py"
ACTOR = "acer_sync/rollout/actor.py"
BUFFER = "acer_sync/replay/buffer.py"

#: The tests each mutant runs against: the math's fast tests (the ones that take tens of seconds to
#: learn something are deselected by ``LEARNING``).
TESTS = [
    "tests/test_losses.py", "tests/test_continuous_losses.py", "tests/test_time_limits.py",
    "tests/test_networks_optim.py", "tests/test_precision.py", "tests/test_recurrent.py",
    "tests/test_continuous_training.py", "tests/test_buffer.py", "tests/test_acting_path.py",
    "tests/test_compiled_update.py",
]
LEARNING = "not lstm_solves and not cartpole_learns and not steer_a_point"


class Mutant(NamedTuple):
    name: str
    path: str
    original: str
    mutated: str
    what: str


MUTANTS = [
    Mutant("L1", LOSSES, "rho_bar = rho_taken.to(dtype).clamp(max=rho_clip)", "rho_bar = rho_taken.to(dtype)",
           "Retrace: rho not truncated"),
    Mutant("L2", LOSSES, "discounts = (gamma * not_done).unbind(0)", "discounts = (gamma + 0 * not_done).unbind(0)",
           "Retrace: no reset at a terminal"),
    Mutant("L3", LOSSES, "(q_ret[t] - q_taken_rows[t]) + value_rows[t]", "(q_ret[t] - q_taken_rows[t]) + value_rows[t + 1]",
           "Retrace: the carry uses V(x_t+1)"),
    Mutant("L4", LOSSES, "next_target = value_rows[-1]", "next_target = value_rows[-2]", "Retrace: bootstraps from V(x_T-1)"),
    Mutant("L5", LOSSES, "timeout_terms = (gamma * timeout_values)", "timeout_terms = (timeout_values)",
           "a time limit's bootstrap without gamma"),
    Mutant("L6", LOSSES, "timeout_terms = (gamma * timeout_values)", "timeout_terms = (gamma * not_done * timeout_values)",
           "a time limit's final value dropped (masked as a terminal)"),
    Mutant("L7", LOSSES, "rho_clip: float = 1.0,", "rho_clip: float = 10.0,", "Retrace truncates at 10"),
    Mutant("L8", LOSSES, ".gather(-1, index).squeeze(-1).clamp(max=c)", ".gather(-1, index).squeeze(-1).clamp(min=c)",
           "policy gain: max(c, rho) for min(c, rho)"),
    Mutant("L9", LOSSES, "torch.where(rho > c, 1.0 - c / rho", "torch.where(rho >= c, 1.0 - c / rho",
           "bias correction: rho >= c (the same for c > 0; 0/0 at c = 0)"),
    Mutant("L10", LOSSES, "torch.where(rho > c, 1.0 - c / rho", "torch.where(rho > c, c / rho - 1.0",
           "bias correction: the sign of [1 - c/rho]"),
    Mutant("L11", LOSSES, "correction_weight * pi.detach() * advantage_all",
           "correction_weight * (pi.detach() / rho) * advantage_all", "bias correction weighted by mu for pi"),
    Mutant("L12", LOSSES, "advantage_all = q.detach() - values.unsqueeze(-1)", "advantage_all = q.detach()",
           "bias correction without its V baseline"),
    Mutant("L13", LOSSES, "rho = rho.detach()\n", "rho = rho\n", "policy gain: rho not held constant"),
    Mutant("L14", LOSSES, "torch.relu(k_dot_g - delta)", "(k_dot_g - delta)", "trust region: max(0, .) removed"),
    Mutant("L15", LOSSES, "k_norm_sq = (k * k).sum(-1, keepdim=True)", "k_norm_sq = (k * k).sum(-1, keepdim=True).sqrt()",
           "trust region: |k| for |k|^2"),
    Mutant("L16", LOSSES, "return g - scale * k", "return g + scale * k", "trust region: the step's sign"),
    Mutant("L17", LOSSES, "return -pi_avg / (pi + eps)", "return pi_avg / (pi + eps)", "the KL's gradient: its sign"),
    Mutant("L18", LOSSES, "return -pi_avg / (pi + eps)", "return -pi / (pi_avg + eps)",
           "the KL's gradient: pi and pi_avg swapped"),
    Mutant("L19", LOSSES, "return -(pi * torch.log(pi + eps)).sum(-1)", "return (pi * torch.log(pi + eps)).sum(-1)",
           "entropy: its sign"),
    Mutant("L20", LOSSES, "values + advantage_taken - advantage_sampled.mean(-1)",
           "values + advantage_taken + advantage_sampled.mean(-1)", "SDN: + the samples' mean"),
    Mutant("L21", LOSSES, "torch.exp((log_rho_taken / action_dim).clamp(max=0.0))",
           "torch.exp((log_rho_taken).clamp(max=0.0))", "continuous Retrace: the 1/d exponent dropped"),
    Mutant("L22", LOSSES, "weight = torch.exp(log_rho_taken.detach().clamp(max=0.0))",
           "weight = torch.exp(log_rho_taken.detach())", "V's target: rho not truncated at 1"),
    Mutant("L23", LOSSES, "(correction_weight * (q_sdn_sampled.detach() - values))",
           "(correction_weight * q_sdn_sampled.detach())", "Gaussian gain: the correction without V"),
    Mutant("L24", LOSSES, "(truncated_weight * (q_opc.detach() - values))", "(truncated_weight * q_opc.detach())",
           "Gaussian gain: the truncated term without V"),
    Mutant("L25", LOSSES, "torch.relu(1.0 - torch.exp(log_c - log_rho_sampled.detach()))",
           "(1.0 - torch.exp(log_c - log_rho_sampled.detach()))", "Gaussian correction: [.]+ removed"),
    Mutant("L26", LOSSES, "torch.exp(log_rho_taken.detach().clamp(max=log_c))", "torch.exp(log_rho_taken.detach())",
           "Gaussian truncated weight not truncated"),
    Mutant("L27", LOSSES, "correction_weight = torch.relu(1.0 - torch.exp(log_c - log_rho_sampled.detach()))",
           "correction_weight = torch.relu(1.0 - torch.exp(log_c - log_rho_taken.detach()))",
           "Gaussian correction weighted by rho(a) for rho(a')"),
    Mutant("A1", ACER, "+ cfg.ent_coef * entropy).sum()", "- cfg.ent_coef * entropy).sum()", "the entropy bonus's sign"),
    Mutant("A2", ACER, "k = dist.kl_grad(stats_avg, stats_now)", "k = dist.kl_grad(stats_now, stats_now)",
           "k from pi for pi_avg"),
    Mutant("A3", ACER, "self.average_net.unroll(obs_avg, batch.firsts[:T], batch.state)",
           "self.average_net.unroll(obs_avg, batch.firsts[:T], tuple(torch.zeros_like(s) for s in batch.state))",
           "the average LSTM replays from zeros"),
    Mutant("A4", ACER, "self.net.unroll(batch.obs, batch.firsts, batch.state)",
           "self.net.unroll(batch.obs, batch.firsts, tuple(torch.zeros_like(s) for s in batch.state))",
           "the online LSTM replays from zeros"),
    Mutant("A5", ACER, "with torch.no_grad():\n            values_all = (pi_all * q_all).sum(-1)",
           "if True:\n            values_all = (pi_all * q_all).sum(-1)", "V, hence Q^ret, not held constant"),
    Mutant("A6", ACER, "rho_taken, cfg.gamma,\n            timeout_values", "rho_taken, cfg.gamma, rho_clip=cfg.c,\n            timeout_values",
           "Retrace truncated at c for 1"),
    Mutant("A7", ACER, "torch.ones_like(rho_bar), cfg.gamma", "rho_bar, cfg.gamma", "Q^opc with rho_bar"),
    Mutant("A8", ACER, "losses.value_target(log_rho_taken, q_ret,", "losses.value_target(log_rho_taken, q_opc,",
           "V's target from Q^opc"),
    Mutant("A9", ACER, "retrace_weight_continuous(log_rho_taken, dist.dim)", "retrace_weight_continuous(log_rho_taken, 1)",
           "d = 1 in rho^(1/d)"),
    Mutant("A10", ACER, "z = losses.trust_region_adjust(g, k, cfg.delta) if cfg.trust_region else g", "z = g",
           "trust region off"),
    Mutant("N1", NETWORKS,
           "torch._foreach_mul_(self.average_params, alpha)\n            torch._foreach_add_(self.average_params, self.online_params, alpha=1.0 - alpha)",
           "torch._foreach_mul_(self.average_params, 1.0 - alpha)\n            torch._foreach_add_(self.average_params, self.online_params, alpha=alpha)",
           "Polyak average: alpha swapped"),
    Mutant("N2", NETWORKS,
           "moved = torch._foreach_mul(self.average_params, alpha)\n        torch._foreach_add_(moved, self.online_params, alpha=1.0 - alpha)",
           "moved = torch._foreach_mul(self.average_params, 1.0 - alpha)\n        torch._foreach_add_(moved, self.online_params, alpha=alpha)",
           "Polyak average, sync-free: alpha swapped"),
    Mutant("N3", NETWORKS, "average.copy_(torch.where(finite, new, average))", "average.copy_(new)",
           "Polyak average, sync-free: a non-finite step not masked"),
    Mutant("M1", MEMORY, "h, c = self.lstm(features[t], (h * keep[t], c * keep[t]))", "h, c = self.lstm(features[t], (h, c))",
           "LSTM: no reset at an episode's start"),
    Mutant("R1", RUNNER, "cut = truncated & ~terminated & self.env.final_mask[rows]", "cut = truncated & self.env.final_mask[rows]",
           "a step terminated and truncated is bootstrapped"),
    Mutant("R2", ACTOR, "not_first = torch.zeros(len(envs), dtype=torch.bool", "not_first = torch.ones(len(envs), dtype=torch.bool",
           "V(x_final) from a reset LSTM state"),
    Mutant("R3", ACTOR, "np.concatenate([stacked[envs, 1:], final[envs, None]], axis=1)",
           "np.concatenate([stacked[envs, :-1], final[envs, None]], axis=1)", "V(x_final)'s frame stack off by one"),
    Mutant("R4", RUNNER, "segment.timeout_values[t, rows] = actor.final_values(final, cut)", "pass",
           "V(x_final) never stored"),
    Mutant("B1", BUFFER, "ids == ids[..., -1:]", "ids == ids[..., :1]",
           "replayed frame stacks masked from the oldest frame"),
]

#: Mutants that change no behaviour a test could see (run anyway; their survival is not a failure).
EQUIVALENT: set[str] = set()


def committed_tree(directory: Path) -> None:
    """HEAD's files into ``directory`` (what CI tests: never the working tree's edits)."""
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")


def run_tests(tree: Path) -> tuple[int, list[str]]:
    """The fast tests on ``tree``, stopping at the first failure: pytest's exit code and the tests
    that failed."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS, "-k", LEARNING],
                            cwd=tree, capture_output=True, text=True)
    return result.returncode, [text.split(" ")[1] for text in result.stdout.splitlines() if text.startswith("FAILED ")]


def run_mutant(mutant: Mutant, tree: Path) -> dict:
    path = tree / mutant.path
    source = path.read_text()
    line = source[: source.index(mutant.original)].count("\n") + 1
    path.write_text(source.replace(mutant.original, mutant.mutated))
    started = time.monotonic()
    try:
        code, failed = run_tests(tree)
    finally:
        path.write_text(source)
    killed = code == 1 and bool(failed)  # a test failed; an import error or a crash (2-5) kills nothing
    return {"mutant": mutant.name, "where": f"{mutant.path}:{line}", "what": mutant.what, "killed": killed,
            "by": failed[0] if failed else f"(pytest exit {code})" if code not in (0, 1) else "",
            "seconds": round(time.monotonic() - started)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and check each still applies")
    parser.add_argument("--json", action="store_true", help="a JSON line per mutant")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - {mutant.name for mutant in MUTANTS})
    if unknown:
        print(f"mutants.py: error: no mutant {unknown[0]} (see --list)", file=sys.stderr)
        return 2
    chosen = [mutant for mutant in MUTANTS if not args.names or mutant.name in args.names]
    survived = []
    with tempfile.TemporaryDirectory(prefix="acer_mutants.") as scratch:
        tree = Path(scratch)
        committed_tree(tree)
        stale = [mutant.name for mutant in chosen if (tree / mutant.path).read_text().count(mutant.original) != 1]
        if stale:
            print(f"mutants.py: error: the line that {', '.join(stale)} change is not once in the committed source: "
                  "update their entries", file=sys.stderr)
            return 2
        if args.list:
            for mutant in chosen:
                print(f"{mutant.name:4} {mutant.path:28} {mutant.what}")
            return 0
        code, failed = run_tests(tree)
        if code != 0:
            print(f"mutants.py: error: the tests do not pass on the unchanged tree (pytest exit {code}"
                  + (f", {failed[0]}" if failed else "") + "): fix that first", file=sys.stderr)
            return 2
        for mutant in chosen:
            record = run_mutant(mutant, tree)
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                verdict = f"killed by {record['by']}" if record["killed"] else "SURVIVED"
                print(f"{mutant.name:4} {record['where']:32} {mutant.what}: {verdict} ({record['seconds']} s)", flush=True)
            if not record["killed"] and mutant.name not in EQUIVALENT:
                survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants killed" + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

"""What a progress row says: the update statistics averaged since the last row, and the run's counters."""

from __future__ import annotations

import os

import numpy as np
import torch

from acer_sync.training.acer import UPDATE_STATS


class UpdateStats:
    """Sums of each update's statistics, on-policy and off-policy apart, since the last progress
    row, and the largest gradient norm among them: tensors on the device, added to once an update
    and read from the host once a row. The largest norm tells one update that spiked from many
    moderate ones, which a row's mean (of about a dozen updates) cannot.

    A skipped (non-finite) update is counted (``counts``, and the agent's ``nonfinite_updates``)
    but its statistics, inf or NaN, are left out of the sums, masked on the device: they would
    have made its whole row's means inf or NaN, hiding the hundreds of updates that stepped.
    So is a statistic that an update that stepped leaves undefined (NaN): ``explained_variance``
    of a constant Q^ret; each statistic is averaged over the updates that define it."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.stepped: dict[str, torch.Tensor] = {}  # the updates that stepped, a device count
        self.defined: dict[str, torch.Tensor] = {}  # of those, the ones that define each statistic, device counts
        self.largest_grad_norm: dict[str, torch.Tensor] = {}
        self.counts = {"on": 0, "off": 0}

    def add(self, stats: dict[str, torch.Tensor], off_policy: bool) -> None:
        kind = "off" if off_policy else "on"
        values = torch.stack([stats[name].detach().float() for name in UPDATE_STATS])
        stepped = stats["nonfinite"].detach().float() == 0
        defined = stepped & ~values.isnan()  # [len(UPDATE_STATS)]
        grad_norm = torch.where(stepped, values[UPDATE_STATS.index("grad_norm")], -torch.inf)
        values = torch.where(defined, values, torch.zeros_like(values))
        if kind in self.sums:
            self.sums[kind] = self.sums[kind] + values
            self.stepped[kind] = self.stepped[kind] + stepped.float()
            self.defined[kind] = self.defined[kind] + defined.float()
            self.largest_grad_norm[kind] = torch.maximum(self.largest_grad_norm[kind], grad_norm)
        else:
            self.sums[kind], self.stepped[kind], self.largest_grad_norm[kind] = values, stepped.float(), grad_norm
            self.defined[kind] = defined.float()
        self.counts[kind] += 1

    def means(self) -> dict[str, float]:
        """Each statistic's mean over the updates that stepped since :meth:`reset` and define it,
        and after ``grad_norm`` the largest, ``grad_norm_max`` (NaN where none ran, or none
        stepped, or none defined it)."""
        means = {}
        count = len(UPDATE_STATS)
        for kind, prefix in (("on", ""), ("off", "off_")):
            stepped = 0.0
            if self.counts[kind]:
                read = torch.cat([self.sums[kind], self.defined[kind], self.largest_grad_norm[kind].unsqueeze(0),
                                  self.stepped[kind].unsqueeze(0)]).tolist()
                totals, defined, (largest, stepped) = read[:count], read[count:2 * count], read[2 * count:]
            if not stepped:
                totals, defined, largest = [float("nan")] * count, [0.0] * count, float("nan")
            for name, total, times in zip(UPDATE_STATS, totals, defined):
                if name != "nonfinite":
                    means[prefix + name] = total / times if times else float("nan")
                if name == "grad_norm":
                    means[prefix + "grad_norm_max"] = largest
        return means


def resident_memory_mb() -> float:
    """This process's resident memory (RSS) in MB, from /proc/self/statm (NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")


def progress_row(trainer, fps: float) -> dict:
    """The progress row of ``trainer`` now, its update statistics since the last row included;
    the evaluation columns are empty (an evaluation fills them)."""
    tracker = trainer.tracker
    row: dict[str, float] = {
        "total_timesteps": trainer.timesteps,
        "iterations": trainer.iterations,
        "updates": trainer.updates,
        "time_elapsed": round(trainer.time_elapsed(), 1),
        "fps": round(fps, 1),
        "episodes": tracker.episodes,
        "mean_episode_reward": tracker.mean_return(),
        "mean_episode_length": float(np.mean(tracker.recent_lengths)) if tracker.recent_lengths else float("nan"),
        "lr": float("nan") if trainer.learned_lr is None else trainer.learned_lr,  # no update yet (overlap's first iteration)
        "off_policy_updates": trainer.update_stats.counts["off"],
        "nonfinite_updates": trainer.agent.nonfinite_updates,
        "rss_mb": round(resident_memory_mb(), 1),
        "eval_mean": float("nan"),
        "eval_std": float("nan"),
        "eval_episodes": 0,
        "eval_seconds": 0.0,
    }
    row.update(trainer.update_stats.means())
    return row

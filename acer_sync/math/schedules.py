"""Learning-rate schedules, as functions of the number of agent steps taken so far."""

from __future__ import annotations

SCHEDULES = ("linear", "constant")


def learning_rate(schedule: str, initial: float, timesteps: int, total_timesteps: int) -> float:
    """The learning rate after ``timesteps`` agent steps.

    ``linear`` decays from ``initial`` to 0 at ``total_timesteps`` (Baselines' ``learn()``
    default); ``constant`` keeps ``initial`` (what ``baselines.run`` uses for Atari). The
    position in the schedule is therefore fully given by the step counter, which checkpoints keep.
    """
    if schedule == "constant":
        return initial
    if schedule == "linear":
        return initial * max(0.0, 1.0 - timesteps / total_timesteps)
    raise ValueError(f"unknown schedule {schedule!r}; choose from {SCHEDULES}")

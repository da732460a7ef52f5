"""How a run ended: what :meth:`acer_sync.training.trainer.Trainer.train` returns.

The Trainer says why it stopped and nothing more; the scripts turn an :class:`Outcome` into an
exit code and an ``error:`` line through the one table in :mod:`acer_sync.base.errors`, and
:func:`acer_sync.train` into a return value or a :class:`acer_sync.api.runs.TrainingStopped`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class Stop(enum.Enum):
    """Why a run stopped; each value says it in words."""

    FINISHED = "reached total_timesteps"
    #: A first SIGINT or SIGTERM: a checkpoint was written, and the run can be resumed. A second
    #: SIGINT stops at once, keeping the previous checkpoint.
    INTERRUPTED = "stopped by SIGINT or SIGTERM"
    #: An env worker process died; a checkpoint was written first.
    ENV_DIED = "an env worker process died"
    #: An env raised an exception, or returned a non-finite observation or reward (training or
    #: evaluation); a checkpoint of the last completed iteration was written first (none where it
    #: failed when made for the run or in its first reset: the run did not start).
    ENV_FAILED = "an env failed"
    #: An env step or reset did not return within ``env_timeout`` seconds; a checkpoint of the last
    #: completed iteration was written first (none where it hung in its first reset).
    ENV_TIMEOUT = "an env did not answer within env_timeout"
    #: A file of the run could not be written (a full disk, a lost mount, no permission): the
    #: checkpoint written before stays, and nothing was left half-written.
    WRITE_FAILED = "a file of the run could not be written"
    #: ``max_nonfinite`` non-finite updates in a row, or a policy whose statistics were not finite
    #: for a finite observation (no action could be drawn); the last good checkpoint is kept.
    NONFINITE = "too many non-finite updates in a row, or a non-finite policy"
    #: A callback asked to stop (returned False), e.g. the reward to stop at was reached; a
    #: checkpoint was written. A success: the scripts exit 0.
    CALLBACK = "stopped by a callback"
    #: A user's callback raised an exception; a checkpoint was written, and the exception propagates.
    CALLBACK_FAILED = "a callback raised an exception"
    #: The device or the host ran out of memory in the run (an update, acting, an evaluation); a
    #: checkpoint of where it stood was written.
    OUT_OF_MEMORY = "out of memory"
    #: Another exception stopped the run: a bug, in a torso of yours or in acer_sync, or a
    #: KeyboardInterrupt that no signal sent. A checkpoint of where it stood was written (the
    #: collection it broke dropped, the updates done kept), and the exception propagates.
    CRASHED = "an exception stopped the run"


@dataclass(frozen=True)
class Outcome:
    """How a run ended.

    :param stop: why it stopped.
    :param run_dir: the run directory (its checkpoint continues the run).
    :param timesteps: the agent steps trained when it stopped.
    :param error: what went wrong, in one line, for an ``error:`` line; empty when nothing did
        (the run finished, or stopped for a first signal after saving its checkpoint).
    :param message: why a callback stopped the run (:attr:`Stop.CALLBACK`), in one line; for
        :attr:`Stop.INTERRUPTED`, which signal it was (``stopped by SIGTERM``).
    :param checkpoint_step: the step ``checkpoints/latest.pt`` holds once the run ended (None:
        none was written, or not known).
    """

    stop: Stop
    run_dir: Path
    timesteps: int
    error: str = ""
    message: str = ""
    checkpoint_step: int | None = None

    @property
    def finished(self) -> bool:
        """Whether the run ended as planned: at ``total_timesteps``, or stopped by a callback."""
        return self.stop in (Stop.FINISHED, Stop.CALLBACK)

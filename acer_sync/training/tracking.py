"""``--track``: a run's progress rows, config and evaluation videos in Weights & Biases, as CleanRL's
``--track`` logs them.

The rows are logged as they are written to ``progress.csv``, at the agent step they were written
(``wandb.log(row, step=timesteps)``), not by syncing TensorBoard's files, which made the run wait
about 10 s at its end. W&B keeps its own files under the run directory's ``wandb/``; with
``WANDB_MODE=offline`` that is all it does (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads them
later). The W&B run's id is saved in the checkpoint, so a resumed run logs on into the same W&B run.
Where W&B cannot start (no API key, no network), the run says so in one warning line and trains on
untracked: a tracking service is not worth a stopped run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from acer_sync.base.config import Config
from acer_sync.base.errors import UserError
from acer_sync.base.log import log
from acer_sync.base.outcome import Outcome
from acer_sync.training.callbacks import Callback, EvalCallback, ProgressCallback


def check_wandb() -> None:
    """A one-line UserError where ``--track`` cannot import wandb."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise UserError("--track logs to Weights & Biases, which is not installed: pip install wandb") from None


#: Under the run directory's ``wandb/``: the W&B run's id and the step of the last row an offline
#: session gave it, which a resumed offline run cannot tell (it counts its steps from 0 again).
LOGGED_FILE = "last_logged_step"


class WandbCallback(Callback):
    """Logs each progress row (numbers only; the final one, ``progress``'s, too), the config once,
    and each video the evaluation recorded (``capture_video``) to a W&B run named after the run
    directory."""

    def __init__(self, run_dir: Path, config: Config, evaluation: EvalCallback | None = None,
                 progress: ProgressCallback | None = None):
        self.run_dir = run_dir
        self.config = config
        self.evaluation = evaluation
        self.progress = progress
        self.run = None
        self.run_id: str | None = None
        self.offline = False
        #: Offline, the last step of a row this W&B run was given, by any session (:data:`LOGGED_FILE`); -1: none.
        self.logged_to = -1

    def on_training_start(self, trainer) -> None:
        import wandb

        cfg = self.config
        try:
            self.run = wandb.init(
                project=cfg.wandb_project, entity=cfg.wandb_entity or None, name=self.run_dir.name, id=self.run_id,
                resume="allow", dir=str(self.run_dir), config=dataclasses.asdict(cfg), reinit="create_new",
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )
        except Exception as error:  # no API key, no network, a project refused: the run goes on untracked
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            log.warning(f"--track: W&B did not start ({type(error).__name__}: {reason}); training goes on without it "
                        "(log in with wandb login, or set WANDB_MODE=offline to keep the run under the run directory)")
            return
        self.run_id = self.run.id
        # An online run says what it holds (its step); an offline one, opened again, counts from 0,
        # so the run directory keeps the last step each session gave it.
        self.offline = self.run.settings.mode == "offline"
        self.logged_to = self._recorded_step() if self.offline else -1
        last = self._last_step()
        if last > trainer.timesteps:
            log.warning(
                f"--track: W&B run {self.run.id} holds rows to step {last}, past the checkpoint's {trainer.timesteps} "
                "(the session after it ended without one); W&B ignores rows at steps it has passed, so this "
                f"session's rows to step {last} are in progress.csv and TensorBoard only"
            )
        offline = Path(self.run.dir).parent
        # every session of the run writes a folder of its own: the command uploads them all, in order
        sessions = offline.parent / "offline-run-*"
        where = f"offline, in {offline}; upload the run with wandb sync {sessions}" if self.run.settings.mode == "offline" else self.run.url
        log.info(f"W&B run {self.run.id} ({where})")

    def _last_step(self) -> int:
        """The step of the last row the W&B run holds (a resumed run's history goes on from it), -1 where none."""
        try:
            step = int(self.run.step) - 1  # ``step`` is the next log()'s
        except Exception:  # noqa: BLE001 - a mode without it ("shared"): nothing to compare
            step = -1
        return max(step, self.logged_to)

    def _recorded_step(self) -> int:
        """The step :data:`LOGGED_FILE` records for this W&B run; -1 where it holds none (or is torn)."""
        try:
            run_id, step = (self.run_dir / "wandb" / LOGGED_FILE).read_text().split()
            return int(step) if run_id == self.run.id else -1
        except (OSError, ValueError):
            return -1

    def _logged(self, step: int) -> None:
        """Offline, record that the W&B run was given a row at ``step`` (a failed write loses only this note)."""
        if not self.offline or step <= self.logged_to:
            return
        self.logged_to = step
        try:
            (self.run_dir / "wandb").mkdir(exist_ok=True)
            (self.run_dir / "wandb" / LOGGED_FILE).write_text(f"{self.run.id} {step}\n")
        except OSError:
            pass

    def on_rollout_end(self, trainer, row: dict) -> None:
        if self.run is None:
            return
        if row:
            self._log_row(trainer, row)
        self._log_videos()

    def _log_row(self, trainer, row: dict) -> None:
        numbers = {name: value for name, value in row.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
        self.run.log(numbers, step=trainer.timesteps)
        self._logged(trainer.timesteps)

    def _log_videos(self) -> None:
        if self.evaluation is not None and self.evaluation.new_videos:
            import wandb

            for step, path in self.evaluation.new_videos:
                self.run.log({"eval_video": wandb.Video(str(path), format="mp4")}, step=step)
                self._logged(step)
            self.evaluation.new_videos.clear()

    def on_training_end(self, trainer, outcome: Outcome) -> None:
        if self.run is None:
            return
        try:
            if self.progress is not None and self.progress.final_row is not None:
                if trainer.timesteps > self._last_step():
                    self._log_row(trainer, self.progress.final_row)
                else:  # the stop's row at this step, before the evaluation a resume at the total played
                    log.warning(f"--track: W&B run {self.run.id} has a row at step {trainer.timesteps} already and keeps "
                                "it; this session's row at that step is in progress.csv and TensorBoard only")
            self._log_videos()
        finally:
            self.run.finish(exit_code=0 if outcome.finished else 1)
            self.run = None

    def state(self) -> dict:
        return {} if self.run_id is None else {"run_id": self.run_id}

    def load_state(self, state: dict) -> None:
        self.run_id = state.get("run_id")

"""Progress logging: one CSV row and one set of TensorBoard scalars per log interval."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from acer_sync.training.checkpoint import atomic_write


class Logger:
    """Writes ``progress.csv`` and TensorBoard event files in ``run_dir``.

    On resume from a checkpoint at step ``resume_step`` the CSV is appended to with its existing
    columns, after the rows past that step are dropped: a process killed after its last checkpoint
    logged them, and the resumed run logs those steps again. TensorBoard is opened with
    ``purge_step=resume_step + 1``, so it hides that process's events past the checkpoint too.
    Each row is flushed to both as it is logged, so a crash loses no row before it.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.csv_path = Path(run_dir) / "progress.csv"
        self.columns: list[str] | None = None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with open(self.csv_path, newline="") as handle:
                self.columns = next(csv.reader(handle), None)
            if resume_step is not None:
                drop_rows_after(self.csv_path, resume_step)
        self.csv_file = open(self.csv_path, "a", newline="")
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"), purge_step=purge_step)

    def log(self, row: dict[str, float]) -> None:
        if self.columns is None:
            self.columns = list(row)
            csv.writer(self.csv_file).writerow(self.columns)
        csv.writer(self.csv_file).writerow([_format(row.get(name, float("nan"))) for name in self.columns])
        self.csv_file.flush()
        step = int(row["total_timesteps"])
        for name, value in row.items():
            if name != "total_timesteps" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.csv_file.close()
        self.writer.close()


def drop_rows_after(csv_path: Path, step: int) -> None:
    """Rewrite ``progress.csv`` atomically without its rows past ``step`` and without a torn last
    line (a row cut short by a kill); leave it alone when it holds neither."""
    with open(csv_path, newline="") as handle:
        lines = handle.read().splitlines(keepends=True)
    header = next(csv.reader(lines[:1]), [])
    if "total_timesteps" not in header:
        return
    step_column = header.index("total_timesteps")
    kept = lines[:1]
    for line in lines[1:]:
        cells = next(csv.reader([line]), [])
        if line.endswith("\n") and len(cells) == len(header) and _step(cells[step_column]) <= step:
            kept.append(line)
    if len(kept) < len(lines):
        atomic_write(csv_path, lambda handle: handle.write("".join(kept).encode()))


def _step(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)

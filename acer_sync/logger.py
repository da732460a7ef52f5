"""Progress logging: one CSV row and one set of TensorBoard scalars per log interval."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class Logger:
    """Writes ``progress.csv`` and TensorBoard event files in ``run_dir``.

    On resume the CSV is appended to with its existing columns; TensorBoard scalars are keyed by
    ``total_timesteps``, so a resumed run continues the same curves.
    """

    def __init__(self, run_dir: Path):
        self.csv_path = Path(run_dir) / "progress.csv"
        self.columns: list[str] | None = None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with open(self.csv_path, newline="") as handle:
                self.columns = next(csv.reader(handle), None)
        self.csv_file = open(self.csv_path, "a", newline="")
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

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

    def close(self) -> None:
        self.csv_file.close()
        self.writer.close()


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)

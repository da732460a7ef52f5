"""Progress logging: one CSV row and one set of TensorBoard scalars per log interval."""

from __future__ import annotations

import csv
import math
import threading
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from acer_sync.base.errors import UserError, WriteFailed
from acer_sync.base.log import number_text
from acer_sync.training.checkpoint import atomic_write_text


def _quiet_tensorboard_thread(args) -> None:
    """``threading.excepthook`` without the traceback of TensorBoard's writer thread: its error
    (a full disk, say) is raised again by the writer's next ``flush`` in the run's own thread,
    where :meth:`Logger.log` reports it in one line. Any other thread's goes to the hook before."""
    if type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _previous_excepthook(args)


_previous_excepthook = threading.excepthook
threading.excepthook = _quiet_tensorboard_thread


class Logger:
    """Writes ``progress.csv`` and TensorBoard event files in ``run_dir``.

    On resume from a checkpoint at step ``resume_step`` the CSV is appended to with its existing
    columns, after the rows past that step are dropped: a process killed after its last checkpoint
    logged them, and the resumed run logs those steps again. TensorBoard is opened with
    ``purge_step=resume_step + 1``, so it hides that process's events past the checkpoint too.
    Each row is flushed to both as it is logged, so a crash loses no row before it. A write that
    fails (a full disk) raises :class:`~acer_sync.base.errors.WriteFailed` naming the file.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.csv_path = Path(run_dir) / "progress.csv"
        self.tb_path = Path(run_dir) / "tb"
        self.columns: list[str] | None = None
        try:  # first, and now: TensorBoard makes it at the first row, after a run's files are written
            self.tb_path.mkdir(exist_ok=True)
        except OSError as error:  # a file named tb, a read-only folder: the start fails, and leaves nothing
            raise WriteFailed(self.tb_path, error) from None
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            self.columns = check_progress(self.csv_path)
            try:
                if self.columns is None:  # a header cut short, and no row: the first row writes it again
                    atomic_write_text(self.csv_path, "")
                elif resume_step is not None:
                    drop_rows_after(self.csv_path, resume_step)
            except OSError as error:
                raise WriteFailed(self.csv_path, error) from None
        try:
            self.csv_file = open(self.csv_path, "a", newline="")
        except OSError as error:
            raise WriteFailed(self.csv_path, error) from None
        try:
            self.writer = SummaryWriter(log_dir=str(self.tb_path), purge_step=None if resume_step is None else resume_step + 1)
        except OSError as error:
            self.csv_file.close()
            raise WriteFailed(self.tb_path, error) from None

    def log(self, row: dict[str, float]) -> None:
        try:
            if self.columns is None:
                self.columns = list(row)
                csv.writer(self.csv_file).writerow(self.columns)
            csv.writer(self.csv_file).writerow([_format(row.get(name, float("nan"))) for name in self.columns])
            self.csv_file.flush()
        except OSError as error:
            raise WriteFailed(self.csv_path, error) from None
        step = int(row["total_timesteps"])
        try:
            for name, value in row.items():
                if name != "total_timesteps" and isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()
        except OSError as error:
            raise WriteFailed(self.tb_path, error) from None

    def close(self) -> None:
        """Close both files; a failed write is reported by :meth:`log`, not again here."""
        for closer in (self.csv_file.close, self.writer.close):
            try:
                closer()
            except OSError:
                pass


def check_progress(csv_path: Path) -> list[str] | None:
    """The columns of ``progress.csv``; a UserError where its header is damaged: not starting with
    ``total_timesteps``, or with another number of columns than its complete rows; or not text.
    None where it holds a header cut short and nothing else (a kill as the run wrote it): nothing
    to keep, and the next row writes the header whole."""
    try:
        with open(csv_path, newline="") as handle:
            lines = handle.read().splitlines(keepends=True)
    except UnicodeDecodeError:
        raise UserError(f"{csv_path} is not a text file: restore it, or move the file away") from None
    if len(lines) == 1 and not lines[0].endswith("\n") and (
            "total_timesteps".startswith(lines[0]) or lines[0].startswith("total_timesteps,")):
        return None
    header = next(csv.reader(lines[:1]), [])
    row_widths = [(number, len(next(csv.reader([line]), []))) for number, line in enumerate(lines[1:], 2) if line.endswith("\n")]
    widths = {width for _, width in row_widths}
    if header[:1] == ["total_timesteps"] and len(header) in widths and len(widths) > 1:
        number, width = next((number, width) for number, width in row_widths if width != len(header))
        raise UserError(f"{csv_path} has a damaged row at line {number} ({width} columns, its header {len(header)}): "
                        "restore that line, or remove it")
    if header[:1] != ["total_timesteps"] or len(widths) > 1 or (widths and widths != {len(header)}):
        raise UserError(
            f"{csv_path} has a damaged header ({len(header)} columns, starting {','.join(header[:2])!r}; its rows have "
            f"{', '.join(map(str, sorted(widths))) or 'no'} columns): restore its first line, or move the file away"
        )
    return header


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
        atomic_write_text(csv_path, "".join(kept))


def _step(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def _format(value) -> str:
    if isinstance(value, float):
        return number_text(value)
    return str(value)

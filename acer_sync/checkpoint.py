"""Checkpoints: written atomically, loaded without running code.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists and dicts.
It is read with ``torch.load(..., weights_only=True)``, whose unpickler refuses any other object,
so a file that carries a code payload is rejected before the payload can run.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch

from acer_sync.errors import UserError

FORMAT_VERSION = 1
LATEST = "latest.pt"


def atomic_write(path: Path, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    A crash at any moment leaves either the old file or the new one, never a partial file.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(path: Path, payload: dict) -> None:
    payload = {"format": FORMAT_VERSION, **payload}
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except OSError as error:
        raise UserError(f"cannot write checkpoint {path}: {error.strerror or error}") from None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's latest checkpoint."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "checkpoints" / LATEST
        if not candidate.is_file():
            raise UserError(f"{path} holds no checkpoint ({candidate} is missing)")
        return candidate
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint with ``weights_only=True``; every failure is a one-line UserError."""
    path = resolve_checkpoint(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "unpickling failed"
        raise UserError(
            f"refusing to load {path}: it is not a plain-data checkpoint ({first_line})"
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError) as error:
        raise UserError(f"cannot read checkpoint {path}: it is corrupt or truncated ({type(error).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise UserError(f"{path} is not an acer_sync checkpoint (format {FORMAT_VERSION})")
    return payload

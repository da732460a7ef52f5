"""What a run records about itself besides its settings: package versions, the git commit, the
command line (``config.json``), and the same of each resumed session."""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
from pathlib import Path

import numpy as np
import torch

from acer_sync.base.config import Config
from acer_sync.base.log import log
from acer_sync.training.checkpoint import atomic_write_text

CONFIG_FILE = "config.json"


def package_versions() -> dict[str, str]:
    import ale_py
    import gymnasium

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gymnasium.__version__,
        "ale_py": ale_py.__version__,
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_config(run_dir: Path, config: Config, argv: list[str], ran: dict, commit: str | None = None) -> None:
    """``config.json``: every setting, the package versions, the git commit and the command line.

    :param commit: the git commit of the code, where it was found elsewhere (a sweep's trial runs
        a copy of the code without ``.git``, so sweep.py gives it its own); by default, this code's.
    :param ran: what the settings resolved to (:meth:`acer_sync.training.trainer.Trainer.how_it_runs`),
        recorded as ``ran``.
    :raises WriteFailed: where it cannot be written (written atomically: no half file is left).
    """
    payload = {
        "config": dataclasses.asdict(config),
        "versions": package_versions(),
        "git_commit": git_commit() if commit is None else commit,
        "command": argv,
        "ran": ran,
    }
    text = json.dumps(payload, indent=2, default=str)
    atomic_write_text(run_dir / CONFIG_FILE, text)


def record_resume(run_dir: Path, saved: Config, config: Config, argv: list[str], step: int, ran: dict,
                  commit: str | None = None) -> None:
    """A resumed session in ``config.json``: its settings become the session's ``config`` (and what
    they resolved to, ``ran``), and ``resumes`` gains the session's step, command, git commit,
    package versions, the settings it changed from the checkpoint's ``saved`` ones (``{name:
    [before, after]}``) and its ``ran``; the first session's record stays as it is. A file that
    cannot be read as a run's record is left alone (a warning).

    :raises WriteFailed: where it cannot be written (written atomically: the old file stays whole).
    """
    path = Path(run_dir) / CONFIG_FILE
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        payload = None
    if not isinstance(payload, dict) or not isinstance(payload.get("config"), dict):
        log.warning(f"{path} is not a run's record of its settings, so this session is not added to it")
        return

    def plain(settings: Config) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(settings), default=str))

    before, now = plain(saved), plain(config)
    changed = {name: [before[name], value] for name, value in now.items() if before[name] != value}
    resumes = payload.get("resumes") if isinstance(payload.get("resumes"), list) else []
    session = {"step": step, "command": argv, "git_commit": git_commit() if commit is None else commit,
               "versions": package_versions(), "changed": changed, "ran": ran}
    payload = {**payload, "config": now, "ran": ran, "resumes": [*resumes, session]}
    atomic_write_text(path, json.dumps(payload, indent=2, default=str))


def read_config(run_dir: Path) -> dict | None:
    """The settings ``config.json`` records (its ``config``), or None where the run has no
    readable one; a run written before a setting existed lacks that key."""
    try:
        payload = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    config = payload.get("config") if isinstance(payload, dict) else None
    return config if isinstance(config, dict) else None

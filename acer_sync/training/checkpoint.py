"""Checkpoints: one format, written atomically, loaded without running code, migrated on load.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists and dicts.
It is read with ``torch.load(..., weights_only=True)``, whose unpickler refuses any other object,
so a file that carries a code payload is rejected before the payload can run.

Format 3 (:data:`FORMAT_VERSION`) holds, besides ``format``:

* ``config``: every :class:`~acer_sync.base.config.Config` field; ``env_id``; ``action_low`` and
  ``action_high``, the Box a Gaussian policy's actions are clipped to (empty for discrete actions);
  ``action_start``, a ``Discrete(n, start)`` space's first action (0 in files written before it);
  ``observation_space``, the env's own where training turns its observations into other frames, as
  plain data (:mod:`atari.space_data`; None otherwise, and in files written before it);
* ``model_spec`` (every key the network records), ``model``, ``average_model``, ``optimizer``;
* ``counters``: ``timesteps``, ``iterations``, ``updates``, ``episodes``, ``nonfinite_updates``,
  ``nonfinite_streak`` (those in a row at the end, so that ``--max-nonfinite`` counts across a
  resume), ``unlearned_segments``, ``time_elapsed``; ``recent_returns`` and ``recent_lengths``, the last 100 episodes; ``rng``;
* ``callbacks``: each callback's own state as plain data, by its class name (``Name#2`` for a second
  one of a class): the best evaluation mean, for ``best.pt``, and the user's callbacks' states;
* ``run_key``: a random name the run is given at its start and keeps through its resumes, which its
  saved replay buffers carry too (:func:`save_buffer`), so a buffer copied in from another run is
  refused (None in files written before it: such a run gets one at its next resume).

:func:`load_checkpoint` hands every reader the current format (:data:`FORMAT_VERSION`): :func:`migrate` brings each earlier file up
to it, in one place, so no reader needs a default for a key that an older version did not write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import lzma
import os
import pickle
import re
import secrets
import tempfile
import threading
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy._core.multiarray as np_multiarray
import torch

from acer_sync.base.config import setting_defaults
from acer_sync.base.errors import UserError, WriteFailed, names_a_path
from acer_sync.base.transfer import numpy_dtype
from acer_sync.nets.networks import complete_spec, network_from_spec
from acer_sync.replay.frozen import FrozenArray
from acer_sync.training.rng_state import capture_rng, restore_rng
from atari.envs import env_info
from atari.space_data import space_to_data

FORMAT_VERSION = 3
LATEST = "latest.pt"
BEST = "best.pt"
BUFFER_FILE = "buffer.npz"
#: How much of a tensor :func:`write_arrays` brings to the host at a time.
WRITE_CHUNK_BYTES = 8 << 20


def current_umask() -> int:
    """The process's umask, read from /proc (setting it to read it back, elsewhere, would race
    with a thread creating a file meanwhile: the collecting thread of ``--pipeline overlap``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it over ``path``.

    A crash at any moment leaves either the old file or the new one, never a partial file. The file
    gets the mode ``open`` would give it (0o666 less the umask), not ``mkstemp``'s 0o600, so a
    teammate's ``play.py`` reads a checkpoint in a shared folder as it reads ``progress.csv``.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with :func:`atomic_write`; a :class:`WriteFailed` naming the path
    and the cause if it cannot."""
    try:
        atomic_write(path, lambda handle: handle.write(text.encode()))
    except OSError as error:
        raise WriteFailed(path, error) from None


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically; a :class:`WriteFailed` naming the path and the
    cause if it cannot (torch's zip writer turns the OS's error into a RuntimeError)."""
    payload = {"format": FORMAT_VERSION, **payload}
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except (OSError, RuntimeError) as error:
        raise WriteFailed(path, error) from None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's latest checkpoint."""
    if not names_a_path(path):
        raise UserError(f"a checkpoint is a run directory or a .pt file, got {path!r}")
    path = Path(path)
    if path.is_dir():
        candidate = latest_checkpoint(path)
        if not candidate.is_file():
            if (path / LATEST).is_file():
                raise UserError(f"{path} is a run's checkpoints folder: give the run directory, {path.parent}, or a .pt file in it")
            raise UserError(f"{path} holds no checkpoint ({candidate} is missing){copy_hint(candidate)}")
        return candidate
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist{step_copy_hint(path)}")
    return path


def step_copy_hint(path: Path) -> str:
    """Where ``path`` names a step copy by an unpadded step (``step_16000.pt``): the copy's own name
    (``step_0000016000.pt``) where it is there, as "; ..." to end a message; empty otherwise."""
    match = re.fullmatch(r"step_(\d+)\.pt", path.name)
    padded = path.with_name(f"step_{int(match[1]):010d}.pt") if match else None
    return f"; did you mean {padded}?" if padded is not None and padded != path and padded.is_file() else ""


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The path of ``run_dir``'s ``latest.pt`` (which may not exist)."""
    return Path(run_dir) / "checkpoints" / LATEST


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to play or resume from."""
    return latest_checkpoint(run_dir).is_file()


def copy_hint(latest: Path) -> str:
    """Where ``latest`` (a run's ``latest.pt``) is missing or damaged: the newest ``step_*.pt``
    copy beside it to go back to, as "; ..." to end a message; empty where there is none."""
    if latest.name != LATEST:
        return ""
    copies = sorted(latest.parent.glob("step_*.pt"))
    if not copies:
        return ""
    step = copies[-1].stem.removeprefix("step_").lstrip("0") or "0"
    return f"; {copies[-1].name} beside it holds step {step}: copy it to {LATEST} to go back there"


#: What a run's checkpoint holds that reading it (play.py, ``acer_sync.load``, resume) needs, and of which type.
REQUIRED_KEYS = {"config": dict, "model_spec": dict, "env_id": str, "model": dict}


#: numpy's numbers and numeric arrays, which ``weights_only`` reads as data once allowed (torch's
#: docs allow them so). Checkpoints keep none since callbacks' states are made plain
#: (``acer_sync.training.callbacks.plain_state``), but one saved before, with a callback's ``np.mean``
#: in it, loads. Object arrays stay refused: their items could be any object. numpy 1 pickled two of
#: them under ``numpy.core``, numpy 2 under ``numpy._core``.
NUMPY_NUMBERS = [
    np.dtype, np.ndarray, np_multiarray.scalar, np_multiarray._reconstruct,
    (np_multiarray.scalar, "numpy.core.multiarray.scalar"), (np_multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
] + [type(np.dtype(code)) for code in np.typecodes["AllInteger"] + np.typecodes["AllFloat"] + "?"]
#: torch's allowlist is one per process: loads in two threads would take each other's entries away.
_ALLOWLIST_LOCK = threading.Lock()


@contextlib.contextmanager
def numpy_numbers_allowed():
    """:data:`NUMPY_NUMBERS` on torch's ``weights_only`` allowlist for the ``with`` block: only those
    missing from it are added, and only those are taken away after (a caller's own stay)."""
    with _ALLOWLIST_LOCK:
        present = torch.serialization.get_safe_globals()
        with torch.serialization.safe_globals([entry for entry in NUMPY_NUMBERS if entry not in present]):
            yield


def refused_object(error: pickle.UnpicklingError) -> str:
    """What ``weights_only`` refused to build, in a few words (torch's message is a dozen lines,
    with terminal escapes)."""
    found = re.search(r"unsupported (?:global: )?GLOBAL (\S+)|but got <class '([^']+)'>", str(error), re.IGNORECASE)
    name = next((group for group in found.groups() if group), None) if found else None
    return f"it holds {'a ' + name if name else 'an object'}, which only running code could build"


def _unreadable(path: Path, why: str = "") -> UserError:
    """The one line for a checkpoint file that torch cannot read, with ``why`` (what torch's reader
    raised) and the step copy to go back to (:func:`copy_hint`)."""
    return UserError(
        f"cannot read checkpoint {path}: it is corrupt or truncated, or not a checkpoint{f' ({why})' if why else ''}{copy_hint(path)}"
    )


def damaged_member(path: Path) -> str | None:
    """What is damaged in ``path`` (torch's zip archive), as "MEMBER fails its CRC check" or
    "MEMBER is damaged in the zip's index"; None where nothing is.

    torch's reader checks no CRC, so a bit flipped in a tensor's bytes would load as other weights,
    in silence. torch writes a CRC for every member (``torch.utils.serialization.config.save.compute_crc32``,
    on by default); members written with it off store 0 and are not checked. A file (a name not
    ending in "/") marked a folder in the index would be read by torch as empty. It reads the file
    once more: 30 ms for Pong's 24 MB checkpoint.
    """
    with zipfile.ZipFile(path) as archive:
        for member in archive.infolist():
            if member.external_attr & MSDOS_DIRECTORY and not member.filename.endswith("/"):
                return f"{member.filename} {INDEX_DAMAGE}"
            if member.CRC == 0:
                continue
            try:
                with archive.open(member) as data:
                    while data.read(CRC_READ_BYTES):
                        pass
            except zipfile.BadZipFile as error:
                return f"{member.filename} {'fails its CRC check' if 'CRC' in str(error) else INDEX_DAMAGE}"
            except (zlib.error, lzma.LZMAError, OSError, EOFError, NotImplementedError):  # another compression, read from a flipped bit
                return f"{member.filename} {INDEX_DAMAGE}"
    return None


#: What :func:`damaged_member` says of a member whose entry in the zip's index is damaged.
INDEX_DAMAGE = "is damaged in the zip's index"
#: The MS-DOS attribute bit of a zip member that is a folder (``external_attr``).
MSDOS_DIRECTORY = 0x10
#: How much of a checkpoint member :func:`damaged_member` reads at once.
CRC_READ_BYTES = 1 << 22


def load_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint with ``weights_only=True`` and bring it to the current format
    (:func:`migrate`); every failure is a one-line UserError."""
    path = resolve_checkpoint(path)
    try:
        if zipfile.is_zipfile(path) and (damage := damaged_member(path)) is not None:
            raise _unreadable(path, damage)
        with warnings.catch_warnings():  # a file of another pickle protocol warns before it fails
            warnings.simplefilter("ignore", UserWarning)
            with numpy_numbers_allowed():
                payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if not zipfile.is_zipfile(path):  # every checkpoint is torch's zip archive: this is some other file
            raise _unreadable(path) from None
        raise UserError(f"refusing to load {path}: it is not a plain-data checkpoint ({refused_object(error)})") from None
    except OSError as error:
        if error.errno == errno.EINVAL:  # torch's zip reader on some truncated files (a CartPole checkpoint cut in half)
            raise _unreadable(path, "EINVAL") from None
        raise UserError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    except (RuntimeError, EOFError, ValueError, KeyError, IndexError, TypeError, MemoryError, AssertionError,
            NotImplementedError, zipfile.BadZipFile, zlib.error) as error:
        # what torch's readers raise on a file that is damaged or of another kind (text: KeyError; a CSV: IndexError;
        # an array of a size no checkpoint has: MemoryError; a flipped bit in the pickle: AssertionError)
        raise _unreadable(path, type(error).__name__) from None
    version = payload.get("format") if isinstance(payload, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise UserError(f"{path} has checkpoint format {version}, newer than this version's ({FORMAT_VERSION}); update acer_sync")
        raise UserError(f"{path} is not an acer_sync checkpoint (formats 1 to {FORMAT_VERSION})")
    try:
        return migrate(payload)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise UserError(f"{path} is not a usable acer_sync checkpoint ({type(error).__name__}: {error})") from None


def load_run_checkpoint(path: str | Path) -> dict:
    """A run's checkpoint (:func:`load_checkpoint`), with a one-line UserError where it lacks
    what reading it needs (:data:`REQUIRED_KEYS`)."""
    payload = load_checkpoint(path)
    for key, kind in REQUIRED_KEYS.items():
        if not isinstance(payload.get(key), kind):
            found = "missing" if key not in payload else f"a {type(payload[key]).__name__}"
            raise UserError(
                f"{resolve_checkpoint(path)} is not a usable acer_sync checkpoint: its {key} is {found}, not a {kind.__name__}"
            )
    return payload


def migrate(payload: dict) -> dict:
    """``payload`` of any earlier format, in the current one.

    Format 1 (until this version) was written with more keys over time; what its first files lack
    is filled in as those versions behaved: settings added since at their defaults, a network spec
    with its first four keys only (a categorical net without normalization), no episode lengths,
    no ``nonfinite_updates`` or ``time_elapsed`` counters (0), and for a Gaussian policy no Box
    bounds (read from the env). Format 2 adds ``callbacks``. Format 3 is the composed network
    (:mod:`acer_sync.nets.networks`): its parameters renamed (:data:`FORMAT3_NAMES`), its spec
    with ``activation`` (tanh), ``torso`` and ``torso_kwargs`` (none) and ``obs_dtype``; its
    counters gained ``unlearned_segments`` (0 before it existed) with ``--pipeline overlap``, and
    its spec ``lstm_norm`` (``none``) with ``--lstm-norm``.
    """
    payload = dict(payload)
    if payload["format"] == 1:
        if payload["model_spec"].get("arch") == "mlp" and payload["model_spec"].get("policy", "categorical") == "categorical" \
                and _shares_its_torso(payload["model"]):
            payload = _split_shared_torso(payload)
        payload["config"] = {**setting_defaults(), **payload["config"]}
        payload["model_spec"] = {"policy": "categorical", "normalize_obs": False, **payload["model_spec"]}
        payload["counters"] = {"nonfinite_updates": 0, "time_elapsed": 0.0, **payload["counters"]}
        payload.setdefault("recent_lengths", [])
        if not payload.get("action_low") or not payload.get("action_high"):
            payload["action_low"], payload["action_high"] = _action_bounds(payload)
        payload["callbacks"] = {}
        payload["format"] = 2
    if payload["format"] == 2:
        spec = payload["model_spec"]
        payload["model_spec"] = complete_spec(spec)
        for key in ("model", "average_model"):
            payload[key] = {format3_name(name, spec): tensor for name, tensor in payload[key].items()}
        payload["optimizer"] = _optimizer_in_order(payload["optimizer"], list(payload["model"]), payload["model_spec"])
        payload["format"] = 3
    # Files written before Discrete(n, start) was taken lack action_start: their envs' actions started at 0.
    payload.setdefault("action_start", 0)
    # ... and the env's own observation space (None: the frames are its observations, or unknown).
    payload.setdefault("observation_space", None)
    # ... and the run's key (None: a run started before runs had one).
    payload.setdefault("run_key", None)
    # Format 3 files written before --pipeline overlap lack unlearned_segments: none of theirs was;
    # and those written before the streak was kept, nonfinite_streak: a resume began it at 0.
    if isinstance(payload.get("counters"), dict):
        payload["counters"] = {"unlearned_segments": 0, "nonfinite_streak": 0, **payload["counters"]}
    # Format 3 specs written before a key existed (lstm_norm) mean what its default means.
    if isinstance(payload.get("model_spec"), dict):
        payload["model_spec"] = complete_spec(payload["model_spec"])
    return payload


def _shares_its_torso(model: dict) -> bool:
    """Whether a format-1 MLP net is the first version's, whose π and Q shared one torso."""
    return any(name.startswith("torso.") for name in model) and not any("_torso." in name for name in model)


def _split_shared_torso(payload: dict) -> dict:
    """The first version's MLP net (π and Q on one torso) as the nets since (each its own): Q's
    torso a copy of the shared one, in the network, the average network and RMSProp's state (by
    parameter index: the copies come after the saved parameters, and the format-3 migration puts
    them in the composed network's order). The same function; from there on they learn apart."""
    payload = dict(payload)
    names = list(payload["model"])  # in the order of the parameters, which RMSProp's state is indexed by
    shared = [index for index, name in enumerate(names) if name.startswith("torso.")]
    for key in ("model", "average_model"):
        payload[key] = {**payload[key], **{f"q_{names[index]}": payload[key][names[index]].clone() for index in shared}}
    optimizer = payload["optimizer"]
    state = dict(optimizer["state"])
    for position, index in enumerate(shared):
        if index in state:
            state[len(names) + position] = {k: v.clone() for k, v in state[index].items()}
    groups = [{**group, "params": list(range(len(names) + len(shared)))} for group in optimizer["param_groups"]]
    payload["optimizer"] = {**optimizer, "state": state, "param_groups": groups}
    return payload


def _optimizer_in_order(optimizer: dict, names: list[str], spec: dict) -> dict:
    """The optimizer's state, indexed by the composed network's parameter order.

    An optimizer keeps its state by parameter index, in the order of ``parameters()``: a module's
    own parameters before its children's. The recurrent Gaussian net of format 2 held ``log_std``
    itself, so it came first; format 3's head holds it, after the torso and the LSTM. ``names``
    are the saved tensors' (renamed) names in their saved order, which is that order too.
    """
    new_order = [name for name, _ in network_from_spec(spec).named_parameters()]
    old_order = [name for name in names if name in set(new_order)]
    if old_order == new_order or sorted(old_order) != sorted(new_order):
        return optimizer
    old_index = {name: index for index, name in enumerate(old_order)}
    state = optimizer["state"]
    moved = {index: state[old_index[name]] for index, name in enumerate(new_order) if old_index[name] in state}
    return {**optimizer, "state": moved}


#: Format 2's parameter names, and what the composed network (format 3) calls them. A vector
#: net's "torso" was the policy's MLP, which is now the head's (its torso only flattens). The
#: parameters keep their order, so the optimizer's state (by index) needs no change.
FORMAT3_NAMES = {
    "q_torso.": "head.q_mlp.", "value_torso.": "head.value_mlp.", "advantage_torso.": "head.advantage_mlp.",
    "policy_head.": "head.pi.", "q_head.": "head.q.", "mean_head.": "head.mean.", "value_head.": "head.value.",
    "advantage_head.": "head.advantage.", "log_std": "head.log_std", "lstm.": "memory.lstm.",
}


def format3_name(name: str, spec: dict) -> str:
    """What the composed network calls the parameter ``name`` of a format-1 or -2 net of ``spec``."""
    if spec["arch"] == "mlp" and name.startswith("torso."):
        return ("head.mean_mlp." if spec.get("policy") == "gaussian" else "head.pi_mlp.") + name[len("torso."):]
    for old, new in FORMAT3_NAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _action_bounds(payload: dict) -> tuple[list[float], list[float]]:
    """A format-1 checkpoint's Box bounds: none for a categorical policy, the env's for a Gaussian one."""
    if payload["model_spec"]["policy"] != "gaussian":
        return [], []
    info = env_info(payload["env_id"], payload["config"]["env_kwargs"])
    return list(info.action_low), list(info.action_high)



def trainer_payload(trainer) -> dict:
    """What a checkpoint of ``trainer`` holds (the module docstring lists it)."""
    return {
        "config": dataclasses.asdict(trainer.config),
        "env_id": trainer.info.env_id,
        "action_low": list(trainer.info.action_low),
        "action_high": list(trainer.info.action_high),
        "action_start": trainer.info.action_start,
        "observation_space": space_to_data(trainer.info.observation_space),
        "model_spec": trainer.model.spec(),
        "model": trainer.model.state_dict(),
        "average_model": trainer.agent.average_model.state_dict(),
        "optimizer": trainer.agent.optimizer.state_dict(),
        "counters": {
            "timesteps": trainer.timesteps,
            "iterations": trainer.iterations,
            "updates": trainer.updates,
            "episodes": trainer.tracker.episodes,
            "nonfinite_updates": trainer.agent.nonfinite_updates,
            "nonfinite_streak": trainer.agent.nonfinite_streak,
            "time_elapsed": trainer.time_elapsed(),
            # --pipeline overlap: segments that got no on-policy update (a resume does not give the
            # newest stored one its pending update).
            "unlearned_segments": trainer.unlearned_segments + int(trainer.pending_update),
        },
        "recent_returns": list(trainer.tracker.recent_returns),
        "recent_lengths": list(trainer.tracker.recent_lengths),
        "rng": capture_rng(trainer.sampler),
        "callbacks": trainer.callbacks.state(),
        "run_key": trainer.run_key,
    }


def new_run_key() -> str:
    """A fresh run's key (the checkpoints' ``run_key``): 16 random hex digits."""
    return secrets.token_hex(8)


#: The counters every checkpoint holds (format 2), each a whole number >= 0 but ``time_elapsed``.
COUNTERS = ("timesteps", "iterations", "updates", "episodes", "nonfinite_updates", "time_elapsed")


def check_restorable(payload: dict, model, agent, steps_per_iteration: int) -> None:
    """A one-line UserError where ``payload`` cannot be a checkpoint of this run's network and
    optimizer: what :func:`check_saved_state` checks, and a tensor of another name or shape.
    Checked before anything is loaded or any file of the run is touched."""
    check_saved_state(payload, steps_per_iteration)
    for key, module in (("model", model), ("average_model", agent.average_model)):
        _check_tensors(f"checkpoint's {key}", payload.get(key), module.state_dict())
    _check_optimizer(payload.get("optimizer"), agent.optimizer)


def check_saved_state(payload: dict, steps_per_iteration: int) -> None:
    """A one-line UserError where ``payload``'s counters are missing or nonsensical (negative, or
    steps that are not the iterations times ``steps_per_iteration``), or its episode returns,
    generator states or callback states are damaged: what needs no network to check."""
    counters = payload.get("counters")
    if not isinstance(counters, dict):
        raise UserError("the checkpoint holds no counters")
    for name in COUNTERS:
        value = counters.get(name)
        whole = isinstance(value, int) and not isinstance(value, bool)
        number = whole or (name == "time_elapsed" and isinstance(value, float) and np.isfinite(value))
        if not number or value < 0:
            raise UserError(f"the checkpoint's counter {name} is {'missing' if value is None else repr(value)}, not a number >= 0")
    if counters["timesteps"] != counters["iterations"] * steps_per_iteration:
        raise UserError(
            f"the checkpoint's counters disagree: {counters['timesteps']} steps is not {counters['iterations']} "
            f"iterations of {steps_per_iteration} steps"
        )
    unlearned = counters.get("unlearned_segments")
    if not isinstance(unlearned, int) or isinstance(unlearned, bool) or not 0 <= unlearned <= counters["iterations"]:
        raise UserError(f"the checkpoint's counter unlearned_segments is {unlearned!r}, not a number from 0 to its iterations")
    if not counters["iterations"] - unlearned <= counters["updates"] or counters["nonfinite_updates"] > counters["updates"]:
        raise UserError(
            f"the checkpoint's counters disagree: {counters['updates']} updates for {counters['iterations']} iterations "
            f"and {counters['nonfinite_updates']} non-finite updates"
        )
    streak = counters.get("nonfinite_streak")
    if not isinstance(streak, int) or isinstance(streak, bool) or not 0 <= streak <= counters["nonfinite_updates"]:
        raise UserError(f"the checkpoint's counter nonfinite_streak is {streak!r}, not a number from 0 to its non-finite updates")
    for key in ("recent_returns", "recent_lengths"):
        values = payload.get(key)
        if not isinstance(values, list) or not all(_is_finite_number(value) for value in values):
            raise UserError(f"the checkpoint's {key} is {'missing' if values is None else 'damaged'}, not a list of numbers")
    for key in ("rng", "callbacks"):
        if not isinstance(payload.get(key), dict):
            raise UserError(f"the checkpoint's {key} state is missing or damaged")


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _check_tensors(what: str, saved, expected: dict) -> None:
    if not isinstance(saved, dict):
        raise UserError(f"the {what} is missing")
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        raise UserError(f"the {what} has other tensors than this network: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, tensor in expected.items():
        if not isinstance(saved[name], torch.Tensor) or saved[name].shape != tensor.shape:
            shape = tuple(saved[name].shape) if isinstance(saved[name], torch.Tensor) else type(saved[name]).__name__
            raise UserError(f"the {what} has {name} of shape {shape}; this network's is {tuple(tensor.shape)}")


def _check_optimizer(saved, optimizer) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not isinstance(saved.get("state"), dict):
        raise UserError("the checkpoint's optimizer state is missing")
    if sum(len(group.get("params", ())) for group in groups) != len(params):
        raise UserError("the checkpoint's optimizer holds another number of parameters than this network")
    for index, state in saved["state"].items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise UserError(f"the checkpoint's optimizer has state for parameter {index!r}, which this network lacks")
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[index].shape:
                raise UserError(
                    f"the checkpoint's optimizer state {name} of parameter {index} is {tuple(value.shape)}; the "
                    f"parameter is {tuple(params[index].shape)}"
                )


def restore(payload: dict, model, agent, tracker, sampler: np.random.Generator, steps_per_iteration: int) -> dict:
    """Load a checkpoint's weights, optimizer, episodes and generators into a new run's parts,
    once :func:`check_restorable` found nothing wrong; returns its counters (``timesteps``,
    ``iterations``, ``updates``, ``time_elapsed``)."""
    check_restorable(payload, model, agent, steps_per_iteration)
    model.load_state_dict(payload["model"])
    agent.average_model.load_state_dict(payload["average_model"])
    agent.optimizer.load_state_dict(payload["optimizer"])
    agent.optimizer.init_state()  # a checkpoint saved before the first update has none
    counters = payload["counters"]
    agent.nonfinite_updates = int(counters["nonfinite_updates"])
    agent.nonfinite_streak = int(counters["nonfinite_streak"])
    tracker.episodes = int(counters["episodes"])
    tracker.recent_returns.extend(payload["recent_returns"])
    tracker.recent_lengths.extend(payload["recent_lengths"])
    restore_rng(payload["rng"], sampler)
    return {name: counters[name] for name in ("timesteps", "iterations", "updates", "time_elapsed", "unlearned_segments")}


def write_arrays(handle, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> None:
    """Write ``arrays`` to the open binary file ``handle`` as ``np.savez`` writes them (an
    uncompressed zip of ``.npy`` members, which ``np.load`` and :class:`~acer_sync.replay.buffer.SavedArrays` read), a chunk
    at a time (:func:`write_npy`)."""
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                write_npy(member, array)


def write_npy(member, array: np.ndarray | torch.Tensor | FrozenArray) -> None:
    """``array`` as ``np.save`` writes it (in C order), its data :data:`WRITE_CHUNK_BYTES` at a time:
    a tensor's brought to the host a chunk at a time, so saving a buffer on the GPU does not copy
    it to the host whole (a default Atari buffer is 5.7 GB; 64 envs' 23 GB), and a numpy array's
    written from its own memory. numpy's writer copied each chunk twice on the way (its buffered
    iterator, then ``tobytes``): 2.3-5.7x the time of a 2 GB array's save on the 2-core machine."""
    if isinstance(array, FrozenArray):  # the buffer as it was at a step, while training stores on
        dtype, shape = array.dtype, array.shape
    elif isinstance(array, torch.Tensor):
        dtype, shape = numpy_dtype(array.dtype), tuple(array.shape)
        data = array.detach().reshape(-1).view(torch.uint8)
    else:
        array = np.asarray(array)
        if array.dtype.hasobject:  # as numpy's writer and np.load(allow_pickle=False) refuse it
            raise ValueError("Object arrays cannot be saved when allow_pickle=False")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        dtype, shape = array.dtype, array.shape
        data = array.reshape(-1).view(np.uint8)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(member, header)
    if isinstance(array, FrozenArray):  # whole rows a read
        per_read = max(1, WRITE_CHUNK_BYTES // max(1, array.row_bytes))
        for start in range(0, shape[0], per_read):
            member.write(array.read(start, min(shape[0], start + per_read)).reshape(-1).view(np.uint8))
        return
    for start in range(0, len(data), WRITE_CHUNK_BYTES):
        chunk = data[start:start + WRITE_CHUNK_BYTES]
        member.write(chunk.cpu().numpy() if isinstance(chunk, torch.Tensor) else chunk)


def save_buffer(directory: Path, buffer, timesteps: int, run_key: str) -> None:
    """Write ``buffer``'s state to ``directory/buffer.npz`` atomically, with ``timesteps``, the
    step of the checkpoint it belongs to, and the run's ``run_key`` (:func:`load_buffer` uses it
    with that checkpoint of that run only); a :class:`WriteFailed` if it cannot."""
    write_buffer_arrays(directory, buffer.state(), timesteps, run_key)


def write_buffer_arrays(directory: Path, state: Mapping, timesteps: int, run_key: str) -> None:
    """:func:`save_buffer` of a buffer's ``state`` (or its frozen views)."""
    arrays = {**state, "checkpoint_step": np.array(timesteps, dtype=np.int64), "run_key": np.array(run_key)}
    try:
        atomic_write(directory / BUFFER_FILE, lambda handle: write_arrays(handle, arrays))
    except (OSError, ValueError) as error:
        raise WriteFailed(directory / BUFFER_FILE, error) from None


class BufferWriter:
    """:func:`save_buffer` in a thread of its own while training goes on: ``buffer`` as it was at
    step ``timesteps`` (:meth:`~acer_sync.replay.buffer.ReplayBuffer.freeze`; what training stores
    meanwhile does not reach the file). :meth:`finish` waits for it and raises what stopped it (a
    :class:`WriteFailed`: a full disk)."""

    def __init__(self, directory: Path, buffer, timesteps: int, run_key: str):
        self.step = timesteps
        self.error: BaseException | None = None
        frozen = buffer.freeze()
        self.thread = threading.Thread(target=self._write, args=(directory, buffer, frozen, run_key), daemon=True,
                                       name="acer_sync buffer save")
        self.thread.start()

    def _write(self, directory: Path, buffer, frozen: dict, run_key: str) -> None:
        # A buffer on the GPU comes to the host on a stream of the thread's own, not queued
        # behind the updates on the default stream (the rows it reads are not written meanwhile).
        on_gpu = buffer.device.type == "cuda"
        try:
            with torch.cuda.stream(torch.cuda.Stream(buffer.device)) if on_gpu else contextlib.nullcontext():
                write_buffer_arrays(directory, frozen, self.step, run_key)
        except BaseException as error:  # noqa: BLE001 - raised in the training's thread by finish()
            self.error = error
        finally:
            buffer.thaw()

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def finish(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def buffer_step(arrays) -> int | None:
    """The checkpoint step a saved buffer's arrays (an npz file, open) belong to; None for a file
    written before buffers recorded it."""
    return int(arrays["checkpoint_step"]) if "checkpoint_step" in arrays.files else None


def least_buffer_step(arrays) -> int | None:
    """The least checkpoint step a buffer saved before buffers recorded their step can belong to:
    its ``counters``' steps per env (written since it last started empty) times its envs. Such
    files came from the serial loop (the overlapped one came later), whose checkpoint at step S
    had written at most S / num_envs steps per env into the buffer. None where it cannot be read
    (:meth:`~acer_sync.replay.buffer.ReplayBuffer.load_state` then says why)."""
    try:
        counters, actions = np.asarray(arrays["counters"]), arrays["actions"]
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile):
        return None
    if counters.shape != (2,) or actions.ndim < 2:
        return None
    return int(counters[0]) * int(actions.shape[1])


def saved_buffer_step(directory: Path) -> int | None:
    """The checkpoint step of the buffer file in ``directory`` (read from its small
    ``checkpoint_step`` array alone); None where there is none, or it cannot be read."""
    try:
        with np.load(Path(directory) / BUFFER_FILE, allow_pickle=False) as arrays:
            return buffer_step(arrays)
    except Exception:  # noqa: BLE001 - missing, damaged or another kind of file: the next save replaces it
        return None


def load_buffer(run_dir: Path, buffer, timesteps: int, run_key: str | None) -> str:
    """Restore the buffer saved beside a run's checkpoint at step ``timesteps``, if any; says what
    happened. A buffer saved at another step (a save cut short by a signal, a kill or a full
    disk) is not used: replay starts empty. One that cannot be read, whose contents do not fit
    this run, or that another run saved (its ``run_key`` is not the checkpoint's ``run_key``), is a
    UserError (nothing of the run is changed yet)."""
    path = Path(run_dir) / "checkpoints" / BUFFER_FILE
    if not path.exists():
        return "no saved replay buffer, so it starts empty on resume"
    try:
        arrays = np.load(path, allow_pickle=False)
        if not isinstance(arrays, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not the npz archive of arrays that a buffer is saved as")
        with arrays:
            saved_key = str(arrays["run_key"]) if "run_key" in arrays.files else None
            if saved_key is not None and run_key is not None and saved_key != run_key:
                raise UserError(
                    f"the replay buffer {path} was saved by another run (its run key is {saved_key}, this run's "
                    f"{run_key}); put this run's own back, or move it away to resume with an empty replay"
                )
            saved_step = buffer_step(arrays)
            if saved_step is not None and saved_step != timesteps:
                return (
                    f"the saved replay buffer is from step {saved_step}, not the checkpoint's {timesteps}, so it is "
                    "not used: replay starts empty"
                )
            least = least_buffer_step(arrays) if saved_step is None else None
            if least is not None and least > timesteps:  # a step copy put back as latest.pt, say
                return (
                    f"the saved replay buffer is from step {least} or later, not the checkpoint's {timesteps}, so it is "
                    "not used: replay starts empty"
                )
            buffer.load_state(arrays)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, NotImplementedError, TypeError) as error:
        # a damaged zip's header can name a zip version or a compression it does not have
        raise UserError(
            f"cannot restore the replay buffer from {path}: {str(error).strip() or type(error).__name__}; move it "
            "away to resume with an empty replay"
        ) from None
    unchecked = "" if saved_step is not None else " (saved before buffers recorded their checkpoint's step: not checked)"
    return f"replay resumes with the saved buffer ({buffer.num_steps_stored} steps per env){unchecked}"


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Remove the temporary files of writes that a kill cut short (``.NAME.*.tmp``, see
    :func:`atomic_write`) from a run directory and its checkpoints; returns them."""
    leftovers = [p for folder in (Path(run_dir), Path(run_dir) / "checkpoints") for p in folder.glob(".*.tmp")]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers

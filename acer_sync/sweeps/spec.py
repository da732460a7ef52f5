"""A sweep file: the YAML that describes a sweep, read, checked and expanded into trials.

::

    name: cartpole-rr
    envs: [CartPole-v1]
    seeds: [0, 1]
    settings:                  # any train.py setting, by its config name
      total_timesteps: 50000
      replay_ratio: [1, 4]     # a list is a grid axis
    trial: {cpus: 1, gpus: 0}  # resources of one trial; gpus may be a fraction
    failures: 3                # restarts of a trial whose process dies (optional)

Trials are every env x seed x grid point. Each trial's Config is its env's preset, then its env's
tuned settings (``acer_sync/data/envs/<EnvId>.yaml``), then the settings on top (as ``train.py
--config``), its ``threads`` set to the trial's CPUs, and it is checked as ``train.py`` checks its
flags (:func:`acer_sync.api.runs.check_config`), before Ray starts. ``envs`` take ``module:EnvId`` ids,
and ``settings.env_kwargs`` a mapping. Every mistake is a one-line :class:`UserError`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from acer_sync.api.runs import check_config
from acer_sync.base.config import MAX_THREADS, Config, build_config, given_twice, present_defaults
from acer_sync.base.config_file import check_setting, load_env_settings, read_yaml_mapping
from acer_sync.base.errors import UserError
from atari.envs import env_info

REQUIRED_KEYS = ("name", "envs", "seeds")
OPTIONAL_KEYS = ("settings", "trial", "failures")
RESOURCE_KEYS = ("cpus", "gpus")
DEFAULT_FAILURES = 3
#: Settings that the sweep file gives elsewhere: ``envs``, ``seeds`` and ``trial.cpus``.
SET_BY_THE_SWEEP = {"env": "envs", "seed": "seeds", "threads": "trial: {cpus: N}"}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Trial:
    """One run of the sweep: its directory name under ``runs/<sweep>/`` and its full Config."""

    name: str
    config: Config


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file."""

    name: str
    trials: tuple[Trial, ...]
    cpus: int
    gpus: float
    failures: int
    #: The settings given as lists, in the file's order.
    grid_axes: tuple[str, ...]


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def value_text(value) -> str:
    """A setting's value as it appears in a trial name: ``1``, ``0.5``, ``True``, ``64-64``,
    ``size-5`` (env kwargs ``{size: 5}``)."""
    if isinstance(value, dict):
        text = "-".join(f"{key}-{value_text(item)}" for key, item in value.items())
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]", "-", text)


def check_list(payload: dict, key: str, source: str, item_ok, item_text: str) -> list:
    values = payload[key]
    if not isinstance(values, list) or not values:
        raise UserError(f"{source}: {key} must be a non-empty list, such as {key}: [{item_text}]")
    bad = [value for value in values if not item_ok(value)]
    if bad:
        raise UserError(f"{source}: {key} holds {bad[0]!r}; each entry must be {item_text}")
    repeated = [value for index, value in enumerate(values) if value in values[:index]]
    if repeated:
        raise UserError(f"{source}: {key} lists {repeated[0]!r} twice")
    return values


def check_settings(payload: dict, source: str) -> dict[str, list]:
    """``settings`` as ``{name: [values]}``: a scalar is a list of one, a list a grid axis."""
    settings = payload.get("settings") or {}
    if not isinstance(settings, dict):
        raise UserError(f"{source}: settings must be a mapping of train.py settings, such as settings: {{lr: 0.001}}")
    axes = {}
    for name, value in settings.items():
        name = str(name)
        if name in SET_BY_THE_SWEEP:
            raise UserError(f"{source}: settings.{name} is set by the sweep's {SET_BY_THE_SWEEP[name]}, not under settings")
        values = value if isinstance(value, list) else [value]
        if not values:
            raise UserError(f"{source}: settings.{name} is an empty list; a grid axis needs at least one value")
        axes[name] = [check_setting(name, item, f"{source}: settings") for item in values]
        repeated = [item for index, item in enumerate(axes[name]) if item in axes[name][:index]]
        if repeated:  # 0.001 and 1.0e-3, 1 and 1.0: two trials of one setting, in one run directory
            raise UserError(f"{source}: settings.{name} lists {repeated[0]!r} twice")
    twice = given_twice(axes)
    if twice:  # and the one that lost would name the trials
        raise UserError(f"{source}: settings gives the setting {twice[0]} twice, as {twice[1]} and {twice[2]}")
    return axes


def check_resources(payload: dict, source: str) -> tuple[int, float]:
    resources = payload.get("trial") or {}
    if not isinstance(resources, dict):
        raise UserError(f"{source}: trial must be a mapping such as trial: {{cpus: 1, gpus: 0}}")
    unknown = [str(key) for key in resources if key not in RESOURCE_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown key trial.{unknown[0]}; a trial's resources are {' and '.join(RESOURCE_KEYS)}")
    cpus, gpus = resources.get("cpus", 1), resources.get("gpus", 0)
    if not is_int(cpus) or cpus < 1:
        raise UserError(f"{source}: trial.cpus must be a whole number >= 1, got {cpus!r}")
    if cpus > MAX_THREADS:  # a trial's threads are its cpus
        raise UserError(f"{source}: trial.cpus must be <= {MAX_THREADS}, got {cpus}")
    if not is_number(gpus) or gpus < 0 or (gpus > 1 and gpus != int(gpus)):
        raise UserError(f"{source}: trial.gpus must be a fraction in [0, 1] or a whole number, got {gpus!r}")
    return cpus, float(gpus)


#: The file in a sweep's folder that records the sweep its trials belong to (acer_sync.sweeps.launch).
RECORD_FILE = "sweep.json"


def load_sweep(path: Path, runs_dir: Path | None = None) -> Sweep:
    """Read and check the sweep file at ``path`` and expand its trials.

    ``runs_dir``: sweep.py's ``--runs-dir``, under which the sweep's folder holds a continued
    sweep. Where it does (its :data:`RECORD_FILE`), the trials are checked as resumed runs
    (:func:`acer_sync.base.config.validate`), so a check added since the sweep started (the cap on
    ``replay_ratio``) does not stop it from going on: its started trials resume, and one that had
    not started fails at its start with the check's line, as a new run.
    """
    source = str(path)
    payload = read_yaml_mapping(path)
    unknown = [str(key) for key in payload if key not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if unknown:
        raise UserError(f"{source}: unknown key {unknown[0]!r}; a sweep file has {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise UserError(f"{source}: missing key {missing[0]!r}")
    name = payload["name"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise UserError(f"{source}: name must be a directory name of letters, digits, '.', '_' and '-', got {name!r}")
    envs = check_list(payload, "envs", source, lambda value: isinstance(value, str), "an env id such as CartPole-v1")
    seeds = check_list(payload, "seeds", source, lambda value: is_int(value) and value >= 0, "a whole number >= 0")
    axes = check_settings(payload, source)
    cpus, gpus = check_resources(payload, source)
    failures = payload.get("failures", DEFAULT_FAILURES)
    if not is_int(failures) or failures < 0:
        raise UserError(f"{source}: failures must be a whole number >= 0, got {failures!r}")
    env_files = {env: load_env_settings(env) for env in envs}
    infos = {}

    def info_of(env: str, env_kwargs: dict):
        """The env as the trial makes it (its kwargs may change its spaces); unknown env ids and
        kwargs it does not take fail here, in one line."""
        key = (env, json.dumps(env_kwargs, sort_keys=True))
        if key not in infos:
            infos[key] = env_info(env, env_kwargs)
        return infos[key]
    if gpus == 0 and "cuda" in axes.get("device", []):
        raise UserError(f"{source}: settings.device is cuda but trial.gpus is 0; give each trial a share of a GPU")

    grid_axes = [name for name, value in (payload.get("settings") or {}).items() if isinstance(value, list)]
    continued = runs_dir is not None and (runs_dir / name / RECORD_FILE).is_file()
    trials = []
    for env, seed, point in itertools.product(envs, seeds, itertools.product(*axes.values())):
        settings = dict(zip(axes, point))
        name_parts = [re.sub("[/:]", "-", env), f"seed{seed}"] + [f"{axis}{value_text(settings[axis])}" for axis in grid_axes]
        trial_name = "_".join(name_parts)
        if any(trial.name == trial_name for trial in trials):  # values that print alike (:g), or keys alike once cleaned
            raise UserError(f"{source}: two trials would both be named {trial_name} (and share its run directory); "
                            "give the values of each grid axis so that they read differently")
        env_settings = env_files[env][1]
        info = info_of(env, settings.get("env_kwargs", env_settings.get("env_kwargs", {})))
        config = build_config(
            info.atari, {**settings, "env": env, "seed": seed, "threads": cpus}, continuous=info.continuous,
            env_settings=env_settings,
        )
        # The trial trains on the GPU share it reserves, not on this machine's (a Ray head may have
        # none), and with no share on the CPU (acer_sync.sweeps.trial.on_reserved_devices).
        device_type = "cpu" if config.device == "cpu" or gpus == 0 else "cuda"
        try:
            check_config(config, info, device_type, resumed=continued)
        except UserError as error:
            raise UserError(f"{source}: trial {trial_name}: {error}") from None
        trials.append(Trial(trial_name, config))
    return Sweep(name, tuple(trials), cpus, gpus, failures, tuple(grid_axes))


def sweep_record(sweep: Sweep) -> dict:
    """What a sweep's directory records of its file, to tell whether a later run is the same sweep."""
    return {
        "name": sweep.name,
        "trials": {trial.name: dataclasses.asdict(trial.config) for trial in sweep.trials},
        "trial": {"cpus": sweep.cpus, "gpus": sweep.gpus},
        "failures": sweep.failures,
        # The defaults the trials were expanded with, of the settings whose default became auto:
        # a trial recorded at a former default named it only where the record says otherwise.
        "defaults": present_defaults(),
    }

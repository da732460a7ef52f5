"""Command-line parsing for the scripts: one-line usage errors, and flags built from Config."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import yaml

from acer_sync.base.config import PRESETS, RECURRENT_CLASSIC, RESUMABLE_CHANGES, fields
from acer_sync.base.config_file import check_env_kwargs, load_yaml
from acer_sync.base.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a :class:`UserError`, which the script's
    :func:`acer_sync.base.errors.run_cli` reports in one line (``prog: error: ...``) with exit code 2.
    A flag is given in full: argparse's abbreviations (``--num-env`` for ``--num-envs``) are refused, so a
    mistyped flag is an error, not another setting, and a command keeps its meaning when flags are added."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")


def finite_float(text: str) -> float:
    """A float that is neither NaN nor infinite."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def float_or_inf(text: str) -> float:
    """A float that may be ``inf`` (for c, where it means no truncation) but not NaN."""
    value = float(text)
    if math.isnan(value):
        raise ValueError(text)
    return value


def key_value(text: str) -> tuple[str, object]:
    """One ``KEY=VALUE`` of ``--env-kwargs``, the value read as YAML (``200``, ``true``, ``0.5``,
    ``hard``)."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = load_yaml(value) if value else ""
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{text}: not a YAML value ({getattr(error, 'problem', None) or type(error).__name__})") from None
    try:
        return key, check_env_kwargs({key: parsed}, text)[key]
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def path(text: str) -> Path:
    """A file or directory argument; an empty one is refused (``Path("")`` is the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file (give '.' for the current directory)")
    return Path(text)


finite_float.__name__ = "finite number"
float_or_inf.__name__ = "number"


#: ``--help``'s groups, in order, and the settings in each (every Config field is in one: a test checks).
FLAG_GROUPS: dict[str, tuple[str, ...]] = {
    "env": ("env", "env_kwargs", "num_envs", "vec_env", "env_groups", "reward_scale", "normalize_obs", "env_timeout"),
    "algorithm": (
        "nsteps", "gamma", "lr", "lr_schedule", "rms_alpha", "rms_eps", "q_coef", "ent_coef", "max_grad_norm", "c",
        "trust_region", "delta", "alpha", "policy_std", "action_scale", "sdn_samples",
    ),
    "replay": ("buffer_size", "replay_ratio", "replay_start", "replay_state"),
    "network": ("network", "hidden", "activation", "lstm_size", "lstm_norm", "torso", "torso_kwargs"),
    "run and logging": (
        "seed", "total_timesteps", "log_interval", "log_seconds", "checkpoint_every", "keep_checkpoints", "save_buffer",
        "max_nonfinite", "eval_every", "eval_episodes", "eval_greedy", "capture_video", "track", "wandb_project",
        "wandb_entity",
    ),
    "performance": ("device", "threads", "precision", "compile", "pipeline", "replay_device"),
}


def describe_setting(f: dataclasses.Field) -> tuple[str, str]:
    """A setting's help text (marked where a resume may change it) and its default, with the
    presets' values where they differ: what ``--help`` shows and the docs' flag tables list."""
    help_text = f.metadata["help"]
    if f.name in RESUMABLE_CHANGES:
        help_text += "; may change on --resume"
    if f.metadata.get("required"):
        return help_text, "required for a new run"
    if f.type in (dict, "dict"):
        return help_text, "none"
    preset_values = [(name, values.get(f.name)) for name, values in (
        ("Atari preset", PRESETS["atari"]), ("classic-control preset", PRESETS["classic"]),
        ("classic-control preset with --network lstm", RECURRENT_CLASSIC), ("continuous preset", PRESETS["continuous"]),
    ) if f.name in values]
    default = f.default if f.default != "" else ("by env kind" if preset_values else "none")
    return help_text, "; ".join([str(default), *(f"{name}: {value}" for name, value in preset_values)])


def add_config_flags(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One flag per Config field, in :data:`FLAG_GROUPS`'s groups, which it returns by title (a script
    adds its own flags to them). Defaults are None so that presets and resume can tell what was set."""
    groups = {title: parser.add_argument_group(title) for title in FLAG_GROUPS}
    by_name = {f.name: f for f in fields()}
    for title, names in FLAG_GROUPS.items():
        for f in (by_name[name] for name in names):
            group = groups[title]
            own = "--" + f.name.replace("_", "-")
            flags = (f.metadata["flag"], own) if "flag" in f.metadata else (own,)  # the documented name first
            help_text, default = describe_setting(f)
            shown = default if f.metadata.get("required") else f"default: {default}"
            kwargs = dict(dest=f.name, default=None, help=f"{help_text} ({shown})")
            if f.type in (dict, "dict"):
                group.add_argument(*flags, nargs="+", type=key_value, metavar="KEY=VALUE", **kwargs)
                continue
            if "choices" in f.metadata:
                kwargs["choices"] = [c for c in f.metadata["choices"] if c]
            if f.type in (bool, "bool"):
                group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
            elif f.type in (int, "int"):
                group.add_argument(*flags, type=int, metavar="N", **kwargs)
            elif f.type in (float, "float"):
                group.add_argument(*flags, type=float_or_inf if f.name == "c" else finite_float, metavar="X", **kwargs)
            else:
                if "const" in f.metadata:  # the flag alone means this value
                    kwargs.update(nargs="?", const=f.metadata["const"])
                group.add_argument(*flags, type=str, metavar=f.metadata.get("metavar"), **kwargs)
    return groups


def config_overrides(args: argparse.Namespace) -> dict:
    """The Config fields the user gave on the command line (``--env-kwargs`` pairs as a dict)."""
    overrides = {f.name: getattr(args, f.name) for f in fields() if getattr(args, f.name) is not None}
    for f in fields():
        if f.type in (dict, "dict") and f.name in overrides:
            pairs = overrides[f.name]
            repeated = [key for index, (key, _) in enumerate(pairs) if key in dict(pairs[:index])]
            if repeated:
                raise UserError(f"--{f.name.replace('_', '-')} gives {repeated[0]} twice")
            overrides[f.name] = dict(pairs)
    return overrides


"""Command-line parsing for the scripts: one-line usage errors, and flags built from Config."""

from __future__ import annotations

import argparse
import math

import yaml

from acer_sync.base.config import PRESETS, RECURRENT_CLASSIC, fields
from acer_sync.base.config_file import check_env_kwargs
from acer_sync.base.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is a :class:`UserError`, which the script's
    :func:`acer_sync.base.errors.run_cli` reports in one line (``prog: error: ...``) with exit code 2."""

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
        parsed = yaml.safe_load(value) if value else ""
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{text}: not a YAML value ({getattr(error, 'problem', None) or type(error).__name__})") from None
    try:
        return key, check_env_kwargs({key: parsed}, text)[key]
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


finite_float.__name__ = "finite number"
float_or_inf.__name__ = "number"


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Config field; defaults are None so that presets and resume can tell what was set."""
    atari, classic, continuous = PRESETS["atari"], PRESETS["classic"], PRESETS["continuous"]
    for f in fields():
        own = "--" + f.name.replace("_", "-")
        flags = (f.metadata["flag"], own) if "flag" in f.metadata else (own,)  # the documented name first
        help_text = f.metadata["help"]
        if f.type in (dict, "dict"):
            parser.add_argument(*flags, dest=f.name, nargs="+", type=key_value, metavar="KEY=VALUE", default=None,
                                help=f"{help_text} (default: none)")
            continue
        default = f.default
        shown = f"default: {default}" if default != "" else "default: by env kind"
        if f.name in atari:
            shown += f"; Atari preset: {atari[f.name]}"
        if f.name in classic:
            shown += f"; classic-control preset: {classic[f.name]}"
        if f.name in RECURRENT_CLASSIC:
            shown += f"; classic-control preset with --network lstm: {RECURRENT_CLASSIC[f.name]}"
        if f.name in continuous:
            shown += f"; continuous preset: {continuous[f.name]}"
        kwargs = dict(default=None, help=f"{help_text} ({shown})")
        if "choices" in f.metadata:
            kwargs["choices"] = [c for c in f.metadata["choices"] if c]
        kwargs["dest"] = f.name
        if f.type in (bool, "bool"):
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
        elif f.type in (int, "int"):
            parser.add_argument(*flags, type=int, metavar="N", **kwargs)
        elif f.type in (float, "float"):
            parser.add_argument(*flags, type=float_or_inf if f.name == "c" else finite_float, metavar="X", **kwargs)
        else:
            if "const" in f.metadata:  # the flag alone means this value
                kwargs.update(nargs="?", const=f.metadata["const"])
            parser.add_argument(*flags, type=str, metavar=f.metadata.get("metavar"), **kwargs)


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


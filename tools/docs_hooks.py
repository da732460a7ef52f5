"""MkDocs hook: the flag tables of ``docs/training.md``, drawn from train's own parser when the site
is built, so the docs say what ``python train.py --help`` says.

A page marks where they go with ``<!-- flags: GROUP -->`` (a ``--help`` group's title). The list of
settings a resume may change is written in the page, read on GitHub too (``tests/test_docs.py``
checks it against ``RESUMABLE_CHANGES``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the clone's acer_sync, as mkdocstrings reads it

from acer_sync.base.config import fields
from acer_sync.cli.args import describe_setting
from acer_sync.cli.train import build_parser

FLAGS = re.compile(r"<!-- flags: (?P<group>[\w ]+) -->")


def cell(text: str) -> str:
    """``text`` in a Markdown table cell: no pipe, tag or emphasis read into it."""
    for char, escaped in (("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("_", "\\_")):
        text = text.replace(char, escaped)
    return text


def flag_text(action: argparse.Action) -> str:
    metavar = action.metavar or ("{" + ",".join(action.choices) + "}" if action.choices else action.dest.upper())
    takes_value = action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)
    if isinstance(action, argparse.BooleanOptionalAction):
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    suffix = f" {metavar}" if takes_value else ""
    return ", ".join(f"`{flag}{suffix}`" for flag in action.option_strings)


def flag_table(parser: argparse.ArgumentParser, title: str) -> str:
    """One ``--help`` group as a table: the flag, its default (and the presets'), what it does."""
    settings = {f.name: f for f in fields()}
    groups = {group.title: group for group in parser._action_groups}
    if title not in groups:
        raise ValueError(f"no --help group {title!r}; the groups are {', '.join(map(str, groups))}")
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in groups[title]._group_actions:
        if action.dest in settings:
            help_text, default = describe_setting(settings[action.dest])
        else:
            help_text, default = action.help, ""
        rows.append(f"| {flag_text(action)} | {cell(default)} | {cell(help_text)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not FLAGS.search(markdown):
        return markdown
    parser = build_parser("train.py")
    return FLAGS.sub(lambda match: flag_table(parser, match["group"]), markdown)

"""Read one algorithm's learning curve off a plot of OpenAI Baselines' benchmark page.

``benchmarks_atari10M.htm`` (openai/baselines, commit 46fa1b6) draws one matplotlib SVG per game:
per algorithm, the mean of 6 runs as a line of 100 points from 0 to 10M agent steps, coloured as in
the page's table. This script finds the game's plot by its title, maps the line's SVG coordinates
to data through the axis ticks (and the x axis' ``1e7`` offset label), interpolates it linearly to
the given agent steps, and prints ``{"steps": [...], "returns": [...]}`` as stored in
``acer_sync/data/atari_scores.json``::

    git -C baselines show 46fa1b6:benchmarks_atari10M.htm > page.htm
    python tools/baselines_curve.py page.htm Breakout --algo acer
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

SVG_NS = "{http://www.w3.org/2000/svg}"
#: Each algorithm's line colour, as the page's table shows it.
ALGORITHM_COLORS = {
    "ppo2": "#66c2a5", "deepq": "#fc8d62", "acktr": "#8da0cb", "acer": "#e78ac3",
    "ppo2_mpi": "#a6d854", "a2c": "#ffd92f", "trpo_mpi": "#e5c494",
}
#: Every 0.25M agent steps to 5M, then every 1M to 10M.
DEFAULT_STEPS = [k * 250_000 for k in range(1, 21)] + [k * 1_000_000 for k in range(6, 11)]
MAX_TICK_RESIDUAL = 1e-3  # SVG units: the ticks of a linear axis lie on one line


def game_plots(page: str) -> dict[str, ET.Element]:
    """The page's SVG plots by title (the one text outside the axes)."""
    plots = {}
    for match in re.finditer(r"<svg\b.*?</svg>", page, re.S):
        root = ET.fromstring(match.group(0))
        axis_texts = {id(text) for group in root.iter(f"{SVG_NS}g") if group.get("id", "").startswith("matplotlib.axis")
                      for text in group.iter(f"{SVG_NS}text")}
        titles = [text.text for text in root.iter(f"{SVG_NS}text") if id(text) not in axis_texts]
        if len(titles) == 1:
            plots[titles[0].strip()] = root
    return plots


def path_points(d: str) -> np.ndarray:
    """The ``[k, 2]`` points of a path made of ``M x y`` and ``L x y`` commands."""
    return np.array(re.findall(r"[ML]\s*(-?[\d.]+)\s+(-?[\d.]+)", d), dtype=float)


def style_of(element: ET.Element) -> dict[str, str]:
    """An element's ``style`` attribute as a dict (``"stroke:#e78ac3;..."`` or ``"stroke: #e78ac3; ..."``)."""
    items = (item.split(":", 1) for item in element.get("style", "").split(";") if ":" in item)
    return {key.strip(): value.strip() for key, value in items}


def tick_position(tick: ET.Element, coordinate: int) -> float:
    """Where a tick sits: its grid line's start, or else where its marker is drawn (``<use x= y=>``)."""
    for line in tick.findall(f"{SVG_NS}g"):
        grid_line = line.find(f"{SVG_NS}path")
        if grid_line is not None:
            return float(path_points(grid_line.get("d"))[0, coordinate])
    return float(tick.find(f".//{SVG_NS}use").get("xy"[coordinate]))


def axis_map(root: ET.Element, axis: str) -> np.poly1d:
    """SVG coordinate to data value along ``axis`` (``"x"`` or ``"y"``), fitted to its ticks."""
    group = next(g for g in root.iter(f"{SVG_NS}g") if g.get("id") == f"matplotlib.axis_{1 if axis == 'x' else 2}")
    coordinate = 0 if axis == "x" else 1
    positions, values, scale = [], [], 1.0
    for child in group.findall(f"{SVG_NS}g"):
        label = "".join(child.find(f".//{SVG_NS}text").itertext()).replace("\u2212", "-")
        if child.get("id", "").startswith(f"{axis}tick"):
            positions.append(tick_position(child, coordinate))
            values.append(float(label))
        else:  # matplotlib's offset label, e.g. "1e7"
            scale = float(label)
    fit = np.polyfit(positions, np.array(values) * scale, 1)
    residual = np.abs(np.polyval(fit, positions) - np.array(values) * scale).max() / abs(fit[0])
    if residual > MAX_TICK_RESIDUAL:
        raise ValueError(f"the {axis} ticks are not on a linear scale")
    return np.poly1d(fit)


def read_curve(page: str, game: str, color: str, steps: list[int]) -> list[float]:
    """The line of ``color`` in ``game``'s plot, interpolated linearly to ``steps``."""
    plots = game_plots(page)
    if game not in plots:
        raise LookupError(f"the page has no plot titled {game!r}; it has {', '.join(sorted(plots)) or 'none'}")
    root = plots[game]
    lines = [path for group in root.iter(f"{SVG_NS}g") if group.get("id", "").startswith("line2d")
             for path in group.findall(f"{SVG_NS}path") if style_of(path).get("stroke") == color]
    if len(lines) != 1:
        raise LookupError(f"the {game} plot has {len(lines)} lines of colour {color}, not one")
    points = path_points(lines[0].get("d"))
    x, y = axis_map(root, "x")(points[:, 0]), axis_map(root, "y")(points[:, 1])
    return [float(value) for value in np.interp(steps, x, y)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baselines_curve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="benchmarks_atari10M.htm")
    parser.add_argument("game", help="the plot's title, e.g. Breakout")
    parser.add_argument("--algo", choices=sorted(ALGORITHM_COLORS), default="acer")
    parser.add_argument("--steps", type=int, nargs="+", default=DEFAULT_STEPS,
                        help="agent steps to read at (default: every 0.25M to 5M, then every 1M to 10M)")
    parser.add_argument("--digits", type=int, default=1, help="decimals of the returns (default 1)")
    args = parser.parse_args(argv)
    try:
        page = args.page.read_text(encoding="utf-8")
        returns = read_curve(page, args.game, ALGORITHM_COLORS[args.algo], args.steps)
    except (OSError, UnicodeDecodeError, ET.ParseError, LookupError, ValueError) as error:
        print(f"{parser.prog}: error: {args.page}: {getattr(error, 'strerror', None) or error}", file=sys.stderr)
        return 2
    print(json.dumps({"steps": args.steps, "returns": [round(value, args.digits) for value in returns]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tools/: reading Baselines' benchmark curves off its SVG plots, and the share of forced steps in a saved buffer."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

from tools import baselines_curve
from helpers import ROOT

CURVE_STEPS = np.linspace(0, 10_000_000, 100)  # as the benchmark page draws each algorithm


def pong_like(steps: np.ndarray) -> np.ndarray:
    return -20 + 40 * (steps / 1e7) ** 2


def breakout_like(steps: np.ndarray) -> np.ndarray:
    return 450 * np.sin(steps / 1e7 * np.pi / 2)


def svg_plot(title: str, curves: dict[str, np.ndarray], grid: bool) -> str:
    """One matplotlib SVG plot as the page has them: a shaded band and a line per colour, text as <text>."""
    with plt.rc_context({"svg.fonttype": "none"}):
        figure, panel = plt.subplots(figsize=(8, 2))
        for color, returns in curves.items():
            panel.fill_between(CURVE_STEPS, returns - 5, returns + 5, color=color, alpha=0.3)
            panel.plot(CURVE_STEPS, returns, color=color)
        panel.set_title(title)
        panel.grid(grid)
        text = io.StringIO()
        figure.savefig(text, format="svg")
        plt.close(figure)
    return text.getvalue()


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """A page of two plots like benchmarks_atari10M.htm's, one with grid lines (as the page's) and one without."""
    acer, a2c = baselines_curve.ALGORITHM_COLORS["acer"], baselines_curve.ALGORITHM_COLORS["a2c"]
    pong = svg_plot("Pong", {acer: pong_like(CURVE_STEPS), a2c: -pong_like(CURVE_STEPS)}, grid=True)
    breakout = svg_plot("Breakout", {a2c: breakout_like(CURVE_STEPS) / 2, acer: breakout_like(CURVE_STEPS)}, grid=False)
    return f"<html><body><h3>Learning Curves</h3>\n{pong}\n{breakout}\n</body></html>"


@pytest.mark.parametrize("game, algo, truth", [
    ("Pong", "acer", pong_like), ("Pong", "a2c", lambda steps: -pong_like(steps)),
    ("Breakout", "acer", breakout_like), ("Breakout", "a2c", lambda steps: breakout_like(steps) / 2),
])
def test_a_line_is_read_through_the_axis_ticks_and_interpolated(page, game, algo, truth):
    steps = baselines_curve.DEFAULT_STEPS
    read = baselines_curve.read_curve(page, game, baselines_curve.ALGORITHM_COLORS[algo], steps)
    # The drawn line joins the 100 points with straight segments: so does the reading.
    expected = np.interp(steps, CURVE_STEPS, truth(CURVE_STEPS))
    span = np.ptp(truth(CURVE_STEPS))
    np.testing.assert_allclose(read, expected, atol=1e-4 * span)


def test_the_script_prints_the_json_of_atari_scores(tmp_path, page):
    path = tmp_path / "page.htm"
    path.write_text(page)
    result = subprocess.run([sys.executable, "tools/baselines_curve.py", str(path), "Breakout", "--steps", "1000000", "5000000"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    curve = json.loads(result.stdout)
    assert curve["steps"] == [1_000_000, 5_000_000]
    assert curve["returns"] == [round(float(breakout_like(np.array(step))), 1) for step in (1_000_000, 5_000_000)]


@pytest.mark.parametrize("game, message", [
    ("Seaquest", "has no plot titled 'Seaquest'; it has Breakout, Pong"),
    (None, "No such file or directory"),
])
def test_a_missing_plot_or_page_is_one_line(tmp_path, page, game, message):
    path = tmp_path / "page.htm"
    if game is not None:
        path.write_text(page)
    result = subprocess.run([sys.executable, "tools/baselines_curve.py", str(path), game or "Pong"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("baselines_curve.py: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1

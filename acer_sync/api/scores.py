"""Reference Atari scores, read from ``data/atari_scores.json``.

* Published ACER results: Schulman et al. (2017), *Proximal Policy Optimization Algorithms*,
  arXiv:1707.06347, Appendix B, Table 6 (mean of the last 100 episodes after 10M timesteps,
  i.e. 40M frames).
* Baselines' ACER learning curves (``baselines_curve``): OpenAI Baselines' Atari10M benchmark,
  mean of 6 runs, read from the benchmark page's curve data.
* Random and human reference scores: Mnih et al. (2015), *Human-level control through deep
  reinforcement learning*, Nature 518, doi:10.1038/nature14236, Extended Data Table 2.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib.resources import files

# "PongNoFrameskip-v4", "BreakoutDeterministic-v4", "Pong-ramNoFrameskip-v4", "ALE/Pong-v5".
_ATARI_ID = re.compile(r"^(?:ALE/)?(?P<game>[A-Za-z]+?)(?:-ram)?(?:NoFrameskip|Deterministic)?-v\d+$")


@lru_cache(maxsize=1)
def score_table() -> dict[str, dict[str, float]]:
    """Per game (``"Pong"``, ``"Breakout"``, ...): ``acer_published``, ``random`` and ``human``."""
    text = (files("acer_sync") / "data" / "atari_scores.json").read_text(encoding="utf-8")
    return json.loads(text)["games"]


def game_name(env_id: str) -> str | None:
    """The table's name for the game behind ``env_id``, or None if the table does not list it.

    ``"PongNoFrameskip-v4"`` and ``"ALE/Pong-v5"`` give ``"Pong"``; ``"CartPole-v1"`` gives None.
    """
    match = _ATARI_ID.match(env_id)
    if match is None:
        return None
    by_lower_name = {name.lower(): name for name in score_table()}
    return by_lower_name.get(match["game"].lower())


def published_acer(env_id: str) -> float | None:
    """ACER's score in the PPO paper's Table 6 (Schulman et al. 2017, 10M timesteps), or None."""
    game = game_name(env_id)
    return None if game is None else score_table()[game].get("acer_published")


def baselines_curve(env_id: str) -> tuple[list[int], list[float]] | None:
    """Baselines' ACER curve as ``(agent steps, mean training return of 6 runs)`` points, or None."""
    game = game_name(env_id)
    curve = None if game is None else score_table()[game].get("baselines_curve")
    return None if curve is None else (list(curve["steps"]), list(curve["returns"]))


def human_normalized(env_id: str, score: float) -> float | None:
    """``(score - random) / (human - random)`` with Mnih et al. (2015)'s reference scores.

    1.0 is the human tester's score and 0.0 random play's; None for games without reference scores.
    """
    game = game_name(env_id)
    if game is None:
        return None
    reference = score_table()[game]
    if "random" not in reference or "human" not in reference:
        return None
    return (score - reference["random"]) / (reference["human"] - reference["random"])

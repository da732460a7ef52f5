"""acer_sync: synchronous, vectorized ACER (Wang et al. 2017) in PyTorch.

The library's face, in Stable-Baselines3's conventions::

    import acer_sync

    run_dir = acer_sync.train("CartPole-v1", total_timesteps=20_000)
    policy = acer_sync.load(run_dir)
    action, state = policy.predict(observation, state, episode_start, deterministic=True)

``train`` (:mod:`acer_sync.api.runs`) writes the run directory ``train.py`` writes; ``load`` gives a
:class:`Policy` (:mod:`acer_sync.api.policy`); ``make_env`` the env whose observations it takes (Atari:
preprocessed and frame-stacked). Bad input raises :class:`UserError` with a one-line message; a
run that stops early raises :class:`TrainingStopped`. :class:`Config` lists every setting.

The names are imported on first use, so ``import acer_sync.base.config`` stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_EXPORTS = {
    "train": "acer_sync.api.runs",
    "TrainingStopped": "acer_sync.api.runs",
    "load": "acer_sync.api.policy",
    "Policy": "acer_sync.api.policy",
    "make_env": "acer_sync.api.policy",
    "UserError": "acer_sync.base.errors",
    "Config": "acer_sync.base.config",
    "Callback": "acer_sync.training.callbacks",
    "StopTrainingOnReward": "acer_sync.training.callbacks",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'acer_sync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

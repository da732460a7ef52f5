"""Env callables: a zero-argument function that returns a gymnasium env, registered with gymnasium
under ``acer_sync-callable/<module>.<name>`` so that an id names it (in config.json, the
checkpoints, and the vector envs' workers). Apart from :mod:`acer_sync.api.runs`, so that loading a
policy (:mod:`acer_sync.api.policy`) needs no training code."""

from __future__ import annotations

import functools
import inspect
import re
from typing import Callable

import gymnasium as gym

from acer_sync.base.errors import UserError

#: The gymnasium namespace under which env callables are registered.
CALLABLE_NAMESPACE = "acer_sync-callable"


def callable_env_id(make_env: Callable[[], gym.Env]) -> str:
    """``acer_sync-callable/<module>.<qualified name>``, with characters gymnasium ids refuse replaced."""
    module = getattr(make_env, "__module__", None) or "unknown"
    name = getattr(make_env, "__qualname__", None) or type(make_env).__qualname__
    return f"{CALLABLE_NAMESPACE}/" + re.sub(r"[^\w.-]", "-", f"{module}.{name}")


def is_callable_env(env_id: str) -> bool:
    """Whether ``env_id`` names an env callable (see [`register_callable`][])."""
    return env_id.startswith(CALLABLE_NAMESPACE + "/")


def register_callable(make_env: Callable[[], gym.Env]) -> str:
    """Register ``make_env`` with gymnasium (replacing an earlier callable of the same name) and
    return its id; ``gym.make`` of that id, here or in a forked worker, calls ``make_env()``.

    Partials, lambdas and the instances of one class share a name, so two runs of this process may
    have registered different callables under one id: the id is then marked shared
    ([`callable_is_shared`][]), and what only the id names (a resume without ``env``, load's check
    of the env) cannot tell which callable a run was trained on."""
    env_id = callable_env_id(make_env)

    def make(**kwargs) -> gym.Env:
        if kwargs:
            raise UserError(f"{env_id} is made by a callable without arguments; it cannot take {', '.join(kwargs)}")
        env = make_env()
        if not isinstance(env, gym.Env):
            raise UserError(f"the env callable {env_id.split('/', 1)[1]} returned {type(env).__name__}, not a gymnasium env")
        return env

    earlier = gym.registry.get(env_id)
    earlier_make = getattr(earlier.entry_point, "make_env", None) if earlier is not None else None
    make.make_env = make_env
    make.shared = earlier is not None and (getattr(earlier.entry_point, "shared", False) or not _same_callable(earlier_make, make_env))
    gym.registry.pop(env_id, None)
    gym.register(env_id, entry_point=make)
    return env_id


def _same_callable(first, second) -> bool:
    """Whether two env callables are one: the same object, or partials of one function with equal arguments."""
    if first is second:
        return True
    if inspect.ismethod(first) and inspect.ismethod(second):  # factory.make is a new object at each access
        return first == second
    if not (isinstance(first, functools.partial) and isinstance(second, functools.partial)):
        return False
    try:
        return bool(_same_callable(first.func, second.func) and first.args == second.args
                    and first.keywords == second.keywords)
    except Exception:  # noqa: BLE001 - arguments whose == raises or is not a bool (arrays): not provably equal
        return False


def callable_is_shared(env_id: str) -> bool:
    """Whether this process registered different callables under ``env_id`` ([`register_callable`][])."""
    spec = gym.registry.get(env_id)
    return spec is not None and bool(getattr(spec.entry_point, "shared", False))

"""Envs that misbehave on cue, for the bad-day tests: ``FaultyCartPole-v0`` is CartPole until its
step ``at_step`` (counted per env instance), where it does what ``fault`` says:

* ``raise``: raises ``RuntimeError("sensor cable unplugged")``;
* ``nan_obs`` / ``nan_reward``: returns a NaN in its observation / its reward; ``big_reward``: a
  reward of 1e39, finite but beyond float32's range;
* ``hang``: sleeps for an hour;
* ``slow``: sleeps 0.1 s in every step from then on (a process stopped now is stopped in a step);
* ``stall``: sleeps 2 s in that step, once, and ends its episode there (terminated);
* ``stop_process``: in that step, once, has the whole process stopped (SIGSTOP) 0.3 s into it for
  2.5 s and continued (SIGCONT) (Ctrl-Z, then ``fg``), the step returning 3.2 s after it began;
* ``seven_obs``: returns 7 as its observation's first number, once, the episode going on; ``seven_at_cut``:
  the same, and truncates the episode there (``tests/user_torsos.py:NanAtSeven`` is NaN on it);
* ``exit``: calls ``sys.exit(0)``; ``os_exit``: ends its process with ``os._exit(5)`` (no Python
  cleanup, as a C library's ``exit`` or an abort ends it; a ``subproc`` worker dies of it);
* ``nan_terminal`` / ``nan_at_cut``: returns a NaN observation and ends the episode there, once,
  as terminated (a state that diverged) / as truncated (a time limit).

In an env made with a ``render_mode`` (``--capture-video``'s), from its step ``at_step`` on:
``render_raise`` raises ``RuntimeError("GL context lost")`` in ``render``, ``render_hang`` sleeps
for an hour there. In every env: ``close_raise`` raises ``RuntimeError("port busy")`` in
``close``, ``close_hang`` sleeps for an hour there, ``close_exit`` calls ``sys.exit(3)`` there, and
``close_unpicklable`` raises a :class:`ConnectionLost`, which pickle cannot rebuild (its
``__init__`` takes two arguments), as some SDKs' errors.

``unpicklable``: raises a :class:`ConnectionLost` (below); ``json``: raises a ``json.JSONDecodeError``
(three arguments, which gymnasium's ``type(error)(error)`` cannot rebuild).

At start-up instead: ``raise_at_init`` raises ``OSError("no such device")`` when made, ``exit_at_init``
calls ``sys.exit(2)`` there;
``raise_at_reset`` raises ``RuntimeError("sensor cable unplugged")`` and ``hang_at_reset`` sleeps for
an hour in every reset.

``from_instance`` leaves the first instances made in this process well: with the sync backend,
the training envs are made first and the evaluation envs after them. ``train.py --env
faulty_envs:FaultyCartPole-v0 --env-kwargs fault=raise at_step=50`` (with ``tests`` on PYTHONPATH).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np

ENV_ID = "FaultyCartPole-v0"
_instances = itertools.count()


class ConnectionLost(Exception):
    def __init__(self, port: int, what: str):
        super().__init__(f"port {port} {what}")


class FaultyCartPole(gym.Wrapper):
    def __init__(self, fault: str = "raise", at_step: int = 50, from_instance: int = 0, render_mode: str | None = None):
        super().__init__(gym.make("CartPole-v1", render_mode=render_mode))
        if fault not in ("raise", "nan_obs", "nan_reward", "hang", "slow", "stall", "raise_at_init", "raise_at_reset", "hang_at_reset",
                         "seven_obs", "seven_at_cut", "stop_process", "exit", "os_exit", "big_reward", "nan_terminal", "nan_at_cut", "close_exit", "close_unpicklable", "unpicklable", "exit_at_init", "json", "render_raise", "render_hang", "close_raise", "close_hang"):
            raise ValueError(f"unknown fault {fault!r}")
        self.fault, self.at_step = fault, at_step
        self.faulty = next(_instances) >= from_instance
        self.steps = 0
        if self.faulty and fault == "raise_at_init":
            raise OSError("no such device")
        if self.faulty and fault == "exit_at_init":
            sys.exit(2)

    def reset(self, **kwargs):
        if self.faulty and self.fault == "raise_at_reset":
            raise RuntimeError("sensor cable unplugged")
        if self.faulty and self.fault == "hang_at_reset":
            time.sleep(3600)
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.faulty and self.steps >= self.at_step:
            if self.fault == "raise":
                raise RuntimeError("sensor cable unplugged")
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "unpicklable":
                raise ConnectionLost(7, "lost")
            if self.fault == "json":
                raise json.JSONDecodeError("Expecting value", "x", 0)
            if self.fault == "exit":
                sys.exit(0)
            if self.fault == "os_exit":
                os._exit(5)
            if self.fault == "slow":
                time.sleep(0.1)
            if self.fault == "stop_process" and self.steps == self.at_step:
                pid = os.getpid()
                stopper = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -STOP {pid}; sleep 2.5; kill -CONT {pid}"])
                threading.Thread(target=stopper.wait, daemon=True).start()  # reaped when it ends
                time.sleep(3.2)  # 0.4 s past the stop's end, however loaded the machine
            if self.fault == "stall" and self.steps == self.at_step:
                time.sleep(2.0)
                terminated = True
            if self.fault in ("seven_obs", "seven_at_cut") and self.steps == self.at_step:
                obs = np.array(obs, dtype=np.float32)
                obs[0] = 7.0
                truncated = truncated or (self.fault == "seven_at_cut" and not terminated)
            if self.fault in ("nan_terminal", "nan_at_cut") and self.steps == self.at_step:
                obs = np.array(obs, dtype=np.float32)
                obs[2] = np.nan
                terminated, truncated = self.fault == "nan_terminal", self.fault == "nan_at_cut"
            if self.fault == "nan_obs":
                obs = np.array(obs, dtype=np.float32)
                obs[2] = np.nan
            if self.fault == "nan_reward":
                reward = float("nan")
            if self.fault == "big_reward":
                reward = 1e39
        return obs, reward, terminated, truncated, info

    def render(self):
        if self.faulty and self.render_mode is not None and self.steps >= self.at_step:
            if self.fault == "render_raise":
                raise RuntimeError("GL context lost")
            if self.fault == "render_hang":
                time.sleep(3600)
        return self.env.render()

    def close(self):
        if self.faulty and self.fault == "close_raise":
            raise RuntimeError("port busy")
        if self.faulty and self.fault == "close_hang":
            time.sleep(3600)
        if self.faulty and self.fault == "close_exit":
            sys.exit(3)
        if self.faulty and self.fault == "close_unpicklable":
            raise ConnectionLost(7, "lost")
        self.env.close()


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=FaultyCartPole)

"""The acting path without round trips (issue 35): the frame stack kept on the device, only the
newest frames uploaded, actions and μ back in one copy. On CUDA it is the default; here it runs on
the CPU against the numpy path it replaces, which it must equal exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config
from acer_sync.nets.build import build_model
from acer_sync.rollout.actor import Actor, DeviceFrameStack
from atari import parts
from atari.envs import VecEnv, env_info
from atari.stacking import FrameStacker


@pytest.mark.parametrize("layout", [((6, 7), np.dtype(np.uint8)), {"camera": ((3, 5, 5), np.dtype(np.uint8)),
                                                                    "switch": ((2,), np.dtype(np.float32))}])
def test_the_device_stack_holds_what_the_numpy_stack_holds(layout):
    rng = np.random.default_rng(0)
    N, stack = 3, 4
    host, device = FrameStacker(N, stack, layout), DeviceFrameStack(N, stack, layout, torch.device("cpu"))

    def frames():
        return parts.map_parts(lambda part: (rng.integers(1, 255, (N, *part[0]))).astype(part[1]), layout) \
            if isinstance(layout, dict) else rng.integers(1, 255, (N, *layout[0])).astype(layout[1])

    first = frames()
    host.reset(first)
    device.reset(first)
    for step in range(9):
        starts = rng.random(N) < 0.3
        new = frames()
        host.push(new, starts)
        device.push(new, starts)
        for expected, got in zip(parts.parts_of(host.stacked), parts.parts_of(device.stacked)):
            assert np.array_equal(got.numpy(), expected), step


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_an_actor_with_the_device_stack_acts_exactly_as_the_numpy_one(env):
    info = env_info(env)
    config = build_config(False, dict(env=env, hidden="16"), continuous=info.continuous)
    torch.manual_seed(0)
    model = build_model(info, config)
    actors = [Actor(model, info, 3, torch.device("cpu"), generator=torch.Generator().manual_seed(1), device_stack=flag)
              for flag in (False, True)]
    vec = VecEnv(info, 3, "sync")
    frames, _ = vec.reset(seed=0)
    for actor in actors:
        actor.reset(frames)
    for _ in range(30):
        (actions, mu), (device_actions, device_mu) = (actor.act() for actor in actors)
        assert np.array_equal(actions, device_actions) and actions.dtype == device_actions.dtype
        assert np.array_equal(mu, device_mu)
        frames, _, terminated, truncated, _ = vec.step(actors[0].distribution.env_actions(actions))
        cut = truncated & ~terminated & vec.final_mask
        values = [actor.final_values(vec.final_frames, cut | vec.final_mask) for actor in actors]
        assert np.array_equal(values[0], values[1])
        for actor in actors:
            actor.observe(frames, terminated | truncated, np.zeros(3, bool), np.zeros(3, bool))
    vec.close()

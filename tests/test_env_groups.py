"""Envs stepping in groups (``--env-groups``, issue 35): each group's step sent and received apart,
in a fixed order, so that one group's actions are chosen while the others step. A group must be
exactly the envs it would be alone: the same frames, the same bookkeeping, the same run for a seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from acer_sync.base.config import build_config, validate
from acer_sync.base.errors import UserError
from acer_sync.rollout.runner import Runner, group_seed
from acer_sync.training.setup import build_trainer
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker
from atari.errors import EnvFailed
from helpers import assert_segments_equal, breakout_with_an_lstm


def test_envs_in_groups_step_as_the_same_envs_in_one():
    info = env_info("PongNoFrameskip-v4")
    whole, grouped = VecEnv(info, 4, "ale"), VecEnv(info, 4, "ale", groups=2)
    try:
        for got, expected in zip(grouped.reset(seed=5), whole.reset(seed=5), strict=True):
            assert np.array_equal(got, expected)
        rng = np.random.default_rng(0)
        ended = 0
        for step in range(300):
            actions = rng.integers(0, info.n_actions, 4)
            for got, expected in zip(grouped.step(actions), whole.step(actions), strict=True):
                assert np.array_equal(got, expected), step
            assert np.array_equal(grouped.final_mask, whole.final_mask)
            assert np.array_equal(grouped.final_frames[grouped.final_mask], whole.final_frames[whole.final_mask])
            ended += int(whole.final_mask.sum())
        assert grouped.steps == whole.steps == 300
    finally:
        whole.close()
        grouped.close()


def test_a_runner_with_env_groups_collects_what_each_group_collects_alone():
    # Breakout (stacks cleared at lost lives, the forced FIRE after them) with an LSTM state: the
    # columns of group g are a Runner of its envs alone, seeded as env g·size onwards, acting with
    # a generator seeded from the first's seed and g.
    info, model, fields = breakout_with_an_lstm()
    N, groups, T, segments = 4, 2, 10, 6
    env = VecEnv(info, N, "ale", groups=groups)
    tracker = EpisodeTracker(N, True, True)
    runner = Runner(env, model, torch.device("cpu"), T, tracker, fields, generator=torch.Generator().manual_seed(7))
    assert len(runner.actors) == groups and runner.actor is runner.actors[0]
    runner.reset(seed=3)
    collected = [runner.run() for _ in range(segments)]
    env.close()
    assert sum(int(segment.dones.sum()) for segment in collected) > 0  # lost lives on the way
    size = N // groups
    for group in range(groups):
        rows = slice(group * size, (group + 1) * size)
        alone_env = VecEnv(info, size, "ale")
        seed = 7 if group == 0 else group_seed(7, group)
        alone = Runner(alone_env, model, torch.device("cpu"), T, EpisodeTracker(size, True, True), fields,
                       generator=torch.Generator().manual_seed(seed))
        alone.reset(seed=3 + group * size)
        for index, segment in enumerate(collected):
            assert_segments_equal(alone.run(), segment, rows, where=(group, index))
        alone_env.close()


def test_a_groups_faults_name_the_runs_env_numbers():
    # A group's Actor and VecEnv see its envs from 0: their errors add the group's first env.
    from acer_sync.rollout.actor import policy_not_finite

    stats = np.ones((8, 6), np.float32)
    stats[1] = np.nan
    assert "of env 9, which was finite" in str(policy_not_finite(stats, first_env=8))
    env = VecEnv(env_info("PongNoFrameskip-v4"), 4, "ale", groups=2)
    try:
        with pytest.raises(EnvFailed, match="env 3 of PongNoFrameskip-v4 returned a non-finite reward"):
            env._stepped(np.zeros((2, 1, 84, 84), np.uint8), np.array([0.0, np.nan]), np.zeros(2, bool), np.zeros(2, bool),
                         {"lives": np.zeros(2)}, first=2)
    finally:
        env.close()


def test_env_groups_must_divide_the_envs_and_run_on_ale_only():
    problems = validate(build_config(True, dict(env="PongNoFrameskip-v4", env_groups=3)))
    assert problems == ["--env-groups must be >= 1 and divide --num-envs (16) into groups of equal size"]
    with pytest.raises(UserError, match="--env-groups 2 steps ALE's vector envs apart: it needs --vec-env ale"):
        VecEnv(env_info("CartPole-v1"), 4, "sync", groups=2)
    config = build_config(False, dict(env="CartPole-v1", num_envs=4, env_groups=2))
    with pytest.raises(UserError, match="--env-groups 2 steps ALE's vector envs apart"):  # before the buffer is made
        build_trainer(config, env_info("CartPole-v1"), Path("/nonexistent/run"))


@pytest.mark.parametrize("pipeline", ["serial", "overlap"])
def test_a_run_with_env_groups_trains_and_is_one_run_for_a_seed(tmp_path, pipeline):
    def run(name: str):
        config = build_config(True, dict(
            env="PongNoFrameskip-v4", device="cpu", num_envs=4, env_groups=2, nsteps=5, total_timesteps=100,
            buffer_size=50, replay_start=10, eval_every=0, log_interval=1, threads=1, pipeline=pipeline))
        rows = []
        (tmp_path / name).mkdir()
        trainer = build_trainer(config, env_info("PongNoFrameskip-v4"), tmp_path / name, on_progress=rows.append)
        assert trainer.train().finished
        return trainer, rows

    (first, first_rows), (second, second_rows) = run("a"), run("b")
    assert first.updates > 0 and len(first_rows) == len(second_rows) == 5
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)

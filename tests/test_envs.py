"""The env layer: backends agree, autoreset never drops an action, life loss and clipping."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from acer_sync.base.errors import UserError
from acer_sync.nets.distributions import distribution_for
from acer_sync.replay.buffer import buffer_fields
from acer_sync.rollout.runner import Runner
from atari.envs import VecEnv, env_info
from atari.episodes import EpisodeTracker, LifeLossActions
from atari.stacking import FrameStacker
from helpers import NeverFire


class ActionEchoEnv(gym.Env):
    """Pays the action it was sent as the reward; episodes last 3 steps; obs = (episode, t)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self):
        self.episode = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.array([self.episode, self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.episode, self.t], np.float32), float(action), self.t == 3, False, {}


gym.register("ActionEcho-v0", entry_point=ActionEchoEnv)


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_autoreset_never_ignores_an_action(backend):
    env = VecEnv(env_info("ActionEcho-v0"), 2, backend)
    frames, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    episode_ends = 0
    for _ in range(10):
        actions = rng.integers(1, 3, size=2)  # never 0, so an ignored action shows as reward 0
        frames, rewards, terminated, _, _ = env.step(actions)
        np.testing.assert_array_equal(rewards, actions)
        # SAME_STEP: the step that ends an episode already returns the next episode's first obs.
        np.testing.assert_array_equal(frames[terminated, 1], 0)
        episode_ends += int(terminated.sum())
    env.close()
    assert episode_ends == 6  # 10 steps, 3-step episodes, 2 envs: every step was a real step


def test_ale_and_gymnasium_backends_preprocess_identically():
    """With deterministic resets, both backends give the same frames, raw rewards, lives and ends."""
    info = env_info("SpaceInvadersNoFrameskip-v4")
    ale = VecEnv(info, 1, "ale", noop_max=0)
    wrapped = VecEnv(info, 1, "sync", noop_max=0)
    trackers = [EpisodeTracker(1, True, True) for _ in range(2)]
    frames_a, lives_a = ale.reset(seed=0)
    frames_b, lives_b = wrapped.reset(seed=0)
    assert frames_a.shape == frames_b.shape == (1, 84, 84) and frames_a.dtype == frames_b.dtype == np.uint8
    np.testing.assert_array_equal(frames_a, frames_b)
    np.testing.assert_array_equal(lives_a, lives_b)
    for tracker, lives in zip(trackers, (lives_a, lives_b)):
        tracker.reset(lives)
    rng = np.random.default_rng(0)
    seen = {"life_loss": 0, "game_over": 0, "big_reward": 0}
    steps_after_game_over = 0
    for _ in range(5000):
        actions = rng.integers(0, info.n_actions, size=1)
        out_a, out_b = ale.step(actions), wrapped.step(actions)
        for a, b in zip(out_a, out_b):
            np.testing.assert_array_equal(a, b)
        train_a = trackers[0].step(*out_a[1:])
        train_b = trackers[1].step(*out_b[1:])
        for a, b in zip(train_a, train_b):
            np.testing.assert_array_equal(a, b)
        rewards, dones, game_over = train_a
        seen["big_reward"] += int((out_a[1] > 1).sum())
        assert np.all(np.abs(rewards) <= 1) and np.all(rewards == np.sign(out_a[1]))
        seen["life_loss"] += int((dones & ~game_over).sum())
        seen["game_over"] += int(game_over.sum())
        if seen["game_over"]:
            steps_after_game_over += 1
            if steps_after_game_over > 30:
                break
    ale.close()
    wrapped.close()
    assert seen["game_over"] == 1 and seen["life_loss"] >= 2 and seen["big_reward"] > 0
    # Logged scores are raw full-game scores, not clipped and not per life.
    assert trackers[0].recent_returns[0] == trackers[1].recent_returns[0] > 3 * 1


def test_episode_tracker_life_loss_clipping_and_raw_scores():
    tracker = EpisodeTracker(2, life_loss_ends_episode=True, clip_rewards=True)
    tracker.reset(np.array([3, 3]))
    step = tracker.step
    r, d, g = step(np.array([5.0, 0.0]), np.array([False, False]), np.array([False, False]), np.array([3, 2]))
    np.testing.assert_array_equal(r, [1.0, 0.0])
    np.testing.assert_array_equal(d, [False, True])  # env 1 lost a life
    np.testing.assert_array_equal(g, [False, False])
    r, d, g = step(np.array([-7.0, 10.0]), np.array([True, False]), np.array([False, False]), np.array([3, 2]))
    np.testing.assert_array_equal(r, [-1.0, 1.0])
    np.testing.assert_array_equal(d, [True, False])  # the new game's lives (3) are no life loss
    assert list(tracker.recent_returns) == [-2.0] and tracker.episodes == 1
    r, d, g = step(np.array([0.0, 1.0]), np.array([False, False]), np.array([False, True]), np.array([3, 3]))
    assert d[1] and g[1] and list(tracker.recent_returns) == [-2.0, 11.0]


def test_life_loss_actions_follow_a_lost_life_and_stop_at_a_new_game():
    forced = LifeLossActions(3, (0, 1, 2))
    none = np.zeros(3, dtype=bool)

    def step(life_lost=none, game_over=none):
        forced.step(np.asarray(life_lost), np.asarray(game_over))
        envs, actions = forced.forced()
        return envs.tolist(), actions.tolist()

    assert step() == ([], [])
    assert step(life_lost=[False, True, False]) == ([1], [0])  # env 1 lost a life: NOOP first
    assert step(life_lost=[True, False, False]) == ([0, 1], [0, 1])  # then FIRE; env 0 starts its own
    assert step(game_over=[True, False, False]) == ([1], [2])  # env 0's game ended: its reset fires
    assert step() == ([], [])  # env 1 played NOOP, FIRE, 2 and is the agent's again
    assert step(life_lost=[False, False, True]) == ([2], [0])
    forced.reset()
    assert forced.forced()[0].tolist() == []
    nothing = LifeLossActions(2, ())  # a game without FIRE
    nothing.step(np.array([True, True]), np.array([False, False]))
    assert nothing.forced()[0].tolist() == []


def test_baselines_life_loss_actions_only_in_fire_games():
    assert env_info("BreakoutNoFrameskip-v4").life_loss_actions == (0, 1, 2)
    assert env_info("SeaquestNoFrameskip-v4").life_loss_actions == (0, 1, 2)
    assert env_info("MsPacmanNoFrameskip-v4").life_loss_actions == ()  # no FIRE in its action set
    assert env_info("CartPole-v1").life_loss_actions == ()


class LifeLossRecorder(EpisodeTracker):
    """The training view of episodes, also noting which steps lost a life with the game going on."""

    def __init__(self):
        super().__init__(1, life_loss_ends_episode=True, clip_rewards=True)
        self.life_lost_at: list[bool] = []

    def step(self, *args):
        result = super().step(*args)
        self.life_lost_at.append(bool(self.life_lost[0]))
        return result


@pytest.mark.parametrize("backend", ["ale", "sync"])
def test_breakout_serves_again_after_a_lost_life_and_stores_what_was_played(backend):
    info = env_info("BreakoutNoFrameskip-v4")
    env = VecEnv(info, 1, backend, noop_max=0)
    tracker = LifeLossRecorder()
    fields = buffer_fields(info.frame_shape, info.frame_dtype, distribution_for(info))
    runner = Runner(env, NeverFire(info.n_actions), torch.device("cpu"), 50, tracker, fields)
    runner.reset(seed=0)
    segments = [runner.run() for _ in range(6)]
    env.close()
    actions = np.concatenate([segment.actions[:, 0] for segment in segments])
    mu = np.concatenate([segment.mu[:, 0] for segment in segments])
    dones = np.concatenate([segment.dones[:, 0] for segment in segments])
    life_losses = np.flatnonzero(tracker.life_lost_at)
    # The NOOP policy never serves; only the forced FIRE after each lost life brings the next ball
    # into play, so it loses every life of its first game and the game ends.
    assert len(life_losses) == 4 and tracker.episodes == 1
    assert dones[life_losses].all()  # each life loss ends a training episode
    forced_steps = np.concatenate([life_losses + k for k in (1, 2, 3)])
    for t in life_losses:
        np.testing.assert_array_equal(actions[t + 1 : t + 4], [0, 1, 2])  # Baselines' NOOP, FIRE, action 2
        np.testing.assert_array_equal(mu[t + 1 : t + 4], np.eye(info.n_actions)[[0, 1, 2]])  # one-hot μ
    agent_steps = np.setdiff1d(np.arange(len(actions)), forced_steps)
    assert (actions[agent_steps] == 0).all() and (mu[agent_steps, 0] == 1).all()  # everything else is the agent's


def test_frame_stacker_clears_at_episode_start():
    stacker = FrameStacker(2, 3, ((1,), np.dtype(np.float32)))
    stacker.reset(np.array([[1.0], [1.0]]))
    stacker.push(np.array([[2.0], [2.0]]), np.array([False, False]))
    stacked = stacker.push(np.array([[3.0], [3.0]]), np.array([False, True]))
    np.testing.assert_array_equal(stacked[:, :, 0], [[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])


def test_unknown_env_suggests_close_matches():
    with pytest.raises(UserError, match="did you mean.*PongNoFrameskip-v4"):
        env_info("PongNoFrameskip-v5x")


class MultiDiscreteEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])


gym.register("MultiDiscreteTest-v0", entry_point=MultiDiscreteEnv)


def test_multidiscrete_actions_are_refused():
    with pytest.raises(UserError, match="MultiDiscrete action space; acer_sync supports Discrete and Box actions only"):
        env_info("MultiDiscreteTest-v0")


def test_ale_backend_refuses_non_atari():
    with pytest.raises(UserError, match="Atari games only"):
        VecEnv(env_info("CartPole-v1"), 1, "ale")


def test_only_the_sync_backend_hands_out_env_0():
    sync = VecEnv(env_info("CartPole-v1"), 1, "sync")
    subproc = VecEnv(env_info("CartPole-v1"), 1, "subproc")
    try:
        assert sync.first_env().spec.id == "CartPole-v1"
        with pytest.raises(UserError, match="on the subproc backend; only sync reaches it"):
            subproc.first_env()
    finally:
        sync.close()
        subproc.close()


@pytest.mark.parametrize("backend", ["ale", "sync"])
def test_noop_starts_are_as_varied_as_baselines(backend):
    """Our backends start Breakout from 0-29 (ale) or 1-30 (gymnasium) no-ops, Baselines from
    1-30: 30 different starting states each. 160 resets of 4 envs must find at least 25 and at
    most 30 different first frames, and exactly one with ``noop_max`` 0, so the variety comes
    from the no-op starts the backend is given."""
    info = env_info("BreakoutNoFrameskip-v4")
    for noop_max, expected in ((30, range(25, 31)), (0, range(1, 2))):
        env = VecEnv(info, 4, backend, noop_max=noop_max)
        try:
            frames, _ = env.reset(seed=0)
            starts = {frame.tobytes() for frame in frames}
            for _ in range(39):
                frames, _ = env.reset()
                starts.update(frame.tobytes() for frame in frames)
        finally:
            env.close()
        assert len(starts) in expected, (backend, noop_max, len(starts))


def test_the_ale_backend_takes_every_seed_a_run_may_give_it():
    # ale-py's vector env refused 2**31 - 1 and above with a TypeError: a run seeded 2**31 - 1 did
    # not start (exit 3, "an env failed"), and 2,140,000,000 failed at its 7th evaluation (seed + 1,000,003 k)
    # (ale-py seeds env i with seed + i: with 8 envs, 2,147,483,643 failed too)
    info = env_info("PongNoFrameskip-v4")
    env = VecEnv(info, 8, "ale")
    try:
        first, _ = env.reset(seed=2**32 - 1)
        again, _ = env.reset(seed=2**32 - 1)
        for seed in (2_140_000_000 + 7 * 1_000_003, 2**31 - 5, 2**31 - 1):
            env.reset(seed=seed)
    finally:
        env.close()
    assert np.array_equal(first, again)  # the same seed, the same games

"""Callbacks, in Stable-Baselines3's semantics: hooks around the iteration, a stop by returning False,
``best.pt`` at the best evaluation mean, a reward to stop at, and a checkpoint before a user's
exception propagates."""

import enum
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import acer_sync
from acer_sync.api import runs as api
from acer_sync.base.outcome import Stop
from acer_sync.training.checkpoint import load_checkpoint, save_checkpoint
from helpers import ROOT, read_progress

SMALL = dict(vec_env="sync", device="cpu", num_envs=2, nsteps=5, buffer_size=100, replay_start=20, eval_every=0,
             log_interval=4, checkpoint_every=10_000, progress_bar=False)


class Recorder(acer_sync.Callback):
    """Notes every hook it sees, and stops after ``stop_after`` iterations (None: never)."""

    def __init__(self, stop_after=None):
        self.events, self.rows, self.stop_after = [], [], stop_after

    def on_training_start(self, trainer):
        self.events.append(("start", trainer.timesteps))

    def on_rollout_end(self, trainer, row):
        self.events.append(("rollout", trainer.timesteps))
        if row:
            self.rows.append(dict(row))
        if self.stop_after is not None and trainer.iterations >= self.stop_after:
            return False
        return None

    def on_training_end(self, trainer, outcome):
        self.events.append(("end", outcome.stop))


def test_hooks_run_once_at_the_start_once_an_iteration_and_once_at_the_end_with_every_row(tmp_path):
    recorder = Recorder()
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=100, callbacks=[recorder], **SMALL)
    assert recorder.events[0] == ("start", 0)
    assert [step for kind, step in recorder.events if kind == "rollout"] == list(range(10, 101, 10))
    assert recorder.events[-1] == ("end", Stop.FINISHED)
    logged = read_progress(tmp_path / "run")
    assert [int(row["total_timesteps"]) for row in recorder.rows] == [int(row["total_timesteps"]) for row in logged]
    assert list(recorder.rows[0]) == list(logged[0])  # the row as written, every column in order


def test_a_callback_that_returns_false_stops_the_run_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    recorder = Recorder(stop_after=3)
    outcome = api.run("CartPole-v1", run_dir=run_dir, total_timesteps=10_000, callbacks=[recorder], **SMALL)
    assert outcome.stop is Stop.CALLBACK and outcome.finished and outcome.timesteps == 30
    assert "Recorder stopped the run at step 30" in outcome.message
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 30
    assert recorder.events[-1] == ("end", Stop.CALLBACK)
    # No row was due (every 4 iterations), and the run ended after 3: the row of the end is written
    # all the same, so progress.csv shows where the stop came (--stop-at-reward's step and mean).
    assert [int(row["total_timesteps"]) for row in read_progress(run_dir)] == [30]
    # acer_sync.train returns the run directory for a stop by a callback, and the run resumes.
    assert acer_sync.train(resume=run_dir, total_timesteps=60, progress_bar=False) == run_dir
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 60


def test_a_false_from_on_training_start_stops_before_the_first_iteration(tmp_path):
    class NotToday(acer_sync.Callback):
        stop_message = "not today"

        def on_training_start(self, trainer):
            return False

    outcome = api.run("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=100, callbacks=[NotToday()], **SMALL)
    assert outcome.stop is Stop.CALLBACK and outcome.timesteps == 0 and outcome.message == "not today"
    assert load_checkpoint(tmp_path / "run")["counters"]["timesteps"] == 0


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("how", ["callback", "on_progress", "on_checkpoint"])
def test_an_exception_in_a_users_callback_saves_a_checkpoint_then_propagates(tmp_path, how):
    run_dir = tmp_path / "run"

    class Explodes(acer_sync.Callback):
        def on_rollout_end(self, trainer, row):
            if trainer.iterations == 5:
                raise Boom("the user's bug")

    def explodes(_):
        raise Boom("the user's bug")

    class SeesTheEnd(acer_sync.Callback):
        def on_training_end(self, trainer, outcome):
            self.outcome = outcome

    sees_the_end = SeesTheEnd()
    hooks = {"callback": dict(callbacks=[Explodes(), sees_the_end]), "on_progress": dict(on_progress=explodes, callbacks=[sees_the_end]),
             "on_checkpoint": dict(on_checkpoint=explodes, checkpoint_every=60, callbacks=[sees_the_end])}[how]
    with pytest.raises(Boom, match="the user's bug"):
        acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=10_000, **{**SMALL, **hooks})
    assert sees_the_end.outcome.stop is Stop.CALLBACK_FAILED and sees_the_end.outcome.error == "Boom: the user's bug"
    saved = load_checkpoint(run_dir)["counters"]["timesteps"]
    # the first row is due after 4 iterations; the first checkpoint at step 60, after 6
    assert saved == {"callback": 50, "on_progress": 40, "on_checkpoint": 60}[how]
    assert int(read_progress(run_dir)[-1]["total_timesteps"]) == saved  # the run's end was written
    assert acer_sync.train(resume=run_dir, total_timesteps=saved + 20, progress_bar=False) == run_dir


def test_best_pt_holds_the_best_evaluation_and_its_mean_survives_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    settings = {**SMALL, "eval_every": 40, "eval_episodes": 2, "log_interval": 1000}
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=200, **settings)
    evaluations = [row for row in read_progress(run_dir) if int(row["eval_episodes"])]
    assert [int(row["total_timesteps"]) for row in evaluations] == [40, 80, 120, 160, 200]
    means = [float(row["eval_mean"]) for row in evaluations]
    best_step = int(evaluations[means.index(max(means))]["total_timesteps"])
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["counters"]["timesteps"] == best_step
    assert load_checkpoint(run_dir)["callbacks"]["EvalCallback"]["best_mean"] == max(means)
    acer_sync.train(resume=run_dir, total_timesteps=400, progress_bar=False)
    evaluations = [row for row in read_progress(run_dir) if int(row["eval_episodes"])]
    means = [float(row["eval_mean"]) for row in evaluations]
    best_step = int(evaluations[means.index(max(means))]["total_timesteps"])
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["counters"]["timesteps"] == best_step


def test_a_run_killed_between_a_new_best_and_its_checkpoint_keeps_best_pt_on_resume(tmp_path):
    # best.pt is written at the evaluation, its mean reaches latest.pt at the next checkpoint: after
    # a kill in between, latest.pt records an older, lower best mean (0 here; best.pt's is set far
    # above any CartPole score), and the resumed run replaced best.pt at its first evaluation.
    run_dir = tmp_path / "run"
    settings = {**SMALL, "eval_every": 40, "eval_episodes": 2, "log_interval": 1000}
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=200, **settings)
    best, latest = run_dir / "checkpoints" / "best.pt", run_dir / "checkpoints" / "latest.pt"
    for path, mean in ((best, 1e9), (latest, 0.0)):
        payload = load_checkpoint(path)
        payload["callbacks"]["EvalCallback"]["best_mean"] = mean
        save_checkpoint(path, payload)
    best_step = load_checkpoint(best)["counters"]["timesteps"]
    acer_sync.train(resume=run_dir, total_timesteps=320, progress_bar=False)
    assert len([row for row in read_progress(run_dir) if int(row["eval_episodes"])]) == 8
    assert load_checkpoint(best)["counters"]["timesteps"] == best_step
    assert load_checkpoint(latest)["callbacks"]["EvalCallback"]["best_mean"] == 1e9
    payload = load_checkpoint(latest)
    del payload["callbacks"]["EvalCallback"]  # killed before any checkpoint recorded a best mean
    save_checkpoint(latest, payload)
    acer_sync.train(resume=run_dir, total_timesteps=360, progress_bar=False)
    assert load_checkpoint(best)["counters"]["timesteps"] == best_step
    best.write_bytes(b"damaged")  # one that cannot be read is replaced at the next evaluation
    acer_sync.train(resume=run_dir, total_timesteps=400, progress_bar=False)
    assert load_checkpoint(best)["counters"]["timesteps"] == 400


def test_an_evaluation_due_when_a_stop_signal_comes_is_skipped(tmp_path):
    # A stop (SIGINT, request_stop) that comes during the iteration after which an evaluation is
    # due: the run saves and stops at once, without playing the evaluation's games first.
    class StopDuringIteration(acer_sync.Callback):
        def on_training_start(self, trainer):
            iterate = trainer.iterate

            def iterate_then_stop():
                iterate()
                if trainer.timesteps >= 40:
                    trainer.request_stop("a test's stop")
            trainer.iterate = iterate_then_stop

    run_dir = tmp_path / "run"
    settings = {**SMALL, "eval_every": 20, "eval_episodes": 2, "log_interval": 1}
    outcome = api.run("CartPole-v1", run_dir=run_dir, total_timesteps=1_000, callbacks=[StopDuringIteration()], **settings)
    assert outcome.stop is Stop.INTERRUPTED and outcome.timesteps == 40
    evaluated = {int(row["total_timesteps"]): int(row["eval_episodes"]) for row in read_progress(run_dir)}
    assert evaluated[20] == 2 and evaluated[40] == 0
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 40


def test_a_stop_during_an_evaluation_ends_its_games_and_reports_none_of_them(tmp_path):
    # A SIGTERM's grace is short and Pong's 100 games take minutes on a CPU: the games played on
    # after the stop (here they would never end), and the batch system's SIGKILL lost the run's
    # steps since its last checkpoint.
    class StopDuringEvaluation(acer_sync.Callback):
        def on_training_start(self, trainer):
            threading.Timer(2.0, trainer.request_stop, args=("a test's stop",)).start()

    run_dir = tmp_path / "run"
    settings = {**SMALL, "eval_every": 20, "eval_episodes": 10**9, "log_interval": 1}
    started = time.monotonic()
    outcome = api.run("CartPole-v1", run_dir=run_dir, total_timesteps=1_000, callbacks=[StopDuringEvaluation()], **settings)
    assert outcome.stop is Stop.INTERRUPTED and outcome.timesteps == 20 and time.monotonic() - started < 60
    assert {int(row["eval_episodes"]) for row in read_progress(run_dir)} == {0}
    assert load_checkpoint(run_dir)["counters"]["timesteps"] == 20
    assert not (run_dir / "checkpoints" / "best.pt").exists()


@pytest.mark.parametrize("evaluation", [False, True])
def test_train_py_stop_at_reward_stops_with_a_checkpoint_and_exits_0(tmp_path, evaluation):
    run_dir = tmp_path / "run"
    flags = ["--eval-every", "200", "--eval-episodes", "4"] if evaluation else ["--eval-every", "0"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", "--vec-env", "sync", "--num-envs", "4",
         "--total-timesteps", "1000000", "--stop-at-reward", "12", "--log-interval", "1", "--run-dir", str(run_dir),
         "--no-progress", "--compile", "off", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "reached the reward 12" in result.stdout and result.stderr == ""
    rows = read_progress(run_dir)
    saved = load_checkpoint(run_dir)["counters"]["timesteps"]
    assert saved == int(rows[-1]["total_timesteps"]) < 1_000_000
    if evaluation:
        assert "evaluation mean over 4 games" in result.stdout and float(rows[-1]["eval_mean"]) >= 12
        assert saved == 240  # the first evaluation (80 steps an iteration): a random CartPole policy lasts ~22 steps
    else:
        assert "mean of the last 100 episodes" in result.stdout and int(rows[-1]["episodes"]) >= 100
        assert int(rows[-2]["episodes"]) < 100 or float(rows[-2]["mean_episode_reward"]) < 12


def test_what_is_not_a_callback_is_one_line_error_before_anything_is_written(tmp_path):
    with pytest.raises(acer_sync.UserError) as error:
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", callbacks=[print], **SMALL)
    assert "\n" not in str(error.value) and "acer_sync.Callback" in str(error.value)
    assert not (tmp_path / "run").exists()


def test_verbose_0_shows_nothing_but_warnings_and_errors(tmp_path, capsys):
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "quiet", total_timesteps=40, verbose=0,
                    **{**SMALL, "progress_bar": True})
    assert capsys.readouterr() == ("", "")
    # a callback's state left out of the checkpoints was said to no one at verbose=0 (SB3's still shows its warnings)
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "warned", total_timesteps=30, verbose=0, callbacks=[Opaque(later=True)],
                    **SMALL)
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "callback Opaque's state()['value'] is a object" in err
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "loud", total_timesteps=40, **SMALL)
    out = capsys.readouterr().out
    assert f"run directory: {tmp_path / 'loud'}" in out and "replay buffer: 2 envs" in out


class Counter(acer_sync.Callback):
    """Keeps numpy values in its state, as a callback that averages with numpy would."""

    def __init__(self, start=0):
        self.iterations = start
        self.seen = None

    def on_rollout_end(self, trainer, row):
        self.iterations += 1

    def state(self):
        return {"iterations": np.int64(self.iterations), "mean": np.mean([1.0, 2.0]), "trace": np.arange(3)}

    def load_state(self, state):
        self.seen = state
        self.iterations = state["iterations"]


def test_numpy_values_in_a_callbacks_state_are_kept_as_plain_numbers_and_two_of_a_class_apart(tmp_path):
    # np.mean's np.float64 in the state made every checkpoint unloadable (weights_only refuses numpy).
    run_dir = tmp_path / "run"
    first, second = Counter(), Counter(start=100)
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=30, callbacks=[first, second], **SMALL)
    states = load_checkpoint(run_dir)["callbacks"]
    assert states["Counter"] == {"iterations": 3, "mean": 1.5, "trace": [0, 1, 2]}
    assert states["Counter#2"]["iterations"] == 103
    assert type(states["Counter"]["iterations"]) is int and type(states["Counter"]["mean"]) is float
    resumed = [Counter(), Counter()]
    acer_sync.train("CartPole-v1", resume=run_dir, total_timesteps=40, callbacks=resumed, **SMALL)
    assert [counter.seen["iterations"] for counter in resumed] == [3, 103]
    assert [counter.iterations for counter in resumed] == [4, 104]


class Opaque(acer_sync.Callback):
    def __init__(self, later=False):
        self.later, self.value = later, None

    def on_rollout_end(self, trainer, row):
        self.value = object()

    def state(self):
        return {"value": self.value if self.later else object()}


class Level(enum.IntEnum):
    LOW = 1


class Subtle(acer_sync.Callback):
    """What passed a check by isinstance and made the checkpoint unloadable: an IntEnum, a datetime64, an object array."""

    def __init__(self, bad=None):
        self.bad = bad

    def on_training_start(self, trainer):
        self.started = trainer.timesteps

    def state(self):
        return {"level": Level.LOW, "started": self.started, **({"bad": self.bad} if self.bad is not None else {})}


def test_a_state_that_reads_the_run_is_checked_at_checkpoints_and_subclasses_become_plain(tmp_path):
    # Its state() fails before on_training_start (AttributeError): not a reason to refuse the run.
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=30, callbacks=[Subtle()], **SMALL)
    state = load_checkpoint(run_dir)["callbacks"]["Subtle"]
    assert state == {"level": 1, "started": 0} and type(state["level"]) is int


@pytest.mark.parametrize("bad, kind", [(np.datetime64("2026-11-26"), "date"), (np.array([object()]), "object")])
def test_numpy_values_that_are_not_numbers_are_left_out(tmp_path, caplog, bad, kind):
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=30, callbacks=[Subtle(bad)], **SMALL)
    assert load_checkpoint(run_dir)["callbacks"] == {}
    assert any("state()['bad']" in record.getMessage() and f"is a {kind}" in record.getMessage() for record in caplog.records)


def test_a_callback_state_that_is_not_plain_data_is_refused_at_the_start_or_left_out_later(tmp_path, caplog):
    with pytest.raises(acer_sync.UserError, match=r"callback Opaque's state\(\)\['value'\] is a object: a checkpoint keeps only"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "refused", total_timesteps=30, callbacks=[Opaque()], **SMALL)
    assert not (tmp_path / "refused").exists()
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=30, callbacks=[Opaque(later=True)], **SMALL)
    assert load_checkpoint(run_dir)["callbacks"] == {}  # the checkpoint loads, without that state
    warnings = [record.getMessage() for record in caplog.records if "checkpoints leave it out" in record.getMessage()]
    assert len(warnings) == 1  # once, not at every checkpoint


def test_a_reward_to_stop_at_that_no_evaluation_can_reach_is_warned_of(tmp_path, caplog):
    # The default --eval-every 50000 and a run of 40 steps: the evaluation's mean is never read.
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, callbacks=[acer_sync.StopTrainingOnReward(25)],
                    **{**SMALL, "eval_every": 50_000})
    assert any("--stop-at-reward 25 follows the evaluation's mean, and no evaluation is due before --total-timesteps 40"
               in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("threshold", [float("nan"), "100", True])
def test_a_reward_to_stop_at_that_is_not_a_number_is_a_user_error(threshold):
    with pytest.raises(acer_sync.UserError, match="^StopTrainingOnReward: the reward to stop at must be a finite number"):
        acer_sync.StopTrainingOnReward(threshold)
    assert acer_sync.StopTrainingOnReward(np.float32(195.0)).threshold == 195.0  # numpy's numbers are numbers


def test_a_reward_to_stop_at_is_not_warned_of_when_the_last_iteration_evaluates(tmp_path, caplog):
    # 40 steps an iteration: asked for 50, the run ends at 80, where the evaluation every 80 steps comes.
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=50, callbacks=[acer_sync.StopTrainingOnReward(1000)],
                    **{**SMALL, "num_envs": 4, "nsteps": 10, "eval_every": 80, "eval_episodes": 1})
    assert not any("--stop-at-reward" in record.getMessage() for record in caplog.records)


def test_a_false_value_as_sb3_reads_it_stops_the_run_and_none_goes_on(tmp_path):
    # numpy's False (`return best < threshold` on numpy floats) and 0 went on in silence: only `is False` stopped
    for returned, stops in [(np.False_, True), (0, True), (None, False), (np.True_, False)]:
        class Returns(acer_sync.Callback):
            def on_rollout_end(self, trainer, row):
                return returned if trainer.iterations >= 3 else None

        outcome = api.run("CartPole-v1", run_dir=tmp_path / f"run_{returned}", total_timesteps=60, callbacks=[Returns()], **SMALL)
        assert (outcome.stop, outcome.timesteps) == ((Stop.CALLBACK, 30) if stops else (Stop.FINISHED, 60)), returned


@pytest.mark.parametrize("hook", ["_on_step", "on_step", "_on_rollout_end", "_on_training_start"])
def test_a_callback_with_sb3s_hooks_is_refused_rather_than_never_called(tmp_path, hook):
    # An SB3 callback's _on_step returning False was never called: the run trained to its end
    base = type("Base", (acer_sync.Callback,), {hook: lambda self: False})
    sb3_style = type("EarlyStop", (base,), {})  # defined on a base class of the user's too
    with pytest.raises(acer_sync.UserError, match=rf"^callback EarlyStop defines {hook}, Stable-Baselines3's, which acer_sync "
                                                  r"does not call: its hooks are on_training_start\(trainer\), on_rollout_end"):
        acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=40, callbacks=[sb3_style()], **SMALL)
    assert not (tmp_path / "run").exists()


class Counts(acer_sync.Callback):
    """Counts its iterations into its state, and notes the outcome its end is given."""

    def __init__(self, stop_at=None):
        self.iterations, self.stop_at, self.ended = 0, stop_at, None

    def on_rollout_end(self, trainer, row):
        self.iterations += 1
        return False if self.iterations == self.stop_at else None

    def on_training_end(self, trainer, outcome):
        self.ended = (outcome.stop, outcome.checkpoint_step, load_checkpoint(trainer.run_dir)["counters"]["timesteps"])

    def state(self):
        return {"iterations": self.iterations}

    def load_state(self, state):
        self.iterations = state["iterations"]


def test_a_periodic_checkpoint_holds_the_users_callback_state_of_its_iteration_and_the_end_sees_the_final_step(tmp_path):
    # The periodic checkpoint was written before the user's callbacks ran: their state one iteration
    # behind (a resume from it counted one iteration twice); on_training_end's outcome.checkpoint_step
    # was the previous checkpoint's (360 for a run whose latest.pt held 400), or None
    counts = Counts()
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", total_timesteps=100, callbacks=[counts],
                    **{**SMALL, "checkpoint_every": 30, "keep_checkpoints": 5})
    for step in (30, 60, 90):
        saved = load_checkpoint(tmp_path / "run" / "checkpoints" / f"step_{step:010d}.pt")
        assert saved["callbacks"]["Counts"] == {"iterations": step // 10}
    assert counts.ended == (Stop.FINISHED, 100, 100)
    stopper = Counts(stop_at=4)
    assert api.run("CartPole-v1", run_dir=tmp_path / "stopped", total_timesteps=100, callbacks=[stopper], **SMALL).stop is Stop.CALLBACK
    assert stopper.ended == (Stop.CALLBACK, 40, 40)


class CheckpointCallback(acer_sync.Callback):
    """A user's callback named as SB3's (and acer_sync's built-in) one, with a state of its own."""

    def __init__(self):
        self.saves, self.loaded = 0, None

    def on_rollout_end(self, trainer, row):
        self.saves += 1

    def state(self):
        return {"saves": self.saves}

    def load_state(self, state):
        self.loaded = state


def test_a_users_callback_named_as_a_built_in_keeps_its_state_and_the_end_reports_the_row_before_the_checkpoint(tmp_path):
    # Keys are class names in the list's order ("CheckpointCallback#2" for the user's): running the
    # checkpoints after the user's callbacks must not renumber them, or an old checkpoint's user
    # state goes to the built-in; at the end the final row still reaches on_progress before
    # on_checkpoint (a sweep reports the checkpoint's step with the last row).
    events = []
    run_dir = tmp_path / "run"
    acer_sync.train("CartPole-v1", run_dir=run_dir, total_timesteps=10_000, callbacks=[CheckpointCallback(), Recorder(stop_after=3)],
                    on_progress=lambda row: events.append(("row", row["total_timesteps"])),
                    on_checkpoint=lambda path: events.append(("checkpoint", load_checkpoint(path)["counters"]["timesteps"])), **SMALL)
    assert events == [("row", 30), ("checkpoint", 30)]
    assert load_checkpoint(run_dir)["callbacks"]["CheckpointCallback#2"] == {"saves": 3}
    resumed = CheckpointCallback()
    acer_sync.train(resume=run_dir, total_timesteps=40, callbacks=[resumed, Recorder()], progress_bar=False)
    assert resumed.loaded == {"saves": 3}

"""The command line's doors: ``python -m acer_sync COMMAND``, the console scripts of ``pip install .``,
train's required ``--env``, its ``--help`` groups, and the line a run ends with."""

import os
import signal
import subprocess
import sys
import time
import tomllib

import pytest

from acer_sync.__main__ import main as acer_sync_main
from acer_sync.base import malloc, openmp
from acer_sync.base.config import RESUMABLE_CHANGES, fields
from acer_sync.cli.args import FLAG_GROUPS
from acer_sync.cli.train import build_parser
from helpers import ROOT, on_glibc, one_line_error, read_progress

SMALL_CARTPOLE = ["--env", "CartPole-v1", "--total-timesteps", "1600", "--eval-every", "800", "--eval-episodes", "2",
                  "--no-progress"]


def run(command: list[str], cwd, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def module(*args) -> list[str]:
    return [sys.executable, "-m", "acer_sync", *map(str, args)]


def test_train_without_an_env_says_so_in_one_line_and_writes_nothing(tmp_path):
    line = one_line_error(run([sys.executable, str(ROOT / "train.py")], cwd=tmp_path))
    assert line.startswith("train.py: error: --env is required") and "--env CartPole-v1" in line
    assert "--resume RUN_DIR" in line
    assert list(tmp_path.iterdir()) == []  # no runs/ made


def test_every_setting_has_one_help_group_and_help_shows_them_in_order():
    grouped = [name for names in FLAG_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in fields())  # each field once
    assert list(FLAG_GROUPS) == ["env", "algorithm", "replay", "network", "run and logging", "performance"]
    text = build_parser("train.py").format_help()
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options", *FLAG_GROUPS]
    run_group = text.split("\nrun and logging:\n")[1].split("\nperformance:\n")[0]
    for flag in ("--run-dir", "--resume", "--config", "--stop-at-reward", "--track", "--seed"):
        assert f"  {flag}" in run_group
    assert "(required for a new run)" in text
    # what a resume may change is said once per flag, from the one list
    said = " ".join(text.split()).split("may change on --resume")
    assert len(said) - 1 == len(RESUMABLE_CHANGES)


def test_python_m_acer_sync_train_does_what_train_py_does_and_ends_with_a_summary(tmp_path):
    result = run(module("train", *SMALL_CARTPOLE, "--run-dir", tmp_path / "run"), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rows = read_progress(tmp_path / "run")
    assert int(rows[-1]["total_timesteps"]) == 1600
    last = result.stdout.strip().splitlines()[-1]
    final = float(rows[-1]["mean_episode_reward"])
    # the best of the 100-episode means; of the means over fewer where no row had 100 episodes yet
    # (it named a 68-episode mean the best "100-episode mean")
    full = [float(row["mean_episode_reward"]) for row in rows if int(row["episodes"]) >= 100]
    means = full or [float(row["mean_episode_reward"]) for row in rows if row["mean_episode_reward"] != "nan"]
    label = "(100-episode means)" if full else "(means of under 100 episodes)"
    assert last.startswith("python -m acer_sync train: finished: 1,600 steps in ")
    assert f"mean return {final:.2f} at the end, best {max(means):.2f} {label}" in last
    assert "best evaluation" in last
    assert f"checkpoint {tmp_path / 'run' / 'checkpoints' / 'latest.pt'}" in last
    assert f"play it: python -m acer_sync play {tmp_path / 'run'}" in last
    # the summary is also the line of a resumed run, and of one that continues to a later step
    resumed = run(module("train", "--resume", tmp_path / "run", "--total-timesteps", "2400", "--no-progress"), cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip().splitlines()[-1].startswith("python -m acer_sync train: finished: 2,400 steps in ")


def exit_code_of(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stopped:
        acer_sync_main(argv, "python -m acer_sync")
    return stopped.value.code


def test_python_m_acer_sync_lists_its_commands_and_refuses_others(capsys):
    assert exit_code_of(["--help"]) == 0
    listed = capsys.readouterr().out
    for command in ("train", "play", "plot", "sweep"):
        assert f"  {command} " in listed
    assert exit_code_of([]) == 2 and "usage: python -m acer_sync {train,play,plot,sweep}" in capsys.readouterr().err
    assert exit_code_of(["fly"]) == 2
    assert capsys.readouterr().err == "python -m acer_sync: error: unknown command 'fly'; choose one of train, play, plot, sweep\n"
    assert exit_code_of(["plot", "--x", "hours"]) == 2
    assert capsys.readouterr().err.startswith("python -m acer_sync plot: error: ")


def test_a_run_that_cannot_start_does_not_name_its_run_directory(tmp_path):
    result = run([sys.executable, str(ROOT / "train.py"), "--env", "CartPole-v1", "--torso", "no_such_module:Torso",
                  "--run-dir", tmp_path / "run", "--no-progress"], cwd=ROOT)
    assert "no_such_module" in one_line_error(result)
    assert "run directory" not in result.stdout
    assert not (tmp_path / "run").exists()


def test_pip_install_puts_the_console_scripts_on_the_path(tmp_path):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "acer-sync": "acer_sync.__main__:main", "acer-train": "acer_sync.__main__:train",
        "acer-play": "acer_sync.__main__:play", "acer-plot": "acer_sync.__main__:plot",
        "acer-sweep": "acer_sync.__main__:sweep",
    }
    target = tmp_path / "site"
    installed = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                     "--target", str(target), str(ROOT)], cwd=tmp_path, timeout=300)
    assert installed.returncode == 0, installed.stderr
    away = tmp_path / "elsewhere"  # not the clone: the installed package and its data files
    away.mkdir()
    env = {"PYTHONPATH": str(target)}
    trained = run([str(target / "bin" / "acer-train"), *SMALL_CARTPOLE, "--run-dir", "run"], cwd=away, env=env)
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.strip().splitlines()[-1].startswith("acer-train: finished: 1,600 steps")
    played = run([str(target / "bin" / "acer-sync"), "play", "run", "--episodes", "1"], cwd=away, env=env)
    assert played.returncode == 0, played.stderr
    assert "mean score over 1 episode:" in played.stdout
    line = one_line_error(run([str(target / "bin" / "acer-plot"), "nothing"], cwd=away, env=env))
    assert line.startswith("acer-plot: error: ")


@pytest.mark.parametrize("script", ["train.py", "play.py", "plot.py", "sweep.py"])
def test_the_root_scripts_are_thin(script):
    text = (ROOT / script).read_text()
    assert f'run_command("{script[:-3]}", sys.argv[1:], "{script}")' in text
    assert len(text.splitlines()) <= 12


def test_the_entry_points_let_openmps_threads_sleep_unless_the_user_chose(monkeypatch):
    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: the entry points set PASSIVE before
    # that (bench.py's JSON shows it in tests/test_bench.py), keep a policy the user set, and leave
    # a process that has loaded torch alone.
    monkeypatch.setitem(os.environ, "OMP_WAIT_POLICY", "ACTIVE")
    assert not openmp.default_wait_policy() and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    del os.environ["OMP_WAIT_POLICY"]
    assert "torch" in sys.modules and not openmp.default_wait_policy() and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")  # as in an entry point before its imports (restored after)
    assert openmp.default_wait_policy() and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


#: A Python process that takes, fills and frees a 64 MB block 5 times (after 2 to warm up), with
#: keep_freed_memory() called first or not, and prints the minor page faults of the 5.
FAULTS_OF_BLOCKS = """
import resource, sys
import numpy as np
from acer_sync.base.malloc import keep_freed_memory
print(keep_freed_memory() if sys.argv[1] == "keep" else None)
def cycle():
    block = np.empty(8 << 20)
    block.fill(1.0)
    del block
cycle(); cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not on_glibc(), reason="glibc's malloc")
def test_keeping_freed_memory_spares_a_large_blocks_page_faults_unless_the_environment_tunes_malloc():
    environment = {name: value for name, value in os.environ.items() if not malloc.tunes_malloc(name)}

    def faults(mode: str, **variables) -> tuple[str, int]:
        result = subprocess.run([sys.executable, "-c", FAULTS_OF_BLOCKS, mode], cwd=ROOT, capture_output=True,
                                text=True, timeout=120, env={**environment, **variables})
        assert result.returncode == 0, result.stderr
        kept, count = result.stdout.split()
        return kept, int(count)

    # glibc maps a block this large afresh and unmaps it when freed: a page fault per page, at least
    # 32 a block (2 MB pages, numpy's madvise; 16,384 of 4 KB), none once freed memory is kept
    kept, plain = faults("plain")
    assert kept == "None" and plain >= 5 * 32
    kept, count = faults("keep")
    assert kept == "True" and count < plain / 10
    for variables in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}):
        kept, count = faults("keep", **variables)  # the user's own tuning: left as it is
        assert kept == "False" and count >= 5 * 32, variables


#: A Python process that frees a 256 MB block inside freed_memory_kept() and prints whether it
#: kept freed memory, then the block's megabytes still resident inside and after.
BLOCK_KEPT_THEN_GIVEN_BACK = """
import os
import signal
import numpy as np
from acer_sync.base.malloc import freed_memory_kept
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
before = resident_mb()
with freed_memory_kept() as kept:
    block = np.ones(32 << 20)
    del block
    inside = resident_mb() - before
print(kept, round(inside), round(resident_mb() - before))
"""


@pytest.mark.skipif(not on_glibc() or malloc.tuned_by_environment(), reason="glibc's malloc, as this process has it")
def test_a_run_keeps_freed_memory_while_it_trains_and_gives_it_back_at_its_end(tmp_path):
    import acer_sync

    keeping = []
    acer_sync.train("CartPole-v1", run_dir=tmp_path / "run", progress_bar=False, num_envs=2, total_timesteps=40,
                    vec_env="sync", device="cpu", eval_every=0, log_interval=1, hidden="8",
                    on_progress=lambda row: keeping.append(malloc._runs_keeping))
    assert keeping and set(keeping) == {1} and malloc._runs_keeping == 0
    result = subprocess.run([sys.executable, "-c", BLOCK_KEPT_THEN_GIVEN_BACK], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    kept, inside, after = result.stdout.split()
    assert kept == "True" and int(inside) >= 250 and int(after) < 50  # freed, kept, then given back


def test_a_compile_worker_that_does_not_stop_is_killed_within_seconds_and_every_script_stops_them(monkeypatch):
    # torch 2.11 on a lent H200: a cold compile's worker ignored its shutdown, and bench.py and train.py, their work
    # done, waited at exit up to 300 s (pytorch/pytorch#162199), in the device's minutes.
    import torch._inductor.async_compile as async_compile

    from acer_sync.base import compile_workers, errors

    class Pool:  # a SubprocPool: shutdown asks its worker to stop and waits for it
        def __init__(self, stops: bool):
            self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            self.stops = stops

        def shutdown(self):
            if self.stops:
                self.process.terminate()
            self.process.wait(300)

    stuck, stopping = Pool(stops=False), Pool(stops=True)
    monkeypatch.setattr(async_compile, "_pool_set", {stuck, stopping})
    # torch's own, which also forgets this process's real pool (AsyncCompile.process_pool's cache)
    monkeypatch.setattr(async_compile, "shutdown_compile_workers", async_compile._pool_set.clear)
    started = time.monotonic()
    assert compile_workers.stop_compile_workers(wait=1) == 1
    assert time.monotonic() - started < 10 and not async_compile._pool_set  # the exit's own hook finds none left
    assert stuck.process.returncode == -signal.SIGKILL and stopping.process.returncode == -signal.SIGTERM
    assert compile_workers.stop_compile_workers() == 0  # no pool: nothing to do

    ends = []
    monkeypatch.setattr(errors, "stop_compile_workers", lambda: ends.append(True))
    handlers = {signum: signal.getsignal(signum) for signum in errors.STOP_SIGNALS}  # run_cli puts in its own
    try:
        for main in (lambda: 0, lambda: (_ for _ in ()).throw(errors.UserError("bad"))):
            with pytest.raises(SystemExit):
                errors.run_cli(main, "script.py")
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert ends == [True, True]


@pytest.mark.parametrize("main, signum, code, said", [
    ("lambda: 3", signal.SIGINT, 3, "script.py: interrupted as it ended\n"),
    ("lambda: 0", signal.SIGTERM, 0, "script.py: interrupted by SIGTERM as it ended\n"),
    ("lambda: 1 / 0", signal.SIGINT, 1, "ZeroDivisionError: division by zero\nscript.py: interrupted as it ended"),
    # after a first signal, which the run took as its stop (a second one exited 130 at once, the crash unsaid)
    ("lambda: (errors.signal_stop(signal.SIGINT), 1 / 0)", signal.SIGINT, 1, "ZeroDivisionError: division by zero\n"),
    ("lambda: sys.exit()", signal.SIGINT, 0, "script.py: interrupted as it ended"),
])
def test_a_signal_while_a_script_stops_the_compile_workers_ends_it_at_once_as_it_was_ending(main, signum, code, said):
    # It raised a KeyboardInterrupt out of the wait (a traceback), torch's atexit hook then waited on the worker
    # again, and the script's own exit code (or its crash's traceback) was lost.
    script = (
        "import os, signal, subprocess, sys, threading\n"
        "import torch._inductor.async_compile as async_compile\n"
        "from acer_sync.base import errors\n"
        "class Pool:\n"
        "    process = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL,\n"
        "                               stderr=subprocess.DEVNULL)\n"
        "    def shutdown(self):\n"
        "        self.process.wait(300)\n"
        "async_compile._pool_set.add(Pool())\n"
        f"threading.Timer(2, os.kill, (os.getpid(), {int(signum)})).start()\n"
        f"errors.run_cli({main}, 'script.py')\n"
    )
    started = time.monotonic()
    result = run([sys.executable, "-c", script], cwd=ROOT, timeout=60)
    assert result.returncode == code and said in result.stderr and time.monotonic() - started < 30, result.stderr
    assert "KeyboardInterrupt" not in result.stderr

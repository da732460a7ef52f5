"""bench.py runs the real training path and reports every figure as JSON (no timing assertions)."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from acer_sync.base.malloc import tunes_malloc
from helpers import ROOT, on_glibc, one_line_error

KEYS = {
    "steps_per_sec", "steps_per_sec_timed", "env_steps_per_sec", "learner_steps_per_sec", "raw_learner_steps_per_sec",
    "serial_bound_steps_per_sec", "loop_efficiency", "learner_efficiency", "phase_seconds", "phase_fraction",
    "buffer_bytes_per_transition", "default_buffer_gb", "peak_rss_mb", "device", "torch_threads", "versions", "machine",
    "gpu_busy_fraction", "pipeline", "compile", "update_compiled", "cudagraph_skips", "replay_device",
    "collect_thread_fraction", "env_steps_per_sec_in_loop", "collect_steps_per_sec", "acting_graphed",
    "learner_update_steps_per_sec", "learner_acting_fraction", "raw_update_steps_per_sec", "update_efficiency",
    "bound_steps_per_sec", "bound_efficiency", "raw_compile", "malloc_keeps_freed", "updates_per_iteration",
}
PHASES = {"env", "observe", "acting", "buffer_put", "buffer_get", "on_policy_update", "off_policy_updates", "average_update"}


@pytest.mark.parametrize("env, network, arch, given, pipeline", [
    # --pipeline auto, train.py's default: serial on a CPU, as the JSON says
    ("PongNoFrameskip-v4", "auto", "cnn", "auto", "serial"), ("CartPole-v1", "lstm", "lstm", "overlap", "overlap"),
])
def test_bench_prints_json_with_every_key(env, network, arch, given, pipeline):
    result = subprocess.run(
        # 4 envs and a second of measuring: the keys, not the figures (Pong's CNN at 16 envs and 3 s took 26 s)
        [sys.executable, str(ROOT / "bench.py"), "--env", env, "--network", network, "--seconds", "1", "--num-envs", "4",
         "--json", "--device", "cpu", "--pipeline", given],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY" and not tunes_malloc(name)},
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert KEYS <= set(figures) and figures["network"] == arch and figures["pipeline"] == pipeline
    assert figures["omp_wait_policy"] == "PASSIVE"  # set before torch loaded, as train.py's is
    assert figures["malloc_keeps_freed"] == on_glibc()  # as a training run's
    assert PHASES <= set(figures["phase_seconds"])
    assert figures["machine"]["cpu_count"] >= figures["machine"]["cpus_usable"] >= 1 and figures["machine"]["device_name"]
    assert figures["steps_per_sec"] > 0 and figures["raw_learner_steps_per_sec"] > 0
    assert figures["updates_per_iteration"] >= 1  # the on-policy update, and the off-policy ones drawn
    # the updates alone are a part of each learner iteration, timed inside it: never slower than the whole
    assert figures["learner_update_steps_per_sec"] >= figures["learner_steps_per_sec"]
    assert figures["raw_update_steps_per_sec"] >= figures["raw_learner_steps_per_sec"]
    assert 0 <= figures["learner_acting_fraction"] < 1 and figures["update_efficiency"] > 0
    # the bound on the loop: the slower of the env and the learner (its own work when overlapped)
    learner = figures["learner_update_steps_per_sec" if pipeline == "overlap" else "learner_steps_per_sec"]
    assert figures["bound_steps_per_sec"] == round(min(figures["env_steps_per_sec"], learner), 1)
    assert figures["bound_efficiency"] == pytest.approx(figures["steps_per_sec"] / figures["bound_steps_per_sec"], rel=1e-2)
    assert figures["raw_compile"] == "off"
    if env == "PongNoFrameskip-v4":
        assert figures["buffer_bytes_per_transition"] < 7_100  # a property of the layout, not a timing
    assert figures["gpu_busy_fraction"] is None and figures["replay_device"] == "cpu"  # no CUDA here
    assert figures["compile"] == "off" and figures["update_compiled"] is False and figures["acting_graphed"] is None
    assert figures["env_steps_per_sec_in_loop"] > 0 and figures["collect_steps_per_sec"] > 0
    if pipeline == "overlap":  # the envs step in the collecting thread, timed apart; the learner waits for it
        assert figures["phase_seconds"]["env"] == 0 and "collect_wait" in figures["phase_seconds"]
        assert set(figures["collect_thread_fraction"]) == {"env", "observe", "acting", "other"}
        assert figures["collect_thread_fraction"]["env"] > 0
    else:
        assert figures["collect_thread_fraction"] is None


@pytest.mark.parametrize("fails", [False, True])
def test_the_raw_passes_compile_as_the_learners_update_does_or_run_eagerly(monkeypatch, capsys, fails):
    # Under --compile update the ceiling's update passes are compiled too (with Dynamo and
    # AOTAutograd alone here, aot_eager: Inductor's code generation takes a minute on this CPU);
    # a compile that fails runs them eagerly and says so.
    import torch._dynamo.exc

    import bench
    from acer_sync.base.config import build_config
    from atari.envs import env_info

    info = env_info("CartPole-v1")
    config = build_config(False, dict(env="CartPole-v1", num_envs=2, nsteps=4, hidden="8", compile="update"))
    real_compile = torch.compile

    def compile_for_the_test(function, **options):
        if fails:
            def failing():
                raise torch._dynamo.exc.Unsupported("a graph it cannot capture")
            return failing
        return real_compile(function, **{**options, "backend": "aot_eager"})

    monkeypatch.setattr(bench.torch, "compile", compile_for_the_test)
    torch._dynamo.reset()
    raw_sps, raw_update_sps, raw_compile = bench.bench_raw_learner(info, config, torch.device("cpu"), 0.2)
    assert raw_sps > 0 and raw_update_sps >= raw_sps
    assert raw_compile == ("off" if fails else "update")
    assert ("the raw passes' compile failed" in capsys.readouterr().err) == fails


def test_a_failed_ceiling_costs_its_own_figures_not_the_rows(monkeypatch, capsys):
    # The raw passes run last, apart: where they fail (a compile or a CUDA graph of theirs), the
    # row keeps every other figure, and the ceiling's are None with the error named.
    import bench

    def failing(*args, **kwargs):
        raise RuntimeError("the ceiling's CUDA graph failed")

    monkeypatch.setattr(bench, "bench_raw_learner", failing)
    assert bench.main(["--env", "CartPole-v1", "--seconds", "0.4", "--num-envs", "2", "--device", "cpu", "--json"]) == 0
    out, err = capsys.readouterr()
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["steps_per_sec"] > 0 and figures["learner_steps_per_sec"] > 0 and figures["bound_efficiency"] > 0
    assert figures["raw_learner_steps_per_sec"] is None and figures["learner_efficiency"] is None
    assert figures["raw_update_steps_per_sec"] is None and figures["update_efficiency"] is None
    assert figures["raw_compile"] == "failed (RuntimeError)" and "the ceiling's CUDA graph failed" in err


def test_the_gpu_busy_fraction_averages_nvidia_smis_utilization(tmp_path):
    # bench.GpuBusy samples `nvidia-smi --query-gpu=utilization.gpu`; a stand-in prints 30 then 50.
    import torch

    import bench

    smi = tmp_path / "nvidia-smi"
    count = tmp_path / "count"
    smi.write_text(f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n"
                   "if [ $n -eq 0 ]; then echo 30; else echo 50; fi\n")
    smi.chmod(0o755)
    busy = bench.GpuBusy(torch.device("cuda", 0), period=0.05, command=str(smi))
    with busy:
        deadline = time.monotonic() + 30
        while len(busy.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert busy.samples[:3] == [0.3, 0.5, 0.5] and 0.3 < busy.fraction <= 0.5
    assert bench.GpuBusy(torch.device("cpu")).fraction is None


def test_bench_rejects_bad_seconds():
    result = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--seconds", "0"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--seconds must be" in one_line_error(result)


def test_bench_refuses_continuous_envs_in_one_line():
    result = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--env", "Pendulum-v1", "--seconds", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "discrete-action envs only" in one_line_error(result)


@pytest.mark.slow
def test_bench_sweep_prints_json_with_both_ratios():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench_sweep.py"), "--steps", "2000", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["runs"] == 2 and figures["steps_per_run"] == 2000 and figures["cpus_per_trial"] == 1
    steps = 2 * 2000
    for way in ("sequential", "sweep"):
        # The wall figure is both runs' steps over the wall time (rounded to 0.1 s in the JSON) ...
        assert figures[f"{way}_wall_steps_per_sec"] == pytest.approx(steps / figures[f"{way}_wall_seconds"], rel=0.05)
        # ... and the training time, from the runs' progress.csv, is a part of that wall time.
        assert figures[f"{way}_training_steps_per_sec"] >= figures[f"{way}_wall_steps_per_sec"]
    # Each ratio is the sweep's gain: sweep over one after the other in throughput, in wall time the reverse.
    training = figures["sweep_training_steps_per_sec"] / figures["sequential_training_steps_per_sec"]
    assert figures["training_ratio"] == pytest.approx(training, rel=0.01)
    wall = figures["sequential_wall_seconds"] / figures["sweep_wall_seconds"]
    assert figures["wall_ratio"] == pytest.approx(wall, rel=0.05)


def test_bench_sweep_rejects_too_few_steps():
    result = subprocess.run([sys.executable, str(ROOT / "bench_sweep.py"), "--steps", "10"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--steps must be >= 1000" in one_line_error(result)


@pytest.mark.parametrize("flags, message", [
    (["--compile", "graph"], "--compile graph runs the update as a CUDA graph"),
    (["--replay-device", "cuda"], "--replay-device cuda keeps the replay buffer on the GPU"),
])
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_bench_refuses_what_train_refuses_off_cuda(flags, message):
    result = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--env", "CartPole-v1", "--seconds", "1", *flags],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert message in one_line_error(result)

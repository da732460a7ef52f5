#!/bin/bash
# The GPU report (issue 35): bench.py at the Pong defaults over what a GPU box should be measured on,
# most telling first, and the CUDA-only tests, within a time budget; one JSON line each, appended to
# OUT_DIR/<device>-<commit>.jsonl.
#
#   tools/gpu_report.sh                               # on a GPU box: --device cuda, 40 s a figure, 9 minutes in all
#   tools/gpu_report.sh --out "$OUT/bench" --commit ID   # on the lent device machine, carrying .whl (tools/gpu_wheels.sh):
#                                                     # its files come back from $OUT; copy them to docs/bench/
#   tools/gpu_report.sh --device cpu --seconds 4 --budget 120 --out /tmp/report   # the dry run, on a CPU
#
# Options: --env ID (default PongNoFrameskip-v4; the tests' dry run takes CartPole-v1), --device
# cuda|cpu (default cuda), --seconds S (bench.py's measuring time per setting, default 40), --budget S (the whole report's wall time, default 500, counted from the
# script's start: a setting that would not fit is recorded as skipped), --out DIR (default docs/bench), --python PY (default: python, else python3),
# --cut S (a setting still running after S seconds is cut and recorded as failed, so that one that
# hangs cannot hold the whole call; default: its measuring time, its setup's allowance and 120 s),
# --commit ID (the commit the files are named by; default: git's HEAD here, which on the lent device
# machine was a stale one: its copy of the working tree is current, its git metadata was not).
# No setting and no test runs past the budget and GRACE (30 s) more: with a setting's 10 s from its
# TERM to its KILL, the report ends within --budget + 40 s of its start: 9 minutes at the default
# budget (a device call's command runs at most 600 s).
# Order: bench.py's defaults at Pong (serial and eager: the baseline of every report), then the CUDA-only tests (at most
# TESTS_SECONDS, so that a pass/fail answer on the GPU paths comes back whatever the timings take),
# then the other settings. Each bench line is bench.py's own JSON with "report": the setting's flags
# and "started_s": the second of the report it started at (or was skipped or failed at) added; the
# tests' line holds pytest's summary line, or says that there is no CUDA. bench.py's stderr and the
# tests' output go to OUT_DIR/<device>-<commit>.log.
set -u
cd "$(dirname "$0")/.."
start=$(date +%s)  # the budget counts the wheels' install and torch's first import too
ENV_ID=PongNoFrameskip-v4 DEVICE=cuda SECONDS_PER=40 BUDGET=500 GRACE=30 CUT="" COMMIT="" OUT_DIR=docs/bench PY=${PYTHON:-$(command -v python || command -v python3)}
while [ $# -gt 0 ]; do
  case $1 in
    --env) ENV_ID=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --cut) CUT=$2; shift 2 ;;
    --commit) COMMIT=$2; shift 2 ;;
    *) echo "gpu_report.sh: error: unknown option $1 (see the header of tools/gpu_report.sh)" >&2; exit 2 ;;
  esac
done
for whole in "--seconds $SECONDS_PER" "--budget $BUDGET" "--cut ${CUT:-1}"; do  # the budget's arithmetic is bash's, in whole seconds
  case ${whole#* } in ''|*[!0-9]*|0) echo "gpu_report.sh: error: ${whole% *} must be a positive whole number of seconds, got ${whole#* }" >&2; exit 2 ;; esac
done
# gymnasium and ale-py from .whl where the image lacks them (the lent GPU machine's)
source tools/use_wheels.sh
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_report.sh: error: --device cuda, but torch sees no CUDA device (a dry run: --device cpu)" >&2
  exit 2
fi
mkdir -p "$OUT_DIR" || exit 2
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
case $commit in ''|*[!0-9A-Za-z._-]*) echo "gpu_report.sh: error: --commit takes a commit's name (letters, digits, . _ -), got $commit" >&2; exit 2 ;; esac
device_name=$("$PY" -c "
import re, torch
name = torch.cuda.get_device_name(0) if '$DEVICE' == 'cuda' else 'cpu'
print(re.sub(r'[^A-Za-z0-9.]+', '-', name).strip('-').lower())")
out="$OUT_DIR/$device_name-$commit.jsonl"
log="$OUT_DIR/$device_name-$commit.log"  # bench.py's stderr and the tests' output, to read a failure
echo "gpu_report: $DEVICE ($device_name), $SECONDS_PER s a setting, budget $BUDGET s -> $out"

skip() {  # HEAD LABEL WHY NOTE: a setting recorded as skipped, WHY in its line and NOTE on the console
  echo "{$1, \"skipped\": \"$3\"}" >> "$out"
  echo "  skipped ($4): $2"
}

cut_within_budget() {  # CUT ELAPSED: CUT seconds, or fewer where they would pass the budget's end
  local left=$(( BUDGET + GRACE - $2 ))
  echo $(( $1 < left ? $1 : left ))
}

setting() {  # [VAR=VALUE ...] then bench.py's flags for one setting (the variables set for its run)
  local vars=()
  while [ $# -gt 0 ] && [ "${1#--}" = "$1" ] && [ "${1#*=}" != "$1" ]; do vars+=("$1"); shift; done
  local elapsed=$(( $(date +%s) - start )) setup=30 label="${vars[*]:+${vars[*]} }$*"
  local head="\"report\": \"$label\", \"started_s\": $elapsed"
  # bench.py measures for SECONDS_PER after building its envs and buffer (allow 30 s for that) and,
  # with --compile, compiling the update (allow 60 s more: 40-80 s on the 2-core CPU)
  case "$*" in *--compile*) setup=90 ;; esac
  case "$DEVICE $*" in "cpu "*"--compile graph"*)  # bench.py refuses it off CUDA, as train.py does
    skip "$head" "$label" "--compile graph needs CUDA" "no CUDA"
    return ;;
  esac
  if [ $(( elapsed + SECONDS_PER + setup )) -gt "$BUDGET" ]; then
    skip "$head" "$label" "the time budget of $BUDGET s" time
    return
  fi
  local line code cut
  cut=$(cut_within_budget "${CUT:-$(( SECONDS_PER + setup + 120 ))}" "$elapsed")
  echo "== bench.py $label" >> "$log"
  # a setting that hangs (or hangs on its way out) is cut, so that it cannot hold the whole call;
  # bench.py takes a SIGTERM as a stop after the iteration under way, so a KILL follows 10 s later
  line=$(env "${vars[@]}" timeout -k 10 "$cut" "$PY" bench.py --env "$ENV_ID" --device "$DEVICE" --seconds "$SECONDS_PER" \
    --json "$@" 2>>"$log" | tail -1; exit "${PIPESTATUS[0]}")
  code=$?
  local hung="" failure="bench.py printed no JSON line" said="failed"
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then  # 137: killed 10 s after the TERM (or for memory)
    failure="cut at $cut s (exit $code)" said="cut at $cut s"
    # bench.py prints its JSON line once it has measured everything: a setting cut after it hung on
    # its way out, its figures whole (on the H200, a cnn_lstm bench after a cold compile: torch 2.11's
    # Inductor waited at exit for its compile workers, up to 300 s, pytorch/pytorch#162199)
    hung="\"cut_after_its_figures\": \"$failure: its exit hung\", "
  fi
  if [ "${line:0:1}" != "{" ]; then
    echo "{$head, \"failed\": \"$failure\"}" >> "$out"
    echo "  $said: $label"
    return
  fi
  echo "{$head, $hung${line:1}" >> "$out"
  echo "  done: $label ($(( $(date +%s) - start )) s${hung:+; its exit hung and was cut at $cut s})"
  case "$*" in *"--compile update"*|*"--compile graph"*)
    case "$line" in *'"update_compiled": false'*) echo "  note: the compile failed and this setting ran the eager update (the warning is in $log)" ;; esac
    case "$DEVICE$line" in cpu*|*'"cudagraph_skips": 0'*|*'"cudagraph_skips": null'*) ;; *) echo "  note: some compiled graphs ran without a CUDA graph (cudagraph_skips)" ;; esac
    case "$line" in *'"acting_graphed": false'*) echo "  note: acting's step could not be captured as a CUDA graph and it acted eagerly (the warning is in $log)" ;; esac ;;
  esac
}

probe() {  # tools/env_groups.py's flags: whether env groups stepping at the same time would hide acting
  local elapsed=$(( $(date +%s) - start )) label="env groups $*" line code
  local head="\"report\": \"$label\", \"started_s\": $elapsed"
  case $ENV_ID in *NoFrameskip*|ALE/*) ;; *)
    skip "$head" "$label" "the probe steps ALE's vector env: Atari games only" "not Atari"
    return ;;
  esac
  if [ $(( elapsed + PROBE_SECONDS )) -gt "$BUDGET" ]; then
    skip "$head" "$label" "the time budget of $BUDGET s" time
    return
  fi
  local cut
  cut=$(cut_within_budget $(( PROBE_SECONDS + 30 )) "$elapsed")
  echo "== tools/env_groups.py $*" >> "$log"
  timeout -k 5 "$cut" "$PY" tools/env_groups.py --env "$ENV_ID" "$@" 2>>"$log" > "$OUT_DIR/.probe"
  code=$?
  while read -r line; do  # one JSON line per acting time
    [ "${line:0:1}" = "{" ] && echo "{$head, ${line:1}" >> "$out"
  done < "$OUT_DIR/.probe"
  rm -f "$OUT_DIR/.probe"
  [ "$code" = 0 ] || echo "{$head, \"failed\": \"exit $code (the log has its error)\"}" >> "$out"
  echo "  done: $label ($(( $(date +%s) - start )) s)"
}

cuda_tests() {  # the CUDA-only tests, within TESTS_SECONDS and what the budget leaves
  local summary cut
  cut=$(cut_within_budget "$TESTS_SECONDS" $(( $(date +%s) - start )))
  if [ "$DEVICE" = cuda ] && [ "$cut" -lt 30 ]; then
    summary="not run: the time budget of $BUDGET s"
  elif [ "$DEVICE" = cuda ]; then
    echo "== the CUDA tests" >> "$log"
    summary=$(timeout -k 10 "$cut" "$PY" -m pytest -v -rfE -p no:cacheprovider -o faulthandler_timeout=60 --durations=15 \
      $CUDA_TEST_FILES -k cuda 2>&1 | tee -a "$log" | tail -1)
    # -v: each test's line goes to the log as it ends, so a run cut short still shows which passed;
    # a test that hangs leaves its threads' stacks there (faulthandler), and the slowest are timed
    [[ $summary =~ (passed|failed|error|skipped|deselected|no\ tests\ ran).*\ in\ [0-9.]+s ]] \
      || summary="no summary line (cut at $cut s; its last line: ${summary:-none})"
  else
    summary="no CUDA: the CUDA-only tests were not run"
  fi
  summary=$(printf '%s' "$summary" | tr -d '\000-\037')  # a cut run's last line may hold a tab or another control character
  summary=${summary//\\/\\\\}  # or a backslash: the JSON line stays valid
  echo "{\"report\": \"cuda tests\", \"summary\": \"${summary//\"/\'}\"}" >> "$out"
  echo "  cuda tests: $summary ($(( $(date +%s) - start )) s)"
}

# Most telling first: bench.py's baseline (serial and eager, as in every report; train.py's defaults on
# CUDA, --pipeline auto and --compile auto, are the overlapped --compile update rows), the CUDA tests, then overlapped with the update
# as a CUDA graph (the fastest of the second and third reports) at 16 envs, the same with the envs
# in 2 groups that step at the same time (--env-groups 2: one group's actions chosen while the other
# steps), at 64 envs, then the env groups' probe (tools/env_groups.py: what groups could give on
# the machine's cores, 16 envs in 2 groups, acting standing in as a 0.1 and a 0.3 ms spin), the graph
# at 32 envs, the same in bf16
# (the third report's time ran out before these two), the update compiled without the graph (acting
# eager), the same at 16 envs with torch's OpenMP threads spinning as libgomp's default lets them
# (300,000 spins; bench.py, like train.py, sets OMP_WAIT_POLICY=PASSIVE where it is unset: the third
# report's contrast ran 0.85x), overlapped eager, the replay buffer in host memory (batches upload
# on the side stream), then serial at 64 envs.
TESTS_SECONDS=240  # pytest is killed 10 s after its SIGTERM: a training under test takes that signal as a stop
# The files holding CUDA-only tests (tests/test_tools.py checks that every test marked requires_cuda
# is in one of them, with cuda in its name), the acting path's first: it changed since the last report.
CUDA_TEST_FILES="tests/test_acting_path.py tests/test_precision.py tests/test_compiled_update.py tests/test_cuda_replay.py tests/test_pipeline.py tests/test_torsos.py"
setting --num-envs 16
cuda_tests
setting --num-envs 16 --pipeline overlap --compile graph
setting --num-envs 16 --pipeline overlap --compile graph --env-groups 2
setting --num-envs 64 --pipeline overlap --compile graph
PROBE_SECONDS=35  # two acting times, each shape 5 s, and the envs' start
probe --num-envs 16 --groups 2 --acting-ms 0.1,0.3 --seconds 5
setting --num-envs 32 --pipeline overlap --compile graph
setting --num-envs 16 --pipeline overlap --compile graph --precision bf16
setting --num-envs 16 --pipeline overlap --compile update
setting --num-envs 64 --pipeline overlap --compile update
setting OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=300000 --num-envs 16 --pipeline overlap --compile graph
setting --num-envs 16 --pipeline overlap
setting --num-envs 16 --pipeline overlap --compile graph --replay-device cpu
setting --num-envs 64
echo "gpu_report: $(( $(date +%s) - start )) s in all; $out"

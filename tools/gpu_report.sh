#!/bin/bash
# The GPU report (issue 35): bench.py at the Pong defaults over what a GPU box should be measured on,
# most telling first, within a time budget, then the CUDA-only tests; one JSON line each, appended to
# OUT_DIR/<device>-<commit>.jsonl.
#
#   tools/gpu_report.sh                               # on a GPU box: --device cuda, 40 s a figure, 9 minutes in all
#   tools/gpu_report.sh --device cpu --seconds 4 --budget 120 --out /tmp/report   # the dry run, on a CPU
#
# Options: --device cuda|cpu (default cuda), --seconds S (bench.py's measuring time per setting,
# default 40), --budget S (the whole report's wall time, default 540: a setting that would not fit
# is recorded as skipped), --out DIR (default docs/bench), --python PY (default: python).
# Each bench line is bench.py's own JSON with "report": the setting's flags added. The last line
# holds the CUDA-only tests' outcome (pytest's summary line), or says that there is no CUDA.
set -u
cd "$(dirname "$0")/.."
DEVICE=cuda SECONDS_PER=40 BUDGET=540 OUT_DIR=docs/bench PY=${PYTHON:-python}
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    *) echo "gpu_report.sh: error: unknown option $1 (see the header of tools/gpu_report.sh)" >&2; exit 2 ;;
  esac
done
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_report.sh: error: --device cuda, but torch sees no CUDA device (a dry run: --device cpu)" >&2
  exit 2
fi
mkdir -p "$OUT_DIR" || exit 2
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
device_name=$("$PY" -c "
import re, torch
name = torch.cuda.get_device_name(0) if '$DEVICE' == 'cuda' else 'cpu'
print(re.sub(r'[^A-Za-z0-9.]+', '-', name).strip('-').lower())")
out="$OUT_DIR/$device_name-$commit.jsonl"
start=$(date +%s)
echo "gpu_report: $DEVICE ($device_name), $SECONDS_PER s a setting, budget $BUDGET s -> $out"

setting() {  # bench.py's flags for one setting
  local elapsed=$(( $(date +%s) - start ))
  # bench.py measures for SECONDS_PER after building its envs and buffer (allow 30 s for that)
  if [ $(( elapsed + SECONDS_PER + 30 )) -gt "$BUDGET" ]; then
    echo "{\"report\": \"$*\", \"skipped\": \"the time budget of $BUDGET s\"}" >> "$out"
    echo "  skipped (time): $*"
    return
  fi
  local line
  line=$("$PY" bench.py --device "$DEVICE" --seconds "$SECONDS_PER" --json "$@" 2>/dev/null | tail -1)
  if [ "${line:0:1}" != "{" ]; then
    echo "{\"report\": \"$*\", \"failed\": \"bench.py printed no JSON line\"}" >> "$out"
    echo "  failed: $*"
    return
  fi
  echo "{\"report\": \"$*\", ${line:1}" >> "$out"
  echo "  done: $* ($(( $(date +%s) - start )) s)"
}

# Most telling first: the Pong defaults as they are, then overlapped and compiled (the update whole,
# then as a CUDA graph), at 16 and 64 envs, the replay buffer in host memory (batches upload on the
# side stream), then bf16 and 32 envs.
setting --num-envs 16
setting --num-envs 16 --pipeline overlap --compile update
setting --num-envs 64 --pipeline overlap --compile update
setting --num-envs 16 --pipeline overlap --compile graph
setting --num-envs 16 --pipeline overlap
setting --num-envs 16 --pipeline overlap --compile update --replay-device cpu
setting --num-envs 64
setting --num-envs 16 --pipeline overlap --compile update --precision bf16
setting --num-envs 32 --pipeline overlap --compile update
setting --num-envs 64 --pipeline overlap --compile graph

if [ "$DEVICE" = cuda ]; then
  summary=$("$PY" -m pytest -q -p no:cacheprovider tests/test_precision.py tests/test_compiled_update.py tests/test_cuda_replay.py tests/test_pipeline.py -k cuda 2>&1 | tail -1)
else
  summary="no CUDA: the CUDA-only tests were not run"
fi
echo "{\"report\": \"cuda tests\", \"summary\": \"${summary//\"/\'}\"}" >> "$out"
echo "gpu_report: $summary; $(( $(date +%s) - start )) s in all; $out"

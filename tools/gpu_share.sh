#!/bin/bash
# Trials sharing one GPU (issue 35): one train.py run alone for S seconds, then K runs at once for
# S seconds, and their summed steps/s against the one alone, as one JSON line in OUT_DIR/share.jsonl
# (their run directories beside it). sweep.py with `trial: {gpus: 0.25}` shares a GPU the same
# way (Ray only tells each trial which GPU it sees), but Ray's wheels do not fit the 64 MiB a
# device call carries, so the trials here are plain processes, each with the threads a sweep would
# give it (the machine's cores / K; the run alone gets as many).
#
#   tools/gpu_share.sh --out "$OUT/share"          # on the lent GPU machine: Pong, 4 trials, 120 s each phase
#   tools/gpu_share.sh --device cpu --env CartPole-v1 --trials 2 --seconds 20 --out /tmp/share   # its dry run
#
# Options: --env ID (default PongNoFrameskip-v4), --device D (cuda), --trials K (4), --seconds S
# (120), --out DIR (runs/gpu_share: where share.jsonl is appended; copy it to docs/bench/), --runs DIR
# (runs/gpu_share: the trials' run directories and logs; apart from --out, since a device call
# brings back at most 8 files), --python PY; anything after -- goes to every train.py. Each
# trial's steps/s is measured between its progress rows (one every 5 s) over the last 60% of its
# time, past start-up and the compile; a phase's runs start together and are stopped by SIGINT
# (killed where one is still there 90 s later, so that a stuck trial cannot hold the call).
set -u
cd "$(dirname "$0")/.."
ENV_ID=PongNoFrameskip-v4 DEVICE=cuda TRIALS=4 SECONDS_PER=120 OUT_DIR=runs/gpu_share RUNS_DIR=runs/gpu_share PY=${PYTHON:-$(command -v python || command -v python3)}
while [ $# -gt 0 ]; do
  case $1 in
    --env) ENV_ID=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --trials) TRIALS=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --runs) RUNS_DIR=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu_share.sh: error: unknown option $1 (see the header of tools/gpu_share.sh)" >&2; exit 2 ;;
  esac
done
# gymnasium and ale-py from .whl where the image lacks them (the lent GPU machine's)
source tools/use_wheels.sh
mkdir -p "$OUT_DIR" "$RUNS_DIR" || exit 2
threads=$(( $(nproc) / TRIALS )); [ "$threads" -ge 1 ] || threads=1

phase() {  # phase NAME COUNT: COUNT runs at once for SECONDS_PER seconds
  local name=$1 count=$2 i
  shift 2
  for i in $(seq 1 "$count"); do
    rm -rf "$RUNS_DIR/$name-$i"
    timeout -s INT -k 90 "$SECONDS_PER" "$PY" train.py --env "$ENV_ID" --device "$DEVICE" --seed "$i" --threads "$threads" \
      --total-timesteps 1000000000 --eval-every 0 --log-seconds 5 --no-progress --run-dir "$RUNS_DIR/$name-$i" "$@" \
      > "$RUNS_DIR/$name-$i.log" 2>&1 &
  done
  wait
}
echo "gpu_share: $ENV_ID on $DEVICE, 1 trial alone then $TRIALS at once, $SECONDS_PER s each, $threads threads a trial"
phase alone 1 "$@"
phase shared "$TRIALS" "$@"
"$PY" - "$RUNS_DIR" "$TRIALS" "$ENV_ID" "$DEVICE" "$threads" "$SECONDS_PER" <<'PYEOF' | tee -a "$OUT_DIR/share.jsonl"
import csv, json, sys
from pathlib import Path

runs, trials, env, device, threads, seconds = sys.argv[1:]

def steps_per_sec(run):
    """Steps/s between the progress rows of the last 60% of the run's time (None without two)."""
    path = Path(runs) / run / "progress.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    if len(rows) < 2:
        return None
    end = float(rows[-1]["time_elapsed"])
    late = [r for r in rows if float(r["time_elapsed"]) >= 0.4 * end]
    first, last = (late[0], late[-1]) if len(late) >= 2 else (rows[-2], rows[-1])
    span = float(last["time_elapsed"]) - float(first["time_elapsed"])
    return round((int(last["total_timesteps"]) - int(first["total_timesteps"])) / span, 1) if span > 0 else None

alone = steps_per_sec("alone-1")
shared = [steps_per_sec(f"shared-{i}") for i in range(1, int(trials) + 1)]
total = round(sum(shared), 1) if None not in shared else None
print(json.dumps({"report": "sharing", "env": env, "device": device, "trials": int(trials), "threads_per_trial": int(threads),
                  "seconds": float(seconds), "alone_steps_per_sec": alone, "shared_steps_per_sec": shared,
                  "shared_total_steps_per_sec": total,
                  "total_over_alone": round(total / alone, 3) if total and alone else None}))
PYEOF

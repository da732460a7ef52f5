#!/bin/bash
# steps/s of short runs at each setting, idle and with 2 busy-loop processes sharing the 2 cores.
# Usage: [PYTHON=.venv/bin/python] tools/measure_defaults.sh OUT.tsv (columns: run, load, env, steps/s over the second half, wall s)
out=$1; : > "$out"
cd "$(dirname "$0")/.."
run() {  # label load env steps extra...
  label=$1; load=$2; env=$3; steps=$4; shift 4
  dir=$(mktemp -d)
  hogs=()
  if [ "$load" = busy ]; then
    for i in 1 2; do python3 -c "while True: pass" & hogs+=($!); done
  fi
  start=$(date +%s.%N)
  "${PYTHON:-python}" train.py --env "$env" --total-timesteps "$steps" --eval-every 0 --run-dir "$dir/run" --no-progress --log-seconds 0 "$@" > "$dir/log" 2>&1
  end=$(date +%s.%N)
  for h in "${hogs[@]}"; do kill $h; done
  # steps/s over the rows after replay started (the last half of the run), and the whole run's wall time
  fps=$(python3 - "$dir/run/progress.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
late = rows[len(rows) // 2:]
steps = float(late[-1]["total_timesteps"]) - float(rows[len(rows) // 2 - 1]["total_timesteps"]) if len(rows) > 1 else float(rows[-1]["total_timesteps"])
secs = float(late[-1]["time_elapsed"]) - (float(rows[len(rows) // 2 - 1]["time_elapsed"]) if len(rows) > 1 else 0.0)
print(f"{steps / secs:.0f}")
PY
)
  printf "%s\t%s\t%s\t%s\t%.1f\n" "$label" "$load" "$env" "$fps" "$(echo "$end - $start" | bc)" | tee -a "$out"
  rm -rf "$dir"
}
for load in idle busy; do
  for backend in subproc sync; do for threads in 0 1; do
    run "cartpole $backend threads=$threads" $load CartPole-v1 20000 --vec-env $backend --threads $threads
  done; done
  for threads in 0 1; do
    run "halfcheetah subproc threads=$threads" $load HalfCheetah-v5 6000 --threads $threads
  done
done

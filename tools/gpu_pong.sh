#!/bin/bash
# Pong to a 100-game mean of 20 on the lent GPU (issue 35), in pieces that fit device calls: a
# call runs train.py for at most S seconds (a fresh run, or a resume where RUN_DIR holds a
# checkpoint), stops it with SIGINT (the run saves its checkpoint), and copies what a later call
# needs to go on into OUT_DIR, small enough to carry back: config.json, progress.csv,
# segments.jsonl, checkpoints/latest.pt and compile_cache.tar.gz (the last two in parts where large,
# below), since a device call brings back at most 8 files, of at most 16 MiB, none more than 2
# folders below $OUT (--out "$OUT/pong" puts latest.pt at that depth). The run itself
# trains in RUN_DIR, with its TensorBoard files and train.log. While it trains, progress.csv and each
# new checkpoint are copied out every 10 s (GPU_PONG_WATCH_SECONDS sets it), so that a call cut by the
# device's limit, whose $OUT still comes back, brings back the run's rows and its last checkpoint (a
# cut leaves no segments.jsonl line and no compile cache). Each call appends one JSON line to
# segments.jsonl and prints it: the segment's wall time, the run's steps and training time so
# far, the last 100-game mean, and where the mean first reached the target (steps, training time).
# The stop uses the training episodes' 100-game mean (raw scores), so evaluation is off unless the
# flags turn it on: with --eval-every N --eval-episodes 100 --eval-greedy the run stops at the first
# evaluation of 100 games at the target instead (--stop-at-reward's rule), and the line records
# where ("eval_reached"; its time is not training time). The difference matters on Pong: the CPU's
# 5M cnn_lstm checkpoint scores 19.53 over 100 games sampled, as its training games do, and 20.78
# greedy (docs/performance.md). A call whose line has either "reached" or "eval_reached" ends the
# series: the next call says so and trains nothing.
#
# A fresh run checkpoints every 100,000 steps (a flag after -- may change it; a resume keeps the
# run's own), so that a call that dies loses little; a call that ended before its first checkpoint
# (a crash at the start, the first compile cut) leaves a run that cannot resume, and the next call
# moves it aside (RUN_DIR.failed-<time>, its segments.jsonl carried on) and starts afresh. A run
# that got past 100,000 steps but has no checkpoints/latest.pt lost it on the way (a carry without
# it): that is an error, and nothing is moved.
#
# torch.compile's caches (Inductor's and Triton's, TORCHINDUCTOR_CACHE_DIR=RUN_DIR/compile_cache)
# travel with the run as a fifth file, compile_cache.tar.gz: every lent machine starts cold, and
# the cnn_lstm update's compile from a cold cache takes minutes (an 8 s bench of it took 183 s on
# the 2-core CPU cold, 40 s with the cache moved to another path); a call restores the archive
# where RUN_DIR has no cache yet.
#
#   tools/gpu_pong.sh --seconds 420 --out "$OUT/pong" -- --pipeline overlap --compile graph
#       (the first call trains in runs/gpu_pong; the next call, in this session or a later one,
#       carries the previous call's OUT_DIR copied into runs/gpu_pong, and runs the same command)
#   tools/gpu_pong.sh --device cpu --env CartPole-v1 --reward 150 --seconds 20 --out /tmp/pong   # its dry run
#
# Options: --env ID (PongNoFrameskip-v4), --device D (cuda), --reward R (20), --seconds S (420: with
# the 90 s a stop may take before the kill, and a minute for the wheels, the cache and the copies,
# within a device call's 600 s; give the call's timeout less 180 s),
# --run-dir DIR (where the run trains, runs/gpu_pong; resumed where it holds checkpoints/latest.pt),
# --out DIR (runs/gpu_pong), --python PY, --part-bytes N (15 MiB; see below); anything after --
# goes to train.py on every call (a resume accepts the settings it may change, and the others only
# at their saved values).
#
# A device call brings back files of at most 16 MiB, and the cnn_lstm's latest.pt is about 23 MB
# (the network, the average network and RMSProp's state): OUT_DIR holds a file larger than
# --part-bytes as FILE.part-aa, FILE.part-ab, ... (split), and a call whose RUN_DIR holds such parts
# (the previous call's OUT_DIR, carried back) joins them first. OUT_DIR stays within 8 files and
# 46 MiB, so that the next call carries it beside the checkout and .whl within the 64 MiB a call
# carries: where the compile cache's parts would pass either, they are left out, and said so.
set -u
cd "$(dirname "$0")/.."
ENV_ID=PongNoFrameskip-v4 DEVICE=cuda REWARD=20 SECONDS_FOR=420 RUN_DIR=runs/gpu_pong OUT_DIR=runs/gpu_pong
CHECKPOINT_EVERY=100000  # a fresh run's --checkpoint-every
WATCH_SECONDS=${GPU_PONG_WATCH_SECONDS:-10}  # how often a new checkpoint is copied out while the run trains
PART_BYTES=15728640  # 15 MiB: a device call brings back files of at most 16 MiB
OUT_MAX_FILES=8 OUT_MAX_BYTES=48234496  # 46 MiB: the next call carries it beside the checkout (12.5 MB) and .whl (3.6 MB) within 64 MiB
PY=${PYTHON:-$(command -v python || command -v python3)}
while [ $# -gt 0 ]; do
  case $1 in
    --env) ENV_ID=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --reward) REWARD=$2; shift 2 ;;
    --seconds) SECONDS_FOR=$2; shift 2 ;;
    --run-dir) RUN_DIR=$2; shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --part-bytes) PART_BYTES=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu_pong.sh: error: unknown option $1 (see the header of tools/gpu_pong.sh)" >&2; exit 2 ;;
  esac
done
RUN_DIR=${RUN_DIR%/} OUT_DIR=${OUT_DIR%/}
# OUT_DIR apart from RUN_DIR: what the next call needs is copied there (else the run trains in OUT_DIR itself, and a
# copy would take train.py's files' place)
OUT_APART=""
[ "$(realpath -m "$RUN_DIR")" = "$(realpath -m "$OUT_DIR")" ] || OUT_APART=1
case $PART_BYTES in ''|*[!0-9]*|0) echo "gpu_pong.sh: error: --part-bytes must be a positive whole number of bytes, got $PART_BYTES" >&2; exit 2 ;; esac

join_parts() {  # FILE: FILE made again from FILE.part-aa, -ab, ... (a previous call's OUT_DIR, carried back)
  local parts=("$1".part-*)
  [ -e "${parts[0]}" ] || return 0
  cat "${parts[@]}" > "$1.joining" && mv "$1.joining" "$1" && rm -f "${parts[@]}" && return 0
  rm -f "$1.joining"
  echo "gpu_pong.sh: error: could not join ${parts[*]} into $1" >&2
  exit 2
}

put_out() {  # FILE DEST: a copy of FILE at DEST, or in parts DEST.part-aa, -ab, ... of PART_BYTES where larger;
  # made beside as DEST.new first and renamed over the copy before it, so that a call cut while it copies leaves
  # that copy whole (but in the renames of its parts, a moment)
  rm -f "$2.new" "$2.new".part-*
  if [ "$(stat -c %s "$1")" -gt "$PART_BYTES" ]; then
    split -b "$PART_BYTES" -a 2 "$1" "$2.new.part-" || return 1
    local part kept=()
    for part in "$2.new".part-*; do mv "$part" "$2${part#"$2.new"}" || return 1; kept+=("$2${part#"$2.new"}"); done
    rm -f "$2"
    for part in "$2".part-*; do  # the parts past the new ones, of a larger copy before
      [[ " ${kept[*]} " == *" $part "* ]] || rm -f "$part"
    done
  else
    cp "$1" "$2.new" && mv "$2.new" "$2" && rm -f "$2".part-*
  fi
}

copy_out() {  # what the next call needs, into OUT_DIR (where it is apart from RUN_DIR)
  [ -n "$OUT_APART" ] || return 0
  mkdir -p "$OUT_DIR/checkpoints" || return 1
  local name failed=0
  for name in config.json progress.csv segments.jsonl checkpoints/latest.pt; do
    [ -f "$RUN_DIR/$name" ] || continue
    put_out "$RUN_DIR/$name" "$OUT_DIR/$name" || failed=1
  done
  return $failed
}

keep_out_current() {  # while train.py runs, every WATCH_SECONDS: progress.csv, and each new checkpoint, copied out,
  # so that a call cut by the device's limit (whose OUT still comes back) brings the run's rows and last checkpoint
  [ -n "$OUT_APART" ] || return 0
  local copied="" stamp stop=""
  trap 'stop=1' TERM  # the kill after the run ends the loop between copies, never in one: the final copy overlaps none
  while [ -z "$stop" ]; do
    sleep "$WATCH_SECONDS" &
    wait $!  # (a sleep in the foreground would hold the TERM until it ends)
    [ -z "$stop" ] || break
    [ -f "$RUN_DIR/progress.csv" ] && put_out "$RUN_DIR/progress.csv" "$OUT_DIR/progress.csv"
    [ -z "$stop" ] || break
    stamp=$(stat -c %i.%Y "$RUN_DIR/checkpoints/latest.pt" 2>/dev/null) || continue  # a new file each save (a rename)
    [ "$stamp" = "$copied" ] || { copy_out && copied=$stamp; }
  done
}

join_parts "$RUN_DIR/checkpoints/latest.pt"
join_parts "$RUN_DIR/compile_cache.tar.gz"
if [ -f "$RUN_DIR/segments.jsonl" ] && tail -n 1 "$RUN_DIR/segments.jsonl" | grep -qE '"(eval_)?reached": \{'; then
  echo "gpu_pong: $RUN_DIR reached its target already: $(tail -n 1 "$RUN_DIR/segments.jsonl")"
  exit 0
fi
if [ ! -f "$RUN_DIR/checkpoints/latest.pt" ] && [ -n "$(ls -A "$RUN_DIR" 2>/dev/null)" ]; then
  trained=$(tail -n 1 "$RUN_DIR/progress.csv" 2>/dev/null | cut -d, -f1)
  case $trained in ''|*[!0-9]*) trained=0 ;; esac  # no progress.csv, or its header alone
  if [ "$trained" -ge "$CHECKPOINT_EVERY" ]; then
    echo "gpu_pong.sh: error: $RUN_DIR trained to step $trained but holds no checkpoints/latest.pt (was it carried?); nothing moved" >&2
    exit 2
  fi
  aside="$RUN_DIR.failed-$(date +%s)"
  mv "$RUN_DIR" "$aside" || exit 2
  mkdir -p "$RUN_DIR" || exit 2
  for name in segments.jsonl compile_cache.tar.gz; do
    [ -f "$aside/$name" ] && cp "$aside/$name" "$RUN_DIR/$name"
  done
  echo "gpu_pong: $RUN_DIR held no checkpoint to resume (a call that ended before its first one): moved to $aside, starting afresh"
fi
# gymnasium and ale-py from .whl where the image lacks them (the lent GPU machine's)
source tools/use_wheels.sh
mkdir -p "$OUT_DIR" "$RUN_DIR" || exit 2
export TORCHINDUCTOR_CACHE_DIR
TORCHINDUCTOR_CACHE_DIR="$(realpath -m "$RUN_DIR")/compile_cache"
if [ ! -d "$TORCHINDUCTOR_CACHE_DIR" ] && [ -f "$RUN_DIR/compile_cache.tar.gz" ]; then
  tar xzf "$RUN_DIR/compile_cache.tar.gz" -C "$RUN_DIR" && echo "gpu_pong: restored torch.compile's caches from $RUN_DIR/compile_cache.tar.gz"
fi

common=(--device "$DEVICE" --stop-at-reward "$REWARD" --no-progress --log-seconds 10 --keep-checkpoints 0)
if [ -f "$RUN_DIR/checkpoints/latest.pt" ]; then
  kind=resume
  cmd=("$PY" train.py --resume "$RUN_DIR" "${common[@]}" "$@")
else
  kind=fresh
  cmd=("$PY" train.py --env "$ENV_ID" --run-dir "$RUN_DIR" --eval-every 0 --total-timesteps 1000000000 \
       --checkpoint-every "$CHECKPOINT_EVERY" "${common[@]}" "$@")
fi
echo "gpu_pong: $kind, $ENV_ID on $DEVICE to a 100-game mean of $REWARD, at most $SECONDS_FOR s: ${cmd[*]}"
start=$(date +%s)
# SIGINT at S seconds saves a checkpoint (timeout sends it to train.py and again to its process group:
# train.py takes the copy for the same stop); a run still there 90 s later (in its first compile, say) is killed.
keep_out_current > /dev/null 2>&1 &  # its sleep, left at the kill, holds no pipe of the caller's open
watcher=$!
timeout -s INT -k 90 "$SECONDS_FOR" "${cmd[@]}" 2>&1 | tee -a "$RUN_DIR/train.log"
code=${PIPESTATUS[0]}
wall=$(( $(date +%s) - start ))
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null

mkdir -p "$RUN_DIR"  # a run that failed at its start made none
"$PY" - "$RUN_DIR" "$kind" "$code" "$wall" "$REWARD" "$*" <<'PYEOF'
import csv, json, math, sys
from pathlib import Path

run, kind, code, wall, reward, flags = sys.argv[1:]


def number(text):
    """A progress cell as a float, or None where it is empty or nan (no game ended yet): JSON has no NaN."""
    value = float(text) if text else math.nan
    return None if math.isnan(value) else value

path = Path(run) / "progress.csv"
rows = list(csv.DictReader(path.open())) if path.exists() else []
# the first row whose mean is over the last 100 games (as --stop-at-reward's) and at the target
reached = next((row for row in rows if int(row["episodes"]) >= 100 and float(row["mean_episode_reward"]) >= float(reward)), None)
# the first evaluation at the target (a row without one has 0 games and eval_mean nan): the one that
# stopped the run (--stop-at-reward follows the evaluation's mean where the run evaluates)
evaluated = next((row for row in rows if int(row["eval_episodes"]) > 0 and float(row["eval_mean"]) >= float(reward)), None)
last = rows[-1] if rows else {}
line = {
    "segment": kind, "exit_code": int(code), "segment_wall_s": round(float(wall), 1), "flags": flags,
    "steps": int(last.get("total_timesteps", 0)), "training_s": float(last.get("time_elapsed", 0)),
    "mean_return_100": number(last.get("mean_episode_reward")),
    "reached": {"steps": int(reached["total_timesteps"]), "training_s": float(reached["time_elapsed"])} if reached else None,
    "eval_reached": {"steps": int(evaluated["total_timesteps"]), "eval_mean": float(evaluated["eval_mean"]),
                     "games": int(evaluated["eval_episodes"])} if evaluated else None,
}
segments = Path(run) / "segments.jsonl"  # it travels with the run
with segments.open("a") as handle:
    handle.write(json.dumps(line) + "\n")
print("gpu_pong:", json.dumps(line))
PYEOF
if [ -d "$TORCHINDUCTOR_CACHE_DIR" ]; then
  tar czf "$RUN_DIR/compile_cache.tar.gz.packing" -C "$RUN_DIR" compile_cache \
    && mv "$RUN_DIR/compile_cache.tar.gz.packing" "$RUN_DIR/compile_cache.tar.gz" || rm -f "$RUN_DIR/compile_cache.tar.gz.packing"
fi
copy_out || echo "gpu_pong: warning: not every file of $RUN_DIR was copied to $OUT_DIR (see the lines above)" >&2
# the compile cache, where OUT_DIR has room for it: counted before it is copied, so that a call cut at any moment
# leaves OUT_DIR within what a device call brings back
if [ -f "$RUN_DIR/compile_cache.tar.gz" ] && [ -n "$OUT_APART" ]; then
  rm -f "$OUT_DIR"/compile_cache.tar.gz*  # an earlier call's
  size=$(stat -c %s "$RUN_DIR/compile_cache.tar.gz")
  parts=$(( (size + PART_BYTES - 1) / PART_BYTES )) && [ "$parts" -ge 1 ] || parts=1  # an empty file is one file too
  files=$(( $(find "$OUT_DIR" -type f | wc -l) + parts ))
  bytes=$(( $(find "$OUT_DIR" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }') + size ))
  if [ "$files" -gt "$OUT_MAX_FILES" ] || [ "$bytes" -gt "$OUT_MAX_BYTES" ]; then
    echo "gpu_pong: the compile cache is left out of $OUT_DIR ($files files, $bytes bytes with it; a device call brings back $OUT_MAX_FILES, and the next carries $OUT_MAX_BYTES beside the checkout): the next call compiles cold"
  else
    put_out "$RUN_DIR/compile_cache.tar.gz" "$OUT_DIR/compile_cache.tar.gz" \
      || echo "gpu_pong: warning: the compile cache was not copied to $OUT_DIR: the next call compiles cold" >&2
  fi
fi
du -sh "$OUT_DIR" | sed 's/^/gpu_pong: OUT_DIR holds /'

#!/bin/bash
# The Python packages the GPU report needs that the lent device machine's image lacks (gymnasium,
# ale-py with its ROMs, farama-notifications; its image has torch, numpy, pytest, tensorboard, tqdm,
# pyyaml and opencv), as wheels for its Python (3.12; another: its version as the argument), at the
# versions of this checkout's venv, into
# .whl/ (about 3.5 MB; ignored through .gitignore, so that sweep.py does not ship it to a Ray cluster
# either). Run it here, where pip reaches a package index; then a device call carries .whl and
# tools/gpu_report.sh installs them there:
#
#   tools/gpu_wheels.sh                     # here, once (tools/gpu_wheels.sh 3.13: for an image's Python 3.13)
#   device run, carry [".whl"]: tools/gpu_report.sh --out "$OUT/bench" --commit ID   (ID: this checkout's HEAD, written in)
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYTHON_VERSION=${1:-3.12}
case $PYTHON_VERSION in
  3.[0-9]|3.[0-9][0-9]) ;;
  *) echo "gpu_wheels.sh: error: the device's Python version must be like 3.12, got $PYTHON_VERSION" >&2; exit 2 ;;
esac
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null; }
# The versions of this checkout's venv, before anything is fetched or removed.
pins=""
for package in gymnasium ale-py farama-notifications; do
  pinned=$(version "$package") || {
    echo "gpu_wheels.sh: error: $PY has no $package to take its version from (PYTHON names another python)" >&2
    exit 2
  }
  pins="$pins $package==$pinned"
done
# Into a folder beside .whl first: a download that fails (no package index, no wheel for that
# Python) leaves the .whl there was, and says why in one line.
rm -rf .whl.new
if ! said=$("$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl.new \
    $pins 2>&1); then
  rm -rf .whl.new
  reason=$(printf '%s\n' "$said" | grep -m1 '^ERROR: ' | sed 's/^ERROR: //; s/\.$//')
  echo "gpu_wheels.sh: error: the wheels for Python $PYTHON_VERSION did not download (${reason:-pip failed}); .whl is unchanged" >&2
  exit 2
fi
rm -rf .whl && mv .whl.new .whl
ls .whl

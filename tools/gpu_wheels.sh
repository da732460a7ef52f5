#!/bin/bash
# The Python packages the GPU report needs that the lent device machine's image lacks (gymnasium,
# ale-py with its ROMs, farama-notifications; its image has torch, numpy, pytest, tensorboard, tqdm,
# pyyaml and opencv), as wheels for its Python 3.12, at the versions of this checkout's venv, into
# .whl/ (about 3.5 MB; ignored through .gitignore, so that sweep.py does not ship it to a Ray cluster
# either). Run it here, where pip reaches a package index; then a device call carries .whl and
# tools/gpu_report.sh installs them there:
#
#   tools/gpu_wheels.sh                     # here, once
#   device run, carry [".whl"]: tools/gpu_report.sh --out "$OUT/bench"
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  "gymnasium==$(version gymnasium)" "ale-py==$(version ale-py)" "farama-notifications==$(version farama-notifications)" 2>/dev/null
ls .whl

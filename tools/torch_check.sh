#!/bin/bash
# The tests that compile the update, and the GPU paths' CPU tests, under another torch release, such
# as the lent GPU machine's (2.11 when last read; this project pins 2.13). What torch.compile can
# capture differs between releases, and a compile that fails falls back to the eager update with a
# warning: 2.11's Dynamo refused the update's requires_grad_, so the first GPU report's compiled
# settings all ran eager (issue 35). Run this before a GPU session after changing the update.
#
#   tools/torch_check.sh 2.11.0                 # builds its virtualenv once (about 5 GB), then tests
#   tools/torch_check.sh 2.11.0 -k graph        # pytest's options after the version
#   PYTHON=python3.12 tools/torch_check.sh 2.11.0   # the GPU machine's Python too (its image: 3.12)
#
# The virtualenv lives outside the checkout, in
# ${XDG_CACHE_HOME:-~/.cache}/acer_sync/venv-torch-VERSION-pyX.Y, shared by every clone: inside it,
# its 5 GB counted as code that sweep.py ships to a Ray cluster (the cluster tests failed with "over
# Ray's limit"). torch comes from the package index with pip's configuration ignored (--isolated),
# so that a machine-wide constraint or wheel folder cannot substitute this checkout's torch; its
# CUDA build imports and runs on a CPU. gymnasium and ale-py are this checkout's versions, the ones
# tools/gpu_wheels.sh sends to the GPU machine.
set -eu
cd "$(dirname "$0")/.."
version=${1:?usage: tools/torch_check.sh TORCH_VERSION [pytest options], e.g. tools/torch_check.sh 2.11.0}
shift
base=${PYTHON:-python3}
venv=${XDG_CACHE_HOME:-$HOME/.cache}/acer_sync/venv-torch-$version-py$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
mkdir -p "$(dirname "$venv")"
if [ ! -x "$venv/bin/python" ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "torch_check.sh: error: no .venv/bin/python here; the check installs this checkout's gymnasium and ale-py versions" >&2
    exit 2
  fi
  same() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }  # this checkout's version
  "$base" -m venv "$venv"
  PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install --isolated -q "torch==$version"
  "$venv/bin/python" -m pip install -q "gymnasium[classic-control]==$(same gymnasium)" "ale-py==$(same ale-py)" \
    opencv-python-headless tensorboard tqdm pytest pyyaml matplotlib
fi
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
# the files whose CUDA tests the GPU report runs, the acting path, bench, and the frozen references
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_compiled_update.py tests/test_pipeline.py \
  tests/test_precision.py tests/test_cuda_replay.py tests/test_acting_path.py tests/test_bench.py \
  tests/test_time_limits.py tests/test_torsos.py "$@"

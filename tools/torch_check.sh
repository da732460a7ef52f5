#!/bin/bash
# The tests that compile the update, and the GPU paths' CPU tests, under another torch release, such
# as the lent GPU machine's (2.11 when last read; this project pins 2.13). What torch.compile can
# capture differs between releases, and a compile that fails falls back to the eager update with a
# warning: 2.11's Dynamo refused the update's requires_grad_, so the first GPU report's compiled
# settings all ran eager (issue 35). Run this before a GPU session after changing the update.
#
#   tools/torch_check.sh 2.11.0                 # builds its virtualenv once (about 5 GB), then tests
#   tools/torch_check.sh 2.11.0 -k graph        # pytest's options after the version
#
# The virtualenv lives outside the checkout, in ${XDG_CACHE_HOME:-~/.cache}/acer_sync/venv-torch-VERSION,
# shared by every clone: inside it, its 5 GB counted as code that sweep.py ships to a Ray cluster
# (the cluster tests failed with "over Ray's limit"). torch comes from the package index with pip's
# configuration ignored (--isolated), so that a machine-wide constraint or wheel folder cannot
# substitute this checkout's torch; its CUDA build imports and runs on a CPU.
set -eu
cd "$(dirname "$0")/.."
version=${1:?usage: tools/torch_check.sh TORCH_VERSION [pytest options], e.g. tools/torch_check.sh 2.11.0}
shift
venv=${XDG_CACHE_HOME:-$HOME/.cache}/acer_sync/venv-torch-$version
mkdir -p "$(dirname "$venv")"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install --isolated -q "torch==$version"
  "$venv/bin/python" -m pip install -q "gymnasium[classic-control]" ale-py opencv-python-headless tensorboard tqdm \
    pytest pyyaml matplotlib
fi
"$venv/bin/python" -c "import torch; print('torch', torch.__version__)"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_compiled_update.py tests/test_pipeline.py \
  tests/test_bench.py tests/test_time_limits.py "$@"

# Sourced by tools/gpu_report.sh, tools/gpu_share.sh and tools/gpu_pong.sh, with PY set: the lent device machine's image
# has torch but not gymnasium or ale-py; tools/gpu_wheels.sh puts their wheels in .whl here, a device
# call carries it, and they are installed beside the image's packages (exit 2 if they do not install).
if ! "$PY" -c "import gymnasium, ale_py" 2>/dev/null; then
  if [ -d .whl ] && ! compgen -G '.whl/*.whl' > /dev/null; then
    echo "$(basename "$0"): error: .whl holds no wheels; run tools/gpu_wheels.sh on the CPU machine and carry .whl" >&2
    exit 2
  fi
  if [ -d .whl ]; then
    # One line where they do not install (wheels for another Python than the image's): pip's reason,
    # and the command that fetches the right ones, before the device time goes on anything else.
    if ! said=$("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_report_site \
        .whl/*.whl 2>&1); then
      reason=$(printf '%s\n' "$said" | grep -m1 '^ERROR: ' | sed 's/^ERROR: //; s/\.$//')
      version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
      echo "$(basename "$0"): error: the wheels in .whl did not install on this Python $version (${reason:-pip failed}); run tools/gpu_wheels.sh $version on the CPU machine and carry .whl" >&2
      exit 2
    fi
    export PYTHONPATH=/tmp/gpu_report_site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # Without .whl (not carried), every bench line would say "printed no JSON line" and the tests
  # fail at import: one line now, before the device time goes on them.
  "$PY" -c "import gymnasium, ale_py" 2>/dev/null || {
    echo "$(basename "$0"): error: gymnasium or ale-py does not import here; run tools/gpu_wheels.sh on the CPU machine and carry .whl" >&2
    exit 2
  }
fi

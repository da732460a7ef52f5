"""One Pong-sized buffer (16 envs, 50,000 steps each) saved as save_buffer saves it, with numpy's
writer (before) and write_npy (after), alternating, in one process with malloc tuned as in a run."""
#   PYTHONPATH=. python docs/bench/cpu-buffer-save/save_ab.py /tmp/buffer.npz   # needs 6 GB of memory and 6 GB of disk
import json
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from acer_sync.base.malloc import keep_freed_memory
from acer_sync.training.checkpoint import atomic_write, write_arrays


def write_arrays_before(handle, arrays):
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)

keep_freed_memory()
rng = np.random.default_rng(0)
steps, envs = 50_000, 16
arrays = {
    "frames": rng.integers(0, 256, size=(steps + 4, envs, 84, 84), dtype=np.uint8),
    "actions": rng.integers(0, 6, size=(steps, envs)), "mu": rng.random((steps, envs, 6), dtype=np.float32),
    "rewards": rng.random((steps, envs), dtype=np.float32), "dones": rng.random((steps, envs)) < 0.01,
    "firsts": rng.random((steps, envs)) < 0.01, "timeout_values": np.zeros((steps, envs), np.float32),
}
gb = sum(a.nbytes for a in arrays.values()) / 1e9
path = Path(sys.argv[1])
results = {"before": [], "after": []}
for round_ in range(3):
    for name, write in (("before", write_arrays_before), ("after", write_arrays))[:: 1 if round_ % 2 == 0 else -1]:
        start = time.perf_counter()
        atomic_write(path, lambda handle: write(handle, arrays))
        results[name].append(round(time.perf_counter() - start, 2))
        path.unlink()
        print(name, results[name][-1], "s", flush=True)
print(json.dumps({"buffer_gb": round(gb, 2), "save_seconds": results,
                  "median_ratio": round(sorted(results["before"])[1] / sorted(results["after"])[1], 2)}))

"""OpenMP's wait policy for the command line's processes (``train``, ``play``, ``sweep``,
``bench.py``): torch's OpenMP threads sleep as soon as an operator ends
(``OMP_WAIT_POLICY=PASSIVE``) instead of spinning on the cores that the envs' threads need.

Measured (docs/performance.md): on an H200 box with 16 cores (Pong, 64 envs, overlapped, the
compiled update) the env stepped 1.43× faster inside the loop and the loop ran 1.14× faster end to
end; on the 2-core CPU (Pong, 16 envs, three alternating rounds) collection alone ran 1.22× faster,
the learner 1.07×, end to end 0.98× (inside its rounds' spread).

OpenMP reads the variable once, when torch loads it, so the entry points set it before torch is
imported. A policy the user set is kept (``OMP_WAIT_POLICY=ACTIVE`` lets the threads spin); a
program that imports torch itself before calling the API chooses for itself.
"""

from __future__ import annotations

import os
import sys

#: The policy the entry points set where none is.
DEFAULT_WAIT_POLICY = "PASSIVE"


def default_wait_policy() -> bool:
    """Set ``OMP_WAIT_POLICY`` to :data:`DEFAULT_WAIT_POLICY` where the environment has none and
    torch is not loaded yet. Returns whether it did (child processes inherit it)."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = DEFAULT_WAIT_POLICY
    return True

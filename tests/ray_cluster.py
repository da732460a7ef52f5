"""A 2-node Ray cluster on this machine, on loopback only, for tests/test_cluster.py.

Run as a script in its own process (so that the test process never starts Ray itself), with the
Ray settings in its environment (token authentication, a home of its own). It starts a head and
one worker node with ``ray.cluster_utils.Cluster``, each with 1 CPU and its node address
127.0.0.1, under the temporary directory ``RAY_TMPDIR`` names, prints one JSON line (the cluster's address and the
node id of each node), then reads commands from stdin:

``kill-worker``
    kill every process of the worker node at once (SIGKILL), as when a machine dies;
``stop`` or the end of stdin
    shut the whole cluster down.

Ray's own reaper processes shut the nodes down if this process dies without doing so.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from ray._private import ray_constants
from ray.cluster_utils import Cluster


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def kill_node(cluster: Cluster, node) -> None:
    """SIGKILL the node's worker processes (the trials) and then its own processes, as a dying machine would."""
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    for pid in children(raylet):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.remove_node(node, allow_graceful=False)


def main() -> None:
    node_args = dict(num_cpus=1, node_ip_address="127.0.0.1", include_dashboard=False)
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    try:
        worker = cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        print(json.dumps({"address": cluster.address, "head_node": cluster.head_node.node_id, "worker_node": worker.node_id}),
              flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "kill-worker":
                kill_node(cluster, worker)
                print("killed", flush=True)
            elif command == "stop":
                break
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()

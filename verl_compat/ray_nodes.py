"""The one question verl-compat's early starts ask of a Ray cluster: is it one node, and which.

The early starts (rollout servers, helper processes) pin their processes to that node, and a worker group's master
address is the driver's own where the driver runs on it; on several nodes each of them does as upstream.
"""

from __future__ import annotations


def only_node(require_cpu: bool = False) -> str | None:
    """The node id of the cluster's only alive node (with ``require_cpu``: the only alive node that has CPUs, as
    verl's loop managers place their workers), else None."""
    import ray

    nodes = [
        node["NodeID"]
        for node in ray.nodes()
        if node.get("Alive") and (not require_cpu or node.get("Resources", {}).get("CPU", 0) > 0)
    ]
    return nodes[0] if len(nodes) == 1 else None

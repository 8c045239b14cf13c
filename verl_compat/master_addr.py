"""Where verl's worker group gets its torch.distributed master address and port.

verl runs ``get_master_addr_port`` (single_controller/ray/base.py) as a Ray task in the placement group's first
bundle: a fresh Ray worker process, started and importing Ray, only to read the node's IP address and bind a free
port. The trainer worker is created after it, so it sits on the start-up's critical path: the first
``RayWorkerGroup.__init__`` took 2.0-3.0 s of the planned P40 job's start-up on the H100 and H200 hosts
(``benchmarks/results/p40_h100_ppo_planned_4cea77f_vs_b8a240e.json``, ``raw.call_totals``). Where the cluster is
one node and the driver is on it, every bundle is on the driver's node, so the same function runs in the driver's
process and gives the task's answer (that node's address, a port free on it). On several nodes, through Ray
Client, or for a task verl-compat does not know, verl's task runs as upstream.
"""

from __future__ import annotations

from typing import Any

from verl_compat.ray_nodes import only_node


def driver_on_only_node() -> bool:
    """One alive node in the cluster, and this process (the driver) runs on it."""
    import ray

    if ray.util.client.ray.is_connected():  # a Ray Client driver runs off the cluster's nodes
        return False
    return only_node() == ray.get_runtime_context().get_node_id()


def master_addr_port(task: Any, placement_group: Any, bundle_index: int, master_port_range: Any) -> tuple[str, str]:
    """verl's ``get_master_addr_port`` answer for a worker group whose rank 0 is ``bundle_index`` of
    ``placement_group``: computed here on a one-node cluster, else by verl's task in that bundle."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    function = getattr(task, "_function", None)  # the plain function under Ray's RemoteFunction
    if function is not None and driver_on_only_node():
        return function(master_port_range=master_port_range)
    strategy = PlacementGroupSchedulingStrategy(
        placement_group=placement_group, placement_group_bundle_index=bundle_index
    )
    return ray.get(task.options(scheduling_strategy=strategy).remote(master_port_range=master_port_range))

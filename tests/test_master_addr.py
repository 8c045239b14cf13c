"""verl's worker-group master address and port on a one-node cluster: the driver computes verl's own answer in its
process instead of a Ray task in a fresh worker (verl_compat.master_addr, patch 0026); elsewhere verl's task runs."""

from __future__ import annotations

import socket

import pytest

from verl_compat import master_addr

pytestmark = pytest.mark.usefixtures("local_ray")


class Spy:
    """verl's remote function, recording what is scheduled through it (``has_function=False``: a task whose plain
    function cannot be reached, which must run as a task)."""

    def __init__(self, has_function: bool = True):
        from verl.single_controller.ray.base import get_master_addr_port

        self.task = get_master_addr_port
        self.options_calls: list[dict] = []
        if has_function:
            self._function = get_master_addr_port._function

    def options(self, **kwargs):
        self.options_calls.append(kwargs)
        return self.task.options(**kwargs)


@pytest.fixture(scope="module")
def bundle(local_ray):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready())
    yield pg
    remove_placement_group(pg)


def _bindable(port: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", int(port)))
        except OSError:
            return False
    return True


def test_one_node_answers_in_the_driver_without_a_task(bundle):
    import ray

    assert master_addr.driver_on_only_node()
    spy = Spy()
    addr, port = master_addr.master_addr_port(spy, bundle, 0, None)
    assert spy.options_calls == []  # no Ray task was scheduled
    assert addr == ray.util.get_node_ip_address().strip("[]")
    assert isinstance(port, str) and _bindable(port)


def test_the_port_range_is_verls(bundle):
    with socket.socket() as taken:
        taken.bind(("", 0))
        first = taken.getsockname()[1]
        _, port = master_addr.master_addr_port(Spy(), bundle, 0, [first, first + 50])
    assert first < int(port) < first + 50  # verl's own search: the taken port skipped, the next free one


def test_several_nodes_run_verls_task_in_the_bundle(bundle, monkeypatch):
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    monkeypatch.setattr(master_addr, "driver_on_only_node", lambda: False)
    spy = Spy()
    addr, port = master_addr.master_addr_port(spy, bundle, 0, None)
    (call,) = spy.options_calls
    strategy = call["scheduling_strategy"]
    assert isinstance(strategy, PlacementGroupSchedulingStrategy)
    assert strategy.placement_group == bundle and strategy.placement_group_bundle_index == 0
    assert addr == ray.util.get_node_ip_address().strip("[]") and port.isdigit()


def test_a_task_without_its_function_runs_as_a_task(bundle):
    spy = Spy(has_function=False)
    master_addr.master_addr_port(spy, bundle, 0, None)
    assert len(spy.options_calls) == 1


def test_verls_worker_group_takes_the_seams_answer(bundle, monkeypatch):
    from verl.single_controller.ray.base import RayWorkerGroup, get_master_addr_port

    monkeypatch.setattr(get_master_addr_port, "options", lambda **kw: pytest.fail("a Ray task was started"))
    group = RayWorkerGroup.__new__(RayWorkerGroup)  # only the attributes _get_master_addr_port reads
    group._master_addr = group._master_port = None
    group._get_master_addr_port(bundle, bundle_index=0, master_port_range=None)
    assert group._master_addr and _bindable(group._master_port)

"""TransferQueue started from the driver (verl_compat.tq_prestart): the TaskRunner's own tq.init joins it."""

from __future__ import annotations

import ray
from omegaconf import OmegaConf

from verl_compat import tq_prestart


def _job_config(**over):
    base = {
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}, "nnodes": 1, "n_gpus_per_node": 1},
        "actor_rollout_ref": {"rollout": {"name": "hf"}},
        "transfer_queue": {
            "enable": False,
            "metrics": {"enabled": False, "port": 0},
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {"total_storage_size": 64, "num_data_storage_units": 1},
            },
        },
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(over))


def test_wanted_only_on_verl_compats_path():
    assert tq_prestart.wanted(_job_config())
    for change in (
        {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
        {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"hf": {"prestart": False}}}}},
        {"trainer": {"use_v1": False}},
        {"transfer_queue": {"backend": {"storage_backend": "MooncakeStore"}}},
    ):
        assert not tq_prestart.wanted(_job_config(**change)), change


def test_conf_is_what_the_task_runner_passes():
    config = _job_config()
    conf = tq_prestart.conf_for(config)
    assert conf.enable is True and config.transfer_queue.enable is False  # the job's config is not touched
    assert conf.backend.SimpleStorage.num_data_storage_units == 1


@ray.remote(num_cpus=0)
class _TaskRunner:
    """Stands in for verl's TaskRunnerV1.run: tq.init with the job's conf, then data through it."""

    def run(self, conf):
        import torch
        import transfer_queue as tq
        from transfer_queue import interface

        tq.init(conf)
        made_storage = interface._TQ_STORAGE is not None
        tq.kv_put("row0", partition_id="train", fields={"x": torch.arange(4)})
        got = tq.kv_batch_get(["row0"], partition_id="train")["x"]
        tq.close()  # as verl's TaskRunner does at the end of a job
        return made_storage, [row.tolist() for row in got.unbind()]


def test_storage_units_start_beside_the_controller(local_ray, monkeypatch):
    """tq.init asks the controller's process for its address before its storage step; here that answer waits until
    the storage units are up, which only happens when they were started beside the controller."""
    import time

    import transfer_queue as tq
    from transfer_queue import interface

    ask_controller = interface.process_zmq_server_info
    seen = {}

    def controller_address(handle):
        deadline = time.monotonic() + 60
        while not (interface._TQ_STORAGE or {}).get("SimpleStorage") and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["storage_up_first"] = bool((interface._TQ_STORAGE or {}).get("SimpleStorage"))
        return ask_controller(handle)

    monkeypatch.setattr(interface, "process_zmq_server_info", controller_address)
    config = _job_config()
    thread = tq_prestart.start(config)
    thread.join(timeout=120)
    monkeypatch.undo()
    assert seen == {"storage_up_first": True}
    assert interface._maybe_create_tq_storage.__name__ == "_maybe_create_tq_storage"  # TransferQueue's own again
    made_storage, got = ray.get(_TaskRunner.remote().run.remote(tq_prestart.conf_for(config)), timeout=120)
    assert made_storage is False and got == [[0, 1, 2, 3]]  # the units' addresses reached the stored config
    tq.close()
    tq_prestart._OURS.clear()


def test_task_runner_joins_the_prestarted_queue(local_ray):
    from transfer_queue import interface

    config = _job_config()
    thread = tq_prestart.start(config)
    assert thread is not None
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert interface._TQ_STORAGE and interface._TQ_CONTROLLER is not None  # the driver made them
    made_storage, got = ray.get(_TaskRunner.remote().run.remote(tq_prestart.conf_for(config)), timeout=120)
    assert made_storage is False  # it connected to the driver's queue instead of starting its own
    assert got == [[0, 1, 2, 3]]
    # a second job in this process: the first one's storage units go, a new queue comes up
    old = list(interface._TQ_STORAGE["SimpleStorage"].values())
    thread = tq_prestart.start(config)
    thread.join(timeout=120)
    assert interface._TQ_STORAGE and list(interface._TQ_STORAGE["SimpleStorage"].values()) != old
    made_storage, got = ray.get(_TaskRunner.remote().run.remote(tq_prestart.conf_for(config)), timeout=120)
    assert made_storage is False and got == [[0, 1, 2, 3]]
    import transfer_queue as tq

    tq.close()
    tq_prestart._OURS.clear()


def _use_queue_here():
    import torch
    import transfer_queue as tq

    tq.kv_put("row0", partition_id="train", fields={"x": torch.arange(4)})
    return [row.tolist() for row in tq.kv_batch_get(["row0"], partition_id="train")["x"].unbind()]


def test_in_driver_runner_goes_on_while_the_queue_starts(local_ray, monkeypatch):
    """verl's TaskRunner run in the driver (verl_compat.task_runner): its tq.init returns while the early start is
    still waiting for the controller's answer, and its later calls use the client that start makes."""
    import threading

    import transfer_queue as tq
    from transfer_queue import interface

    answer = threading.Event()
    ask_controller = interface.process_zmq_server_info

    def controller_address(handle):
        assert answer.wait(120)
        return ask_controller(handle)

    monkeypatch.setattr(interface, "process_zmq_server_info", controller_address)
    config = _job_config()
    thread = tq_prestart.start(config)
    with tq_prestart.runner_in_this_process():
        assert tq.init(tq_prestart.conf_for(config)) is not None  # returned with the start held mid-way
        assert thread.is_alive() and interface._TQ_CLIENT is None
        answer.set()
        thread.join(timeout=120)
        assert _use_queue_here() == [[0, 1, 2, 3]]
    assert tq.init is interface.init
    tq.close()
    tq_prestart._OURS.clear()


def test_in_driver_runner_gets_its_own_init_when_the_early_start_fails(local_ray, monkeypatch):
    import threading

    import transfer_queue as tq
    from transfer_queue import interface

    asked = threading.Event()
    create = interface._maybe_create_tq_storage
    calls = []

    def storage_failing_once(conf):
        calls.append(conf)
        if len(calls) == 1:
            assert asked.wait(120)
            raise RuntimeError("storage units could not start")
        return create(conf)

    monkeypatch.setattr(interface, "_maybe_create_tq_storage", storage_failing_once)
    config = _job_config()
    thread = tq_prestart.start(config)
    with tq_prestart.runner_in_this_process():
        tq.init(tq_prestart.conf_for(config))
        asked.set()  # the early start fails after the runner went on
        thread.join(timeout=120)
        assert len(calls) == 2  # the runner's own tq.init ran, in the early start's thread
        assert _use_queue_here() == [[0, 1, 2, 3]]
    tq.close()
    tq_prestart._OURS.clear()


def test_in_driver_runner_waits_where_metrics_are_on(local_ray):
    import transfer_queue as tq
    from transfer_queue import interface

    config = _job_config(transfer_queue={"metrics": {"enabled": True}})
    thread = tq_prestart.start(config)
    with tq_prestart.runner_in_this_process():
        tq.init(tq_prestart.conf_for(config))
        assert not thread.is_alive() and interface._TQ_CLIENT is not None
    tq.close()
    tq_prestart._OURS.clear()

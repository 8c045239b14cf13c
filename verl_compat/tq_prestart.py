"""Start TransferQueue (its controller and storage processes) from the driver right after ``ray.init``.

Why: verl's TaskRunner first imports its trainer (about 20 s on the H200's host), then calls ``tq.init``, which
starts the controller's process, waits for it, then starts the storage units' processes and waits again: 22.8 s
of the H200 host's 115 s start-up in round I (``benchmarks/results/p40_h200_ppo_head_to_head_round_i.json``,
``raw.startup_trace``), all before the trainer's workers are created. Started from a driver thread, the same
processes come up while the TaskRunner imports, and its ``tq.init`` finds the controller by name and only connects
(TransferQueue's own path for a second process: ``_init_from_existing``). The storage units' processes start
beside the controller's, not after it answers (``_storage_beside_controller``).

The driver then owns the storage units (the TaskRunner's ``tq.close`` still removes the controller); they go with
the driver's process, or with the next job this process prestarts. Where verl-compat's early start-up applies
(``verl_compat.rollout.prestart.enabled``: the `hf` engine under verl's v1 trainer) and the storage is
TransferQueue's default SimpleStorage; ``actor_rollout_ref.rollout.engine_kwargs.hf.prestart=false`` turns it off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from verl_compat.rollout.prestart import enabled, get_key

logger = logging.getLogger("verl_compat.tq_prestart")

_OURS: list[bool] = []  # set once this process has initialised TransferQueue for a job
_LOCK = threading.Lock()
_EARLY: dict[str, Any] = {}  # this process's early start: "running", then "ok" (bool); "asked" by an in-driver runner


def wanted(config: Any) -> bool:
    backend = get_key(config, "transfer_queue.backend.storage_backend", "SimpleStorage")
    return enabled(config) and get_key(config, "transfer_queue") is not None and backend == "SimpleStorage"


def conf_for(config: Any) -> Any:
    """What verl's ``TaskRunnerV1.run`` passes to ``tq.init``: ``config.transfer_queue``, enabled, resolved."""
    from omegaconf import OmegaConf

    conf = OmegaConf.create(OmegaConf.to_container(config.transfer_queue, resolve=True))
    conf.enable = True
    return conf


def start(config: Any) -> threading.Thread | None:
    """Driver, after ``ray.init``: initialise TransferQueue in a background thread; None where not wanted."""
    with _LOCK:
        _EARLY.clear()  # a previous job's in this process says nothing about this one
    if not wanted(config):
        return None
    thread = threading.Thread(target=_init, args=(conf_for(config),), name="verl-compat-tq-prestart", daemon=True)
    with _LOCK:
        _EARLY["running"] = thread
    thread.start()
    logger.info("TransferQueue: starting its controller and storage from the driver")
    return thread


@contextmanager
def runner_in_this_process() -> Iterator[None]:
    """While verl's TaskRunner runs in this process (verl_compat.task_runner): its ``tq.init``, the first thing its
    ``run`` does, returns at once where this process's early start is under way, so that the trainer's set-up
    (tokenizer, data, the workers' processes) goes on beside it; the set-up makes no TransferQueue call (its workers
    connect when they first use the queue), and the first call of the run finds the client the early start made.
    Should the early start fail, it runs the TaskRunner's own ``tq.init`` (as upstream, where the error shows).
    With TransferQueue's metrics on, the trainer asks for their endpoint while it is built: there it waits."""
    import transfer_queue as tq

    real = tq.init

    def init(conf: Any = None) -> Any:
        with _LOCK:
            thread = _EARLY.get("running")
            if thread is not None and not _metrics_on(conf):
                _EARLY["asked"] = (conf,)
                return conf
        if thread is not None:
            thread.join()
        return conf if _EARLY.get("ok") else real(conf)

    tq.init = init
    try:
        yield
    finally:
        tq.init = real


def _metrics_on(conf: Any) -> bool:
    return bool(conf is not None and get_key(conf, "metrics.enabled", False))


def _init(conf: Any) -> None:
    from transfer_queue import interface as tq  # its own init, not the one runner_in_this_process puts in front

    if _OURS:  # a previous job of this process left its storage units; its TaskRunner removed the controller
        tq.close()
        _OURS.clear()
    ok = False
    try:
        with _storage_beside_controller(conf):
            tq.init(conf)
        _OURS.append(True)
        ok = True
    except Exception:
        # A controller without its stored config would hold the TaskRunner's tq.init waiting: remove what was
        # made, so that the TaskRunner starts TransferQueue itself (or fails with Ray's error, not a hang).
        logger.warning("TransferQueue: the driver's early start failed; the TaskRunner starts it", exc_info=True)
        tq.close()
    finally:
        with _LOCK:
            _EARLY.pop("running", None)
            _EARLY["ok"] = ok
            asked = None if ok else _EARLY.pop("asked", None)
    if asked is not None:  # the TaskRunner in this process went on without it (runner_in_this_process)
        tq.init(*asked)


@contextmanager
def _storage_beside_controller(conf: Any) -> Iterator[None]:
    """``tq.init`` starts the storage units' processes only once the controller's process answers, and each process
    imports torch and TransferQueue first (5-12 s each on the GPU hosts measured, ``raw.startup_trace``), while
    verl's TaskRunner, done importing, polls for the queue once a second. Start the units beside the controller
    (they do not need it to start); ``tq.init``'s storage step then takes these units and their addresses. Where
    TransferQueue has no such step (another release), ``tq.init`` runs as it is."""
    from importlib import resources

    from omegaconf import OmegaConf
    from transfer_queue import interface

    create = getattr(interface, "_maybe_create_tq_storage", None)
    if create is None or interface._TQ_STORAGE is not None:
        yield
        return
    # the config tq.init builds (objects allowed: the units' addresses are objects), for the units alone
    storage_conf = OmegaConf.merge(
        OmegaConf.create({}, flags={"allow_objects": True}),
        OmegaConf.load(resources.files("transfer_queue") / "config.yaml"),
        conf,
    )
    pool = ThreadPoolExecutor(1, thread_name_prefix="verl-compat-tq-storage")
    made = pool.submit(create, storage_conf)
    taken: list[bool] = []

    def take(final_conf: Any) -> Any:
        made.result()  # the units are in interface._TQ_STORAGE, where tq.init's own step puts them
        backend = final_conf.backend.storage_backend
        final_conf.backend[backend].zmq_info = storage_conf.backend[backend].zmq_info
        taken.append(True)
        return final_conf

    interface._maybe_create_tq_storage = take
    try:
        yield
    finally:
        interface._maybe_create_tq_storage = create
        pool.shutdown(wait=True)
        if not taken and made.exception() is None:
            # tq.init joined a queue that another process had started: these units are nobody's
            import ray

            for handle in (interface._TQ_STORAGE or {}).get("SimpleStorage", {}).values():
                ray.kill(handle)
            interface._TQ_STORAGE = None

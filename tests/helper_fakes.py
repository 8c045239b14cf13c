"""Ray actor classes that stand in for verl's agent-loop worker in tests/test_helper_prestart.py; a module of their
own because the prestarted processes import the worker class by its path (this checkout is on their PYTHONPATH)."""

from __future__ import annotations

import os

import ray


@ray.remote
class FakeWorker:
    """Built from the manager's arguments like AgentLoopWorkerTQ; answers generate_sequences."""

    def __init__(self, config, index, *, tag="-"):
        if config == "fail":
            raise ValueError("no tokenizer at /nowhere")
        self.args = (config, index, tag)

    async def generate_sequences(self, batch):
        nice = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's: where verl's worker runs
        return {"args": self.args, "batch": batch, "pid": os.getpid(), "nice": nice}


@ray.remote
class PlainActor:
    """An async Ray actor as Ray starts any: its event-loop thread's priority."""

    async def nice(self):
        return os.getpriority(os.PRIO_PROCESS, 0)


@ray.remote
class OtherWorker(FakeWorker.__ray_actor_class__):
    """A custom manager's worker class: not the one the processes were started for."""

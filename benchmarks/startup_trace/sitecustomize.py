"""Start-up tracer for benchmarks/startup_profile.py: with VERL_COMPAT_STARTUP_TRACE=FILE and this folder on
PYTHONPATH, every Python process of the job (driver, Ray's TaskRunner, workers, rollout server) appends one JSON
line per call of the functions in WATCH (start, end, pid, process) as their modules are imported. Nothing of
verl is edited; without the variable this file does nothing. The steady-state entries (engine forward/backward,
log-probs, entropy, the model's forward) are per micro-batch; with VERL_COMPAT_TRACE_SYNC=1 each call waits for
the GPU before and after, so their durations are the GPU's time (and the step is a little slower)."""

import importlib.abc
import importlib.util
import json
import os
import sys
import time

_PATH = os.environ.get("VERL_COMPAT_STARTUP_TRACE")
_SYNC = os.environ.get("VERL_COMPAT_TRACE_SYNC") == "1"  # wait for the GPU around each call: durations, not launches
_T0 = time.time()


def _sync():
    torch = sys.modules.get("torch")
    if _SYNC and torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


WATCH = {
    "ray": ["init"],
    "transfer_queue": ["init"],
    "verl_compat.seams": ["resolve_config"],
    "verl.trainer.main_ppo": ["run_ppo"],
    "verl.trainer.ppo.v1.trainer_base": [
        "PPOTrainer._init_tokenizer",
        "PPOTrainer._init_dataloader",
        "PPOTrainer._init_resource_pool_mgr",
        "PPOTrainer._setup",
        "PPOTrainer.on_init_end",
        "PPOTrainer._load_checkpoint",
        "PPOTrainer.fit",
    ],
    "verl.single_controller.ray.base": ["RayWorkerGroup.__init__"],
    "verl.workers.engine_workers": [
        "ActorRolloutRefWorker.init_model",
        "ActorRolloutRefWorker.update_weights",
        "TrainingWorker.__init__",
        "TrainingWorker.reset",
    ],
    "verl.workers.engine.fsdp.transformer_impl": [
        "FSDPEngine.initialize",
        "FSDPEngine._build_module",
        "FSDPEngine._build_model_optimizer",
        # steady state, per call (benchmarks/ppo_job.py sums them: call_totals)
        "FSDPEngine.forward_backward_batch",
        "FSDPEngine.optimizer_step",
        "FSDPEngineWithLMHead.forward_step",
        "FSDPEngineWithLMHead.prepare_model_inputs",
        "FSDPEngineWithLMHead.prepare_model_outputs",
    ],
    "verl.utils.torch_functional": ["logprobs_from_logits", "entropy_from_logits"],
    "transformers.models.qwen2.modeling_qwen2": ["Qwen2ForCausalLM.forward", "Qwen2ForTokenClassification.forward"],
    "verl_compat.rollout.decode_graph": ["DecodeRunner._capture"],
    "verl.experimental.reward_loop.reward_loop": ["RewardLoopManager.__init__"],
    "verl.workers.rollout.llm_server": ["LLMServerManager.create"],
    "verl.checkpoint_engine.base": ["CheckpointEngineManager.__init__"],
    "verl.workers.rollout.replica": ["RolloutReplica.init_hybrid"],
    "verl_compat.rollout.server": ["HFServer.__init__", "HFServer.launch_server"],
    "verl_compat.rollout.replica": ["HFReplica.launch_servers"],
    "transformers.modeling_utils": ["PreTrainedModel.from_pretrained"],
    "verl.trainer.ppo.v1.agent_loop": ["AgentLoopManagerTQ.create"],
}


def _emit(name, t0, t1):
    rec = {
        "pid": os.getpid(),
        "proc": " ".join(sys.argv[:1])[-60:],
        "name": name,
        "t0": t0,
        "t1": t1,
        "proc_start": _T0,
    }
    with open(_PATH, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _wrap(fn, name):
    import functools
    import inspect

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapped(*a, **k):
            _sync()
            t0 = time.time()
            try:
                return await fn(*a, **k)
            finally:
                _sync()
                _emit(name, t0, time.time())

        return awrapped

    @functools.wraps(fn)
    def wrapped(*a, **k):
        _sync()
        t0 = time.time()
        try:
            return fn(*a, **k)
        finally:
            _sync()
            _emit(name, t0, time.time())

    return wrapped


def _patch(module, names):
    for dotted in names:
        owner, attr = module, dotted
        if "." in dotted:
            cls_name, attr = dotted.split(".", 1)
            owner = getattr(module, cls_name, None)
            if owner is None:
                continue
            raw = owner.__dict__.get(attr)
            if isinstance(raw, classmethod):
                setattr(owner, attr, classmethod(_wrap(raw.__func__, f"{module.__name__}.{dotted}")))
                continue
            if isinstance(raw, staticmethod):
                setattr(owner, attr, staticmethod(_wrap(raw.__func__, f"{module.__name__}.{dotted}")))
                continue
        fn = getattr(owner, attr, None)
        if callable(fn):
            setattr(owner, attr, _wrap(fn, f"{module.__name__}.{dotted}"))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WATCH:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                original = spec.loader.exec_module

                def exec_module(module, _orig=original, _name=name):
                    t0 = time.time()
                    _orig(module)
                    _emit(f"import {_name}", t0, time.time())
                    _patch(module, WATCH[_name])

                spec.loader.exec_module = exec_module
                return spec
        return None


if _PATH:
    sys.meta_path.insert(0, _Finder())

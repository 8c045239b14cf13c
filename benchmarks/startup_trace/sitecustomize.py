"""Start-up tracer for benchmarks/startup_profile.py: with VERL_COMPAT_STARTUP_TRACE=FILE and this folder on
PYTHONPATH, every Python process of the job (driver, Ray's TaskRunner, workers, rollout server) appends one JSON
line per call of the functions in WATCH (start, end, pid, process) as their modules are imported. Nothing of
verl is edited; without the variable this file does nothing. The steady-state entries (engine forward/backward,
log-probs, entropy, the model's forward) are per micro-batch; with VERL_COMPAT_TRACE_SYNC=1 each call waits for
the GPU before and after, so their durations are the GPU's time (and the step is a little slower). Two more
diagnostics of the trainer: VERL_COMPAT_MEMORY_SNAPSHOT, VERL_COMPAT_TORCH_PROFILE and VERL_COMPAT_ALLOC_STATS
(below)."""

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
        # steady state, per phase: the worker's whole call and its parts outside the model (call_totals)
        "TrainingWorker.train_batch",
        "TrainingWorker.infer_batch",
        "TrainingWorker._postprocess_output",
    ],
    "verl.workers.engine.base": ["BaseEngineCtx.__enter__", "BaseEngineCtx.__exit__"],
    "verl.workers.engine.utils": ["prepare_micro_batches", "postprocess_batch_func"],
    "verl.utils.transferqueue_utils": ["_meta_to_realdata", "_update_meta_with_output"],
    "verl.utils.fsdp_utils": ["load_fsdp_optimizer", "offload_fsdp_optimizer"],
    "tensordict._td": ["TensorDict.to"],
    "verl_compat.batch_moves": ["to_device"],  # the engine's micro-batch move below sm_80 (kernels.batch_moves)
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
        "FSDPEngine.get_per_tensor_param",
    ],
    "verl.utils.torch_functional": ["logprobs_from_logits", "entropy_from_logits"],
    "transformers.models.qwen2.modeling_qwen2": ["Qwen2ForCausalLM.forward", "Qwen2ForTokenClassification.forward"],
    "verl_compat.rollout.decode_graph": ["DecodeRunner._capture"],
    "verl.experimental.reward_loop.reward_loop": ["RewardLoopManager.__init__"],
    "verl.workers.rollout.llm_server": ["LLMServerManager.create"],
    "verl.checkpoint_engine.base": [
        "CheckpointEngineManager.__init__",
        "CheckpointEngineManager.update_weights",
        "CheckpointEngineManager.sleep_replicas",
    ],
    "verl.workers.rollout.replica": ["RolloutReplica.init_hybrid"],
    "verl_compat.rollout.server": [
        "HFServer.__init__",
        "HFServer.configure",
        "HFServer.warm",
        "HFServer.launch_server",
        # the weight sync's parts, per call (call_totals)
        "HFServer.wake_up",
        "HFServer.sleep",
        "HFServer.receive_bucket",
        "HFServer.finish_weight_sync",
    ],
    "verl_compat.rollout.adapter": ["HFServerAdapter.update_weights", "HFServerAdapter.resume"],
    "verl_compat.rollout.prestart": ["prestart_servers"],
    "verl_compat.rollout.replica": ["HFReplica.launch_servers"],
    "transformers.modeling_utils": ["PreTrainedModel.from_pretrained"],
    "verl.trainer.ppo.v1.agent_loop": ["AgentLoopManagerTQ.create"],
}


# VERL_COMPAT_MEMORY_SNAPSHOT=FILE: the trainer records CUDA allocations from its first engine build on and, after
# its second weight sync (global step 1, after one full training step), writes which code allocated the blocks it
# still holds (grouped by allocation stack) to FILE: what stays resident between phases, by owner.
_SNAPSHOT = os.environ.get("VERL_COMPAT_MEMORY_SNAPSHOT")
_SYNCS = {"n": 0}


def _record_history():
    torch = sys.modules.get("torch")
    if _SNAPSHOT and torch is not None and torch.cuda.is_available() and not _SYNCS.get("recording"):
        torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=200000)
        _SYNCS["recording"] = True


def _dump_resident():
    import collections

    torch = sys.modules["torch"]
    groups = collections.defaultdict(lambda: [0, 0])
    for seg in torch.cuda.memory._snapshot()["segments"]:
        for block in seg["blocks"]:
            if block["state"] != "active_allocated":
                continue
            # our and verl's frames, and FSDP's (whose all-gathers and copies own most trainer blocks)
            frames = [
                f for f in block.get("frames", []) if "/torch/" not in f["filename"] or "/fsdp/" in f["filename"]
            ][:8]
            key = " <- ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']}:{f['name']}" for f in frames)
            groups[key or "(no python frame)"][0] += block["size"]
            groups[key or "(no python frame)"][1] += 1
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])[:25]
    out = {
        "pid": os.getpid(),
        "allocated": torch.cuda.memory_allocated(),
        "groups": [{"bytes": b, "blocks": n, "stack": k} for k, (b, n) in top],
    }
    with open(_SNAPSHOT, "w") as f:
        json.dump(out, f, indent=1)


def _after(name):
    if _SNAPSHOT and name.endswith("ActorRolloutRefWorker.update_weights"):
        _SYNCS["n"] += 1
        if _SYNCS["n"] == 2:
            try:
                _dump_resident()
            except Exception as exc:  # noqa: BLE001 - a diagnostic must not end the job
                with open(_SNAPSHOT, "w") as f:
                    json.dump({"error": repr(exc)}, f)


def _before(name):
    if _SNAPSHOT and name.endswith("FSDPEngine.initialize"):
        _record_history()


# VERL_COMPAT_TORCH_PROFILE=FILE: the trainer runs the second call of each engine pass (actor update, actor
# log-prob, reference, critic update, values) under torch.profiler and writes each pass's ops by their own device
# time to FILE, keyed by pass: where each phase's time goes, by kernel (host spans only show where the GPU is
# waited for).
_PROFILE = os.environ.get("VERL_COMPAT_TORCH_PROFILE")
_PASSES = {}
_PROFILES = {}
PROFILE_ROWS = 40


def _pass_label(name, a, k):
    """'actor.train', 'actor.forward', 'ref.forward', 'critic.train', 'critic.forward'; None for other calls."""
    if not name.endswith("FSDPEngine.forward_backward_batch") or not a:
        return None
    engine = a[0]
    forward_only = k.get("forward_only", a[3] if len(a) > 3 else False)
    if getattr(getattr(engine, "engine_config", None), "forward_only", False):
        role = "ref"
    else:
        role = "critic" if "ValueHead" in type(engine).__name__ else "actor"
    return f"{role}.{'forward' if forward_only else 'train'}"


def _profiled(label, fn, a, k):
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    t0 = time.time()
    with torch.profiler.profile(activities=acts) as prof:
        out = fn(*a, **k)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wall = time.time() - t0
    try:
        _PROFILES[label] = _summary(prof, wall)
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not end the job
        _PROFILES[label] = {"error": repr(exc)}
    with open(_PROFILE, "w") as f:
        json.dump({"pid": os.getpid(), "passes": _PROFILES}, f, indent=1)
    return out


def _summary(prof, wall):
    rows = []
    for e in prof.key_averages():
        device = getattr(e, "self_device_time_total", None)
        if device is None:
            device = getattr(e, "self_cuda_time_total", 0)
        rows.append(
            {
                "name": e.key,
                "calls": e.count,
                "self_device_ms": device / 1e3,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
            }
        )
    total_device = sum(r["self_device_ms"] for r in rows)
    rows.sort(key=lambda r: (-r["self_device_ms"], -r["self_cpu_ms"]))
    return {
        "wall_s": wall,
        "self_device_ms_total": total_device,
        "kernel_launches": sum(r["calls"] for r in rows if r["self_device_ms"] > 0),
        "ops": rows[:PROFILE_ROWS],
    }


# VERL_COMPAT_ALLOC_STATS=FILE: around every engine pass and optimizer step of the trainer, one JSON line with what
# torch's caching allocator did meanwhile: retries (an allocation that failed, so every cached block was freed and
# it was tried again), blocks taken from and given back to the driver, and the reserved bytes after. A trainer held
# at its simulated card's cap pays for these with device syncs; this shows whether it does, per pass.
_ALLOC = os.environ.get("VERL_COMPAT_ALLOC_STATS")
ALLOC_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")


def _allocator_stats():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.memory_stats()


_STATS = _allocator_stats  # a test puts its own source here


def _step_label(name, a):
    if not name.endswith("FSDPEngine.optimizer_step") or not a:
        return None
    return ("critic" if "ValueHead" in type(a[0]).__name__ else "actor") + ".step"


def _with_alloc_stats(label, fn, a, k):
    before, t0 = _STATS(), time.time()
    try:
        return fn(*a, **k)
    finally:
        after = _STATS()
        if before is not None and after is not None:
            rec = {"pid": os.getpid(), "pass": label, "t0": t0, "t1": time.time()}
            rec.update({c: after.get(c, 0) - before.get(c, 0) for c in ALLOC_COUNTERS})
            rec["reserved_after"] = after.get("reserved_bytes.all.current", 0)
            with open(_ALLOC, "a") as f:
                f.write(json.dumps(rec) + "\n")


def _call(name, fn, a, k):
    label = _pass_label(name, a, k) if (_PROFILE or _ALLOC) else None
    if label is not None and _PROFILE:
        _PASSES[label] = _PASSES.get(label, 0) + 1
        if _PASSES[label] == 2:
            return _profiled(label, fn, a, k)
    if _ALLOC and (label or _step_label(name, a)):
        return _with_alloc_stats(label or _step_label(name, a), fn, a, k)
    return fn(*a, **k)


def _emit(name, t0, t1, label=None):
    rec = {
        "pid": os.getpid(),
        "proc": " ".join(sys.argv[:1])[-60:],
        "name": name,
        "t0": t0,
        "t1": t1,
        "proc_start": _T0,
    }
    if label:  # which engine pass a forward_backward_batch was (benchmarks/phase_parts.py names phases by it)
        rec["pass"] = label
    with open(_PATH, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _wrap(fn, name):
    import functools
    import inspect

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapped(*a, **k):
            _before(name)
            _sync()
            t0 = time.time()
            try:
                return await fn(*a, **k)
            finally:
                _sync()
                _emit(name, t0, time.time())
                _after(name)

        return awrapped

    @functools.wraps(fn)
    def wrapped(*a, **k):
        _before(name)
        _sync()
        t0 = time.time()
        try:
            return _call(name, fn, a, k)
        finally:
            _sync()
            _emit(name, t0, time.time(), _pass_label(name, a, k))
            _after(name)

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

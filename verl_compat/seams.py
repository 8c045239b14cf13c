"""The functions verl's one-line patches call. Cheap (detect() is cached), safe in any process.

Three kinds:
- `resolve_config` runs once on the driver (verl/trainer/main_ppo.py, after auto_set_device): it knows what the
  user typed, validates it, and writes the device's policy into the config. Everything downstream reads it.
- The worker-side seams see one value without knowing whether the user asked for it. Each asks the same
  resolver the driver uses, through `_resolve`, with a `settled` request: a value that CAN run here is kept
  (the driver already applied the policy and validated the requests), one that cannot is replaced by the
  device's default choice. The sm_80+ identity rule is the resolvers' (registry.choose), not repeated here.
- `device_in_use()`: the one seam with side effects, called where this process is about to use the device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from verl_compat import config_keys as keys
from verl_compat.decision import Decision
from verl_compat.packed import register_if_used
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers import attention, dtype, kernels, rollout_engine
from verl_compat.resolvers.registry import Request

log = logging.getLogger("verl_compat.seams")

Resolver = Callable[[Request, DeviceProfile], Decision]


def _profile() -> DeviceProfile:
    """The cached device profile; also makes sure plugins are loaded (idempotent) in this process."""
    from verl_compat.detect import detect
    from verl_compat.plugins import load_plugins

    load_plugins()
    return detect()


def _resolve(
    resolve: Resolver,
    category: str,
    key: str,
    value: Any,
    upstream: Any,
    *,
    facts: dict[str, Any] | None = None,
    settled: bool = True,
    requested: bool = False,
    identity: bool = True,
    profile: DeviceProfile | None = None,
) -> Any:
    """The one resolve path of the worker seams: `resolve` is the category's resolver (the driver's too).

    `value`: what this call site would use; `upstream`: what upstream verl's call site passes (kept on sm_80+).
    """
    profile = profile or _profile()
    request = Request(category, key, value, requested, upstream, facts or {}, settled=settled, identity=identity)
    return resolve(request, profile).value


def device_in_use(process: str = "trainer") -> None:
    """This process is about to allocate on the device (the FSDP engine build, the hf rollout server).

    On a simulated card over a bigger real GPU: cap this process's memory to the card's and keep SDPA to the
    card's kernels (verl_compat.simulate). A real card's profile changes nothing. Idempotent.
    """
    from verl_compat.simulate import prepare_device

    prepare_device(_profile(), process)


# Driver ---------------------------------------------------------------------------------------------------------
def resolve_config(config: Any) -> dict[str, Decision]:
    """Driver seam (main_ppo.py after auto_set_device): validate requests, write the policy into `config`.

    Requested keys come from the running Hydra app: its command line and every user config file it composed.
    A request the device cannot run, or a setting that cannot work (verl_compat.preflight, a broken checkpoint),
    ends the job before any Ray/GPU work with one short message and exit code 2 (verl_compat.refusal).
    """
    from verl_compat import checkpoints, preflight, value_checks
    from verl_compat.cpu import size_for_host
    from verl_compat.policy import placement_profile, resolve_job_config
    from verl_compat.refusal import refusals
    from verl_compat.user_keys import requested_keys_from_hydra

    with refusals() as origins:
        profile = _profile()
        requested = requested_keys_from_hydra()
        origins.by_key = requested.origins
        preflight.check_files(config, profile.describe())  # before the memory plan reads the model's config.json
        decisions = resolve_job_config(config, profile, requested, platform=placement_profile(profile))
        size_for_host(config, requested)  # Ray/TransferQueue layout that fits this host (a silent hang otherwise)
        value_checks.check_values(config, profile.describe())  # after the policy: bf16 on a P40 is refused as bf16
        preflight.check_settings(config, profile.describe())
        checkpoints.check_at_startup(config, profile.describe())
    changed = [d for d in decisions.values() if d.defaulted and d.upstream is not None and d.value != d.upstream]
    log.info(
        "verl-compat: %s; %d setting(s) differ from upstream verl (`verl-compat doctor` explains)",
        profile.describe(),
        len(changed),
    )
    return decisions


def prestart(config: Any) -> None:
    """Driver seam (main_ppo.run_ppo, after ray.init): start the processes the job will need whose imports can
    overlap the trainer's start-up: TransferQueue's controller and storage (verl_compat.tq_prestart), the `hf`
    rollout servers (verl_compat.rollout.prestart says when) and the agent- and reward-loop workers
    (verl_compat.helper_prestart)."""
    from verl_compat import helper_prestart, tq_prestart
    from verl_compat.rollout.prestart import prestart_servers

    tq_prestart.start(config)
    prestart_servers(config)
    helper_prestart.start(config)


def task_runner(config: Any, cls: Any) -> Any:
    """Driver seam (main_ppo.run_ppo, where it creates the TaskRunner): what ``.remote()`` is called on. verl's
    own TaskRunner run in the driver's process where the early start-up applies (verl_compat.task_runner), else
    ``cls``."""
    from verl_compat.task_runner import runner_class

    return runner_class(config, cls)


def master_addr_port(task: Any, placement_group: Any, bundle_index: int, master_port_range: Any) -> tuple[str, str]:
    """single_controller/ray/base.py RayWorkerGroup._get_master_addr_port: the worker group's master address and
    port, from the driver's process on a one-node cluster instead of a fresh Ray process (verl_compat.master_addr);
    verl's task elsewhere. The same answer on every device."""
    from verl_compat.master_addr import master_addr_port as resolve

    return resolve(task, placement_group, bundle_index, master_port_range)


def helper_worker_class(kind: str, cls: Any, index: int) -> Any:
    """Where verl creates a helper process: the agent- and reward-loop managers' worker ``index`` (agent_loop.py and
    reward_loop.py; kind "agent" or "reward") and the servers' request router (router.py; "balancer", index 0): the
    driver's prestarted process where one waits for this class, else ``cls``."""
    from verl_compat.helper_prestart import worker_class

    return worker_class(kind, cls, index)


# Attention ------------------------------------------------------------------------------------------------------
def attn_impl(default: str, hf_config: Any = None) -> str:
    """attn_implementation where verl hard-codes a default (workers/config/model.py:185, utils/model.py:649/674).

    `default` is upstream's value (kept on sm_80+ where it runs). Otherwise the implementation already on
    `hf_config` when it can run here (the critic loader passes its config: honours the user's critic override),
    else the device's choice.
    """
    current = getattr(hf_config, "_attn_implementation", None) if hf_config is not None else None
    value = current if isinstance(current, str) and current else default
    key = keys.CRITIC_ATTENTION if hf_config is not None else keys.model_keys("override_config.attn_implementation")
    return _resolve(attention.resolve_attention, "attention", key, value, default)


# Dtypes ---------------------------------------------------------------------------------------------------------
_MP_SUBKEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")


def fsdp_mixed_precision(mixed_precision_cfg: Any) -> Any:
    """FSDP mixed precision (transformer_impl.py:391). Where upstream's bf16 runs: unchanged (None = upstream's
    bf16/fp32/fp32).

    Otherwise None becomes the device's policy ({"param_dtype": "fp32"|"fp16", "reduce_dtype": "fp32",
    "buffer_dtype": "fp32"}); given values are validated (IncompatibleRequestError for bf16 on a V100) and a
    missing param_dtype is filled (upstream's .get("param_dtype", "bf16") would pick bf16).
    """
    profile = _profile()
    given = dict(mixed_precision_cfg) if mixed_precision_cfg is not None else {}
    for sub in _MP_SUBKEYS:
        if given.get(sub) is not None:  # a value in the engine config: validated like a request
            key = keys.fsdp_keys(f"mixed_precision.{sub}")
            # reduce/buffer have their own options: fp32 first, as the policy keeps them (fix texts agree)
            resolve, category = (
                (dtype.resolve_train, "dtype.train") if sub == "param_dtype" else (dtype.resolve_reduce, "dtype.reduce")
            )
            _resolve(resolve, category, key, given[sub], given[sub], requested=True, profile=profile)
    if given.get("param_dtype") is not None:
        return mixed_precision_cfg
    key = keys.fsdp_keys("mixed_precision.param_dtype")
    train = _resolve(dtype.resolve_train, "dtype.train", key, "bf16", "bf16", settled=False, profile=profile)
    if train == "bf16":
        return mixed_precision_cfg
    if mixed_precision_cfg is None:
        return {"param_dtype": train, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    return {**given, "param_dtype": train}


def rollout_dtype(value: str) -> str:
    """vLLM server dtype (vllm_async_server.py:326): bfloat16 -> float16/float32 where bf16 cannot run."""
    facts = {"train_dtype": dtype.default_train_dtype(_profile())}
    return _resolve(dtype.resolve_rollout, "dtype.rollout", keys.ROLLOUT_DTYPE, value, value, facts=facts)


def rollout_enforce_eager(value: bool) -> bool:
    """vLLM enforce_eager (vllm_async_server.py:339): forced True where vLLM's compiled/graph path cannot run
    (sm < 7.5); otherwise unchanged."""
    return _resolve(
        rollout_engine.resolve_enforce_eager,
        "rollout.enforce_eager",
        keys.ROLLOUT_ENFORCE_EAGER,
        bool(value),
        bool(value),
        facts={"engine": "vllm"},
    )


# Kernels --------------------------------------------------------------------------------------------------------
def torch_compile_ok() -> bool:
    """May torch.compile run here at all (transformer_impl.py:188)? False only where Inductor cannot compile
    (sm < 7.0); the driver already turned it off by default on sm_70/75 and CPU."""
    key = keys.fsdp_keys("use_torch_compile")
    return bool(_resolve(kernels.resolve_torch_compile, "kernels.torch_compile", key, True, True))


def torch_compile(configured: bool) -> bool:
    """transformer_impl.py:188: compile the entropy when the engine config says so and Inductor can compile here."""
    return bool(configured) and torch_compile_ok()


def flash_ce(available: bool) -> bool:
    """torch_functional.py:98: flash-attn's Triton cross-entropy when verl found it usable and Triton runs here."""
    return bool(available) and use_triton()


def logprobs_fallback(upstream: Callable[..., Any]) -> Callable[..., Any]:
    """torch_functional.py:110: the torch log-prob function verl uses without flash-attn's cross-entropy.
    Upstream's per-token loop (`upstream`) on sm_80+; elsewhere the same values computed per block of tokens."""
    from verl_compat.logprobs import logprobs_blocked

    key = kernels.LOGPROBS_KEY
    chosen = _resolve(kernels.resolve_logprobs, "kernels.logprobs", key, "rowwise", "rowwise", settled=False)
    return upstream if chosen == "rowwise" else logprobs_blocked


def use_triton() -> bool:
    """Guard for verl's own Triton kernels (flash-attn cross-entropy): upstream's True on sm_80+, False elsewhere
    (the torch fallback is exact; Triton below 8.0 is unofficial). No config key sets it: a defaulted request."""
    key = "VERL_DISABLE_FLASH_ATTN_CE (verl's Triton kernels)"
    return bool(_resolve(kernels.resolve_triton, "kernels.triton", key, True, True, settled=False))


# Data -----------------------------------------------------------------------------------------------------------
def keep_short_prompts(dataframe: Any, doc2len: Callable[[Any], int], max_len: int, *, num_proc: int, desc: str):
    """rl_dataset.py:266: verl's overlong-prompt filter, same rows kept (verl_compat.data.prompt_filter)."""
    from verl_compat.data.prompt_filter import keep_short_prompts as keep

    return keep(dataframe, doc2len, max_len, num_proc, desc)


# Worker-side model config -------------------------------------------------------------------------------------
def resolve_model_config(model_config: Any) -> Any:
    """Worker seam for HFModelConfig (engine_workers.py:94): values that cannot run here are replaced by the
    device's choice: hf_config._attn_implementation, use_liger, use_fused_kernels with a Triton backend.
    use_remove_padding is kept (it runs everywhere; the driver decided it). Mutates through object.__setattr__
    (verl's BaseConfig freezes fields) and returns the object.
    """
    profile = _profile()
    register_if_used(getattr(getattr(model_config, "hf_config", None), "_attn_implementation", None))
    hf_config = getattr(model_config, "hf_config", None)
    current = getattr(hf_config, "_attn_implementation", None)
    if hf_config is not None and isinstance(current, str):
        key = keys.model_keys("override_config.attn_implementation")
        chosen = _resolve(attention.resolve_attention, "attention", key, current, current, profile=profile)
        if chosen != current:
            hf_config._attn_implementation = chosen
            register_if_used(chosen)
    if getattr(model_config, "use_liger", False):
        key = keys.model_keys("use_liger")
        if not _resolve(kernels.resolve_liger, "kernels.liger", key, True, True, profile=profile):
            object.__setattr__(model_config, "use_liger", False)
    if getattr(model_config, "use_fused_kernels", False):
        backend = dict(getattr(model_config, "fused_kernel_options", None) or {}).get("impl_backend", "torch")
        key = keys.model_keys("fused_kernel_options.impl_backend")
        if _resolve(kernels.resolve_fused, "kernels.fused", key, backend, backend, profile=profile) != backend:
            object.__setattr__(model_config, "use_fused_kernels", False)
    return model_config


def fused_head_chunk() -> int:
    """dense_common.py:124 (and the VL models' fused forwards): tokens per chunk of verl's FusedLinearForPPO
    (kernels.fused_chunk: smaller below sm_80 on GPUs, where its work tensors bound the memory plan)."""
    k = kernels.FUSED_CHUNK_KEY
    upstream = kernels.UPSTREAM_FUSED_CHUNK
    return int(_resolve(kernels.resolve_fused_chunk, "kernels.fused_chunk", k, upstream, upstream, settled=False))


def batch_to_device(batch: Any, device: Any) -> Any:
    """transformer_impl.py forward_step: each micro-batch to the device (kernels.batch_moves: "tensors" moves its
    tensors and keeps its non-tensor fields, verl_compat.batch_moves; upstream's TensorDict.to on sm_80+)."""
    k, upstream = kernels.BATCH_MOVES_KEY, kernels.UPSTREAM_BATCH_MOVES
    if _resolve(kernels.resolve_batch_moves, "kernels.batch_moves", k, upstream, upstream, settled=False) == "tensors":
        from verl_compat.batch_moves import to_device

        return to_device(batch, device)
    return batch.to(device)


def model_kernels(module: Any) -> Any:
    """transformer_impl.py _build_module, after the model is built and cast: kernels.rms_norm ("torch": its plain
    RMSNorm modules run F.rms_norm, verl_compat.norms; upstream's model code on sm_80+ and CPUs). Returns it."""
    k, upstream = kernels.RMS_NORM_KEY, kernels.UPSTREAM_RMS_NORM
    if _resolve(kernels.resolve_rms_norm, "kernels.rms_norm", k, upstream, upstream, settled=False) == "torch":
        from verl_compat.norms import fuse_rms_norms

        fuse_rms_norms(module)
    return module


def hf_rollout_dtype_and_attn(rollout_config: Any, model_config: Any) -> Any:
    """(torch dtype, attn_implementation) for verl-compat's hf rollout engine; its server calls this once, just
    before it loads the model, so this is also that process's `device_in_use()` point.

    The engine is ours, so there is no upstream value to preserve (identity=False): the configured dtype and
    attention are used when they can run here (sm_80+ included: flash_attention_2 without a usable flash-attn
    becomes sdpa).
    """
    device_in_use("rollout")
    profile = _profile()
    configured = _cfg_get(rollout_config, "dtype", "bfloat16")
    facts = {"train_dtype": dtype.default_train_dtype(profile)}
    chosen_dtype = _resolve(
        dtype.resolve_rollout,
        "dtype.rollout",
        keys.ROLLOUT_DTYPE,
        configured,
        "bfloat16",
        facts=facts,
        identity=False,
        profile=profile,
    )
    hf_config = getattr(model_config, "hf_config", None)
    override = _cfg_get(model_config, "override_config", None) or {}
    attn = (
        getattr(hf_config, "_attn_implementation", None) or override.get("attn_implementation") or "flash_attention_2"
    )
    chosen_attn = _resolve(
        attention.resolve_attention,
        "attention",
        keys.ACTOR_ATTENTION,
        attn,
        "flash_attention_2",
        identity=False,
        profile=profile,
    )
    register_if_used(chosen_attn)
    return dtype.torch_dtype(chosen_dtype), chosen_attn


def _cfg_get(cfg: Any, key: str, default: Any) -> Any:
    """Read a field from a dataclass config, a DictConfig or a dict."""
    if cfg is None:
        return default
    if hasattr(cfg, "get") and not hasattr(type(cfg), "__dataclass_fields__"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


# Memory ---------------------------------------------------------------------------------------------------------
def release_moved_views(module: Any) -> None:
    """fsdp_utils.py:192 and transformer_impl.py:780: after verl moves an FSDP1 model's parameters to the host,
    or after a pass (FSDP1's CPUOffload moves the reference back after its forward): free the GPU copy its stale
    views keep (verl_compat.fsdp_views), where memory.moved_views says so (below sm_80; upstream's on sm_80+)."""
    from verl_compat.resolvers import memory

    key = memory.MOVED_VIEWS_KEY
    if _resolve(memory.resolve_moved_views, "memory.moved_views", key, "keep", "keep", settled=False) != "release":
        return
    from verl_compat import fsdp_views

    fsdp_views.release_moved_views(module)


def offload_init(module: Any, forward_only: bool) -> None:
    """transformer_impl.py `_build_model_optimizer`, after the FSDP wrap: a forward-only model under FSDP1's
    CPUOffload (the reference) is set up in the background and its unused pinned gradient freed
    (verl_compat.offload_init), where memory.offload_init says 'at_build' (below sm_80 on a GPU; upstream's lazy
    init in the first forward on sm_80+ and on a CPU)."""
    if not forward_only:
        return
    from verl_compat import offload_init as init
    from verl_compat.resolvers import memory

    if not init.offloaded_root(module):
        return
    key = memory.OFFLOAD_INIT_KEY
    if _resolve(memory.resolve_offload_init, "memory.offload_init", key, "first_forward", "first_forward",
                settled=False) == "at_build":  # fmt: skip
        init.start(module)


def _optimizer_load(engine: Any) -> str:
    from verl_compat.optimizer_state import engine_step
    from verl_compat.resolvers import memory

    key, facts = memory.OPTIMIZER_LOAD_KEY, {"engine_step": engine_step(engine)}
    return _resolve(memory.resolve_optimizer_load, "memory.optimizer_load", key, "at_entry", "at_entry", facts=facts,
                    settled=False)  # fmt: skip


def optimizer_at_entry(engine: Any, device: str) -> bool:
    """engine/base.py BaseEngineCtx: does entering train mode bring the offloaded optimizer state back? Upstream's
    yes (`is_optimizer_offload_enabled`), except where memory.optimizer_load is 'at_step' (below sm_80 on a GPU, for
    verl's FSDP engine): then its optimizer_step brings it (optimizer_state_for_step). Leaving moves it as upstream."""
    upstream = bool(engine.is_optimizer_offload_enabled)
    if not upstream or device == "cpu":
        return upstream
    return _optimizer_load(engine) != "at_step"


def optimizer_state_for_step(engine: Any) -> None:
    """fsdp/transformer_impl.py FSDPEngine.optimizer_step: bring the offloaded state to the card for the step, after
    the last backward, where optimizer_at_entry left it on the host (verl_compat.optimizer_state)."""
    if not engine.is_optimizer_offload_enabled or _optimizer_load(engine) != "at_step":
        return
    from verl.utils.device import get_device_name
    from verl_compat.optimizer_state import bring_for_step

    bring_for_step(engine, get_device_name())


def hf_processor(name_or_path: Any, **kwargs: Any) -> Any:
    """HFModelConfig's processor (verl/workers/config/model.py): verl's ``hf_processor``, without its second load of
    a text-only model's tokenizer (verl_compat.text_only_processor); the same answer on every device."""
    from verl.utils import hf_processor as upstream
    from verl_compat.text_only_processor import hf_processor as processor

    return processor(upstream, name_or_path, **kwargs)

"""The functions verl's one-line patches call. Cheap (detect() is cached), safe in any process, identity on sm_80+.

Two kinds:
- `resolve_config` runs once on the driver (verl/trainer/main_ppo.py, after auto_set_device): it knows what the
  user typed, validates it, and writes the device's policy into the config. Everything downstream reads it.
- The worker-side seams see one value without knowing whether the user asked for it. Their rule: keep any value
  that CAN run on this device (the driver already applied the policy and validated the requests), and replace
  only a value that cannot run, with the device's default choice. So they never override an explicit choice
  the driver accepted, and still protect code paths the driver does not configure (reward model, other mains).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl_compat.decision import Decision
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers import attention, dtype, kernels
from verl_compat.resolvers.registry import REGISTRY, Context, Option, Request, choose
from verl_compat.simulate import cap_memory

log = logging.getLogger("verl_compat.seams")

_TORCH_TO_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_SHORT_TO_TORCH = {v: k for k, v in _TORCH_TO_SHORT.items()}


def _profile() -> DeviceProfile:
    """The cached device profile; also makes sure plugins are loaded (idempotent) in this process."""
    from verl_compat.detect import detect
    from verl_compat.plugins import load_plugins

    load_plugins()
    return detect()


def _keep_unless_blocked(request: Request, profile: DeviceProfile, options: tuple[Option, ...]) -> Any:
    """`request.value` if it can run here (or is unknown to us), else the device's default choice."""
    match = next((o for o in REGISTRY.options(request.category, options) if o.matches(request.value)), None)
    if match is None or not any(r.hard for r in match.check(Context(request, profile))):
        return request.value
    chosen = choose(request, profile, options, identity_on_ampere=False).value
    log.info("%s=%s cannot run on %s; using %s", request.key, request.value, profile.describe(), chosen)
    return chosen


# Driver ---------------------------------------------------------------------------------------------------------
def resolve_config(config: Any) -> dict[str, Decision]:
    """Driver seam (main_ppo.py after auto_set_device): validate requests, write the policy into `config`.

    Requested keys come from the running Hydra app (command-line overrides + the user's primary config file).
    A request the device cannot run, or a setting that cannot work (verl_compat.preflight, a broken checkpoint),
    ends the job before any Ray/GPU work with one short message and exit code 2 (verl_compat.refusal).
    """
    from verl_compat import checkpoints, preflight, value_checks
    from verl_compat.cpu import size_for_host
    from verl_compat.policy import placement_profile, resolve_job_config
    from verl_compat.refusal import refusals
    from verl_compat.requests import requested_keys_from_hydra

    with refusals():
        profile = _profile()
        requested = requested_keys_from_hydra()
        decisions = resolve_job_config(config, profile, requested, platform=placement_profile(profile))
        size_for_host(config, requested)  # Ray/TransferQueue layout that fits this host (a silent hang otherwise)
        value_checks.check_values(config, profile.describe())  # after the policy: bf16 on a P40 is refused as bf16
        preflight.check_job(config, profile.describe())
        checkpoints.check_at_startup(config, profile.describe())
    changed = [d for d in decisions.values() if d.defaulted and d.upstream is not None and d.value != d.upstream]
    log.info(
        "verl-compat: %s; %d setting(s) differ from upstream verl (`verl-compat doctor` explains)",
        profile.describe(),
        len(changed),
    )
    return decisions


# Attention ------------------------------------------------------------------------------------------------------
def attn_impl(default: str, hf_config: Any = None) -> str:
    """attn_implementation where verl hard-codes a default (workers/config/model.py:185, utils/model.py:649/674).

    sm_80+: `default` unchanged. Otherwise: the implementation already on `hf_config` when it can run here
    (the critic loader passes its config: honours the user's critic override), else the device's choice.
    """
    profile = _profile()
    if profile.is_ampere_or_newer:
        return default
    current = getattr(hf_config, "_attn_implementation", None) if hf_config is not None else None
    value = current if isinstance(current, str) and current else default
    req = Request("attention", "attn_implementation", value, False, default)
    return _keep_unless_blocked(req, profile, attention.ATTENTION_OPTIONS)


# Dtypes ---------------------------------------------------------------------------------------------------------
def fsdp_mixed_precision(mixed_precision_cfg: Any) -> Any:
    """FSDP mixed precision (transformer_impl.py:391). sm_80+: unchanged (None = upstream's bf16/fp32/fp32).

    Otherwise None becomes the device's policy ({"param_dtype": "fp32"|"fp16", "reduce_dtype": "fp32",
    "buffer_dtype": "fp32"}); a given config is validated (IncompatibleRequestError for bf16 on a V100) and a
    missing param_dtype is filled (upstream's .get("param_dtype", "bf16") would pick bf16).
    """
    profile = _profile()
    cap_memory(profile)  # simulated card on a bigger GPU: this is where the engine's allocations start
    if profile.is_ampere_or_newer:
        return mixed_precision_cfg
    train = dtype.default_train_dtype(profile)
    if mixed_precision_cfg is None:
        return {"param_dtype": train, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    given = dict(mixed_precision_cfg)
    for key in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        if given.get(key) is not None:
            resolve, category = (
                (dtype.resolve_train, "dtype.train") if key == "param_dtype" else (dtype.resolve_reduce, "dtype.reduce")
            )
            resolve(Request(category, f"fsdp_config.mixed_precision.{key}", given[key], True), profile)
    if given.get("param_dtype") is None:
        return {**given, "param_dtype": train}
    return mixed_precision_cfg


def load_dtype(default: torch.dtype) -> torch.dtype:
    """Load dtype when fsdp_config.model_dtype is null (transformer_impl.py:262): bf16 -> the device's train dtype
    where bf16 cannot run; anything that can run is kept."""
    profile = _profile()
    short = _TORCH_TO_SHORT.get(default)
    if profile.is_ampere_or_newer or short is None:
        return default
    req = Request("dtype.train", "model_dtype", short, False, short)
    return _SHORT_TO_TORCH[dtype.canonical(_keep_unless_blocked(req, profile, dtype.TRAIN_OPTIONS))]


def rollout_dtype(value: str) -> str:
    """vLLM server dtype (vllm_async_server.py:326): bfloat16 -> float16/float32 where bf16 cannot run."""
    profile = _profile()
    if profile.is_ampere_or_newer:
        return value
    facts = {"train_dtype": dtype.default_train_dtype(profile)}
    req = Request("dtype.rollout", "rollout.dtype", value, False, "bfloat16", facts)
    return _keep_unless_blocked(req, profile, dtype.ROLLOUT_OPTIONS)


def rollout_enforce_eager(value: bool) -> bool:
    """vLLM enforce_eager (vllm_async_server.py:339): forced True where vLLM's compiled/graph path cannot run
    (sm < 7.5); otherwise unchanged."""
    from verl_compat.resolvers import rollout

    profile = _profile()
    if profile.is_ampere_or_newer:
        return value
    req = Request("rollout.enforce_eager", "rollout.enforce_eager", bool(value), False, False, {"engine": "vllm"})
    return _keep_unless_blocked(req, profile, rollout.EAGER_OPTIONS)


# Kernels --------------------------------------------------------------------------------------------------------
def torch_compile_ok() -> bool:
    """May torch.compile run here at all (transformer_impl.py:185)? False only where Inductor cannot compile
    (sm < 7.0); the driver already turned it off by default on sm_70/75 and CPU."""
    profile = _profile()
    if profile.is_ampere_or_newer:
        return True
    req = Request("kernels.torch_compile", "use_torch_compile", True, False, True)
    return bool(_keep_unless_blocked(req, profile, kernels.COMPILE_OPTIONS))


def use_triton() -> bool:
    """Guard for verl's own Triton kernels (flash-attn cross-entropy, torch_functional.py:95): True on sm_80+
    (upstream), False elsewhere (the torch fallback is exact; Triton below 8.0 is unofficial)."""
    profile = _profile()
    if profile.is_ampere_or_newer:
        return True
    req = Request("kernels.triton", "triton", True, False, True)
    return bool(choose(req, profile, kernels.TRITON_OPTIONS).value)


# Worker-side model config -------------------------------------------------------------------------------------
def resolve_model_config(model_config: Any) -> Any:
    """Worker seam for HFModelConfig (engine_workers.py:94). sm_80+: returned untouched.

    Otherwise values that cannot run here are replaced by the device's choice: hf_config._attn_implementation,
    use_liger, use_fused_kernels with a Triton backend. use_remove_padding is kept (it runs everywhere; the driver
    decided it). Mutates through object.__setattr__ (verl's BaseConfig freezes fields) and returns the object.
    """
    profile = _profile()
    if profile.is_ampere_or_newer:
        return model_config
    hf_config = getattr(model_config, "hf_config", None)
    current = getattr(hf_config, "_attn_implementation", None)
    if hf_config is not None and isinstance(current, str):
        chosen = attn_impl(current, hf_config)
        if chosen != current:
            hf_config._attn_implementation = chosen
    if getattr(model_config, "use_liger", False):
        req = Request("kernels.liger", "use_liger", True, False, False)
        if not _keep_unless_blocked(req, profile, kernels.LIGER_OPTIONS):
            object.__setattr__(model_config, "use_liger", False)
    if getattr(model_config, "use_fused_kernels", False):
        options = dict(getattr(model_config, "fused_kernel_options", None) or {})
        backend = options.get("impl_backend", "torch")
        req = Request("kernels.fused", "fused_kernel_options.impl_backend", backend, False, "off")
        if _keep_unless_blocked(req, profile, kernels.FUSED_OPTIONS) != backend:
            object.__setattr__(model_config, "use_fused_kernels", False)
    return model_config


def hf_rollout_dtype_and_attn(rollout_config: Any, model_config: Any) -> tuple[torch.dtype, str]:
    """(torch dtype, attn_implementation) for verl-compat's hf rollout engine.

    The engine is ours, so there is no upstream value to preserve: the configured dtype and attention are used
    when they can run here (sm_80+ included: flash_attention_2 without a usable flash-attn becomes sdpa).
    """
    profile = _profile()
    cap_memory(profile)  # the rollout server's model and KV cache
    configured = _cfg_get(rollout_config, "dtype", "bfloat16")
    facts = {"train_dtype": dtype.default_train_dtype(profile)}
    dreq = Request("dtype.rollout", "rollout.dtype", configured, False, "bfloat16", facts)
    chosen_dtype = _keep_unless_blocked(dreq, profile, dtype.ROLLOUT_OPTIONS)
    torch_dtype = _SHORT_TO_TORCH.get(dtype.canonical(chosen_dtype) or "", torch.float32)

    hf_config = getattr(model_config, "hf_config", None)
    override = _cfg_get(model_config, "override_config", None) or {}
    attn = (
        getattr(hf_config, "_attn_implementation", None) or override.get("attn_implementation") or "flash_attention_2"
    )
    areq = Request("attention", "attn_implementation", attn, False, "flash_attention_2")
    return torch_dtype, _keep_unless_blocked(areq, profile, attention.ATTENTION_OPTIONS)


def _cfg_get(cfg: Any, key: str, default: Any) -> Any:
    """Read a field from a dataclass config, a DictConfig or a dict."""
    if cfg is None:
        return default
    if hasattr(cfg, "get") and not hasattr(type(cfg), "__dataclass_fields__"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value

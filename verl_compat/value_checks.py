"""Values that are valid nowhere: refused at start-up with the valid values and the closest one.

A misspelt dtype, attention backend, kernel switch or rollout engine passes Hydra (every value is a string to
it) and fails a minute later in a Ray worker without naming the key, or worse, runs: `use_torch_compile=ture` is
a truthy string, `attn_implementation=flash_attn_2` makes transformers raise inside the model load.

Each key is read by one library, which accepts its own spellings: verl's PrecisionType for the FSDP dtypes
(`bf16`, `bfloat16`, `fp16`, `float16`, `16`, `fp32`, `float32`, `32`), vLLM/SGLang for the rollout dtype
(`bfloat16`, `float16`, `half`, `float32`, `float`, `auto`), transformers for a model config's dtype and
attention. A value outside those is refused; where it is a known dtype in another spelling (`BF16`,
`torch.bfloat16`), the fix names this key's spelling of it. This runs after the device policy, so `BF16` on a
P40 is refused for being bf16, whatever the spelling.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from verl_compat.errors import InvalidSettingError

FSDP_CONFIGS = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
MODELS = ("actor_rollout_ref.model", "critic.model")
ROLLOUTS = ("actor_rollout_ref.rollout", "reward.reward_model.rollout")

# verl/utils/torch_dtypes.py PrecisionType (exact match; ints from YAML `16` / `32` too)
VERL_PRECISION = ("bf16", "bfloat16", "fp16", "float16", "16", 16, "fp32", "float32", "32", 32)
# vLLM / SGLang `dtype` (and verl-compat's hf engine, which reads the same key)
ENGINE_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
# transformers: a config's torch_dtype / dtype is a torch attribute name (or "auto")
HF_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
BOOLS = (True, False)
FUSED_BACKENDS = ("torch", "triton")  # verl/workers/config/model.py fused_kernel_options.impl_backend

# canonical meaning of a dtype in any spelling torch, transformers or verl use, case-insensitive
_DTYPE_MEANING = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "16": "fp16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "32": "fp32",
    "torch.float32": "fp32",
    "torch.float": "fp32",
}


def dtype_meaning(value: Any) -> str | None:
    return _DTYPE_MEANING.get(str(value).strip().lower()) if value is not None else None


@dataclass(frozen=True)
class Spelling:
    """What a key accepts. `valid()` lists the values; `reader` names who reads the key (for the message)."""

    reader: str
    valid: Callable[[], tuple[Any, ...]]
    nullable: bool = False
    dtype: bool = False  # a dtype key: another spelling of a known dtype maps to this key's spelling
    any_case: bool = False  # the reader lower-cases strings first (vLLM and SGLang do for dtype)
    synonyms: tuple[tuple[str, str], ...] = ()  # names users reach for that mean a valid value ("transformers")

    def problem(self, value: Any) -> tuple[str, Any] | None:
        """(reason, closest valid value) when `value` is not accepted; None when it is."""
        if value is None and self.nullable:
            return None
        valid = self.valid()
        probe = value.strip().lower() if self.any_case and isinstance(value, str) else value
        if any(_same(probe, v) for v in valid):
            return None
        closest = self._closest(value, valid)
        shown = ", ".join(dict.fromkeys(_fmt(v) for v in valid))
        return f"{self.reader} accepts {shown}; {_fmt(value)} is none of these", closest

    def _closest(self, value: Any, valid: tuple[Any, ...]) -> Any:
        synonym = dict(self.synonyms).get(str(value).strip().lower())
        if synonym is not None:
            return synonym
        if self.dtype and (meaning := dtype_meaning(value)) is not None:
            same = [v for v in valid if isinstance(v, str) and dtype_meaning(v) == meaning]
            if same:
                return same[0]
        word = str(value).strip().lower() if isinstance(value, str | int) else None
        if True in valid and word in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return word in ("true", "yes", "on", "1")
        texts = {_fmt(v).lower(): v for v in valid}
        typed = str(value).strip().lower()
        prefixed = [t for t in texts if t.startswith(typed) or typed.startswith(t)] if typed else []
        if prefixed:  # a cut-off or extended name ("bfloat", "sdpa2"): the longest shared start wins
            return texts[max(prefixed, key=lambda t: len(_common_prefix(t, typed)))]
        match = difflib.get_close_matches(typed, list(texts), n=1, cutoff=0.3)
        return texts[match[0]] if match else None


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, bool) or isinstance(a, bool):
        return a is b
    return type(a) is type(b) and a == b


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def attention_backends() -> tuple[str, ...]:
    """transformers' registered attention functions (AttentionInterface, plugins included) plus eager, and the
    values verl-compat's attention resolver knows (plugin candidates)."""
    names: list[str] = ["eager"]
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        names += list(ALL_ATTENTION_FUNCTIONS.valid_keys())
    except ImportError:
        names += ["sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"]
    from verl_compat.resolvers.attention import ATTENTION_OPTIONS
    from verl_compat.resolvers.registry import REGISTRY

    names += [str(o.value) for o in REGISTRY.options("attention", ATTENTION_OPTIONS)]
    return tuple(dict.fromkeys(names))


def _is_hub_kernel(value: Any) -> bool:
    """transformers also loads attention kernels from the hub: `org/repo` or `org/repo:function`."""
    return isinstance(value, str) and value.count("/") == 1 and all(value.split(":")[0].split("/"))


def rollout_engines() -> tuple[str, ...]:
    """verl's RolloutReplicaRegistry names (vllm, sglang, trtllm; hf from verl-compat) and plugin engines."""
    names: list[str] = []
    try:
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        names += list(RolloutReplicaRegistry._registry)
    except ImportError:
        names += ["vllm", "sglang", "trtllm", "hf"]
    from verl_compat.resolvers.registry import REGISTRY
    from verl_compat.resolvers.rollout_engine import ENGINE_OPTIONS

    names += [str(o.value) for o in REGISTRY.options("rollout.engine", ENGINE_OPTIONS)]
    return tuple(dict.fromkeys(names))


FSDP_DTYPE = Spelling("verl's FSDP mixed precision (PrecisionType)", lambda: VERL_PRECISION, nullable=True, dtype=True)
MASTER_DTYPE = Spelling("verl's FSDP model_dtype (PrecisionType)", lambda: VERL_PRECISION, nullable=True, dtype=True)
ENGINE_DTYPE = Spelling("the rollout engine (vLLM, SGLang, hf)", lambda: ENGINE_DTYPES, dtype=True, any_case=True)
HF_DTYPE = Spelling("transformers (a torch dtype name)", lambda: HF_DTYPES, nullable=True, dtype=True)
ATTENTION = Spelling("transformers' attention interface", attention_backends, nullable=True)
SWITCH = Spelling("verl (a boolean)", lambda: BOOLS, nullable=True)
FUSED_BACKEND = Spelling("verl's fused kernels", lambda: FUSED_BACKENDS, nullable=True)
ENGINE = Spelling(
    "verl's rollout registry",
    rollout_engines,
    synonyms=(("transformers", "hf"), ("huggingface", "hf"), ("hf_rollout", "hf"), ("tensorrt", "trtllm")),
)


def checked_keys() -> Iterator[tuple[str, Spelling]]:
    """Every key that can set a dtype, an attention backend, a kernel switch or the rollout engine."""
    for fsdp in FSDP_CONFIGS:
        for sub in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            yield f"{fsdp}.mixed_precision.{sub}", FSDP_DTYPE
        yield f"{fsdp}.model_dtype", MASTER_DTYPE
        yield f"{fsdp}.use_torch_compile", SWITCH
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref"):
        yield f"{role}.use_torch_compile", SWITCH
    for model in MODELS:
        yield f"{model}.override_config.torch_dtype", HF_DTYPE
        yield f"{model}.override_config.dtype", HF_DTYPE
        yield f"{model}.override_config.attn_implementation", ATTENTION
        for switch in ("use_fused_kernels", "use_liger", "use_remove_padding", "enable_gradient_checkpointing"):
            yield f"{model}.{switch}", SWITCH
        yield f"{model}.fused_kernel_options.impl_backend", FUSED_BACKEND
    yield "actor_rollout_ref.rollout.dtype", ENGINE_DTYPE
    yield "actor_rollout_ref.rollout.enforce_eager", SWITCH
    yield "actor_rollout_ref.rollout.name", ENGINE


def check_values(config: Any, device: str) -> None:
    """Raise InvalidSettingError for the first checked key whose value its reader does not accept."""
    from omegaconf import OmegaConf

    for key, spelling in checked_keys():
        value = OmegaConf.select(config, key, default=None, throw_on_missing=False)
        if key.endswith("rollout.name") and value in (None, "???"):
            continue  # unset: the policy fills it in
        if spelling is ATTENTION and _is_hub_kernel(value):
            continue
        found = spelling.problem(value)
        if found is None:
            continue
        reason, closest = found
        if closest is None:
            fix = f"set {key} to one of the values above"
        elif spelling.dtype and dtype_meaning(value) is not None:
            fix = f"set {key}={_fmt(closest)} (the same dtype, in the spelling this key's reader accepts)"
        else:
            fix = f"set {key}={_fmt(closest)} (the closest valid value)"
        raise InvalidSettingError(key, value, device, reason, fix + ", or remove it and let verl-compat choose")

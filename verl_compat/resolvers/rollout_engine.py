"""Rollout resolvers: engine (vllm / sglang / trtllm / hf), tensor parallel size, enforce_eager, checkpoint engine.

The rollout dtype lives in `dtype.resolve_rollout` (it follows the training compute dtype).
- vLLM: current wheels need sm_70+ at the very least (sm_75+ officially); the profile says whether the installed
  build is usable on this card (its `_C` fatbin has the arch). sm_61 and CPU never get it.
- SGLang: sm_75+ (Triton attention backend below Ampere).
- hf: verl-compat's transformers-`generate` engine; runs anywhere, one full model copy per GPU.
"""

from __future__ import annotations

import dataclasses

from verl_compat.decision import Decision
from verl_compat.errors import IncompatibleRequestError
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.checks import requires
from verl_compat.resolvers.registry import Context, Option, Reason, Registry, Request, choose, hard, passthrough, soft

AUTO_VALUES = frozenset({"auto", "???", ""})


def _vllm_reasons(ctx: Context) -> list[Reason]:
    return requires(ctx.profile, "vllm", "rollout.name=vllm")


def _sglang_reasons(ctx: Context) -> list[Reason]:
    return requires(ctx.profile, "sglang", "rollout.name=sglang")


def _trtllm_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [hard("needs_gpu", "TensorRT-LLM needs an NVIDIA GPU, device is a CPU", "cpu", "an NVIDIA GPU")]
    return requires(ctx.profile, "tensorrt_llm", "rollout.name=trtllm")


ENGINE_OPTIONS: tuple[Option, ...] = (
    Option("vllm", _vllm_reasons, "vLLM server (fastest where its build supports the card)", 10),
    Option("sglang", _sglang_reasons, "SGLang server", 20),
    Option("trtllm", _trtllm_reasons, "TensorRT-LLM server", 30),
    Option(
        "hf", why="transformers generate (verl-compat's hf engine): any device, no Triton, no vLLM build", priority=40
    ),
)


def _engine_fix(request: Request, profile: DeviceProfile, alternative: object) -> str:
    return (
        f"set {request.key}={alternative} (or {request.key}=auto to let verl-compat choose; "
        "`verl-compat doctor` lists the engines usable here)"
    )


def normalise_engine_request(request: Request) -> Request:
    """`rollout.name` missing, `???` or `auto` means: let the resolver choose."""
    value = request.value
    if value is None or (isinstance(value, str) and value.strip().lower() in AUTO_VALUES):
        return Request(request.category, request.key, None, False, request.upstream, request.facts)
    return request


def resolve_engine(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """actor_rollout_ref.rollout.name."""
    return choose(normalise_engine_request(request), profile, ENGINE_OPTIONS, fix=_engine_fix, registry=registry)


def resolve_tensor_parallel(request: Request, profile: DeviceProfile) -> Decision:
    """rollout.tensor_model_parallel_size; fact: engine. The hf engine holds one full model copy per GPU."""
    engine = request.facts.get("engine")
    if engine != "hf":
        return passthrough(request, profile, [f"{engine} shards the model as configured"])
    if request.requested and request.value not in (None, 1):
        raise IncompatibleRequestError(
            request.key,
            request.value,
            profile.describe(),
            "the hf rollout engine has no tensor parallelism: each GPU runs a full copy of the model",
            f"set {request.key}=1, or use a rollout engine with tensor parallelism (vllm/sglang) where the device "
            "supports it",
        )
    decision = passthrough(request, profile, ["hf: one full model copy per GPU (no tensor parallelism)"])
    return dataclasses.replace(decision, value=1)


def _eager_off_reasons(ctx: Context) -> list[Reason]:
    engine = ctx.fact("engine")
    if ctx.profile.is_cpu:
        return [soft("cpu_no_graphs", "there are no CUDA graphs on a CPU")]
    if engine in ("vllm", "sglang"):
        return requires(ctx.profile, "vllm_graphs", engine=engine)
    return []


EAGER_OPTIONS: tuple[Option, ...] = (
    Option(False, _eager_off_reasons, "CUDA graphs / compiled decode (upstream verl's default)", 10),
    Option(True, why="eager decode: no CUDA graphs, no torch.compile inside the engine", priority=20),
)


def resolve_enforce_eager(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """rollout.enforce_eager; fact: engine."""
    return choose(request, profile, EAGER_OPTIONS, registry=registry)


def _delta_reasons(ctx: Context) -> list[Reason]:
    return requires(ctx.profile, "delta_sharded")


def _nccl_reasons(ctx: Context) -> list[Reason]:
    if ctx.profile.is_cpu:
        return [hard("needs_gpu", "the nccl checkpoint engine needs NVIDIA GPUs (NCCL, cupy), device is a CPU")]
    return []


CHECKPOINT_ENGINE_OPTIONS: tuple[Option, ...] = (
    Option(
        "naive", why="in-process weight update (upstream verl's default; forced by the v1 sync trainer)", priority=10
    ),
    Option("nccl", _nccl_reasons, "NCCL broadcast to standalone rollout replicas", 20),
    Option("delta_sharded", _delta_reasons, "bf16 delta weight transfer", 30),
)


def resolve_checkpoint_engine(request: Request, profile: DeviceProfile, registry: Registry | None = None) -> Decision:
    """rollout.checkpoint_engine.backend."""
    return choose(request, profile, CHECKPOINT_ENGINE_OPTIONS, registry=registry)

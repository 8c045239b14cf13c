"""What each backend, kernel and package needs, as data, in one place (xformers keeps these on each op class).

Read by the package probes (packages.py), the catalog's derived traits (catalog.py), the resolvers
(resolvers/checks.py) and the doctor. A new backend is one `Requirement` here plus an `Option` that asks
`resolvers.checks.requires(profile, name)`; a new card is one catalog line.

Sources: research/hardware-matrix.md (per-card facts), the packages' own error messages (quoted in `label`).
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024

# -- device facts by compute capability -------------------------------------------------------------------------
IDENTITY_CC = (8, 0)  # sm_80+: every resolver returns exactly upstream verl's value (the identity rule)
NATIVE_BF16_CC = (8, 0)  # bf16 tensor cores; torch.cuda.is_bf16_supported() also counts emulation
TENSOR_CORES_CC = (7, 0)  # except the GTX 16xx (sm_75 without tensor cores; catalog.is_gtx16)
TRITON_CC = (7, 0)  # Inductor's guard (GPUTooOldForTriton, torch/_inductor/scheduler.py)
TRITON_OFFICIAL_CC = (8, 0)  # Triton's README since PR #5066; sm_7x is best effort
# Packed (2:1) fp16 ALUs without tensor cores: sm_53 (Jetson TX1), sm_60 (P100), sm_62 (Jetson TX2).
PACKED_FP16_CC = frozenset({(5, 3), (6, 0), (6, 2)})
# Opt-in shared memory per block (CUDA C Programming Guide, "Technical Specifications per Compute Capability").
# 7.5 matches Triton's "out of resource: shared memory, Required: 98304, Hardware limit: 65536" on Turing.
SMEM_OPTIN_BY_CC: dict[tuple[int, int], int] = {
    (6, 0): 48 * KIB,
    (6, 1): 48 * KIB,
    (7, 0): 96 * KIB,
    (7, 5): 64 * KIB,
    (8, 0): 163 * KIB,
    (8, 6): 99 * KIB,
    (8, 9): 99 * KIB,
    (9, 0): 227 * KIB,
}
# Lowest compute capability a CUDA toolkit major can compile for (CUDA 13 dropped sm_50..sm_72).
CUDA_MIN_CC: dict[int, tuple[int, int]] = {12: (5, 0), 13: (7, 5)}


@dataclass(frozen=True)
class Requirement:
    """What one backend, kernel or package needs from the device. None / empty: no requirement of that kind."""

    name: str
    label: str  # how reasons name it
    min_cc: tuple[int, int] | None = None  # minimum compute capability; also means "needs an NVIDIA GPU"
    package: str | None = None  # import name of the package it needs (probed by packages.py)
    dtypes: tuple[str, ...] = ()  # compute dtypes it supports (short names: bf16, fp16, fp32)
    triton: bool = False  # it compiles Triton kernels (so TRITON_CC and the triton package apply)
    shared_memory: int | None = None  # opt-in shared memory per block it needs, bytes
    # (version, cc): prebuilt wheels from `version` on carry kernels only from `cc` (xformers 0.0.31 dropped sm_70)
    wheel_floor: tuple[tuple[int, ...], tuple[int, int]] | None = None
    quote: str = ""  # the package's own words for the requirement, quoted in package probe reasons
    note: str = ""  # a caveat kept with the requirement (shown where it applies)

    def quoted(self) -> str:
        """'flash-attn 2 ("only supports Ampere GPUs or newer")': the label with the package's own words."""
        return f'{self.label} ("{self.quote}")' if self.quote else self.label


REQUIREMENTS: dict[str, Requirement] = {
    r.name: r
    for r in (
        Requirement(
            "flash_attn",
            "flash-attn 2",
            (8, 0),
            "flash_attn",
            ("bf16", "fp16"),
            quote="only supports Ampere GPUs or newer",
        ),
        Requirement("flash_attn_3", "flash-attn 3", (9, 0), "flash_attn_3", ("bf16", "fp16")),
        # cutlass fMHA runs on sm_50+ (SIMT below sm_70); torch's aten::_efficient_attention is the same kernel
        Requirement(
            "xformers",
            "xformers' memory-efficient attention",
            (5, 0),
            "xformers",
            ("bf16", "fp16", "fp32"),
            wheel_floor=((0, 0, 31), (7, 5)),
        ),
        Requirement("vllm", "vLLM", (7, 0), "vllm", ("bf16", "fp16", "fp32")),
        Requirement(
            "vllm_graphs",
            "{engine}'s torch.compile + CUDA-graph path (Triton; hangs and MMA assertions reported on sm_70)",
            (7, 5),
        ),
        Requirement("sglang", "SGLang", (7, 5), "sglang", ("bf16", "fp16"), quote="only supports sm75 and above"),
        Requirement("tensorrt_llm", "TensorRT-LLM", package="tensorrt_llm"),
        Requirement(
            "triton",
            "Triton",
            TRITON_CC,
            "triton",
            triton=True,
            quote="torch Inductor raises GPUTooOldForTriton",
            note="Triton supports compute capability 8.0+ officially; sm_7x is best effort "
            '(Volta: "mma -> mma layout conversion is only supported on Ampere")',
        ),
        Requirement("liger_kernel", "Liger (Triton) kernels", TRITON_CC, "liger_kernel", triton=True),
        Requirement(
            "delta_sharded",
            "the delta_sharded checkpoint engine sends bf16 over CUDA IPC "
            "(delta_weight_transfer.py rejects other dtypes) and",
            NATIVE_BF16_CC,
            dtypes=("bf16",),
        ),
    )
}


def requirement(name: str) -> Requirement:
    """The requirement called `name`; an unknown name is a programming error (KeyError names the valid ones)."""
    try:
        return REQUIREMENTS[name]
    except KeyError:
        known = ", ".join(REQUIREMENTS)
        raise KeyError(f"no requirement {name!r} in verl_compat.capabilities; known: {known}") from None


def cc_text(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def at_least(cc: tuple[int, int] | None, minimum: tuple[int, int]) -> bool:
    return cc is not None and cc >= minimum

"""Named device profiles for simulation (`VERL_COMPAT_DEVICE=p40`): hardware facts only.

The catalog says what the card *is*; `detect.py` merges in what the running process *has* (torch build,
optional packages), so a simulated P40 on a CPU machine still reports that this torch has no sm_61 kernels.

Sources (see research/hardware-matrix.md):
- compute capability, memory and SM count: `torch.cuda.get_device_properties()` output published for each card;
  torch prints `total_memory` in MiB (floor), so `total_memory_bytes` is that figure * 2**20.
- shared memory per block (opt-in) and every compute-capability threshold: `verl_compat.capabilities` (CUDA C
  Programming Guide; 8.0/8.6 match the Ampere tuning guide's per-SM carve-outs, hardware-matrix section 5).
- fp16 rates: P40 fp16 is 1:64 of fp32 (183.7 GFLOPS vs 11.76 TFLOPS); P100 has 2:1 packed fp16 (section 2c).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_compat.capabilities import (
    NATIVE_BF16_CC,
    PACKED_FP16_CC,
    SMEM_OPTIN_BY_CC,
    TENSOR_CORES_CC,
    TRITON_CC,
    TRITON_OFFICIAL_CC,
    at_least,
)
from verl_compat.errors import UnknownDeviceProfileError
from verl_compat.profile import DeviceProfile

MIB = 1024 * 1024


def is_gtx16(device_name: str | None) -> bool:
    """GTX 16xx (TU116/TU117) is sm_75 without tensor cores: capability alone cannot tell."""
    return device_name is not None and "GTX 16" in device_name.upper()


def hardware_traits(cc: tuple[int, int] | None, device_name: str | None = None) -> dict[str, bool]:
    """Derived capability flags, the same rules for catalog entries and detected devices.

    - native_bf16: cc >= 8.0 only; `torch.cuda.is_bf16_supported()` also counts emulation (True on a T4).
    - tensor_cores: sm_70+, except the GTX 16xx.
    - fast_fp16: tensor cores or packed fp16 (sm_60). Not on GTX 16xx: its fp16 ALUs are 2:1 on paper, but vLLM
      decode measured up to 9x faster in fp32 than fp16 there (vllm #54950), and DESIGN.md trains it in fp32.
    - triton_capable: cc >= 7.0, the Inductor guard (`GPUTooOldForTriton`, torch/_inductor/scheduler.py).
      Triton only *officially* supports cc >= 8.0 since PR #5066; see `triton_officially_supported`.
    """
    if cc is None:
        return {"native_bf16": False, "tensor_cores": False, "fast_fp16": False, "triton_capable": False}
    tensor_cores = cc >= TENSOR_CORES_CC and not is_gtx16(device_name)
    return {
        "native_bf16": cc >= NATIVE_BF16_CC,
        "tensor_cores": tensor_cores,
        "fast_fp16": tensor_cores or cc in PACKED_FP16_CC,
        "triton_capable": cc >= TRITON_CC,
    }


def triton_officially_supported(cc: tuple[int, int] | None) -> bool:
    """Triton's README lists compute capability 8.0+; sm_7x works on a best-effort basis."""
    return at_least(cc, TRITON_OFFICIAL_CC)


@dataclass(frozen=True)
class CatalogEntry:
    key: str
    model: str  # marketing name as the driver reports it
    profile: DeviceProfile  # hardware facts; software fields empty until detect() merges them
    note: str = ""


def _gpu(
    key: str,
    model: str,
    cc: tuple[int, int],
    memory_mib: int,
    sm_count: int,
    note: str = "",
) -> CatalogEntry:
    traits = hardware_traits(cc, model)
    profile = DeviceProfile(
        name=key,
        vendor="nvidia",
        device_type="cuda",
        simulated=True,
        compute_capability=cc,
        total_memory_bytes=memory_mib * MIB,
        shared_memory_per_block_optin=SMEM_OPTIN_BY_CC[cc],
        sm_count=sm_count,
        device_count=1,
        **traits,
    )
    return CatalogEntry(key=key, model=model, profile=profile, note=note)


_ENTRIES: tuple[CatalogEntry, ...] = (
    # 22919 MiB is what a Tesla P40 reports with ECC on (the data-centre default); 24451 MiB with ECC off.
    _gpu("p40", "Tesla P40", (6, 1), 22919, 30, "fp16 at 1/64 rate: train and roll out in fp32"),
    _gpu("p100", "Tesla P100-PCIE-16GB", (6, 0), 16280, 56, "packed fp16 (2:1), no tensor cores"),
    _gpu("v100", "Tesla V100-SXM2-16GB", (7, 0), 16160, 80, "fp16 tensor cores; no bf16"),
    _gpu("v100-32gb", "Tesla V100-PCIE-32GB", (7, 0), 32510, 80, "fp16 tensor cores; no bf16"),
    _gpu("t4", "Tesla T4", (7, 5), 15095, 40, "fp16 tensor cores; no bf16"),
    _gpu("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti", (7, 5), 11019, 68, "fp16 tensor cores; no bf16"),
    # GTX 1660 (22 SMs, 6 GiB): memory as reported for the GTX 1660 Ti (same 6 GiB, 24 SMs).
    _gpu("gtx1660", "NVIDIA GeForce GTX 1660", (7, 5), 5936, 22, "sm_75 without tensor cores: fp32"),
    _gpu("gtx1660ti", "NVIDIA GeForce GTX 1660 Ti", (7, 5), 5936, 24, "sm_75 without tensor cores: fp32"),
    _gpu("a100", "A100-SXM4-40GB", (8, 0), 40536, 108, "upstream verl defaults"),
    _gpu("h100", "NVIDIA H100 80GB HBM3", (9, 0), 81089, 132, "upstream verl defaults"),
    CatalogEntry(
        key="cpu",
        model="cpu",
        profile=DeviceProfile(name="cpu", vendor="cpu", device_type="cpu", simulated=True),
        note="fp32, hf rollout, SDPA",
    ),
)

CATALOG: dict[str, CatalogEntry] = {e.key: e for e in _ENTRIES}


def profile_names() -> list[str]:
    return list(CATALOG)


def normalize_name(name: str) -> str:
    """'Tesla_P40 ' -> 'tesla-p40'; 'V100_32GB' -> 'v100-32gb'."""
    n = name.strip().lower().replace("_", "-")
    return n.removeprefix("tesla-")


def get_entry(name: str) -> CatalogEntry:
    key = normalize_name(name)
    if key not in CATALOG:
        import difflib

        closest = difflib.get_close_matches(key, profile_names(), n=1, cutoff=0.5)
        hint = f" (closest: {closest[0]})" if closest else ""
        raise UnknownDeviceProfileError(
            f"VERL_COMPAT_DEVICE={name!r} on this host: unknown device profile {name!r}; valid names: "
            f"{', '.join(profile_names())}. Fix: set VERL_COMPAT_DEVICE to one of them{hint}, or unset it to "
            "detect the real device"
        )
    return CATALOG[key]


def get_profile(name: str) -> DeviceProfile:
    """Hardware facts of a named card, `simulated=True`. Raises UnknownDeviceProfileError listing valid names."""
    return get_entry(name).profile

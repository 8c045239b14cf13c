"""`DeviceProfile`: everything the resolvers need to know about the device, as one frozen record.

A profile is data only: `detect.py` builds one from the running machine, `catalog.py` holds named ones for
simulation (`VERL_COMPAT_DEVICE=p40`). Fields that could not be read are None, never a guess.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from verl_compat.capabilities import IDENTITY_CC, at_least


@dataclass(frozen=True)
class PackageStatus:
    """Whether an optional package is importable, and whether it can actually run on this device."""

    name: str
    installed: bool
    version: str | None = None
    usable: bool = False
    reason: str = ""  # why it is not usable (empty when usable or not installed)
    note: str = ""  # caveat even when usable (e.g. "Triton supports sm_80+ officially; sm_75 is best effort")


@dataclass(frozen=True)
class DeviceProfile:
    # identity
    name: str  # catalog key ("p40", "cpu", ...) or the detected device's marketing name
    vendor: str  # "nvidia" | "cpu" | ...
    device_type: str  # torch device type: "cuda" | "cpu"
    simulated: bool = False  # True when it comes from VERL_COMPAT_DEVICE / the catalog
    # compute
    compute_capability: tuple[int, int] | None = None  # None on CPU
    total_memory_bytes: int | None = None
    shared_memory_per_block_optin: int | None = None  # bytes; Triton's limit for a kernel's shared memory
    sm_count: int | None = None
    device_count: int = 0
    native_bf16: bool = False  # cc >= 8.0 only; never torch.cuda.is_bf16_supported() (it counts emulation)
    fast_fp16: bool = False  # tensor cores (sm_70+) or packed fp16 (sm_60); sm_61 runs fp16 at 1/64 rate
    tensor_cores: bool = False
    triton_capable: bool = False  # Triton compiles only for cc >= 7.0 (and not on CPU)
    # torch build vs device
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    torch_arch_list: tuple[str, ...] = ()
    torch_covers_device: bool | None = None  # None on CPU / unknown
    torch_hip_version: str | None = None  # ROCm builds
    torch_error: str | None = None  # why torch or its arch list could not be read
    # optional packages, keyed by name ("flash_attn", "xformers", "vllm", "sglang", "triton", "liger_kernel")
    packages: dict[str, PackageStatus] = field(default_factory=dict)

    @property
    def sm(self) -> int | None:
        """Compute capability as an integer: (6, 1) -> 61."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return major * 10 + minor

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    @property
    def is_ampere_or_newer(self) -> bool:
        """sm_80+: the devices on which every resolver returns exactly upstream verl's value."""
        return at_least(self.compute_capability, IDENTITY_CC)

    def package(self, name: str) -> PackageStatus:
        return self.packages.get(name, PackageStatus(name=name, installed=False))

    def usable(self, name: str) -> bool:
        return self.package(name).usable

    def describe(self) -> str:
        """Short human label: 'p40 (sm_61, 24.0 GiB, simulated)'."""
        parts = []
        if self.sm is not None:
            parts.append(f"sm_{self.sm}")
        if self.total_memory_bytes:
            parts.append(f"{self.total_memory_bytes / 2**30:.1f} GiB")
        if self.simulated:
            parts.append("simulated")
        return f"{self.name} ({', '.join(parts)})" if parts else self.name

    def with_packages(self, **packages: PackageStatus) -> DeviceProfile:
        merged = dict(self.packages)
        merged.update(packages)
        return dataclasses.replace(self, packages=merged)

    # JSON round trip -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        d["torch_arch_list"] = list(self.torch_arch_list)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        d = dict(d)
        cc = d.get("compute_capability")
        d["compute_capability"] = tuple(cc) if cc is not None else None
        d["torch_arch_list"] = tuple(d.get("torch_arch_list") or ())
        d["packages"] = {k: PackageStatus(**v) for k, v in (d.get("packages") or {}).items()}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json(cls, s: str) -> DeviceProfile:
        return cls.from_dict(json.loads(s))

"""Capability checks over `verl_compat.capabilities`: the one function that turns a requirement into reasons.

Messages show actual vs required, xformers-style; every reason also carries them as data (`actual`, `required`).
"""

from __future__ import annotations

from verl_compat.capabilities import TRITON_CC, TRITON_OFFICIAL_CC, at_least, requirement
from verl_compat.capabilities import cc_text as _cc
from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import NOT_INSTALLED, NOT_PROBED, NOT_USABLE, Reason, hard, soft


def cc_text(profile: DeviceProfile) -> str:
    return _cc(profile.compute_capability)


def requires(profile: DeviceProfile, name: str, what: str = "", **label_fields: str) -> list[Reason]:
    """Why the requirement `name` (capabilities.REQUIREMENTS) is not met on `profile`: compute capability first,
    then Triton, then the package it needs. `what` names the config value in package reasons
    ("rollout.name=vllm"); `label_fields` fill the label's placeholders ("{engine}")."""
    req = requirement(name)
    label = req.label.format(**label_fields) if label_fields else req.label
    reasons = needs_cc(profile, req.min_cc, label) if req.min_cc else []
    if not reasons and req.shared_memory:
        reasons = needs_shared_memory(profile, req.shared_memory, label)
    if not reasons and req.triton and name != "triton":
        reasons = package_known_unusable(profile, "triton", label)
    if not reasons and req.package:
        reasons = needs_package(profile, req.package, what or label)
    return reasons


def needs_cc(profile: DeviceProfile, minimum: tuple[int, int], what: str = "", *, is_hard: bool = True) -> list[Reason]:
    """Reason when the device's compute capability is below `minimum` (or the device is not a CUDA GPU)."""
    need = _cc(minimum)
    prefix = f"{what} " if what else ""
    make = hard if is_hard else soft
    if profile.is_cpu:
        return [
            make(
                "needs_gpu",
                f"{prefix}needs an NVIDIA GPU with compute capability >= {need}, device is a CPU",
                "cpu",
                f">= {need}",
            )
        ]
    cc = profile.compute_capability
    if cc is None:  # unknown device: do not guess, let the user find out
        return []
    if cc < minimum:
        return [
            make(
                "cc_too_old",
                f"{prefix}needs compute capability >= {need}, device has {cc_text(profile)}",
                cc_text(profile),
                f">= {need}",
            )
        ]
    return []


def needs_shared_memory(profile: DeviceProfile, needed: int, what: str = "") -> list[Reason]:
    """Reason when a kernel needs more opt-in shared memory per block than the device has (Triton's
    "out of resource: shared memory, Required: ..., Hardware limit: ..."). Unknown device figure: no reason."""
    have = profile.shared_memory_per_block_optin
    if have is None or have >= needed:
        return []
    prefix = f"{what} " if what else ""
    return [
        hard(
            "shared_memory",
            f"{prefix}needs {needed // 1024} KiB of shared memory per block, device has {have // 1024} KiB",
            have,
            needed,
        )
    ]


def needs_package(profile: DeviceProfile, name: str, what: str = "") -> list[Reason]:
    """Reason when an optional package is missing or not usable on this device.

    "not_installed" only when the profile probed the package and found it absent (reliable: package metadata);
    a package the profile never probed (catalog profiles, names detect does not know) is "not_probed".
    """
    label = what or name
    if name not in profile.packages:
        return [
            hard(
                NOT_PROBED,
                f"{label} needs '{name}', which verl-compat did not find usable on this machine",
                "not probed",
                f"{name} usable",
            )
        ]
    status = profile.package(name)
    if not status.installed:
        return [hard(NOT_INSTALLED, f"{label} needs the '{name}' package, which is not installed", "absent", name)]
    if not status.usable:
        detail = f": {status.reason}" if status.reason else ""
        return [
            hard(
                NOT_USABLE,
                f"'{name}' {status.version or ''} is installed but not usable here{detail}",
                f"{name} {status.version or ''}".strip(),
                f"{name} usable",
            )
        ]
    return []


def package_known_unusable(profile: DeviceProfile, name: str, what: str = "") -> list[Reason]:
    """Like `needs_package`, but only when the profile actually probed the package (catalog profiles do not)."""
    if name not in profile.packages:
        return []
    return needs_package(profile, name, what)


def triton_reasons(profile: DeviceProfile, what: str, *, official_only_soft: bool = True) -> list[Reason]:
    """Triton compiles for cc >= TRITON_CC (Inductor's GPUTooOldForTriton); officially supported from
    TRITON_OFFICIAL_CC (a soft reason below it, when `official_only_soft`)."""
    need = _cc(TRITON_CC)
    if profile.is_cpu:
        return [
            hard(
                "needs_gpu",
                f"{what} needs Triton on an NVIDIA GPU with compute capability >= {need}, device is a CPU",
                "cpu",
                f">= {need}",
            )
        ]
    cc = profile.compute_capability
    if cc is not None and cc < TRITON_CC:
        return [
            hard(
                "cc_too_old",
                f"{what} needs Triton, which needs compute capability >= {need}, device has {cc_text(profile)}",
                cc_text(profile),
                f">= {need}",
            )
        ]
    reasons = package_known_unusable(profile, "triton", what)
    if reasons:
        return reasons
    if official_only_soft and cc is not None and not at_least(cc, TRITON_OFFICIAL_CC):
        return [
            soft(
                "triton_unofficial",
                f"{what}: Triton officially supports compute capability >= {_cc(TRITON_OFFICIAL_CC)}, device has "
                f"{cc_text(profile)} (opt in explicitly)",
                cc_text(profile),
                f">= {_cc(TRITON_OFFICIAL_CC)}",
            )
        ]
    return []

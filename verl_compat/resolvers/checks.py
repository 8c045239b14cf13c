"""Reusable capability checks. Messages show actual vs required, xformers-style."""

from __future__ import annotations

from verl_compat.profile import DeviceProfile
from verl_compat.resolvers.registry import NOT_INSTALLED, Reason, hard, soft


def cc_text(profile: DeviceProfile) -> str:
    cc = profile.compute_capability
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def needs_cc(profile: DeviceProfile, minimum: tuple[int, int], what: str = "", *, is_hard: bool = True) -> list[Reason]:
    """Reason when the device's compute capability is below `minimum` (or the device is not a CUDA GPU)."""
    need = f"{minimum[0]}.{minimum[1]}"
    prefix = f"{what} " if what else ""
    make = hard if is_hard else soft
    if profile.is_cpu:
        return [make("needs_gpu", f"{prefix}needs an NVIDIA GPU with compute capability >= {need}, device is a CPU")]
    cc = profile.compute_capability
    if cc is None:  # unknown device: do not guess, let the user find out
        return []
    if cc < minimum:
        return [make("cc_too_old", f"{prefix}needs compute capability >= {need}, device has {cc_text(profile)}")]
    return []


def needs_package(profile: DeviceProfile, name: str, what: str = "") -> list[Reason]:
    """Reason when an optional package is missing or not usable on this device.

    "not_installed" only when the profile probed the package and found it absent (reliable: package metadata);
    a package the profile never probed (catalog profiles, names detect does not know) is "not_probed".
    """
    label = what or name
    if name not in profile.packages:
        return [hard("not_probed", f"{label} needs '{name}', which verl-compat did not find usable on this machine")]
    status = profile.package(name)
    if not status.installed:
        return [hard(NOT_INSTALLED, f"{label} needs the '{name}' package, which is not installed")]
    if not status.usable:
        detail = f": {status.reason}" if status.reason else ""
        return [hard("not_usable", f"'{name}' {status.version or ''} is installed but not usable here{detail}")]
    return []


def package_known_unusable(profile: DeviceProfile, name: str, what: str = "") -> list[Reason]:
    """Like `needs_package`, but only when the profile actually probed the package (catalog profiles do not)."""
    if name not in profile.packages:
        return []
    return needs_package(profile, name, what)


def triton_reasons(profile: DeviceProfile, what: str) -> list[Reason]:
    """Triton compiles for cc >= 7.0 (Inductor's GPUTooOldForTriton); officially supported from 8.0."""
    if profile.is_cpu:
        return [
            hard("needs_gpu", f"{what} needs Triton on an NVIDIA GPU with compute capability >= 7.0, device is a CPU")
        ]
    cc = profile.compute_capability
    if cc is not None and cc < (7, 0):
        return [
            hard(
                "cc_too_old",
                f"{what} needs Triton, which needs compute capability >= 7.0, device has {cc_text(profile)}",
            )
        ]
    reasons = package_known_unusable(profile, "triton", what)
    if reasons:
        return reasons
    if cc is not None and cc < (8, 0):
        return [
            soft(
                "triton_unofficial",
                f"{what}: Triton officially supports compute capability >= 8.0, device has "
                f"{cc_text(profile)} (opt in explicitly)",
            )
        ]
    return []

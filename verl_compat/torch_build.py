"""Does the installed torch carry kernels for this device, and if not, which build to install.

The most common pre-Ampere failure is a torch built for CUDA 13 (the default wheel since torch 2.11): it has no
sm_60/61/70 kernels and fails at the first launch with "no kernel image is available for execution on the
device". A V100 on such a build gets no `_check_cubins` warning (sm_75 has the same major), so we check here.

Everything except `read_torch_build()` is a pure function of raw values, testable with fake arch lists.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_compat.profile import DeviceProfile

logger = logging.getLogger("verl_compat.torch_build")

CU126_INDEX = "https://download.pytorch.org/whl/cu126"
CU130_INDEX = "https://download.pytorch.org/whl/cu130"


@dataclass(frozen=True)
class WheelIndex:
    """One of PyTorch's wheel indexes: which cards its builds carry kernels for, and for which torch releases."""

    name: str
    url: str
    min_cc: tuple[int, int]  # the oldest card its wheels have kernels for
    first_release: tuple[int, int]
    last_release: tuple[int, int] | None  # None: still published
    cards: str  # the cards it is the build for, in words


# The one table of torch builds per card: install_command (doctor, errors) and the README read it.
# cu126 is the last index with sm_50..sm_70 kernels (cu128 dropped Volta in 2.11, CUDA 13 starts at sm_75), and
# its last release is torch 2.14: PyTorch RFC #190385 drops CUDA 12.x wheels, so from 2.15 Pascal and Volta are
# build-from-source only.
TORCH_BUILDS: tuple[WheelIndex, ...] = (
    WheelIndex("cu126", CU126_INDEX, (5, 0), (2, 6), (2, 14), "P100, P40 / GTX 10xx, V100 (sm_60, sm_61, sm_70)"),
    WheelIndex("cu130", CU130_INDEX, (7, 5), (2, 9), None, "T4 / RTX 20xx (sm_75) and newer"),
)
LAST_CU126_RELEASE = TORCH_BUILDS[0].last_release
TESTED_TORCH = "2.13.0"  # the torch verl-compat's tests run with (README's install lines)


@dataclass(frozen=True)
class TorchBuild:
    """What `torch` reports about itself. `error` is set when torch could not be imported."""

    version: str | None = None
    cuda: str | None = None  # torch.version.cuda; None on CPU and ROCm builds
    hip: str | None = None
    arch_list: tuple[str, ...] = ()  # torch.cuda.get_arch_list(): ('sm_60', ..., 'compute_90')
    error: str | None = None


@dataclass(frozen=True)
class Coverage:
    covers: bool | None  # None: not applicable (CPU device) or cannot tell (ROCm, torch missing)
    reason: str
    advice: str | None = None  # what to install, when `covers` is False


def read_torch_build() -> TorchBuild:
    """Read the running torch's build facts; never raises."""
    try:
        import torch
    except Exception as e:  # a broken torch install must not crash detection
        logger.debug("torch import failed", exc_info=True)
        return TorchBuild(error=f"could not import torch: {type(e).__name__}: {e}")
    try:
        archs = tuple(torch.cuda.get_arch_list())
    except Exception as e:
        logger.debug("torch.cuda.get_arch_list() failed", exc_info=True)
        return TorchBuild(
            version=torch.__version__,
            cuda=torch.version.cuda,
            hip=getattr(torch.version, "hip", None),
            error=f"could not read torch.cuda.get_arch_list(): {type(e).__name__}: {e}",
        )
    return TorchBuild(
        version=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None), arch_list=archs
    )


def parse_arch_list(arch_list: list[str] | tuple[str, ...]) -> tuple[set[int], set[int]]:
    """('sm_60', 'sm_86', 'compute_90') -> ({60, 86}, {90}): SASS targets and PTX targets."""
    sass: set[int] = set()
    ptx: set[int] = set()
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", arch.strip())
        if m is None:
            continue  # e.g. gfx90a on ROCm builds
        (sass if m.group(1) == "sm" else ptx).add(int(m.group(2)))
    return sass, ptx


def _split(sm: int) -> tuple[int, int]:
    return sm // 10, sm % 10


def covers(arch_list: list[str] | tuple[str, ...], cc: tuple[int, int]) -> bool:
    """True when some kernel image in the build can run on a device of compute capability `cc`.

    - SASS `sm_XY` runs on X.Z for Z >= Y (CUDA binary compatibility within a major; a P40 runs sm_60 SASS).
    - PTX `compute_XY` is JIT-compiled by the driver for any cc >= X.Y.
    An empty list (CPU build) covers nothing.
    """
    sass, ptx = parse_arch_list(arch_list)
    major, minor = cc
    sm = major * 10 + minor
    if any(_split(s)[0] == major and _split(s)[1] <= minor for s in sass):
        return True
    return any(p <= sm for p in ptx)


def _how_covered(arch_list: list[str] | tuple[str, ...], cc: tuple[int, int]) -> str:
    sass, ptx = parse_arch_list(arch_list)
    sm = cc[0] * 10 + cc[1]
    if sm in sass:
        return f"it has sm_{sm} kernels"
    same_major = sorted(s for s in sass if _split(s)[0] == cc[0] and _split(s)[1] <= cc[1])
    if same_major:
        return f"sm_{sm} runs its sm_{same_major[-1]} kernels (binary compatible within a major)"
    jit = max(p for p in ptx if p <= sm)
    return f"its compute_{jit} PTX is JIT-compiled for sm_{sm} (slow first launch)"


def _version_tuple(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def base_version(version: str | None) -> str | None:
    """'2.13.0+cpu' -> '2.13.0' (the local part names the build, pip's index picks it)."""
    return version.split("+", 1)[0] if version else None


def install_command(torch_version: str | None, cc: tuple[int, int]) -> str:
    """The pip command for a torch build with kernels for `cc`.

    sm < 7.5 (Pascal, Volta): only the cu126 wheels carry sm_50..sm_70 from torch 2.11 on (cu128 dropped Volta
    in 2.11, CUDA 13 cannot target below sm_75), and only up to torch 2.14. sm_75+: the default cu130 wheel.
    """
    vt = _version_tuple(torch_version)
    base = base_version(torch_version)
    fits = [b for b in TORCH_BUILDS if cc >= b.min_cc]
    # the newest index that has this torch release, else the one with the newest releases for this card
    build = next((b for b in reversed(fits) if vt is not None and _publishes(b, vt)), None)
    if build is None:
        build = max(fits, key=lambda b: b.last_release or (99, 99))
        if build.last_release is not None and (vt is None or vt > build.last_release):
            return f"pip install 'torch=={build.last_release[0]}.{build.last_release[1]}.*' --index-url {build.url}"
    pin = f"torch=={base}" if base else "torch"
    return f"pip install {pin} --index-url {build.url}"


def _publishes(build: WheelIndex, version: tuple[int, int]) -> bool:
    return build.first_release <= version and (build.last_release is None or version <= build.last_release)


def readme_table() -> str:
    """The README's table of torch builds, rendered from TORCH_BUILDS (a test keeps the README equal to it)."""
    rows = ["| card | PyTorch wheel index | torch releases | install |", "|---|---|---|---|"]
    for b in TORCH_BUILDS:
        last = f"{b.last_release[0]}.{b.last_release[1]}" if b.last_release else "current"
        releases = f"{b.first_release[0]}.{b.first_release[1]} .. {last}"
        rows.append(f"| {b.cards} | `{b.url}` | {releases} | `{install_command(TESTED_TORCH, b.min_cc)}` |")
    return "\n".join(rows)


def coverage(
    torch_version: str | None,
    cuda_version: str | None,
    arch_list: list[str] | tuple[str, ...],
    cc: tuple[int, int] | None,
    device_type: str,
    device_label: str = "this device",
    simulated: bool = False,
    hip_version: str | None = None,
) -> Coverage:
    """Whether the torch build runs on the device, why, and what to install if it does not."""
    tv = torch_version or "unknown version"
    if device_type == "cpu":
        return Coverage(None, f"CPU device: torch {tv} needs no CUDA kernels")
    if torch_version is None:
        return Coverage(None, "torch is not importable, cannot check its kernels")
    if hip_version:
        return Coverage(None, f"torch {tv} is a ROCm build (HIP {hip_version}); NVIDIA arch coverage not checked")
    if cc is None:
        return Coverage(None, f"compute capability of {device_label} unknown; cannot check torch {tv}")
    sm = cc[0] * 10 + cc[1]
    where = f"a real {device_label}" if simulated else device_label
    # P40/GTX 10xx: no wheel has sm_61 SASS; the sm_60 kernels run on it (binary compatible within a major)
    via = " (its sm_60 kernels run on sm_61)" if cc == (6, 1) else ""
    if not cuda_version or not arch_list:
        cmd = install_command(torch_version, cc)
        what = "is a CPU-only build" if not cuda_version else f"(CUDA {cuda_version}) reports no CUDA architectures"
        return Coverage(
            False,
            f"torch {tv} {what}: it has no CUDA kernels at all",
            f"on {where} (sm_{sm}) install a CUDA torch with kernels for sm_{sm}: {cmd}{via}",
        )
    if covers(arch_list, cc):
        return Coverage(True, f"torch {tv} (CUDA {cuda_version}) runs on sm_{sm}: {_how_covered(arch_list, cc)}")
    cmd = install_command(torch_version, cc)
    why = f"torch {tv} (CUDA {cuda_version}) has kernels for {', '.join(arch_list)}; none runs on sm_{sm}"
    cuda_major = _version_tuple(cuda_version + ".0")
    if cuda_major and cuda_major[0] >= 13 and cc < (7, 5):
        why += " (CUDA 13 cannot target below sm_75)"
    why += '; kernels would fail with "no kernel image is available for execution on the device"'
    advice = f"on {where} (sm_{sm}) install a build with sm_{sm} kernels: {cmd}{via}"
    vt = _version_tuple(torch_version)
    if cc < (7, 5) and vt is not None and vt > LAST_CU126_RELEASE:
        last = f"{LAST_CU126_RELEASE[0]}.{LAST_CU126_RELEASE[1]}"
        advice += f" (torch {vt[0]}.{vt[1]} has no official wheels for sm_{sm}; {last} is the last)"
    return Coverage(False, why, advice)


def coverage_of(profile: DeviceProfile) -> Coverage:
    """`coverage()` from the torch facts detect() recorded in the profile (no second look at torch)."""
    build = TorchBuild(
        version=profile.torch_version,
        cuda=profile.torch_cuda_version,
        hip=profile.torch_hip_version,
        arch_list=profile.torch_arch_list,
        error=profile.torch_error,
    )
    return coverage_for(build, profile)


def coverage_for(build: TorchBuild, profile: DeviceProfile) -> Coverage:
    """`coverage()` from a TorchBuild and a DeviceProfile."""
    if build.error and build.version is None:
        return Coverage(None, build.error)
    label = profile.name
    if profile.simulated:  # 'p40' -> 'Tesla P40' in the advice
        from verl_compat.catalog import CATALOG

        entry = CATALOG.get(profile.name)
        label = entry.model if entry else label
    return coverage(
        build.version,
        build.cuda,
        build.arch_list,
        profile.compute_capability,
        profile.device_type,
        device_label=label,
        simulated=profile.simulated,
        hip_version=build.hip,
    )

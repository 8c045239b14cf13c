"""Optional packages: installed (from metadata, without importing them) and usable on *this* profile.

"Importable is not usable": flash-attn imports on a V100 and then raises "FlashAttention only supports Ampere
GPUs or newer" at the first call; an xformers wheel built for another torch imports and has no C++ ops.
Every rule below states the actual and the required value. Probing never raises: a failing probe gives
usable=False with reason "could not check: ...".
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from verl_compat import probe_cache
from verl_compat.capabilities import CUDA_MIN_CC, NATIVE_BF16_CC, requirement
from verl_compat.catalog import triton_officially_supported
from verl_compat.profile import DeviceProfile, PackageStatus
from verl_compat.torch_build import TorchBuild, base_version

logger = logging.getLogger("verl_compat.packages")

PACKAGE_NAMES: tuple[str, ...] = ("flash_attn", "xformers", "vllm", "sglang", "triton", "liger_kernel")

# import name -> distribution names to look up, first match wins
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "flash_attn": ("flash-attn", "flash_attn"),
    "xformers": ("xformers",),
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "triton": ("triton", "pytorch-triton"),
    "liger_kernel": ("liger-kernel", "liger-kernel-nightly", "liger_kernel"),
}

Rule = Callable[[DeviceProfile, TorchBuild, str | None], tuple[list[str], list[str]]]  # -> (reasons, notes)


def find_installed(name: str) -> tuple[bool, str | None, str | None]:
    """(installed, version, distribution name) from package metadata; falls back to find_spec (no import)."""
    for dist in DISTRIBUTIONS.get(name, (name,)):
        try:
            return True, metadata.version(dist), dist
        except metadata.PackageNotFoundError:
            continue
    # a top-level find_spec locates the package without executing it (e.g. a source checkout on sys.path)
    return importlib.util.find_spec(name) is not None, None, None


def torch_pin(dist: str | None) -> str | None:
    """The exact `torch==X` a wheel was built against, from its metadata (xformers/vllm/sglang pin torch)."""
    if dist is None:
        return None
    for req in metadata.requires(dist) or []:
        m = re.match(r"\s*torch\s*\(?\s*==\s*([0-9][^,;)\s]*)", req)
        if m and "extra ==" not in req:
            return m.group(1)
    return None


def _cc_str(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "unknown"


def _cuda_reasons(profile: DeviceProfile, what: str) -> list[str]:
    """Reasons shared by every CUDA-only package."""
    if profile.device_type != "cuda":
        return [f"{what} needs a CUDA device; this device is {profile.device_type}"]
    if profile.torch_covers_device is False:
        return [f"the installed torch has no kernels for sm_{profile.sm} (see the torch section)"]
    return []


def _needs_cc(profile: DeviceProfile, minimum: tuple[int, int], what: str) -> list[str]:
    cc = profile.compute_capability
    if cc is None or cc >= minimum:
        return []
    return [f"{what} needs compute capability >= {_cc_str(minimum)}; device has {_cc_str(cc)}"]


def _torch_pin_reasons(build: TorchBuild, dist: str | None, name: str) -> list[str]:
    pin = torch_pin(dist)
    have = base_version(build.version)
    if pin and have and base_version(pin) != have:
        return [f"{name} was built for torch=={pin}, installed torch is {build.version}: its compiled ops won't load"]
    return []


def _needs(profile: DeviceProfile, name: str) -> list[str]:
    """The compute-capability reason of requirement `name` (capabilities.REQUIREMENTS), with the package's words."""
    req = requirement(name)
    return _needs_cc(profile, req.min_cc, req.quoted()) if req.min_cc else []


def _flash_attn(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    reasons = _needs(profile, "flash_attn")
    reasons += _cuda_reasons(profile, "flash-attn")
    if not reasons and importlib.util.find_spec("flash_attn_2_cuda") is None:
        reasons.append("its CUDA extension flash_attn_2_cuda is not installed")
    return reasons, []


def _xformers(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    reasons = _cuda_reasons(profile, "xformers")
    # cutlass fMHA runs on sm_50+ (P100 and up, SIMT below sm_70); prebuilt wheels >= 0.0.31 dropped sm_70 and
    # older, following torch (xformers CHANGELOG). torch's own aten::_efficient_attention is the same kernel.
    reasons += _needs(profile, "xformers")
    version = _installed_version("xformers")
    cc = profile.compute_capability
    since, floor = requirement("xformers").wheel_floor or ((), (0, 0))
    if cc is not None and cc < floor and _version_at_least(version, since):
        reasons.append(
            f"xformers {version} wheels dropped V100 and older (since {'.'.join(map(str, since))}); device has "
            f"{_cc_str(cc)}. torch's own memory-efficient SDPA kernel serves instead"
        )
    reasons += _torch_pin_reasons(build, dist, "xformers")
    if not reasons and build.cuda:
        reasons += _xformers_cpp_ops(build.version, version)
    return reasons, []


def _vllm(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    reasons = _needs(profile, "vllm")
    reasons += _cuda_reasons(profile, "vLLM")
    cc = profile.compute_capability
    cuda_floor = CUDA_MIN_CC.get(_cuda_major(build.cuda), (0, 0))
    if not reasons and cc is not None and cc < cuda_floor:
        reasons.append(
            f"a CUDA {build.cuda} vLLM/torch cannot target sm_{profile.sm} "
            f"(CUDA {_cuda_major(build.cuda)} starts at sm_{cuda_floor[0]}{cuda_floor[1]})"
        )
    reasons += _torch_pin_reasons(build, dist, "vLLM")
    notes = []
    if cc is not None and cc < NATIVE_BF16_CC:
        notes.append("no bf16 below sm_80: use dtype=float16/float32; attention falls back to TRITON_ATTN")
    return reasons, notes


def _sglang(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    reasons = _needs(profile, "sglang")
    reasons += _cuda_reasons(profile, "SGLang")
    reasons += _torch_pin_reasons(build, dist, "SGLang")
    return reasons, []


def _triton(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    if profile.device_type != "cuda":
        # Inductor on CPU generates C++, not Triton: Triton being installed does not help here
        return [f"Triton compiles GPU kernels and needs a CUDA device; this device is {profile.device_type}"], []
    reasons = _needs(profile, "triton")
    reasons += _cuda_reasons(profile, "Triton")
    notes = []
    if not reasons and not triton_officially_supported(profile.compute_capability):
        notes.append(requirement("triton").note)
    return reasons, notes


def _liger(profile: DeviceProfile, build: TorchBuild, dist: str | None) -> tuple[list[str], list[str]]:
    if not find_installed("triton")[0]:
        return ["Liger kernels are Triton kernels and triton is not installed"], []
    reasons, notes = _triton(profile, build, None)
    return [f"Liger kernels are Triton kernels: {r}" for r in reasons], notes


RULES: dict[str, Rule] = {
    "flash_attn": _flash_attn,
    "xformers": _xformers,
    "vllm": _vllm,
    "sglang": _sglang,
    "triton": _triton,
    "liger_kernel": _liger,
}


def hardware_reasons(name: str, profile: DeviceProfile) -> list[str]:
    """Device-only reasons a package cannot run on `profile`, whether or not it is installed."""
    req = requirement(name)
    if profile.device_type != "cuda":
        return [f"{req.label} needs a CUDA device; this device is {profile.device_type}"]
    return _needs_cc(profile, req.min_cc or (0, 0), req.label)


def _installed_version(name: str) -> str | None:
    return find_installed(name)[1]


def _version_at_least(version: str | None, minimum: tuple[int, ...]) -> bool:
    if not version:
        return False
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[: len(minimum)]]
    return tuple(parts) >= minimum


def _cuda_major(cuda: str | None) -> int:
    m = re.match(r"(\d+)", cuda or "")
    return int(m.group(1)) if m else 0


def _binaries(package: str, pattern: str) -> list[Path]:
    """The package's compiled libraries matching `pattern`, found without importing it."""
    spec = importlib.util.find_spec(package)
    where = list(spec.submodule_search_locations or []) if spec else []
    return [f for d in where for f in Path(d).glob(pattern)]


XFORMERS_PROBE = "xformers_cpp_ops"


@functools.cache
def _xformers_cpp_ops(torch_version: str | None, xformers_version: str | None) -> list[str]:
    """Load xformers' C++ ops beside the installed torch in a subprocess (a bad binary cannot crash us), once
    per install: the answer is cached on disk by `probe_cache` (the subprocess imports torch and xformers)."""
    key = {
        "python": sys.executable,
        "torch": torch_version,
        "xformers": xformers_version,
        "binaries": probe_cache.file_stamps(_binaries("xformers", "*.so") + _binaries("torch", "lib/libtorch*.so")),
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),  # where the ops' own libraries are found
    }
    reasons = probe_cache.cached(XFORMERS_PROBE, key, _probe_xformers_cpp_ops)
    if reasons:  # say where the answer is kept: a fix outside these files (a driver, a library) needs a re-check
        kept = probe_cache.path(XFORMERS_PROBE)
        reasons = [*reasons, f"checked once per install, kept in {kept} (delete it to check again)"]
    return reasons


def _probe_xformers_cpp_ops() -> tuple[list[str], bool]:
    """(reasons, whether to keep them): a check that could not run is not an answer about the install."""
    code = (
        "import json, xformers\n"
        "exc = getattr(getattr(xformers, '_cpp_lib', None), '_cpp_library_load_exception', None)\n"
        "print(json.dumps({'has_cpp': getattr(xformers, '_has_cpp_library', None), 'exc': str(exc or '')}))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"could not check xformers' C++ ops: {type(e).__name__}: {e}"], False
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [f"importing xformers failed: {tail}"], True
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result.get("has_cpp") is False:
        return [f"xformers' C++/CUDA ops do not load with this torch: {result.get('exc') or 'unknown error'}"], True
    return [], True


def probe_package(name: str, profile: DeviceProfile, build: TorchBuild) -> PackageStatus:
    """One package's status on `profile`; never raises."""
    installed, version = False, None
    try:
        installed, version, dist = find_installed(name)
        if not installed:
            return PackageStatus(name=name, installed=False)
        rule = RULES.get(name)
        reasons, notes = rule(profile, build, dist) if rule else ([], [])
        return PackageStatus(
            name=name,
            installed=True,
            version=version,
            usable=not reasons,
            reason="; ".join(reasons),
            note="; ".join(notes),
        )
    except Exception as e:  # a probe bug must not take detection down; the doctor shows it
        logger.debug("probe of %s failed", name, exc_info=True)
        return PackageStatus(
            name=name, installed=installed, version=version, usable=False, reason=f"could not check: {e!r}"
        )


def probe_packages(profile: DeviceProfile, build: TorchBuild) -> dict[str, PackageStatus]:
    """Status of every optional package on `profile` (whose torch_* fields are already filled in)."""
    return {name: probe_package(name, profile, build) for name in PACKAGE_NAMES}

"""`detect()`: the DeviceProfile of this process, built once per process and never raising.

`VERL_COMPAT_DEVICE=<catalog name>` makes every process (driver and Ray workers) see that profile: hardware
facts from the catalog, software facts (torch build, packages) from this machine. An unknown name is a user
error and raises UnknownDeviceProfileError listing the valid names. `auto` or unset detects the real device:
torch.cuda first, then `nvidia-smi` (a Ray driver may see no GPU through torch), else the CPU.

Apart from the card decided for, detect keeps the machine used, each built once per process: `host()` (cores,
memory, whether a real accelerator exists; verl_compat.machine) and `real_device()` (the real card's hardware
profile, whatever VERL_COMPAT_DEVICE says).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Callable

from verl_compat import catalog, machine
from verl_compat.packages import probe_packages
from verl_compat.profile import DeviceProfile
from verl_compat.torch_build import TorchBuild, coverage_for, read_torch_build

logger = logging.getLogger("verl_compat.detect")

ENV_VAR = "VERL_COMPAT_DEVICE"
NVIDIA_SMI_QUERY = ["--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"]
# drivers older than ~510 reject the compute_cap field: ask again without it (cc stays None)
NVIDIA_SMI_QUERY_NO_CAP = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
NVIDIA_SMI_TIMEOUT_S = 10

Runner = Callable[[list[str]], str]  # runs a command, returns stdout; injectable for tests


def detect() -> DeviceProfile:
    """Profile of this process's device, or the simulated one named by VERL_COMPAT_DEVICE (cached per value)."""
    return _detect_cached(requested_profile_name())


def requested_profile_name() -> str | None:
    value = os.environ.get(ENV_VAR, "").strip()
    return None if value.lower() in ("", "auto") else value


def reset_cache() -> None:
    """Forget cached profiles and host facts (tests change VERL_COMPAT_DEVICE or fake the hardware)."""
    _detect_cached.cache_clear()
    host.cache_clear()
    real_device.cache_clear()


@functools.cache
def host() -> machine.HostFacts:
    """The machine this process runs on (not the simulated card); cheap: no CUDA context is created."""
    return machine.probe_host()


@functools.cache
def real_device() -> DeviceProfile:
    """The real device's hardware profile (the first visible GPU, else the CPU), even when a card is simulated."""
    return detect_hardware()


@functools.cache
def _detect_cached(requested: str | None) -> DeviceProfile:
    if requested is not None:
        profile = simulated_profile(requested)  # unknown name raises: loud by design
    else:
        profile = with_software(real_device())
    logger.debug("device profile: %s", profile.describe())
    return profile


def simulated_profile(name: str, build: TorchBuild | None = None) -> DeviceProfile:
    """Catalog hardware facts + this machine's torch build and packages."""
    return with_software(catalog.get_profile(name), build)


def with_software(profile: DeviceProfile, build: TorchBuild | None = None) -> DeviceProfile:
    """Fill the torch_* and packages fields from the running process; never raises."""
    try:
        build = build or read_torch_build()
        cov = coverage_for(build, profile)
        profile = dataclasses.replace(
            profile,
            torch_version=build.version,
            torch_cuda_version=build.cuda,
            torch_arch_list=tuple(build.arch_list),
            torch_covers_device=cov.covers,
            torch_hip_version=build.hip,
            torch_error=build.error,
        )
        return dataclasses.replace(profile, packages=probe_packages(profile, build))
    except Exception:
        logger.warning("could not read the torch build / packages; leaving those fields empty", exc_info=True)
        return profile


def detect_hardware(run: Runner | None = None) -> DeviceProfile:
    """The real device, hardware facts only: torch.cuda, then nvidia-smi, then CPU. Never raises."""
    for probe in (_from_torch_cuda, lambda: _from_nvidia_smi(run or _run)):
        try:
            profile = probe()
        except Exception:
            logger.debug("device probe failed", exc_info=True)
            continue
        if profile is not None:
            return profile
    return cpu_profile()


def cpu_profile() -> DeviceProfile:
    return DeviceProfile(name="cpu", vendor="cpu", device_type="cpu", device_count=0)


def profile_from_properties(props: object, device_count: int) -> DeviceProfile:
    """Build a profile from `torch.cuda.get_device_properties(i)` (or any object with the same attributes)."""
    name = getattr(props, "name", None) or "cuda"
    major, minor = getattr(props, "major", None), getattr(props, "minor", None)
    cc = (int(major), int(minor)) if major is not None and minor is not None else None
    # shared_memory_per_block_optin appeared in torch 2.x; older builds leave it None
    return DeviceProfile(
        name=name,
        vendor="nvidia",
        device_type="cuda",
        compute_capability=cc,
        total_memory_bytes=getattr(props, "total_memory", None),
        shared_memory_per_block_optin=getattr(props, "shared_memory_per_block_optin", None),
        sm_count=getattr(props, "multi_processor_count", None),
        device_count=device_count,
        **catalog.hardware_traits(cc, name),
    )


def _from_torch_cuda() -> DeviceProfile | None:
    import torch

    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):
        logger.debug("ROCm torch: not an NVIDIA device, treating as unknown CUDA-like device")
    return profile_from_properties(torch.cuda.get_device_properties(0), torch.cuda.device_count())


def parse_nvidia_smi(text: str, with_cap: bool = True) -> list[dict[str, object]]:
    """Rows of `index, name[, compute_cap], memory.total` (nounits: MiB). Unreadable fields become None."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < (4 if with_cap else 3):
            continue
        tail = 2 if with_cap else 1
        index, name, mem = parts[0], ", ".join(parts[1:-tail]), parts[-1]
        cap = parts[-2] if with_cap else ""
        cc = None
        major, _, minor = cap.partition(".")
        if major.isdigit() and minor.isdigit():
            cc = (int(major), int(minor))
        mem_mib = mem.split()[0] if mem else ""
        rows.append(
            {
                "index": int(index) if index.isdigit() else None,
                "name": name or None,
                "compute_capability": cc,
                "total_memory_bytes": int(mem_mib) * 2**20 if mem_mib.isdigit() else None,
            }
        )
    return rows


def _visible(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Honour CUDA_VISIBLE_DEVICES when it lists indices; an empty value (Ray driver) keeps the driver's view."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids or not all(i.isdigit() for i in ids):
        return rows
    wanted = [int(i) for i in ids]
    by_index = {r["index"]: r for r in rows}
    return [by_index[i] for i in wanted if i in by_index]


def _run(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True)
    return out.stdout


def _from_nvidia_smi(run: Runner) -> DeviceProfile | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        rows = parse_nvidia_smi(run([exe, *NVIDIA_SMI_QUERY]))
    except subprocess.CalledProcessError:
        logger.debug("nvidia-smi rejected compute_cap; retrying without it", exc_info=True)
        rows = parse_nvidia_smi(run([exe, *NVIDIA_SMI_QUERY_NO_CAP]), with_cap=False)
    rows = _visible(rows)
    if not rows:
        return None
    first = rows[0]
    cc = first["compute_capability"]
    name = str(first["name"] or "cuda")
    return DeviceProfile(
        name=name,
        vendor="nvidia",
        device_type="cuda",
        compute_capability=cc,  # type: ignore[arg-type]
        total_memory_bytes=first["total_memory_bytes"],  # type: ignore[arg-type]
        device_count=len(rows),
        **catalog.hardware_traits(cc, name),  # type: ignore[arg-type]
    )

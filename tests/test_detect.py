"""detect(), the torch build check and the package probes, on a CPU machine with fake inputs."""

from __future__ import annotations

import dataclasses
import importlib
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verl_compat.catalog import get_profile, profile_names
from verl_compat.detect import (
    ENV_VAR,
    detect,
    detect_hardware,
    parse_nvidia_smi,
    profile_from_properties,
    reset_cache,
    simulated_profile,
)
from verl_compat.errors import UnknownDeviceProfileError
from verl_compat.profile import DeviceProfile
from verl_compat.torch_build import TorchBuild, coverage, covers, install_command, parse_arch_list

# `verl_compat.detect` (the package attribute) is the function; the module is reached through importlib.
detect_mod = importlib.import_module("verl_compat.detect")
packages_mod = importlib.import_module("verl_compat.packages")

CPU_TORCH = torch.version.cuda is None and not torch.cuda.is_available()
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


# detect() -------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not CPU_TORCH, reason="needs a machine without a GPU")
def test_detect_on_this_machine_is_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect_mod.shutil, "which", lambda _name: None)  # no nvidia-smi fallback either
    p = detect()
    assert p.device_type == "cpu" and p.name == "cpu"
    assert p.simulated is False
    assert p.compute_capability is None and p.device_count == 0
    assert p.torch_version == torch.__version__
    assert p.torch_covers_device is None
    assert set(p.packages) == {"flash_attn", "xformers", "vllm", "sglang", "triton", "liger_kernel"}


@pytest.mark.parametrize(
    "name,cc,bf16,triton",
    [("p40", (6, 1), False, False), ("v100", (7, 0), False, True), ("a100", (8, 0), True, True)],
)
def test_simulated_profiles(monkeypatch: pytest.MonkeyPatch, name: str, cc, bf16: bool, triton: bool) -> None:
    monkeypatch.setenv(ENV_VAR, name)
    p = detect()
    assert p.name == name and p.simulated is True and p.device_type == "cuda"
    assert p.compute_capability == cc
    assert p.native_bf16 is bf16
    assert p.triton_capable is triton
    # software facts come from this process, not the catalog
    assert p.torch_version == torch.__version__
    assert p.torch_arch_list == tuple(torch.cuda.get_arch_list())
    if CPU_TORCH:
        assert p.torch_covers_device is False
    assert not p.usable("flash_attn") or bf16


def test_detect_is_cached_per_env_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "t4")
    first = detect()
    assert detect() is first
    monkeypatch.setenv(ENV_VAR, "p100")
    assert detect().name == "p100"
    monkeypatch.setenv(ENV_VAR, "t4")
    assert detect() is first
    reset_cache()
    assert detect() is not first


def test_unknown_device_env_is_loud(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "gtx9999")
    with pytest.raises(UnknownDeviceProfileError) as e:
        detect()
    for name in profile_names():
        assert name in str(e.value)


def test_auto_means_real_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "auto")
    assert detect().simulated is False


def test_simulated_profile_round_trips() -> None:
    for name in profile_names():
        p = simulated_profile(name)
        assert DeviceProfile.from_json(p.to_json()) == p


def test_profile_from_properties() -> None:
    props = SimpleNamespace(
        name="NVIDIA GeForce GTX 1660 Ti", major=7, minor=5, total_memory=6143 * 2**20, multi_processor_count=24
    )
    p = profile_from_properties(props, device_count=2)
    assert p.compute_capability == (7, 5) and p.device_count == 2 and p.sm_count == 24
    assert p.shared_memory_per_block_optin is None  # attribute missing on old torch: None, not a guess
    assert p.tensor_cores is False and p.fast_fp16 is False and p.triton_capable is True
    props.shared_memory_per_block_optin = 65536
    assert profile_from_properties(props, 1).shared_memory_per_block_optin == 65536


def test_detect_hardware_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom():
        raise RuntimeError("CUDA driver exploded")

    monkeypatch.setattr(detect_mod, "_from_torch_cuda", boom)
    monkeypatch.setattr(detect_mod.shutil, "which", lambda _name: None)
    assert detect_hardware().device_type == "cpu"


def test_parse_nvidia_smi() -> None:
    rows = parse_nvidia_smi("0, Tesla P40, 6.1, 22919\n1, NVIDIA GeForce RTX 3060, 8.6, 12288\nbad line\n")
    assert rows[0] == {"index": 0, "name": "Tesla P40", "compute_capability": (6, 1), "total_memory_bytes": 22919 << 20}
    assert rows[1]["compute_capability"] == (8, 6)
    assert len(rows) == 2
    odd = parse_nvidia_smi("0, Tesla P40, [N/A], [N/A]\n")
    assert odd[0]["compute_capability"] is None and odd[0]["total_memory_bytes"] is None


def test_nvidia_smi_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect_mod, "_from_torch_cuda", lambda: None)  # the Ray driver sees no GPU through torch
    monkeypatch.setattr(detect_mod.shutil, "which", lambda _name: "/usr/bin/nvidia-smi")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    out = "0, Tesla P40, 6.1, 22919\n1, Tesla V100-SXM2-16GB, 7.0, 16160\n"
    p = detect_hardware(run=lambda cmd: out)
    assert p.device_type == "cuda" and p.name == "Tesla V100-SXM2-16GB"
    assert p.compute_capability == (7, 0) and p.device_count == 1
    assert p.sm_count is None and p.shared_memory_per_block_optin is None

    def old_driver(cmd: list[str]) -> str:
        if any("compute_cap" in c for c in cmd):
            raise subprocess.CalledProcessError(2, cmd)
        return "0, Tesla P40, 22919\n"

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    p = detect_hardware(run=old_driver)
    assert p.name == "Tesla P40" and p.compute_capability is None and p.total_memory_bytes == 22919 << 20


# torch build ----------------------------------------------------------------------------------------------------
def test_parse_arch_list() -> None:
    assert parse_arch_list(["sm_60", "sm_90a", "compute_120", "gfx90a"]) == ({60, 90}, {120})


@pytest.mark.parametrize("cc", [(6, 0), (6, 1), (7, 0)])
def test_cu130_does_not_cover_pascal_volta(cc) -> None:
    assert covers(CU130, cc) is False


@pytest.mark.parametrize("cc", [(6, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0)])
def test_cu126_covers_old_cards(cc) -> None:
    assert covers(CU126, cc) is True


def test_cu130_covers_turing_and_newer() -> None:
    assert covers(CU130, (7, 5)) and covers(CU130, (8, 0)) and covers(CU130, (12, 0))


def test_ptx_jit() -> None:
    assert covers(["sm_80", "compute_80"], (9, 0)) is True  # JIT from PTX
    assert covers(["sm_80", "compute_80"], (7, 5)) is False  # PTX never runs on an older device
    assert covers(["sm_80"], (9, 0)) is False  # SASS does not cross majors
    assert covers([], (8, 0)) is False


def test_cpu_torch_on_simulated_p40_says_what_to_install() -> None:
    cov = coverage("2.13.0+cpu", None, [], (6, 1), "cuda", device_label="Tesla P40", simulated=True)
    assert cov.covers is False
    assert "no CUDA kernels" in cov.reason
    assert "a real Tesla P40" in cov.advice and "sm_61" in cov.advice
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" in cov.advice


def test_cu130_torch_on_v100() -> None:
    cov = coverage("2.11.0+cu130", "13.0", CU130, (7, 0), "cuda", device_label="Tesla V100")
    assert cov.covers is False
    assert "CUDA 13" in cov.reason and "no kernel image" in cov.reason
    assert "whl/cu126" in cov.advice and "torch==2.11.0" in cov.advice


def test_covered_device_reason() -> None:
    cov = coverage("2.11.0+cu126", "12.6", CU126, (6, 1), "cuda")
    assert cov.covers is True and "sm_60" in cov.reason and cov.advice is None
    assert "sm_70 kernels" in coverage("2.11.0+cu126", "12.6", CU126, (7, 0), "cuda").reason


def test_coverage_not_applicable() -> None:
    assert coverage("2.13.0+cpu", None, [], None, "cpu").covers is None
    assert coverage(None, None, [], (6, 1), "cuda").covers is None
    assert coverage("2.6.0+rocm6.2", None, ["gfx90a"], (9, 0), "cuda", hip_version="6.2").covers is None


def test_install_command() -> None:
    assert install_command("2.13.0+cu130", (7, 0)).endswith("whl/cu126")
    assert "2.14.*" in install_command("2.15.0+cu132", (6, 1))  # no official sm_61 wheels after 2.14
    assert install_command("2.13.0+cpu", (7, 5)) == (
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130"
    )


def test_only_pytorch_index_urls_in_sources() -> None:
    src = Path(__file__).resolve().parents[1] / "verl_compat"
    for f in ("torch_build.py", "packages.py", "doctor.py", "detect.py", "catalog.py"):
        for url in re.findall(r"https?://[^\s'\")]+", (src / f).read_text()):
            assert url.startswith("https://download.pytorch.org/whl/"), (f, url)


# packages -------------------------------------------------------------------------------------------------------
def _fake_installed(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str]) -> None:
    def fake(name: str):
        return (name in versions, versions.get(name), None)

    monkeypatch.setattr(packages_mod, "find_installed", fake)


def _covered(name: str) -> DeviceProfile:
    return dataclasses.replace(get_profile(name), torch_covers_device=True)


CUDA_BUILD = TorchBuild(version="2.11.0+cu126", cuda="12.6", arch_list=tuple(CU126))


def test_not_installed_is_not_usable_without_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {})
    st = packages_mod.probe_package("flash_attn", _covered("a100"), CUDA_BUILD)
    assert (st.installed, st.usable, st.reason) == (False, False, "")


def test_flash_attn_needs_ampere(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {"flash_attn": "2.8.3"})
    st = packages_mod.probe_package("flash_attn", _covered("v100"), CUDA_BUILD)
    assert st.installed and not st.usable
    assert ">= 8.0" in st.reason and "7.0" in st.reason


def test_triton_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {"triton": "3.5.0", "liger_kernel": "0.6.0"})
    cpu = packages_mod.probe_package("triton", get_profile("cpu"), TorchBuild(version="2.13.0+cpu"))
    assert cpu.installed and not cpu.usable and "CUDA device" in cpu.reason
    p40 = packages_mod.probe_package("triton", _covered("p40"), CUDA_BUILD)
    assert not p40.usable and ">= 7.0" in p40.reason and "6.1" in p40.reason
    t4 = packages_mod.probe_package("triton", _covered("t4"), CUDA_BUILD)
    assert t4.usable and "8.0+" in t4.note
    h100 = packages_mod.probe_package("triton", _covered("h100"), CUDA_BUILD)
    assert h100.usable and h100.note == ""
    liger = packages_mod.probe_package("liger_kernel", _covered("p40"), CUDA_BUILD)
    assert not liger.usable and "Triton" in liger.reason


def test_uncovered_torch_makes_cuda_packages_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {"triton": "3.5.0"})
    prof = dataclasses.replace(get_profile("h100"), torch_covers_device=False)
    st = packages_mod.probe_package("triton", prof, TorchBuild(version="2.13.0+cpu"))
    assert not st.usable and "no kernels for sm_90" in st.reason


def test_vllm_and_sglang_floors(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {"vllm": "0.20.0", "sglang": "0.5.19"})
    cu130 = TorchBuild(version="2.11.0+cu130", cuda="13.0", arch_list=tuple(CU130))
    assert "CUDA 13" in packages_mod.probe_package("vllm", _covered("v100"), cu130).reason
    assert ">= 7.0" in packages_mod.probe_package("vllm", _covered("p100"), CUDA_BUILD).reason
    t4 = packages_mod.probe_package("vllm", _covered("t4"), cu130)
    assert t4.usable and "float16" in t4.note
    assert ">= 7.5" in packages_mod.probe_package("sglang", _covered("v100"), CUDA_BUILD).reason


def test_xformers_wheels_dropped_old_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_installed(monkeypatch, {"xformers": "0.0.33"})
    st = packages_mod.probe_package("xformers", _covered("p40"), CUDA_BUILD)
    assert not st.usable and "0.0.31" in st.reason


def test_probe_failure_becomes_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a):
        raise RuntimeError("metadata is corrupt")

    monkeypatch.setattr(packages_mod, "find_installed", boom)
    st = packages_mod.probe_package("vllm", _covered("a100"), CUDA_BUILD)
    assert st.usable is False and st.reason.startswith("could not check:") and "corrupt" in st.reason


def test_readme_torch_advice_is_the_table() -> None:
    """One table of torch builds: the README shows it and the doctor's command for an old card."""
    from verl_compat.torch_build import TESTED_TORCH, TORCH_BUILDS, readme_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert readme_table() in readme
    old_card = install_command(TESTED_TORCH, (6, 1))
    assert old_card in readme and "cu126" in old_card
    assert f"pip install torch=={TESTED_TORCH} && " in readme  # the dev install line uses the same torch
    assert TORCH_BUILDS[0].last_release == (2, 14)
    assert "2.11.0" not in readme


def test_host_facts_are_the_machine_not_the_simulated_card(monkeypatch: pytest.MonkeyPatch) -> None:
    """The card decided for (p40, simulated) apart from the machine used, each built once by detect."""
    from verl_compat.detect import host, real_device

    monkeypatch.setenv(ENV_VAR, "p40")
    assert detect().name == "p40" and detect().simulated
    facts = host()
    assert facts is host()  # once per process
    assert facts.cpu_count and facts.cpu_count >= 1 and facts.memory_bytes and facts.memory_bytes > 2**28
    if CPU_TORCH and shutil.which("nvidia-smi") is None:
        assert facts.accelerator is False and facts.accelerator_via is None
        assert real_device().device_type == "cpu" and real_device().simulated is False

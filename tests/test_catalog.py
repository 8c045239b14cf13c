"""Catalog figures and the unknown-name error."""

from __future__ import annotations

import pytest

from verl_compat.catalog import CATALOG, get_entry, get_profile, hardware_traits, profile_names
from verl_compat.errors import UnknownDeviceProfileError
from verl_compat.profile import DeviceProfile

KIB = 1024

# name: (cc, smem opt-in, SMs, native_bf16, fast_fp16, tensor_cores, triton_capable)
EXPECTED = {
    "p40": ((6, 1), 48 * KIB, 30, False, False, False, False),
    "p100": ((6, 0), 48 * KIB, 56, False, True, False, False),
    "v100": ((7, 0), 96 * KIB, 80, False, True, True, True),
    "v100-32gb": ((7, 0), 96 * KIB, 80, False, True, True, True),
    "t4": ((7, 5), 64 * KIB, 40, False, True, True, True),
    "rtx2080ti": ((7, 5), 64 * KIB, 68, False, True, True, True),
    "gtx1660": ((7, 5), 64 * KIB, 22, False, False, False, True),
    "gtx1660ti": ((7, 5), 64 * KIB, 24, False, False, False, True),
    "a100": ((8, 0), 166912, 108, True, True, True, True),
    "h100": ((9, 0), 232448, 132, True, True, True, True),
}


def test_catalog_has_every_expected_profile() -> None:
    assert set(profile_names()) == set(EXPECTED) | {"cpu"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_figures(name: str) -> None:
    cc, smem, sms, bf16, fp16, tc, triton = EXPECTED[name]
    p = get_profile(name)
    assert p.name == name
    assert p.simulated is True
    assert p.device_type == "cuda" and p.vendor == "nvidia"
    assert p.compute_capability == cc
    assert p.shared_memory_per_block_optin == smem
    assert p.sm_count == sms
    assert (p.native_bf16, p.fast_fp16, p.tensor_cores, p.triton_capable) == (bf16, fp16, tc, triton)
    assert p.device_count == 1
    assert p.total_memory_bytes is not None and p.total_memory_bytes % 2**20 == 0
    # hardware only: software facts are merged by detect()
    assert p.torch_version is None and p.packages == {}


def test_memory_figures() -> None:
    gib = {n: get_profile(n).total_memory_bytes / 2**30 for n in EXPECTED}
    assert 22 < gib["p40"] < 24.1
    assert 15.5 < gib["p100"] < 16.1
    assert 15.5 < gib["v100"] < 16.1
    assert 31 < gib["v100-32gb"] < 32.1
    assert 14.5 < gib["t4"] < 15.1
    assert 39 < gib["a100"] < 40.1
    assert 78 < gib["h100"] < 80.1


def test_bf16_only_from_ampere() -> None:
    for name, entry in CATALOG.items():
        cc = entry.profile.compute_capability
        assert entry.profile.native_bf16 == (cc is not None and cc >= (8, 0)), name


def test_cpu_profile() -> None:
    p = get_profile("cpu")
    assert p.device_type == "cpu" and p.is_cpu
    assert p.compute_capability is None
    assert not (p.native_bf16 or p.fast_fp16 or p.tensor_cores or p.triton_capable)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownDeviceProfileError) as e:
        get_profile("p41")
    msg = str(e.value)
    assert "p41" in msg
    for name in profile_names():
        assert name in msg
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("alias,key", [("P40", "p40"), (" Tesla_P40 ", "p40"), ("V100_32GB", "v100-32gb")])
def test_name_normalisation(alias: str, key: str) -> None:
    assert get_profile(alias) is CATALOG[key].profile


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_json_round_trip(name: str) -> None:
    p = get_profile(name)
    assert DeviceProfile.from_json(p.to_json()) == p
    assert get_entry(name).model


def test_traits_for_detected_names() -> None:
    assert hardware_traits((7, 5), "NVIDIA GeForce GTX 1660 Ti")["tensor_cores"] is False
    assert hardware_traits((7, 5), "Tesla T4")["tensor_cores"] is True
    assert hardware_traits((6, 0), "Tesla P100-PCIE-16GB")["fast_fp16"] is True
    assert hardware_traits((6, 1), "Tesla P40")["fast_fp16"] is False
    assert hardware_traits((6, 1), None)["triton_capable"] is False
    assert hardware_traits(None) == {
        "native_bf16": False,
        "tensor_cores": False,
        "fast_fp16": False,
        "triton_capable": False,
    }

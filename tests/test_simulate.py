"""A simulated card changes nothing where there is no real GPU, and never for a real card's profile."""

from __future__ import annotations

import dataclasses

from verl_compat.catalog import get_profile
from verl_compat.simulate import prepare_device


def test_no_cap_without_a_cuda_device():
    assert prepare_device(get_profile("p40")) is None  # this machine has no GPU


def test_no_cap_for_real_or_cpu_profiles():
    real = dataclasses.replace(get_profile("p40"), simulated=False)
    assert prepare_device(real) is None
    assert prepare_device(get_profile("cpu")) is None

"""A model section's HFModelConfig built ahead of its call site (the prestarted rollout server's warm-up), taken only
for the same section; a failed build leaves the call site to build and raise where verl does."""

from __future__ import annotations

from functools import partial

import pytest
from omegaconf import OmegaConf
from test_rollout_server import make_tiny_model_dir

from verl_compat.model_config_prebuilt import Prebuilt, section_key


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen"))


def _build():
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    return partial(omega_conf_to_dataclass, dataclass_type=HFModelConfig)


def _section(model_dir, **extra):
    return OmegaConf.create({"path": str(model_dir), "trust_remote_code": False, **extra})


def test_taken_once_for_an_equal_section(model_dir):
    prebuilt = Prebuilt(_section(model_dir), _build())
    early = prebuilt.value
    assert early is not None and early.tokenizer is not None and early.hf_config.model_type == "qwen2"
    # the call site gets its own copy of the section (through Ray): equal content is enough
    assert prebuilt.take(OmegaConf.create(OmegaConf.to_container(_section(model_dir)))) is early
    assert prebuilt.take(_section(model_dir)) is None  # handed over once


def test_changed_section_not_taken(model_dir):
    prebuilt = Prebuilt(_section(model_dir), _build())
    assert prebuilt.take(_section(model_dir, use_shm=False)) is None
    assert prebuilt.value is not None  # kept: not handed to a different section


def test_failed_build_kept_quiet_for_the_call_site(model_dir):
    prebuilt = Prebuilt(_section(model_dir / "missing"), _build())  # raised by the call site's own build
    assert prebuilt.value is None
    assert prebuilt.take(_section(model_dir / "missing")) is None


def test_section_key_is_plain_content_or_none():
    assert section_key(OmegaConf.create({"path": "${oc.env:VERL_COMPAT_TEST_UNSET_VAR}"})) is None  # never reused
    assert section_key(OmegaConf.create({"a": 1, "b": "${a}"})) == {"a": 1, "b": 1}
    assert section_key({"path": "m"}) == {"path": "m"} and section_key(object()) is None  # a built dataclass

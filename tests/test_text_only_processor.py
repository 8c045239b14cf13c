"""HFModelConfig's processor for a text-only model without the tokenizer's second load
(verl_compat.text_only_processor): the same answer as verl's hf_processor (None), and verl's call for everything
that is not certainly text-only."""

from __future__ import annotations

import json
import shutil

import pytest
from test_rollout_server import make_tiny_model_dir

import verl_compat.seams
from verl_compat.text_only_processor import PROCESSING_FILES, hf_processor, is_text_only


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture
def model_copy(text_model, tmp_path):
    return shutil.copytree(text_model, tmp_path / "model")


@pytest.fixture
def tokenizer_loads(monkeypatch):
    """The paths AutoTokenizer.from_pretrained is called with, in order."""
    import transformers

    loads = []
    real = transformers.AutoTokenizer.from_pretrained.__func__
    monkeypatch.setattr(
        transformers.AutoTokenizer,
        "from_pretrained",
        classmethod(lambda cls, *a, **k: loads.append(a) or real(cls, *a, **k)),
    )
    return loads


def _upstream_called(path, **kwargs):
    calls = []

    def upstream(name_or_path, **kw):
        calls.append((name_or_path, kw))
        return "upstream's answer"

    return hf_processor(upstream, path, **kwargs), calls


def test_text_only_folder_answers_like_verl_without_a_tokenizer_load(text_model, tokenizer_loads):
    from verl.utils import hf_processor as verls

    assert verls(str(text_model)) is None  # upstream: AutoProcessor falls back to the tokenizer, verl drops it
    assert len(tokenizer_loads) == 1
    assert is_text_only(str(text_model))
    assert verl_compat.seams.hf_processor(str(text_model), trust_remote_code=False) is None
    assert len(tokenizer_loads) == 1  # no load of ours


def test_verls_model_config_loads_the_tokenizer_once(text_model, tokenizer_loads):
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass

    section = OmegaConf.create({"_target_": "verl.workers.config.HFModelConfig", "path": str(text_model)})
    built = omega_conf_to_dataclass(section)
    assert built.tokenizer is not None and built.processor is None
    assert len(tokenizer_loads) == 1  # upstream: 2 (hf_tokenizer, then AutoProcessor's fallback)


@pytest.mark.parametrize("name", PROCESSING_FILES)
def test_a_processing_file_goes_to_verl(model_copy, name):
    (model_copy / name).write_text("{}")
    answer, calls = _upstream_called(str(model_copy), trust_remote_code=False)
    assert answer == "upstream's answer" and calls == [(str(model_copy), {"trust_remote_code": False})]


@pytest.mark.parametrize(
    "entry", [{"processor_class": "LlavaProcessor"}, {"auto_map": {"AutoProcessor": "proc.MyProcessor"}}]
)
def test_a_processor_named_by_the_tokenizer_or_model_config_goes_to_verl(model_copy, entry):
    for file in ("tokenizer_config.json", "config.json"):
        path = model_copy / file
        original = path.read_text()
        path.write_text(json.dumps({**json.loads(original), **entry}))
        assert not is_text_only(str(model_copy)), file
        path.write_text(original)
    assert is_text_only(str(model_copy))


def test_a_model_type_with_a_processor_goes_to_verl(model_copy):
    from transformers import Qwen2VLConfig

    Qwen2VLConfig().save_pretrained(model_copy)  # qwen2_vl: transformers maps it to Qwen2VLProcessor
    answer, calls = _upstream_called(str(model_copy))
    assert answer == "upstream's answer" and len(calls) == 1


def test_anything_uncertain_goes_to_verl(model_copy, tmp_path):
    assert not is_text_only("Qwen/Qwen2.5-0.5B-Instruct")  # a hub id: transformers resolves it
    assert not is_text_only(str(tmp_path / "missing"))
    (model_copy / "tokenizer_config.json").unlink()  # tokenizer.json alone
    assert not is_text_only(str(model_copy))
    (model_copy / "config.json").write_text("not json")
    answer, calls = _upstream_called(str(model_copy))
    assert answer == "upstream's answer" and len(calls) == 1

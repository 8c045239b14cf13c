"""verl's ``hf_processor`` without loading a text-only model's tokenizer a second time.

Why: verl's ``HFModelConfig`` loads the tokenizer (``hf_tokenizer``) and then the multimodal processor
(``hf_processor``), which calls ``AutoProcessor.from_pretrained``. For a text-only model transformers finds no
processor class and falls back to loading the tokenizer again, which verl then discards (returns None). For the
Qwen2.5 tokenizer that second load is half of each build: 1.46 of 2.85 s on the 2-core CPU, and the build runs in
the driver's ``_init_tokenizer`` and the trainer worker's ``init_model``, both on the start-up's critical path.

Here the fallback is recognised from the files alone, where transformers' own search would find nothing: a local
folder with no processor, image/video preprocessor or feature-extractor config, a tokenizer config without
``processor_class`` or an ``AutoProcessor`` entry in ``auto_map``, and a model config of a type with no processor in
transformers' ``PROCESSOR_MAPPING`` and neither of those keys. Then the answer is upstream's for a text-only model,
None, without the load. Anything else (a hub id, a multimodal model, a file that does not parse) goes to verl's
``hf_processor`` unchanged, so multimodal models get exactly upstream's processor.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import transformers.utils as transformers_utils

logger = logging.getLogger("verl_compat.text_only_processor")

# The files AutoProcessor looks for (its processor, image/feature-extractor and video configs), and a processor's
# saved chat template; any of them present sends the call to upstream
PROCESSING_FILES = (
    transformers_utils.PROCESSOR_NAME,
    transformers_utils.FEATURE_EXTRACTOR_NAME,  # also IMAGE_PROCESSOR_NAME
    transformers_utils.VIDEO_PROCESSOR_NAME,
    transformers_utils.LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE,
)


def _names_a_processor(values: dict[str, Any]) -> bool:
    auto_map = values.get("auto_map") or {}
    return values.get("processor_class") is not None or (isinstance(auto_map, dict) and "AutoProcessor" in auto_map)


def is_text_only(path: Any, trust_remote_code: bool = False) -> bool:
    """True only where ``AutoProcessor.from_pretrained(path)`` would find no processor class and fall back to the
    tokenizer; False where that is not certain."""
    if not isinstance(path, str | os.PathLike) or not os.path.isdir(path):
        return False
    if any(os.path.exists(os.path.join(path, name)) for name in PROCESSING_FILES):
        return False
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            if _names_a_processor(json.load(f)):
                return False
        from transformers import AutoConfig
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        if _names_a_processor(config.to_dict()) or type(config) in PROCESSOR_MAPPING:
            return False
    except Exception:  # no tokenizer config, an unreadable file, an unknown model type: upstream decides
        logger.debug("processor of %s left to verl's hf_processor", path, exc_info=True)
        return False
    return True


def hf_processor(upstream: Callable[..., Any], name_or_path: Any, **kwargs: Any) -> Any:
    """verl's ``hf_processor(name_or_path, **kwargs)``: None for a text-only model folder, else upstream's call."""
    if is_text_only(name_or_path, trust_remote_code=bool(kwargs.get("trust_remote_code", False))):
        return None
    return upstream(name_or_path, **kwargs)

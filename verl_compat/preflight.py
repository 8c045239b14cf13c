"""Cheap checks of a verl job config on the driver, before Ray starts or any model loads.

Without them a missing model folder, a missing data file, more GPUs per node than the host has or
`gpu_memory_utilization=1.5` fail 50-80 s later inside a Ray worker, in a traceback that names no key. Each check
here names the key, the device (or host), the reason and the fix. They only add: verl's own `validate_config`
still runs afterwards (divisibility of batch sizes and the like).

Everything is a file-system stat or a config read; the only network call is one hub lookup for a model id that
is neither a local folder nor in the local hub cache, and only when the hub is not switched off.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_compat.errors import InvalidSettingError

HUB_TIMEOUT_S = 10
_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "oss://")  # fetched by verl's copy_to_local or a custom loader
_DATA_SUFFIXES = (".parquet", ".json", ".jsonl")  # what verl's RLHFDataset reads (rl_dataset.py)


def check_files(config: Any, device: str) -> None:
    """Model folders, data and code files: before the policy, whose memory plan reads the model's config.json.
    Raises InvalidSettingError for the first that cannot work. `device` labels the messages."""
    for check in (_check_model_paths, _check_data_files, _check_code_files):
        check(config, device)


def check_settings(config: Any, device: str) -> None:
    """Fractions, sizes and devices per node: after the policy (the memory plan fills `auto` sizes)."""
    for check in (_check_ranges, _check_devices_per_node):
        check(config, device)


# Config access --------------------------------------------------------------------------------------------------
def _get(config: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=default, throw_on_missing=False)


def _truthy(config: Any, key: str) -> bool:
    return bool(_get(config, key, False))


# Fractions and sizes --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    """A numeric key and the values it may take. `upstream` is verl's default, named in the fix."""

    key: str
    low: float
    high: float = math.inf
    low_open: bool = False  # (low, ...] instead of [low, ...]
    integer: bool = False
    nullable: bool = False
    upstream: Any = None
    when: str | None = None  # only checked when this boolean key is true ("critic": when the job trains one)

    def text(self) -> str:
        if self.integer:
            return f"a whole number >= {int(self.low)}" if self.high == math.inf else f"{self.low}..{self.high}"
        left = "(" if self.low_open else "["
        return f"a number >= {self.low}" if self.high == math.inf else f"a fraction in {left}{self.low}, {self.high}]"

    def problem(self, value: Any) -> str | None:
        """None when `value` is in range, else what is wrong with it ("out of range", "not a number", ...)."""
        if value is None:
            return None if self.nullable else "unset"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "not a number"
        if self.integer and not float(value).is_integer():
            return "not a whole number"
        if not math.isfinite(float(value)):
            return "not finite"
        below = value <= self.low if self.low_open else value < self.low
        return "out of range" if below or value > self.high else None


_ROLLOUT = "actor_rollout_ref.rollout"
_ACTOR = "actor_rollout_ref.actor"
_RM = "reward.reward_model"
RANGES: tuple[Range, ...] = (
    # vLLM/SGLang reserve this fraction of the GPU for weights + KV cache; the hf engine ignores it
    Range(f"{_ROLLOUT}.gpu_memory_utilization", 0, 1, low_open=True, upstream=0.5),
    Range(f"{_RM}.rollout.gpu_memory_utilization", 0, 1, low_open=True, upstream=0.5, when=f"{_RM}.enable"),
    Range(f"{_ROLLOUT}.top_p", 0, 1, low_open=True, upstream=1.0),
    Range(f"{_ROLLOUT}.temperature", 0, upstream=1.0),
    Range(f"{_ROLLOUT}.n", 1, integer=True, upstream=1),
    Range(f"{_ROLLOUT}.tensor_model_parallel_size", 1, integer=True, upstream=2),
    Range("data.train_batch_size", 1, integer=True, upstream=1024),
    Range("data.max_prompt_length", 1, integer=True, upstream=512),
    Range("data.max_response_length", 1, integer=True, upstream=512),
    Range(f"{_ACTOR}.ppo_mini_batch_size", 1, integer=True, upstream=256),
    Range(f"{_ACTOR}.ppo_micro_batch_size_per_gpu", 1, integer=True, nullable=True),
    Range(f"{_ACTOR}.ppo_epochs", 1, integer=True, upstream=1),
    Range(f"{_ACTOR}.optim.lr", 0, upstream=1e-6),
    Range(f"{_ACTOR}.optim.lr_warmup_steps_ratio", 0, 1, upstream=0.0),
    Range(f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu", 1, integer=True, nullable=True),
    Range("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 1, integer=True, nullable=True),
    Range("critic.ppo_micro_batch_size_per_gpu", 1, integer=True, nullable=True, when="critic"),
    Range("critic.optim.lr", 0, upstream=1e-5, when="critic"),
    Range("trainer.n_gpus_per_node", 1, integer=True, upstream=8),
    Range("trainer.nnodes", 1, integer=True, upstream=1),
    Range("trainer.total_epochs", 1, integer=True, upstream=30),
    Range("trainer.total_training_steps", 1, integer=True, nullable=True),
)


def _check_ranges(config: Any, device: str) -> None:
    for r in RANGES:
        if r.when is not None and not (needs_critic(config) if r.when == "critic" else _truthy(config, r.when)):
            continue
        value = _get(config, r.key)
        why = r.problem(value)
        if why is None:
            continue
        fix = f"set {r.key} to {r.text()}"
        if r.upstream is not None:
            fix += f" (verl's default is {r.upstream})"
        raise InvalidSettingError(r.key, value, device, f"it must be {r.text()}; {value!r} is {why}", fix)


# Devices per node -----------------------------------------------------------------------------------------------
def host_gpu_count() -> int | None:
    """GPUs on this host (the real hardware, never a simulated profile); None on the CPU platform, where
    n_gpus_per_node counts worker processes and any number runs."""
    from verl_compat.cpu import cpu_platform_wanted
    from verl_compat.detect import real_device

    if cpu_platform_wanted():
        return None
    count = real_device().device_count
    return count or None


def devices_per_node_problem(config: Any) -> tuple[int, str, str] | None:
    """(the host's GPUs, reason, fix) when a single-node job asks for more GPUs per node than this host has (the
    doctor notes it beside the plan, which is per GPU; the job's start-up refuses it); else None."""
    key = "trainer.n_gpus_per_node"
    # a Ray cluster or several nodes: the GPUs of other hosts are Ray's business (upstream checks after ray.init)
    joins = _get(config, "ray_kwargs.ray_init.address") is not None or bool(os.environ.get("RAY_ADDRESS"))
    if joins or int(_get(config, "trainer.nnodes", 1) or 1) > 1:
        return None
    gpus = host_gpu_count()
    wanted = _get(config, key)
    if gpus is None or not isinstance(wanted, int) or wanted <= gpus:
        return None
    return (
        gpus,
        f"the job asks for {wanted} GPUs per node and this single-node run has {gpus}; Ray would place no worker",
        f"set {key}={gpus} (and trainer.nnodes=1), or join a Ray cluster with ray_kwargs.ray_init.address",
    )


def _check_devices_per_node(config: Any, device: str) -> None:
    problem = devices_per_node_problem(config)
    if problem is not None:
        gpus, reason, fix = problem
        key = "trainer.n_gpus_per_node"
        where = f"this host ({gpus} GPU{'s' if gpus != 1 else ''}; {device})"
        raise InvalidSettingError(key, _get(config, key), where, reason, fix)


# Model paths ----------------------------------------------------------------------------------------------------
def _model_keys(config: Any) -> Iterator[tuple[str, bool, bool]]:
    """(key, required, must hold a model config) for every model/tokenizer path the job will load."""
    yield "actor_rollout_ref.model.path", True, True
    yield "actor_rollout_ref.model.hf_config_path", False, True  # optional ones default to the model path
    yield "actor_rollout_ref.model.tokenizer_path", False, False
    yield "data.tokenizer", False, False
    if needs_critic(config):
        yield "critic.model.path", True, True
        yield "critic.model.tokenizer_path", False, False
    if _truthy(config, f"{_RM}.enable"):
        yield f"{_RM}.model_path", True, True


def needs_critic(config: Any) -> bool:
    import warnings

    try:
        from verl.trainer.ppo.utils import need_critic

        with warnings.catch_warnings():  # its "Disabled critic" warning comes again from verl's validate_config
            warnings.simplefilter("ignore")
            return bool(need_critic(config))
    except (ImportError, AttributeError, KeyError):  # a config without the algorithm section: follow critic.enable
        return _truthy(config, "critic.enable")


def _check_model_paths(config: Any, device: str) -> None:
    for key, required, needs_config in _model_keys(config):
        value = _get(config, key)
        if value is None and not required:
            continue
        problem = model_path_problem(value, needs_config)
        if problem is not None:
            reason, fix = problem
            raise InvalidSettingError(key, value, device, reason, fix.format(key=key))


def model_path_problem(value: Any, needs_config: bool = True) -> tuple[str, str] | None:
    """(reason, fix with a `{key}` placeholder) when `value` is neither a model folder nor a reachable hub id."""
    if not isinstance(value, str) or not value.strip():
        return "no model path is set", "set {key}=/path/to/hf_model (a folder with config.json) or a hub id"
    if value.startswith(_REMOTE_PREFIXES):
        return None
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        if not needs_config:
            return None
        cfg = path / "config.json"
        if not cfg.is_file():
            return (
                f"the folder {path} has no config.json, so it is not a Hugging Face model folder",
                "set {key} to the folder that holds config.json and the weights (save_pretrained's output)",
            )
        try:
            json.loads(cfg.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{cfg} cannot be read as JSON ({e})", "restore or re-download the model files"
        return None
    if path.exists():
        return (
            f"{path} is a file, not a model folder",
            "set {key} to the folder that holds config.json (not a file inside it)",
        )
    return _hub_problem(value, path)


def _hub_problem(value: str, path: Path) -> tuple[str, str] | None:
    where = f"no folder {path} exists (working directory {os.getcwd()})"
    if not _valid_repo_id(value):
        return f"{where}, and it is not a hub model id either", "set {key} to an existing model folder"
    if _hub_cached(value):
        return None
    offline = _hub_offline()
    if offline is not None:
        return (
            f"{where}; as a hub id it is not in the local hub cache and {offline} forbids downloading it",
            "download the model while online (`huggingface-cli download " + value + "`) or set {key} to a folder",
        )
    error = _hub_lookup(value)
    if error is None:
        return None
    return f"{where}; as a hub id: {error}", "set {key} to an existing model folder or a hub id that exists"


def _valid_repo_id(value: str) -> bool:
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _hub_offline() -> str | None:
    """The variable that switches the hub off, if any."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    return None


def _hub_lookup(repo_id: str) -> str | None:
    """None when the hub has this model; otherwise why not (one request, HUB_TIMEOUT_S at most)."""
    if os.environ.get("VERL_USE_MODELSCOPE", "false").lower() == "true":
        return None  # verl downloads from ModelScope then (verl/__init__.py); its ids are not the hub's
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return None  # exists; the download needs the user's token, which verl's loader reads from the env
    except RepositoryNotFoundError:
        return "the hub has no such model (or it is private and no token is set: HF_TOKEN)"
    except Exception as e:  # network errors come from httpx/requests, depending on the hub client's version
        return f"the hub cannot be reached from this host ({type(e).__name__}: {e})"
    return None


# Data files -----------------------------------------------------------------------------------------------------
def _files(value: Any) -> list[Any]:
    from omegaconf import ListConfig

    if isinstance(value, list | tuple | ListConfig):
        return list(value)
    return [value]


def _check_data_files(config: Any, device: str) -> None:
    custom_loader = _get(config, "data.custom_cls.path") is not None
    for key, required in (("data.train_files", True), ("data.val_files", False)):
        value = _get(config, key)
        if value is None and not required:
            continue
        for item in _files(value):
            reason = data_file_problem(item, check_suffix=not custom_loader)
            if reason is not None:
                fix = f"set {key} to existing, readable {'/'.join(_DATA_SUFFIXES)} file(s)"
                raise InvalidSettingError(key, item if len(_files(value)) > 1 else value, device, reason, fix)


def data_file_problem(item: Any, check_suffix: bool = True) -> str | None:
    if not isinstance(item, str) or not item.strip():
        return "no data file is set"
    if item.startswith(_REMOTE_PREFIXES):
        return None
    path = Path(os.path.expanduser(item))
    if not path.exists():
        return f"{path} does not exist (working directory {os.getcwd()})"
    if not path.is_file():
        return f"{path} is not a file"
    if check_suffix and not item.endswith(_DATA_SUFFIXES):
        return f"verl reads {', '.join(_DATA_SUFFIXES)} files; {path.name} is none of these"
    return _unreadable(path)


def _unreadable(path: Path) -> str | None:
    """Open and check the file's framing: parquet starts and ends with PAR1; anything else must be non-empty."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return f"{path} is empty"
            if path.suffix == ".parquet":
                f.seek(max(0, size - 4))
                tail = f.read(4)
                if head != b"PAR1" or tail != b"PAR1" or size < 12:
                    return f"{path} is not a complete parquet file (truncated or another format)"
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    return None


# Code files the job imports ----------------------------------------------------------------------------------
CODE_KEYS = ("reward.custom_reward_function.path", "data.custom_cls.path")


def _check_code_files(config: Any, device: str) -> None:
    """Python files verl loads with load_module (utils/import_utils.py): `pkg://` modules are imported, anything
    else (`file://` or a plain path) must exist."""
    for key in CODE_KEYS:
        value = _get(config, key)
        if not isinstance(value, str) or not value or value.startswith("pkg://"):
            continue
        path = Path(os.path.expanduser(value.removeprefix("file://")))
        if path.is_file():
            continue
        what = "is not a file" if path.exists() else f"does not exist (working directory {os.getcwd()})"
        raise InvalidSettingError(
            key, value, device, f"{path} {what}", f"set {key} to an existing .py file, or pkg://module.name"
        )

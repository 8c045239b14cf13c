"""verl's ``HFModelConfig`` of a model section, built before the call site that needs it.

Why: building it loads the tokenizer, the processor, the generation config and the model's config (2.2 s on the
H100 host, ``PPOTrainer._init_tokenizer`` in ``benchmarks/results/
p40_h100_ppo_planned_task_runner_in_driver_b8a240e.json``, ``raw.startup_trace``), and every process that needs one
builds it on the start-up's critical path. The prestarted rollout server builds it in its warm-up
(``HFServer.warm``); the driver, which runs verl's TaskRunner itself (verl_compat.task_runner), builds it in a
thread while ``ray.init`` starts Ray's processes. The build is Python and tokenizer parsing that holds the
interpreter lock, so it gains where ``ray.init`` waits: on a 2-core CPU 3.3 s of the trainer's set-up; on the H100
host, where ``ray.init`` is 3 s of the driver's own Python, nothing in one run (README, start-up items).

The call site takes a build only for an equal section (its plain content, interpolations resolved); otherwise, or
when the early build failed, it builds its own, so an error surfaces where verl raises it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("verl_compat.model_config_ahead")


def section_key(section: Any) -> Any:
    """A model section's content as plain data, or None (an already built dataclass, an interpolation that does
    not resolve here): what a build ahead and its call site compare."""
    from omegaconf import DictConfig, OmegaConf

    try:
        if isinstance(section, DictConfig):
            return OmegaConf.to_container(section, resolve=True)
    except Exception:  # the call site builds its own
        return None
    return dict(section) if isinstance(section, dict) else None


def build(section: Any) -> Any:
    """verl's trainer's own conversion (``_init_tokenizer``: the section's ``_target_``, HFModelConfig)."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(section)


class Ahead:
    """One build of a section's ``HFModelConfig``, started now (in a daemon thread, or here with
    ``in_thread=False``) with ``build`` (its call site's conversion); ``take`` hands it over once."""

    def __init__(self, section: Any, build: Callable[[Any], Any] = build, in_thread: bool = True) -> None:
        self.key = section_key(section)
        self._built: Any = None
        self._error: Exception | None = None
        self._thread = threading.Thread(
            target=self._run, args=(section, build), name="verl-compat-model-config", daemon=True
        )
        if in_thread:
            self._thread.start()
        else:
            self._run(section, build)

    def _run(self, section: Any, build: Callable[[Any], Any]) -> None:
        try:
            self._built = build(section)
        except Exception as exc:  # the call site builds again and raises it where verl would
            self._error = exc

    def result(self) -> Any | None:
        """The build once it has ended; None where it failed."""
        if self._thread.ident is not None:
            self._thread.join()
        if self._error is not None:
            logger.debug("the model config built ahead failed (%s); its call site builds it again", self._error)
        return self._built

    def take(self, section: Any) -> Any | None:
        """The build, when ``section`` equals the one it was started for and it succeeded; else None."""
        if self.key is None or section_key(section) != self.key:
            return None
        built, self._built = self.result(), None
        return built


_DRIVER: Ahead | None = None


def start_in_driver(config: Any, runner_class: Any) -> bool:
    """Driver, before ``ray.init``: start building the trainer's model config where verl's TaskRunner will run in
    this process (verl_compat.task_runner; a recipe's runner class runs as an actor and builds its own)."""
    global _DRIVER
    from verl_compat.rollout.prestart import get_key
    from verl_compat.task_runner import will_run_in_driver

    section = get_key(config, "actor_rollout_ref.model")
    if section is None or not will_run_in_driver(config, runner_class):
        return False
    _DRIVER = Ahead(section)
    return True


def trainer_model_config(section: Any) -> Any:
    """The trainer's ``HFModelConfig`` (trainer_base ``_init_tokenizer``): the driver's early build when it is for
    this section, else built here."""
    global _DRIVER
    ahead, _DRIVER = _DRIVER, None
    built = ahead.take(section) if ahead is not None else None
    if built is None:
        return build(section)
    logger.info("verl-compat: the trainer's model config (tokenizer, processor, HF config) was built during ray.init")
    return built

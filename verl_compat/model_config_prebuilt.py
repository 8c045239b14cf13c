"""verl's ``HFModelConfig`` of a model section, built before the call site that needs it and taken there only for
the same section.

Why: building it loads the tokenizer, the processor, the generation config and the model's config (2.2 s of the
rollout server's ``configure`` on the H100 host, on the start-up's critical path). The prestarted rollout server
builds it in its warm-up from the driver's model section (``HFServer.warm``) and ``configure`` takes it.

Where not: the driver building the trainer's in a thread during ``ray.init`` (removed 2026-12-07) saved
3.3 s on a 2-core CPU, but on the H100 host the thread held the interpreter lock that ``ray.init`` needs, which
then took 7.45 and 7.64 s against 3.24 and 3.51 s, for 2.2-2.6 s saved later: a net loss, so it was removed
(``benchmarks/results/p40_h100_ppo_planned_4cea77f_vs_b8a240e.json``, ``raw.startup_trace``).

The call site takes a build only for an equal section (its plain content, interpolations resolved); otherwise, or
when the early build failed, it builds its own, so an error surfaces where verl raises it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("verl_compat.model_config_prebuilt")


def section_key(section: Any) -> Any:
    """A model section's content as plain data, or None (an already built dataclass, an interpolation that does
    not resolve here): what a prebuilt config and its call site compare."""
    from omegaconf import DictConfig, OmegaConf

    try:
        if isinstance(section, DictConfig):
            return OmegaConf.to_container(section, resolve=True)
    except Exception:  # the call site builds its own
        return None
    return dict(section) if isinstance(section, dict) else None


class Prebuilt:
    """One build of a section's ``HFModelConfig`` with ``build`` (its call site's conversion), done now; ``take``
    hands it over once."""

    def __init__(self, section: Any, build: Callable[[Any], Any]) -> None:
        self.key = section_key(section)
        self.value: Any = None
        try:
            self.value = build(section)
        except Exception as exc:  # the call site builds again and raises it where verl would
            logger.debug("the model config built ahead failed (%s); its call site builds it again", exc)

    def take(self, section: Any) -> Any | None:
        """The build, when ``section`` equals the one it was made for and it succeeded; else None."""
        if self.key is None or section_key(section) != self.key:
            return None
        built, self.value = self.value, None
        return built

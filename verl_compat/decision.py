"""`Decision`: what a resolver chose, whether the user asked for it, and why each candidate won or lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    value: Any
    accepted: bool
    reasons: tuple[str, ...] = ()  # reason codes/lines: why it was accepted or rejected


@dataclass(frozen=True)
class Decision:
    category: str  # "dtype.train", "attention", "kernels.torch_compile", "rollout.engine", ...
    key: str  # the config key this decision fills, e.g. "actor_rollout_ref.rollout.dtype"
    value: Any
    defaulted: bool  # True when the user did not set the key and the resolver chose
    device: str  # DeviceProfile.describe()
    candidates: tuple[Candidate, ...] = ()
    reasons: tuple[str, ...] = ()  # why `value` was chosen
    upstream: Any = None  # what upstream verl 0.9.1 would have used

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "defaulted": self.defaulted,
            "upstream": self.upstream,
            "reasons": list(self.reasons),
        }

    def explain(self) -> str:
        how = "default" if self.defaulted else "requested"
        lines = [f"{self.category} = {self.value!r} ({how}; key {self.key}; device {self.device})"]
        lines += [f"  because: {r}" for r in self.reasons]
        if self.upstream is not None and self.upstream != self.value:
            lines.append(f"  upstream verl would use {self.upstream!r}")
        for c in self.candidates:
            mark = "+" if c.accepted else "-"
            why = "; ".join(c.reasons) if c.reasons else ""
            lines.append(f"  {mark} {c.value!r}" + (f": {why}" if why else ""))
        return "\n".join(lines)

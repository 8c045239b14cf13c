"""`Decision`: what a resolver chose, whether the user asked for it, and why each candidate won or lost.

Reasons are records (`Reason`: code, message, actual, required, hard) kept with every candidate and serialised
by `to_dict()`, so the doctor's text, `--json` and `--explain` all print the same record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Reason(str):
    """Why an option cannot (hard) or should not (soft) be used, or why it is a good choice (code "why").

    A `str` (its text is "code: message", what logs and tests read) that also keeps the record: `code` is stable
    for tests, `actual` / `required` are the device's value and the requirement (xformers-style), when known.
    """

    code: str
    message: str
    hard: bool
    actual: Any
    required: Any

    def __new__(cls, code: str, message: str, hard: bool = True, actual: Any = None, required: Any = None) -> Reason:
        self = super().__new__(cls, message if code == WHY else f"{code}: {message}")
        self.code, self.message, self.hard, self.actual, self.required = code, message, hard, actual, required
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # pickle / copy: rebuild from the record, not from the text
        return (Reason, (self.code, self.message, self.hard, self.actual, self.required))

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "hard": self.hard,
            "actual": self.actual,
            "required": self.required,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Reason:
        return cls(d["code"], d["message"], d.get("hard", True), d.get("actual"), d.get("required"))


WHY = "why"  # Reason code of an option's own description ("fp32 everywhere: ...")


@dataclass(frozen=True)
class Candidate:
    value: Any
    accepted: bool
    reasons: tuple[Reason, ...] = ()  # why it was accepted or rejected

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "accepted": self.accepted, "reasons": [_reason(r).to_dict() for r in self.reasons]}


def _reason(r: str) -> Reason:
    return r if isinstance(r, Reason) else Reason(WHY, str(r), hard=False)


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
    identity: bool = False  # True when the sm_80+ identity rule kept upstream's value

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "key": self.key,
            "value": self.value,
            "defaulted": self.defaulted,
            "device": self.device,
            "upstream": self.upstream,
            "identity": self.identity,
            "reasons": list(self.reasons),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        candidates = tuple(
            Candidate(c["value"], c["accepted"], tuple(Reason.from_dict(r) for r in c.get("reasons", ())))
            for c in d.get("candidates", ())
        )
        return cls(
            d["category"],
            d["key"],
            d["value"],
            d["defaulted"],
            d["device"],
            candidates,
            tuple(d.get("reasons", ())),
            d.get("upstream"),
            d.get("identity", False),
        )

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

"""The resolver core: candidate options per category, a registry plugins can extend, and `choose()`.

Every resolver category ("attention", "dtype.train", ...) is an ordered list of `Option`s. An option declares
its value and a `check(ctx)` that returns the reasons it cannot (hard) or should not (soft) be used on this
device, xformers-style: "needs compute capability >= 8.0, device has 6.1".

`choose()` applies the requested-vs-defaulted rule (transformers' AttentionInterface):
- the user set the key: a hard reason raises `IncompatibleRequestError` naming key, device, reason and fix;
  soft reasons are recorded and the value is kept;
- the key was left at upstream's default: the first option (by priority) with no reason wins, and the change
  is logged once at INFO on "verl_compat.resolvers.<category>";
- a value a worker-side seam sees (`settled`: the driver already applied the policy, or upstream's call site
  passes it): kept when it can run here (soft reasons are recorded), else the default rule picks;
- sm_80+ with an upstream value: upstream's value is kept unchanged (identity), reasons are recorded for
  `explain()`. The one exception: a defaulted value that cannot run here (its package is missing or unusable;
  upstream would fail at run time) falls back like on every other device. This is the only place the rule lives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from verl_compat.decision import WHY, Candidate, Decision, Reason
from verl_compat.errors import IncompatibleRequestError
from verl_compat.profile import DeviceProfile


def hard(code: str, message: str, actual: Any = None, required: Any = None) -> Reason:
    return Reason(code, message, True, actual, required)


def soft(code: str, message: str, actual: Any = None, required: Any = None) -> Reason:
    return Reason(code, message, False, actual, required)


@dataclass(frozen=True)
class Request:
    """What the config holds for one decision, and whether the user set it.

    `value` is the config's current value (the user's when `requested`, else upstream's default); None or
    MISSING when the key has no upstream value (rollout.name is `???`). `facts` carries decisions made earlier
    (e.g. the rollout engine for the rollout dtype), so each resolver stays a pure function.
    `settled`: a worker-side seam's value (kept where it can run); there `upstream` is the value upstream's call
    site passes, which the sm_80+ identity rule returns. `identity=False` for verl-compat's own code paths
    (the hf rollout engine), where there is no upstream behaviour to preserve.
    """

    category: str
    key: str
    value: Any
    requested: bool = False
    upstream: Any = None
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    settled: bool = False
    identity: bool = True


@dataclass(frozen=True)
class Context:
    request: Request
    profile: DeviceProfile

    def fact(self, name: str, default: Any = None) -> Any:
        return self.request.facts.get(name, default)


Check = Callable[[Context], Iterable[Reason]]


def _no_reasons(_ctx: Context) -> Iterable[Reason]:
    return ()


@dataclass(frozen=True)
class Option:
    """One candidate value of a category. Lower `priority` is tried first when the value is defaulted."""

    value: Any
    check: Check = _no_reasons
    why: str = ""  # why this value is a good choice when it wins
    priority: int = 100
    source: str = "builtin"  # "builtin" or the plugin that registered it
    aliases: tuple[Any, ...] = ()  # other spellings that mean this value ("bf16" / "bfloat16")

    def matches(self, value: Any) -> bool:
        return _same(value, self.value) or any(_same(value, a) for a in self.aliases)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return type(a) is type(b) and a == b


class Registry:
    """Options registered by plugins, per category. Registration is idempotent: every Ray worker re-runs it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._options: dict[str, dict[tuple[str, str], Option]] = {}

    def register(self, category: str, option: Option) -> bool:
        """Add `option` to `category`. Returns False when the same (source, value) was already registered."""
        slot = (option.source, repr(option.value))
        with self._lock:
            bucket = self._options.setdefault(category, {})
            if slot in bucket:
                return False
            bucket[slot] = option
            return True

    def unregister_source(self, source: str) -> None:
        with self._lock:
            for bucket in self._options.values():
                for slot in [s for s in bucket if s[0] == source]:
                    del bucket[slot]

    def options(self, category: str, builtin: Iterable[Option] = ()) -> list[Option]:
        """Built-in options plus registered ones, ordered by priority (stable: built-ins first on ties)."""
        with self._lock:
            extra = list(self._options.get(category, {}).values())
        return sorted([*builtin, *extra], key=lambda o: o.priority)


REGISTRY = Registry()

# Reason code for "the package is not installed at all" (see checks.needs_package): the only reason that makes an
# explicit request fail on sm_80+, where everything else is upstream's business.
NOT_INSTALLED = "not_installed"
NOT_USABLE = "not_usable"  # installed, but the probe found it cannot run here (wrong torch, no CUDA ops, ...)
NOT_PROBED = "not_probed"  # the profile never probed the package (catalog profiles): unknown, not absent

# Fix texts: a category may provide one; the default says which value to set instead.
FixText = Callable[[Request, DeviceProfile, Any], str]


def default_fix(request: Request, profile: DeviceProfile, alternative: Any) -> str:
    return (
        f"set {request.key}={_fmt(alternative)} or remove the override and let verl-compat choose "
        f"({_fmt(alternative)} on {profile.name})"
    )


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _reasons(option: Option, ctx: Context) -> list[Reason]:
    return list(option.check(ctx))


def choose(
    request: Request,
    profile: DeviceProfile,
    builtin: Iterable[Option],
    *,
    fix: FixText = default_fix,
    registry: Registry | None = None,
) -> Decision:
    """Pick a value for `request` on `profile` (see the module docstring for the rules)."""
    options = (registry or REGISTRY).options(request.category, builtin)
    ctx = Context(request, profile)
    evaluated = [(o, _reasons(o, ctx)) for o in options]
    candidates = tuple(
        Candidate(value=o.value, accepted=not rs, reasons=tuple(rs) or ((Reason(WHY, o.why, False),) if o.why else ()))
        for o, rs in evaluated
    )
    device = profile.describe()
    has_upstream = request.value is not None and request.value != "???"

    def decision(value: Any, defaulted: bool, reasons: Iterable[str], identity: bool = False) -> Decision:
        return Decision(
            category=request.category,
            key=request.key,
            value=value,
            defaulted=defaulted,
            device=device,
            candidates=candidates,
            reasons=tuple(reasons),
            upstream=request.upstream,
            identity=identity,
        )

    fallback = _first_acceptable(evaluated)

    def refuse(blockers: list) -> IncompatibleRequestError:
        return IncompatibleRequestError(
            request.key,
            request.value,
            device,
            "; ".join(r.message for r in blockers),
            fix(request, profile, fallback.value if fallback else None),
        )

    cannot_run: list[Reason] = []
    if request.identity and profile.is_ampere_or_newer and has_upstream:
        upstream_value = request.upstream if request.settled else request.value
        matched_reasons = [r for o, rs in evaluated if o.matches(upstream_value) for r in rs]
        # An explicit request for a package that is not installed at all: upstream would die on the import later
        # (in a Ray worker); failing at start-up changes no run that works.
        missing = [r for r in matched_reasons if r.code == NOT_INSTALLED]
        if request.requested and missing:
            raise refuse(missing)
        cannot_run = [r for r in matched_reasons if r.hard and r.code != NOT_PROBED]
        if request.requested or not cannot_run:
            notes = [str(r) for r in matched_reasons]
            return decision(
                upstream_value,
                not request.requested,
                ["sm_80+: upstream verl's value, unchanged", *(f"note: {n}" for n in notes)],
                identity=True,
            )
        # a default that cannot run here falls back, as on every other device (upstream would fail at run time)

    if request.requested and has_upstream:
        matched = next(((o, rs) for o, rs in evaluated if o.matches(request.value)), None)
        if matched is None:
            return decision(
                request.value, False, ["requested explicitly; not a value verl-compat knows, passed through"]
            )
        option, reasons = matched
        blockers = [r for r in reasons if r.hard]
        if blockers:
            raise refuse(blockers)
        warnings = [f"warning: {r.message} (kept because it was requested)" for r in reasons]
        return decision(request.value, False, ["requested explicitly", *warnings])

    if request.settled and has_upstream:
        matched = next(((o, rs) for o, rs in evaluated if o.matches(request.value)), None)
        if matched is None:
            return decision(request.value, True, ["not a value verl-compat knows, passed through"])
        if not any(r.hard for r in matched[1]):
            warnings = [f"warning: {r.message}" for r in matched[1]]
            return decision(request.value, True, ["kept: it can run here (the driver resolved it)", *warnings])

    if fallback is None:  # every built-in category ends with an always-acceptable option; a plugin broke that
        raise RuntimeError(f"verl-compat: no acceptable option for {request.category} on {device}")
    chosen_reasons = [fallback.why] if fallback.why else []
    chosen_reasons += [f"warning: {r.message}" for o, rs in evaluated if o is fallback for r in rs]
    rejected = [
        f"{_fmt(o.value)} rejected: " + "; ".join(r.message for r in rs)
        for o, rs in evaluated
        if rs and o is not fallback
    ]
    if cannot_run:
        chosen_reasons.insert(0, "sm_80+: upstream verl's value cannot run here: " + "; ".join(map(str, cannot_run)))
    if not has_upstream or not fallback.matches(request.value):
        old = _fmt(request.value) if has_upstream else "unset"
        why = "; ".join(r.message for o, rs in evaluated if has_upstream and o.matches(request.value) for r in rs)
        logging.getLogger(f"verl_compat.resolvers.{request.category.split('.')[0]}").info(
            "%s: %s -> %s on %s (%s)", request.key, old, _fmt(fallback.value), device, why or fallback.why
        )
    return decision(fallback.value, True, [*chosen_reasons, *rejected])


def _first_acceptable(evaluated: list[tuple[Option, list[Reason]]]) -> Option | None:
    """The first option with no reason at all, else the first whose reasons are all soft."""
    clean = next((o for o, rs in evaluated if not rs), None)
    if clean is not None:
        return clean
    return next((o for o, rs in evaluated if not any(r.hard for r in rs)), None)


def passthrough(request: Request, profile: DeviceProfile, reasons: Iterable[str]) -> Decision:
    """A decision that keeps the config's value (for categories verl-compat only reports on)."""
    return Decision(
        category=request.category,
        key=request.key,
        value=request.value,
        defaulted=not request.requested,
        device=profile.describe(),
        reasons=tuple(reasons),
        upstream=request.upstream,
    )

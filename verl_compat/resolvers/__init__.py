"""Resolvers, one module per category; each is a pure function of (Request, DeviceProfile) -> Decision."""

from verl_compat.resolvers.registry import REGISTRY, Context, Option, Reason, Registry, Request, choose, hard, soft

__all__ = ["REGISTRY", "Context", "Option", "Reason", "Registry", "Request", "choose", "hard", "soft"]

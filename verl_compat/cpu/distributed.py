"""torch.distributed backend string for verl's process groups."""

from __future__ import annotations


def dist_backend(default: str) -> str:
    """verl builds `"cpu:gloo,<device>:<backend>"`; on the CPU platform that is `"cpu:gloo,cpu:gloo"`, which torch
    rejects ("Duplicate device type cpu in backend string"). Collapse to one entry per device type, and to the
    bare backend name when a single backend serves every device. Any other string is returned unchanged."""
    pairs: dict[str, str] = {}
    for part in default.split(","):
        device, sep, backend = part.strip().partition(":")
        if not sep:
            return default  # a plain backend name ("gloo", "nccl"): nothing to fix
        if pairs.setdefault(device, backend) != backend:
            raise ValueError(f"backend string {default!r} names two backends for device type {device!r}")
    if len(pairs) == len(default.split(",")):
        return default  # no duplicate device types: upstream's string, untouched (e.g. "cpu:gloo,cuda:nccl")
    backends = set(pairs.values())
    if len(backends) == 1:
        return backends.pop()
    return ",".join(f"{d}:{b}" for d, b in pairs.items())

"""Record the floating-point dtypes every aten op sees, and what else ran, while verl works.

`DtypeAudit` is a TorchDispatchMode: every op that reaches the dispatcher (forward, backward, optimizer, FSDP
collectives' local copies) reports the floating dtypes of its tensor inputs and outputs. Used to prove a device
policy holds end to end ("no bf16/fp16 op anywhere on a P40 or a CPU"), not just in the config.
`CompileAudit` records torch.compile calls and Dynamo's compiled frames (Triton/Inductor never run without them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

HALF_DTYPES = frozenset({torch.bfloat16, torch.float16})


class DtypeAudit(TorchDispatchMode):
    """`ops_by_dtype[dtype]` = names of the ops that saw a tensor of that floating dtype (input or output)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops_by_dtype: dict[torch.dtype, set[str]] = defaultdict(set)
        self.op_count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.op_count += 1
        name = str(func.overloadpacket)
        for leaf in tree_leaves((args, kwargs or {}, out)):
            if isinstance(leaf, torch.Tensor) and leaf.dtype.is_floating_point:
                self.ops_by_dtype[leaf.dtype].add(name)
        return out

    @property
    def dtypes(self) -> set[torch.dtype]:
        return set(self.ops_by_dtype)

    def half_precision_ops(self) -> dict[str, list[str]]:
        """{dtype name: sorted op names} for bf16/fp16; empty when the run stayed in fp32."""
        return {str(d): sorted(ops) for d, ops in self.ops_by_dtype.items() if d in HALF_DTYPES}


@dataclass
class CompileAudit:
    compile_calls: list[str] = field(default_factory=list)  # what torch.compile was asked to wrap
    dynamo_frames: int = 0  # frames Dynamo compiled (each would go to Inductor/Triton)


@contextmanager
def audit_compile(monkeypatch: Any) -> Iterator[CompileAudit]:
    """Record torch.compile calls (verl wraps entropy_from_logits at engine init) and Dynamo's compiled frames."""
    from torch._dynamo.utils import counters

    audit = CompileAudit()
    real_compile = torch.compile

    def recording_compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        audit.compile_calls.append(getattr(model, "__qualname__", repr(model)))
        return real_compile(model, *args, **kwargs) if model is not None else real_compile(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    before = counters["frames"]["total"]
    yield audit
    audit.dynamo_frames = counters["frames"]["total"] - before

"""Copy ``(name, tensor)`` pairs from the trainer into the rollout model's parameters.

verl's FSDP engine yields full tensors keyed by HF *checkpoint* names (``get_per_tensor_param`` ->
``convert_weight_keys``, which undoes the model's ``_checkpoint_conversion_mapping``), in the trainer's
parameter dtype (fp32 by default). The rollout model may hold another dtype and, for VLM-style models, other
module names; both are handled here. Tied embeddings show up under both names in ``state_dict`` and point at one
tensor, so either name (or both) may be sent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

import torch
from torch import nn

from verl_compat.rollout.fused_weights import adjacent_groups, bind


class UnknownWeightError(KeyError):
    """A weight name sent by the trainer has no counterpart in the rollout model."""

    def __str__(self) -> str:  # KeyError would otherwise print the message quoted in one line
        return str(self.args[0])


class WeightLoader:
    """Resolves checkpoint names to the model's tensors once, then copies tensors in place."""

    def __init__(self, model: nn.Module):
        self.model = model
        # keep_vars=True gives the Parameter objects themselves (not detached copies), so copy_ writes into the
        # live model; tied weights appear under every name that shares them.
        self._targets: dict[str, torch.Tensor] = dict(model.state_dict(keep_vars=True))
        mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
        self._conversions = [(re.compile(pattern), repl) for pattern, repl in mapping.items()]

    def resolve(self, name: str) -> str | None:
        if name in self._targets:
            return name
        for pattern, repl in self._conversions:
            converted, n = pattern.subn(repl, name)
            if n and converted in self._targets:
                return converted
        return None

    def targets(self, names: Iterable[str]) -> list[torch.Tensor]:
        """The model tensors that ``names`` resolve to (unknown names are skipped: ``load`` refuses them)."""
        resolved = (self.resolve(name) for name in names)
        return [self._targets[t] for t in resolved if t is not None]

    def total_numel(self) -> int:
        """Elements over the model's distinct tensors (tied weights counted once)."""
        return sum(t.numel() for t in {id(t): t for t in self._targets.values()}.values())

    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy every pair into the model; returns the number of tensors copied.

        Names are validated per call before anything is copied, so a wrong bucket leaves the model untouched.
        """
        pairs = list(weights)
        resolved: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        unknown: list[str] = []
        for name, tensor in pairs:
            target_name = self.resolve(name)
            if target_name is None:
                unknown.append(name)
                continue
            target = self._targets[target_name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"weight {name!r}: the trainer sent shape {tuple(tensor.shape)} but the rollout model holds "
                    f"{tuple(target.shape)}; the rollout model was built from a different config than the actor"
                )
            resolved.append((name, target, tensor))
        if unknown:
            raise UnknownWeightError(self._unknown_message(unknown))
        for _name, target, tensor in resolved:
            # copy_ casts dtype and moves across devices in one op; .data avoids autograd version bumps.
            target.data.copy_(tensor.detach(), non_blocking=False)
        return len(resolved)

    def _unknown_message(self, unknown: list[str]) -> str:
        first = unknown[0]
        close = difflib.get_close_matches(first, list(self._targets), n=3)
        hint = ""
        if ".experts." in first:
            hint = (
                " Per-expert MoE keys (vLLM layout) are not re-fused by the hf rollout engine; MoE models are not "
                "supported by rollout.name=hf yet."
            )
        elif "lora_" in first:
            hint = " LoRA adapter tensors are not supported: set actor_rollout_ref.model.lora.merge=True."
        return (
            f"the hf rollout model has no parameter for {len(unknown)} weight name(s) sent by the trainer, "
            f"e.g. {first!r} (closest rollout names: {close}).{hint} The actor and rollout must load the same "
            f"architecture (actor_rollout_ref.model.path)."
        )


class ParameterStorage:
    """Frees and re-allocates a model's parameter storage on its device, for a sleep that discards the weights
    because the next weight sync overwrites every one of them (vLLM's sleep level 2): no host copy either way.

    Tied parameters are one Parameter object, so they stay tied. The fast decoder's fused projections are
    allocated adjacently (:mod:`~verl_compat.rollout.fused_weights`). Buffers (rotary tables, ...) are small and not
    sent by the trainer, so they are kept. After ``allocate`` the values are undefined until ``mark_loaded`` has
    seen every parameter (``unloaded`` names the rest).
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self._shapes: dict[int, tuple[torch.Size, torch.dtype]] = {}
        self._unloaded: dict[int, str] = {}
        self.released = False

    @torch.no_grad()
    def release(self) -> int:
        """Drop every parameter's storage; returns the bytes freed."""
        freed = 0
        for param in self.model.parameters():
            self._shapes[id(param)] = (param.shape, param.dtype)
            freed += param.numel() * param.element_size()
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        self.released = True
        return freed

    @torch.no_grad()
    def allocate(self, device: torch.device | str) -> None:
        """Give every released parameter fresh (uninitialised) storage on ``device``."""
        if not self.released:
            return
        names = {id(p): n for n, p in self.model.named_parameters()}
        # The fast decoder's fused projections get one buffer per group, as the engine laid them out at load.
        groups = adjacent_groups(self.model)
        grouped = {id(p) for group in groups for p in group}
        work = groups + [[p] for p in self.model.parameters() if id(p) not in grouped]
        for group in work:  # grows while iterating: a mixed-dtype group is split into singles
            if len({self._shapes[id(p)][1] for p in group}) > 1:  # one buffer holds one dtype
                work.extend([p] for p in group)
                continue
            shapes = [self._shapes[id(p)][0] for p in group]
            dtype = self._shapes[id(group[0])][1]
            bind(group, shapes, torch.empty(sum(s.numel() for s in shapes), dtype=dtype, device=device))
            self._unloaded.update({id(p): names[id(p)] for p in group})
        self.released = False

    def mark_loaded(self, targets: Iterable[torch.Tensor]) -> None:
        for target in targets:
            self._unloaded.pop(id(target), None)

    @property
    def unloaded(self) -> list[str]:
        return sorted(self._unloaded.values())

"""A one-token decode forward for Llama-style decoders (Llama, Qwen2) with few kernels, reading the model's own
modules and weights (so weight sync and sleep/wake see no difference).

Why: in a CUDA graph replay at small batch the step costs about one kernel's minimum time per kernel, not the
weight read (benchmarks/results: the HF forward through the slot cache was kernel-bound at ~3.4 ms/step for the
Qwen2.5-0.5B shape in fp32 and fp16 alike). Without Triton (a P40 has none) the lever is fewer kernels, using
torch's own fused ops: ``F.rms_norm``; residual adds folded into ``addmm``; RoPE as one batched matmul with a
per-row rotation matrix built once per step (one for q and k together); cache writes as one ``index_copy_``
each; attention scores with the mask added by ``baddbmm`` over the grouped query heads (no repeated K/V); q|k|v
and gate|up as one GEMM each where their storage is adjacent (:mod:`~verl_compat.rollout.fused_weights`; torch's
memory-efficient SDPA kernel instead of the three attention ops was 1.02-1.27x slower:
benchmarks/results/decode_step_kernels_h200.json).
Same math as the HF modules; the engine's tests compare the two.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_compat.rollout.fused_weights import decoder_projections
from verl_compat.rollout.kv_cache import SlotKVCache

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2"})


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


class FastDecoder:
    """``__call__(cache, tok [b], pos [b], mask [b, 1, 1, L]) -> logits [b, V]`` for slots ``[0, b)``."""

    @classmethod
    def for_model(cls, model) -> FastDecoder | None:
        """The fast decoder when ``model`` has exactly the Llama layout, else None (the HF forward is used)."""
        config = model.config
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            return None
        base = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if base is None or not all(hasattr(base, n) for n in needed) or not hasattr(model, "lm_head"):
            return None
        for layer in base.layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if (
                attn is None
                or mlp is None
                or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            ):
                return None
            if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
                return None
        return cls(model)

    def __init__(self, model):
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self._projections = decoder_projections(model)
        self._fused: list[tuple] = []
        self.prepare()

    def prepare(self) -> bool:
        """Take each layer's fused views, laying the projections out adjacently first where they are not (a copy;
        the engine and a discarding sleep's allocation already lay them out); True when a parameter moved (graphs
        captured before hold stale addresses)."""
        moved = False
        for qkv, gate_up in self._projections:
            moved = qkv.pack() | gate_up.pack() | moved
        self._fused = [(qkv.fused(), gate_up.fused()) for qkv, gate_up in self._projections]
        if not self._projections:  # projections that are not plain nn.Linear: one GEMM each
            self._fused = [(None, None)] * len(self.model.model.layers)
        return moved

    def __call__(self, cache: SlotKVCache, tok: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        base = self.model.model
        b, h, kv, d = tok.shape[0], self.heads, self.kv_heads, self.head_dim
        group, width = h // kv, cache.max_len + 1
        x = base.embed_tokens(tok)  # [b, hidden]
        cos, sin = base.rotary_emb(x.unsqueeze(1), pos.unsqueeze(1))  # [b, 1, d]
        rope = _rope_matrix(cos[:, 0], sin[:, 0])  # [b, d, d], built once per step for every layer
        mask3 = mask.expand(b, kv, group, width).reshape(b * kv, group, width)
        # Flat row index of (slot, kv head, pos) in a layer's [slots, kv, width, d] cache, shared by all layers:
        # one index_copy_ per write instead of an advanced-index put.
        heads = torch.arange(kv, device=tok.device)
        rows = torch.arange(b, device=tok.device)
        flat = ((rows.unsqueeze(1) * kv + heads) * width + pos.unsqueeze(1)).reshape(-1)
        for i, layer in enumerate(base.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_w, gate_up_w = self._fused[i]
            y = F.rms_norm(x, (self.hidden,), layer.input_layernorm.weight, _eps(layer.input_layernorm))
            if qkv_w is not None:
                qkv = F.linear(y, *qkv_w)
                qk = torch.bmm(qkv[:, : (h + kv) * d].reshape(b, h + kv, d), rope)
                q, k, v = qk[:, :h], qk[:, h:], qkv[:, (h + kv) * d :].reshape(b, kv, d)
            else:
                q = F.linear(y, attn.q_proj.weight, attn.q_proj.bias).view(b, h, d)
                k = F.linear(y, attn.k_proj.weight, attn.k_proj.bias).view(b, kv, d)
                v = F.linear(y, attn.v_proj.weight, attn.v_proj.bias).view(b, kv, d)
                q, k = torch.bmm(q, rope), torch.bmm(k, rope)
            k_cache, v_cache = cache.data[i, 0], cache.data[i, 1]
            k_cache.view(-1, d).index_copy_(0, flat, k.reshape(-1, d))
            v_cache.view(-1, d).index_copy_(0, flat, v.reshape(-1, d))
            o = self.attend(q, k_cache[:b], v_cache[:b], mask, mask3, attn.scaling)
            x = _linear_residual(x, o.reshape(b, h * d), attn.o_proj)
            y = F.rms_norm(
                x, (self.hidden,), layer.post_attention_layernorm.weight, _eps(layer.post_attention_layernorm)
            )
            if gate_up_w is not None:
                gate, up = F.linear(y, *gate_up_w).split([mlp.gate_proj.out_features, mlp.up_proj.out_features], -1)
            else:
                gate = F.linear(y, mlp.gate_proj.weight, mlp.gate_proj.bias)
                up = F.linear(y, mlp.up_proj.weight, mlp.up_proj.bias)
            act = mlp.act_fn(gate) * up
            x = _linear_residual(x, act, mlp.down_proj)
        x = F.rms_norm(x, (self.hidden,), base.norm.weight, _eps(base.norm))
        return self.model.lm_head(x)

    def attend(self, q, keys, values, mask, mask3, scale: float) -> torch.Tensor:
        """``q [b, h, d]`` over a layer's cache rows ``[b, kv, width, d]``: the grouped query heads of each kv head
        as one batch (no repeated K/V), the mask added by ``baddbmm``. ``mask [b, 1, 1, width]``; ``mask3`` is
        it per (row, kv head), built once per step."""
        b, kv, width, d = keys.shape
        return torch.bmm(attention_probs(q, keys, mask3, scale), values.view(b * kv, width, d))


def attention_probs(q: torch.Tensor, keys: torch.Tensor, mask3: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax of the masked scores ``[b * kv, group, width]`` of ``q [b, h, d]`` over ``keys [b, kv, width, d]``,
    in the keys' dtype (the softmax itself in fp32)."""
    b, kv, width, d = keys.shape
    group = q.shape[1] // kv
    scores = torch.baddbmm(mask3, q.reshape(b * kv, group, d), keys.view(b * kv, width, d).transpose(1, 2), alpha=scale)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(keys.dtype)


def _rope_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's RoPE, ``x * cos + rotate_half(x) * sin``, as ``x @ R`` with ``R = diag(cos) + P diag(sin)`` where
    ``x @ P == rotate_half(x)``: one batched matmul per tensor and layer instead of three elementwise kernels.
    Each output sums two nonzero products, as the elementwise form does."""
    b, d = cos.shape
    half = d // 2
    eye = torch.eye(half, dtype=cos.dtype, device=cos.device)
    zero = torch.zeros_like(eye)
    # rotate_half(x) = cat(-x2, x1): x1 lands in the second half, -x2 in the first.
    p = torch.cat([torch.cat([zero, eye], dim=1), torch.cat([-eye, zero], dim=1)], dim=0)
    return torch.diag_embed(cos) + p.unsqueeze(0) * sin.unsqueeze(1)


def _linear_residual(residual: torch.Tensor, x: torch.Tensor, linear) -> torch.Tensor:
    """``residual + linear(x)`` in one GEMM kernel when the layer has no bias."""
    if linear.bias is None:
        return torch.addmm(residual, x, linear.weight.t())
    return residual + F.linear(x, linear.weight, linear.bias)

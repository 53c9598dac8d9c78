"""Float64 replays: a Qwen2 model whose every op computes in float64.

Causal scores compare replays of training, and a replay is on-policy: when two machines round a
logit differently, a sampled token can flip and the two trajectories part for good. In float32 a
flip is rare per token (about 1e-6) but a replay draws ~15,000 tokens, so one replay in a hundred
would differ between two CPUs by a whole trajectory. In float64 the rounding differences are
about 1e-16 and a flip practically never happens, so a replay's outcome does not depend on the
CPU (docs/causal.md gives the measurements). The build itself and the exact-replay proof stay in
float32.

``transformers``' Qwen2 casts to float32 inside RMSNorm, the rotary tables and the attention
softmax; :func:`widen` converts the parameters and buffers to float64 and replaces those three
with float64 versions of the same formulas, so the model's own forward, its KV-cached decoding
and :class:`benchmark.build.decode.LeanDecoder` all compute in float64 (and agree bit for bit).
"""

from __future__ import annotations

import types

import torch

ATTN_IMPLEMENTATION = "bt_bench_eager_float64"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a norm or softmax computes in: float32 for lower precisions, else the input's."""
    return torch.promote_types(dtype, torch.float32)


def wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` as float32, or as is when it is already float64 (log-probs, sampling weights)."""
    return x if x.dtype == torch.float64 else x.float()


def _rms_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    h = hidden_states.to(compute_dtype(input_dtype))
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * h.to(input_dtype)


def _rope_forward(self, x, position_ids):
    dt = compute_dtype(x.dtype)
    freqs = position_ids[..., None].to(dt) * self.inv_freq.to(device=x.device, dtype=dt)
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * self.attention_scaling).to(x.dtype),
            (emb.sin() * self.attention_scaling).to(x.dtype))


def _eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    from transformers.models.qwen2.modeling_qwen2 import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    w = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=compute_dtype(query.dtype)).to(query.dtype)
    out = torch.matmul(w, value_states).transpose(1, 2).contiguous()
    return out, w


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, _eager_attention)
    if ATTN_IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        # the same additive causal mask as eager attention
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, eager_mask)


def widen(model):
    """Make ``model`` (an eager Qwen2) compute every op in float64, in place; return it."""
    _register()
    model.double()
    for m in model.modules():
        name = type(m).__name__
        if name.endswith("RMSNorm"):
            m.forward = types.MethodType(_rms_forward, m)
        elif name.endswith("RotaryEmbedding"):
            m.forward = types.MethodType(_rope_forward, m)
    model.config._attn_implementation = ATTN_IMPLEMENTATION
    for m in model.modules():
        if hasattr(m, "config") and m.config is not model.config:
            m.config._attn_implementation = ATTN_IMPLEMENTATION
    return model

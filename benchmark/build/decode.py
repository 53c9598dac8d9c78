"""Sampling with a KV cache: the Hugging Face incremental forward, and a lean copy of it.

Every sampled response of a build (GRPO rollouts, behavior curve, draws, targets) and of a replay
comes from :func:`sample`, which decodes incrementally: one forward of the prompt (prefill), then
one forward per new token against the cached keys and values, exactly as
``model(input_ids=new, cache=DynamicCache())`` does in ``transformers``.

Two decoders compute those logits:

* :class:`HFDecoder` calls the model itself with a ``transformers.DynamicCache``;
* :class:`LeanDecoder` calls the same torch kernels in the same order on the live parameters
  (so it follows training updates), with the rotary tables and causal masks cached, without the
  module stack's Python overhead (about 3x faster on the tiny model).

Whether the two are bit-identical depends on the CPU's kernels (strides, ISA), so
:func:`make_decoder` checks it on random inputs at start-up and falls back to
:class:`HFDecoder` when they are not: sampled tokens, and therefore every causal number, never
depend on which of the two ran.
"""

from __future__ import annotations

import torch

from benchmark.build.precision import ATTN_IMPLEMENTATION, compute_dtype, wide

_F = torch.nn.functional


class HFDecoder:
    """Last-position logits from the model's own incremental forward (``DynamicCache``)."""

    kind = "hf"

    def __init__(self, model) -> None:
        self.model = model
        self._cache = None

    @torch.no_grad()
    def start(self, ids: torch.Tensor) -> torch.Tensor:
        """Prefill ``ids`` (B, L); return ``logits[:, -1]`` (B, vocab)."""
        from transformers import DynamicCache

        self._cache = DynamicCache()
        return self.model(input_ids=ids, cache=self._cache, use_cache=True).logits[:, -1, :]

    @torch.no_grad()
    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Append one token per row (B,); return the new last-position logits (B, vocab)."""
        out = self.model(input_ids=tok[:, None], cache=self._cache, use_cache=True)
        return out.logits[:, -1, :]


class LeanDecoder:
    """The same computation as :class:`HFDecoder` for eager Qwen2 models, without the overhead."""

    kind = "lean"

    def __init__(self, model, max_len: int | None = None) -> None:
        from transformers.masking_utils import create_causal_mask

        self.model = model
        conf = model.config
        self.supported = (getattr(conf, "model_type", "") == "qwen2"
                          and getattr(conf, "_attn_implementation", "eager")
                          in ("eager", ATTN_IMPLEMENTATION)
                          and not any(t != "full_attention"
                                      for t in getattr(conf, "layer_types", None) or []))
        self._mask_fn = create_causal_mask
        self._masks: dict = {}
        self._max_len = int(max_len or getattr(conf, "max_position_embeddings", 64))
        self._rope = None
        self._cache: list = []
        self._pos = 0

    def _tables(self, like: torch.Tensor):
        if self._rope is None:
            inner = self.model.model
            pos = torch.arange(self._max_len).unsqueeze(0)
            emb = torch.zeros(1, self._max_len, self.model.config.hidden_size, dtype=like.dtype)
            cos, sin = inner.rotary_emb(emb, pos)
            self._rope = (cos, sin)
        return self._rope

    def _mask(self, b: int, n: int, like: torch.Tensor):
        if (b, n) not in self._masks:
            emb = torch.zeros(b, n, self.model.config.hidden_size, dtype=like.dtype)
            self._masks[(b, n)] = self._mask_fn(
                config=self.model.config, inputs_embeds=emb, attention_mask=None, cache=None,
                position_ids=torch.arange(n).unsqueeze(0))
        return self._masks[(b, n)]

    @staticmethod
    def _rms(x: torch.Tensor, norm) -> torch.Tensor:
        dt = x.dtype
        h = x.to(compute_dtype(dt))
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + norm.variance_epsilon)
        return norm.weight * h.to(dt)

    @staticmethod
    def _rot(x: torch.Tensor) -> torch.Tensor:
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        b, n = ids.shape
        emb = inner.embed_tokens
        h = _F.embedding(ids, emb.weight, emb.padding_idx)
        cos_all, sin_all = self._tables(h)
        start = self._pos
        cos = cos_all[:, start:start + n].unsqueeze(1)
        sin = sin_all[:, start:start + n].unsqueeze(1)
        mask = self._mask(b, n, h) if n > 1 else None  # one query sees every cached key
        for i, layer in enumerate(inner.layers):
            att = layer.self_attn
            hd = att.head_dim
            res = h
            x = self._rms(h, layer.input_layernorm)
            shape = (b, n, -1, hd)
            q = _F.linear(x, att.q_proj.weight, att.q_proj.bias).view(shape).transpose(1, 2)
            k = _F.linear(x, att.k_proj.weight, att.k_proj.bias).view(shape).transpose(1, 2)
            v = _F.linear(x, att.v_proj.weight, att.v_proj.bias).view(shape).transpose(1, 2)
            q = (q * cos) + (self._rot(q) * sin)
            k = (k * cos) + (self._rot(k) * sin)
            # as DynamicCache.update: concatenation makes keys and values contiguous
            if i < len(self._cache):
                k = torch.cat([self._cache[i][0], k], dim=-2)
                v = torch.cat([self._cache[i][1], v], dim=-2)
                self._cache[i] = (k, v)
            else:
                k, v = k.contiguous(), v.contiguous()
                self._cache.append((k, v))
            rep = att.num_key_value_groups
            if rep != 1:
                kl = k.shape[2]
                k = k[:, :, None].expand(b, k.shape[1], rep, kl, hd).reshape(b, -1, kl, hd)
                v = v[:, :, None].expand(b, v.shape[1], rep, kl, hd).reshape(b, -1, kl, hd)
            w = torch.matmul(q, k.transpose(2, 3)) * att.scaling
            if mask is not None:
                w = w + mask
            w = _F.softmax(w, dim=-1, dtype=compute_dtype(q.dtype)).to(q.dtype)
            o = torch.matmul(w, v).transpose(1, 2).contiguous()
            o = o.reshape(b, n, -1).contiguous()
            h = res + _F.linear(o, att.o_proj.weight, att.o_proj.bias)
            res = h
            x = self._rms(h, layer.post_attention_layernorm)
            mlp = layer.mlp
            gate = mlp.act_fn(_F.linear(x, mlp.gate_proj.weight))
            h = res + _F.linear(gate * _F.linear(x, mlp.up_proj.weight), mlp.down_proj.weight)
        h = self._rms(h, inner.norm)
        self._pos += n
        return _F.linear(h, self.model.lm_head.weight)[:, -1, :]

    def start(self, ids: torch.Tensor) -> torch.Tensor:
        """Prefill ``ids`` (B, L); return ``logits[:, -1]`` (B, vocab)."""
        self._cache, self._pos = [], 0
        return self._forward(ids)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Append one token per row (B,); return the new last-position logits (B, vocab)."""
        return self._forward(tok[:, None])

    @torch.no_grad()
    def check(self, n_inputs: int = 12, new_tokens: int = 6, seed: int = 0) -> dict:
        """Compare with :class:`HFDecoder` on random prompts and continuations.

        Returns ``{"bit_identical": bool, "max_abs_diff": float, "inputs": n}``.
        """
        if not self.supported:
            return {"bit_identical": False, "max_abs_diff": None, "inputs": 0,
                    "reason": "not an eager Qwen2 model"}
        ref = HFDecoder(self.model)
        g = torch.Generator().manual_seed(seed)
        vocab = self.model.config.vocab_size
        equal, worst = True, 0.0
        for j in range(n_inputs):
            b, n = (1, 8, 3, 32)[j % 4], 4 + j % 7
            ids = torch.randint(0, vocab, (b, n), generator=g)
            pairs = [(self.start(ids), ref.start(ids))]
            for _ in range(new_tokens):
                tok = torch.randint(0, vocab, (b,), generator=g)
                pairs.append((self.step(tok), ref.step(tok)))
            for a, r in pairs:
                if not torch.equal(a, r):
                    equal = False
                    worst = max(worst, float((a - r).abs().max()))
        return {"bit_identical": equal, "max_abs_diff": worst, "inputs": n_inputs}


def make_decoder(model, lean: bool = True):
    """The fastest decoder whose logits are bit-identical to the model's own on this machine.

    Returns a :class:`LeanDecoder` when ``lean`` and its start-up check against
    :class:`HFDecoder` passes bit for bit, else an :class:`HFDecoder`. ``decoder.kind`` says
    which; ``decoder.check_result`` holds the check (None when not run).
    """
    if lean:
        d = LeanDecoder(model)
        res = d.check()
        if res["bit_identical"]:
            d.check_result = res
            return d
        hf = HFDecoder(model)
        hf.check_result = res
        return hf
    hf = HFDecoder(model)
    hf.check_result = None
    return hf


@torch.no_grad()
def sample(decoder, prompt_ids: torch.Tensor, gen, temperature: float,
           top_p: float, max_new_tokens: int, eos_id: int) -> list[list[int]]:
    """Sample one response per row of ``prompt_ids`` (B, L) with a KV cache.

    Draws come only from ``gen`` (temperature, then nucleus filtering with ``top_p``; one
    ``multinomial`` over the batch per new token). Rows stop at their first eos, which is kept.
    Returns the response ids of each row. Rows of one call must share a prompt length (a GRPO
    group repeats one prompt; a curve batch holds prompts of one kind).

    ``gen`` may also be a list of generators, one per equal block of consecutive rows (several
    GRPO groups decoded in one batch): each block then draws from its own generator, and only
    while one of its rows is unfinished, exactly as if the block were sampled alone; only the
    model's arithmetic sees the larger batch.
    """
    b = prompt_ids.shape[0]
    gens = gen if isinstance(gen, list | tuple) else [gen]
    size = b // len(gens)
    if size * len(gens) != b:
        raise ValueError(f"sample: {b} rows do not split into {len(gens)} equal blocks")
    done = torch.zeros(b, dtype=torch.bool)
    resp: list[list[int]] = [[] for _ in range(b)]
    last = decoder.start(prompt_ids)
    for t in range(max_new_tokens):
        logits = wide(last) / temperature
        probs = torch.softmax(logits, dim=-1)
        sp, si = torch.sort(probs, dim=-1, descending=True)
        keep = (torch.cumsum(sp, dim=-1) - sp) < top_p
        sp = sp * keep
        sp = sp / sp.sum(-1, keepdim=True)
        if len(gens) == 1:
            choice = torch.multinomial(sp, 1, generator=gens[0])
        else:
            choice = torch.zeros(b, 1, dtype=torch.long)
            for k, g in enumerate(gens):
                rows = slice(k * size, (k + 1) * size)
                if not bool(done[rows].all()):
                    choice[rows] = torch.multinomial(sp[rows], 1, generator=g)
        tok = si.gather(1, choice).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, eos_id), tok)
        for j, (t_j, d_j) in enumerate(zip(tok.tolist(), done.tolist(), strict=True)):
            if not d_j:
                resp[j].append(t_j)
        done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        last = decoder.step(tok)
    return resp


__all__ = ["HFDecoder", "LeanDecoder", "make_decoder", "sample"]

"""The functional Qwen2 of K replays: stacked decoding, measuring and sampling; training forward.

The model code of :mod:`benchmark.build.stacked` (which runs the replays): the same math as the
``transformers`` model, written as functions of explicit float64 parameters so that K replays'
parameters can be stacked on a leading dim.

* **decoding** (:func:`prefill`, :func:`decode_step`, :func:`logits`) stacks the K replays'
  activations, ``(K, rows, ...)``: every elementwise and row-wise op is one call for all of them,
  and the matrix products run once per replay with that replay's weights (:func:`linear`: one
  ``bmm`` where that gives each replay the bits of its own ``mm``);
* **sampling** (:func:`sample_stacked`) draws every replay's tokens with the run's streams;
* **training** (:func:`forward_one`) is one replay's forward with autograd, each group laid out
  as one sequence (the prompt once, then its rows).

What a replay computes never depends on which other replays share its batch
(:mod:`benchmark.build.stacked`, "Batch independence").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmark.errors import BuildError

_F = torch.nn.functional
DTYPE = torch.float64


@dataclass(frozen=True)
class Arch:
    """The shapes and constants of an eager Qwen2 model (what the functional forward needs)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    vocab: int
    names: tuple[str, ...]
    cos: torch.Tensor  # (max_len, head_dim) float64 rotary tables
    sin: torch.Tensor
    padding_idx: int | None = None  # the embedding's: no gradient flows into its row

    @classmethod
    def of(cls, model) -> Arch:
        """Read the architecture of a ``transformers`` Qwen2 model (tied embeddings)."""
        c = model.config
        if (getattr(c, "model_type", "") != "qwen2" or not getattr(c, "tie_word_embeddings", 0)
                or c.num_key_value_heads != c.num_attention_heads):
            raise BuildError("stacked replays support Qwen2 models with tied embeddings and "
                             "as many key/value heads as heads (the tiny presets); got "
                             f"model_type={getattr(c, 'model_type', None)!r}")
        hd = c.hidden_size // c.num_attention_heads
        rot = model.model.rotary_emb
        pos = torch.arange(int(c.max_position_embeddings), dtype=DTYPE)
        freqs = pos[:, None] * rot.inv_freq.to(DTYPE)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = float(getattr(rot, "attention_scaling", 1.0))
        return cls(hidden=c.hidden_size, heads=c.num_attention_heads,
                   kv_heads=c.num_key_value_heads, head_dim=hd, layers=c.num_hidden_layers,
                   eps=float(c.rms_norm_eps), vocab=c.vocab_size,
                   names=tuple(n for n, _ in model.named_parameters()),
                   cos=emb.cos() * scale, sin=emb.sin() * scale,
                   padding_idx=model.model.embed_tokens.padding_idx)


# ----------------------------------------------------------------------------------------------
# the stacked forward (no gradient: decoding and measuring)

#: (K, M, in, out) -> whether one ``bmm`` gives each replay the bits of its own ``mm``
_BMM_EXACT: dict[tuple[int, int, int, int], bool] = {}


def _probe(n: int, salt: int = 0) -> torch.Tensor:
    """``n`` float64 values spread over [-1, 1) with every mantissa bit in play, cheaply.

    A Weyl sequence (fractional parts of ``i * golden ratio``), so probing a new shape costs an
    ``arange``, not ``n`` Gaussian draws (those were 8% of a replay step while shapes were new).
    """
    i = torch.arange(salt, salt + n, dtype=DTYPE)
    return torch.frac(i * 0.6180339887498949) * 2.0 - 1.0


def bmm_is_exact(k: int, m: int, n_in: int, n_out: int) -> bool:
    """Whether ``bmm`` of K ``(m, n_in) @ (n_in, n_out)`` equals K separate ``mm`` bit for bit.

    BLAS libraries may compute a batch of small products with other kernels than one product
    alone (seen here for tiny shapes), which would make a replay's numbers depend on its batch.
    Checked once per shape on pseudo-random inputs (kernel choice depends on shapes and
    strides, not on values) with the operands laid out as :func:`linear` lays them out.
    """
    key = (k, m, n_in, n_out)
    if key not in _BMM_EXACT:
        x, w = _probe(k * m * n_in).view(k, m, n_in), _probe(k * n_out * n_in, 7).view(
            k, n_out, n_in)
        fast = torch.bmm(x, w.transpose(1, 2))
        _BMM_EXACT[key] = all(torch.equal(fast[j], torch.mm(x[j], w[j].t())) for j in range(k))
    return _BMM_EXACT[key]


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Per-replay ``x[j] @ w[j]^T (+ b[j])``: ``x`` (K, M, in), ``w`` (K, out, in) -> (K, M, out).

    Defined as one ``mm`` per replay; computed with one ``bmm`` where that is bit-identical
    (:func:`bmm_is_exact`).
    """
    k, m, n_in = x.shape
    if bmm_is_exact(k, m, n_in, w.shape[1]):
        y = torch.bmm(x, w.transpose(1, 2))
    else:
        y = torch.stack([torch.mm(x[j], w[j].t()) for j in range(k)])
    return y if b is None else y + b[:, None, :]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim; ``w`` broadcasts against ``x``."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class Cache:
    """Keys and values of K replays' decoding, per layer ``(K, B, heads, L_max, head_dim)``.

    Preallocated for the longest prompt plus the response limit and filled in place: ``mask``
    ``(B, L_max)`` is 0 where a row has a key and -inf where it has none (a shorter prompt,
    left-padded, or a position not yet decoded); ``pos`` ``(B,)`` is each row's next
    position (its rotary angle) and ``fill`` the next column of the cache.
    """

    def __init__(self, kv: list, mask: torch.Tensor, pos: torch.Tensor, fill: int) -> None:
        self.kv, self.mask, self.pos, self.fill = kv, mask, pos, fill


def _vec(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-replay vector ``(K, n)`` viewed to broadcast against a ``(K, ..., n)`` tensor."""
    return v.view(v.shape[0], *([1] * (ndim - 2)), v.shape[-1])


@torch.no_grad()
def prefill(arch: Arch, p: dict, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Run ``ids`` ``(K, B, n)`` (one prompt per row, positions 0..n-1, causal).

    Returns the last position's hidden state after the final norm ``(K, B, H)`` and per layer
    the keys and values ``(K, B, heads, n, head_dim)``.
    """
    k_n, b, n = ids.shape
    hd, nh, hid = arch.head_dim, arch.heads, arch.hidden
    emb = p["model.embed_tokens.weight"]
    h = torch.stack([_F.embedding(ids[j], emb[j]) for j in range(k_n)]).view(k_n, b * n, hid)
    cos, sin = arch.cos[:n], arch.sin[:n]
    mask = torch.full((n, n), float("-inf"), dtype=DTYPE).triu(1)
    kv = []
    for i in range(arch.layers):
        pre = f"model.layers.{i}."
        x = _rms(h, _vec(p[pre + "input_layernorm.weight"], 3), arch.eps)
        shape = (k_n, b, n, nh, hd)
        q = linear(x, p[pre + "self_attn.q_proj.weight"], p[pre + "self_attn.q_proj.bias"])
        kk = linear(x, p[pre + "self_attn.k_proj.weight"], p[pre + "self_attn.k_proj.bias"])
        v = linear(x, p[pre + "self_attn.v_proj.weight"], p[pre + "self_attn.v_proj.bias"])
        q = _rotate(q.view(shape).transpose(2, 3), cos, sin)  # (K, B, nh, n, hd)
        kk = _rotate(kk.view(shape).transpose(2, 3), cos, sin).contiguous()
        v = v.view(shape).transpose(2, 3).contiguous()
        kv.append((kk, v))
        w = torch.softmax((q[:, :, :, :, None, :] * kk[:, :, :, None, :, :]).sum(-1)
                          * (hd ** -0.5) + mask, dim=-1)  # (K, B, nh, n, n)
        o = (w[..., None] * v[:, :, :, None, :, :]).sum(-2)  # (K, B, nh, n, hd)
        h = h + linear(o.transpose(2, 3).reshape(k_n, b * n, hid),
                       p[pre + "self_attn.o_proj.weight"])
        h = h + _mlp(arch, p, pre, h)
    last = h.view(k_n, b, n, hid)[:, :, -1]
    return _rms(last, _vec(p["model.norm.weight"], 3), arch.eps), kv


def _mlp(arch: Arch, p: dict, pre: str, h: torch.Tensor) -> torch.Tensor:
    x = _rms(h, _vec(p[pre + "post_attention_layernorm.weight"], 3), arch.eps)
    gate = _F.silu(linear(x, p[pre + "mlp.gate_proj.weight"]))
    return linear(gate * linear(x, p[pre + "mlp.up_proj.weight"]), p[pre + "mlp.down_proj.weight"])


@torch.no_grad()
def decode_step(arch: Arch, p: dict, tok: torch.Tensor, cache: Cache) -> torch.Tensor:
    """Append one token per row (``tok`` ``(K, B)``); return the final-norm hidden ``(K, B, H)``.

    Attention is computed elementwise (products and sums), whose every element is computed
    alone: the same bits whatever the batch.
    """
    k_n, b = tok.shape
    hd, nh, hid = arch.head_dim, arch.heads, arch.hidden
    emb = p["model.embed_tokens.weight"]
    h = torch.stack([_F.embedding(tok[j], emb[j]) for j in range(k_n)])  # (K, B, H)
    cos = arch.cos[cache.pos][:, None, :]  # (B, 1, hd): per row position
    sin = arch.sin[cache.pos][:, None, :]
    col = cache.fill
    cache.mask[:, col] = 0.0
    mask = cache.mask[None, :, None, :col + 1]
    for i in range(arch.layers):
        pre = f"model.layers.{i}."
        x = _rms(h, _vec(p[pre + "input_layernorm.weight"], 3), arch.eps)
        q = linear(x, p[pre + "self_attn.q_proj.weight"], p[pre + "self_attn.q_proj.bias"])
        kk = linear(x, p[pre + "self_attn.k_proj.weight"], p[pre + "self_attn.k_proj.bias"])
        v = linear(x, p[pre + "self_attn.v_proj.weight"], p[pre + "self_attn.v_proj.bias"])
        q = _rotate(q.view(k_n, b, nh, hd), cos, sin)
        keys, vals = cache.kv[i]
        keys[:, :, :, col] = _rotate(kk.view(k_n, b, nh, hd), cos, sin)
        vals[:, :, :, col] = v.view(k_n, b, nh, hd)
        keys, vals = keys[:, :, :, :col + 1], vals[:, :, :, :col + 1]  # (K, B, nh, L, hd)
        w = torch.softmax((q[:, :, :, None, :] * keys).sum(-1) * (hd ** -0.5) + mask,
                          dim=-1)  # (K, B, nh, L)
        o = (w[..., None] * vals).sum(-2)  # (K, B, nh, hd)
        h = h + linear(o.reshape(k_n, b, hid), p[pre + "self_attn.o_proj.weight"])
        h = h + _mlp(arch, p, pre, h)
    cache.fill += 1
    cache.pos = cache.pos + 1
    return _rms(h, _vec(p["model.norm.weight"], 3), arch.eps)


@torch.no_grad()
def logits(p: dict, h: torch.Tensor) -> torch.Tensor:
    """``(K, N, H)`` final-norm hidden states -> ``(K, N, vocab)`` logits (tied embeddings)."""
    return linear(h, p["model.embed_tokens.weight"])


_TREES: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _tree(lp: int, g_n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(T,)`` and additive mask ``(T, T)`` of a group laid out as one sequence.

    ``T = lp + g_n * (r - 1)``: the prompt once, then each row's first ``r - 1`` response tokens.
    A prompt token sees the prompt up to itself; row j's token t sees the whole prompt and row
    j's tokens up to t (its position is ``lp + t``).
    """
    key = (lp, g_n, r)
    if key not in _TREES:
        t_n = lp + g_n * (r - 1)
        pos = torch.cat((torch.arange(lp), torch.arange(lp, lp + r - 1).repeat(g_n)))
        row = torch.cat((torch.full((lp,), -1), torch.arange(g_n).repeat_interleave(r - 1)))
        q, k = torch.arange(t_n)[:, None], torch.arange(t_n)[None, :]
        see = ((k < lp) & ((row[:, None] >= 0) | (k <= q))) | (
            (row[:, None] == row[None, :]) & (row[:, None] >= 0) & (k <= q))
        mask = torch.zeros(t_n, t_n, dtype=DTYPE).masked_fill(~see, float("-inf"))
        _TREES[key] = (pos, mask)
    return _TREES[key]


def forward_one(arch: Arch, p: dict, prefix: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Training forward of one replay, with autograd: log-probs of each response token.

    Args:
        arch: the architecture.
        p: the replay's parameters (leaves with ``requires_grad``).
        prefix: ``(Gp, Lp)`` one prompt per group.
        rows: ``(Gp, G, R)`` the groups' response tokens, right-padded to ``R``.

    Returns:
        ``(Gp, G, R)`` float64 log-probabilities (temperature 1) of ``rows[g, j, t]`` given the
        prompt and the earlier response tokens (padding positions hold values to be masked).

    Each group is one sequence of ``Lp + G (R - 1)`` tokens (:func:`_tree`): the shared prompt
    is computed once, and every projection is one product over all the groups' tokens.
    """
    gp, lp = prefix.shape
    _, g_n, r = rows.shape
    hd, nh, hid = arch.head_dim, arch.heads, arch.hidden
    pos, mask = _tree(lp, g_n, r)
    t_n = pos.numel()
    emb = p["model.embed_tokens.weight"]
    ids = torch.cat((prefix, rows[:, :, :-1].reshape(gp, g_n * (r - 1))), dim=1)  # (Gp, T)
    h = _F.embedding(ids, emb, arch.padding_idx)
    cos, sin = arch.cos[pos], arch.sin[pos]
    for i in range(arch.layers):
        pre = f"model.layers.{i}."
        x = _rms(h, p[pre + "input_layernorm.weight"], arch.eps)
        shape = (gp, t_n, nh, hd)
        q = _F.linear(x, p[pre + "self_attn.q_proj.weight"], p[pre + "self_attn.q_proj.bias"])
        kk = _F.linear(x, p[pre + "self_attn.k_proj.weight"], p[pre + "self_attn.k_proj.bias"])
        v = _F.linear(x, p[pre + "self_attn.v_proj.weight"], p[pre + "self_attn.v_proj.bias"])
        q = _rotate(q.view(shape).transpose(1, 2), cos, sin)
        kk = _rotate(kk.view(shape).transpose(1, 2), cos, sin)
        w = torch.softmax(torch.matmul(q, kk.transpose(2, 3)) * (hd ** -0.5) + mask, dim=-1)
        o = torch.matmul(w, v.view(shape).transpose(1, 2)).transpose(1, 2).reshape(gp, t_n, hid)
        h = h + _F.linear(o, p[pre + "self_attn.o_proj.weight"])
        x = _rms(h, p[pre + "post_attention_layernorm.weight"], arch.eps)
        gate = _F.silu(_F.linear(x, p[pre + "mlp.gate_proj.weight"]))
        h = h + _F.linear(gate * _F.linear(x, p[pre + "mlp.up_proj.weight"]),
                          p[pre + "mlp.down_proj.weight"])
    # the hidden states that predict response tokens: the prompt's last, then each row's inputs
    h = torch.cat((h[:, lp - 1:lp].expand(gp, g_n, hid)[:, :, None, :],
                   h[:, lp:].view(gp, g_n, r - 1, hid)), dim=2)  # (Gp, G, R, H)
    lg = _F.linear(_rms(h, p["model.norm.weight"], arch.eps), emb)
    return torch.log_softmax(lg, dim=-1).gather(-1, rows[..., None]).squeeze(-1)


# ----------------------------------------------------------------------------------------------
# sampling


def sample_stacked(arch: Arch, p: dict, pids: list[list[int]], stream,
                   group_size: int, temperature: float, top_p: float, max_new: int,
                   eos: int) -> list[list[list[int]]]:
    """Sample ``group_size`` responses to each prompt for each of K replays, with a KV cache.

    Args:
        arch: the architecture.
        p: the K replays' stacked parameters (:attr:`Stack.params`).
        pids: one prompt's ids per group (lengths may differ).
        stream: ``stream(g)`` a new generator of group g's sampling stream, the same for every
            replay of the seed (common random numbers: every replay draws from the run's
            streams).

    Returns:
        ``out[k][row]``: response ids, rows group-major (``g * group_size + j``), each ending at
        its first eos or after ``max_new`` tokens.

    Each group's prompt runs once (prompts of one length together) and its keys and values
    serve its G rows; then all rows decode together, shorter prompts left-padded (masked keys).
    The draws are :func:`benchmark.build.decode.sample`'s: temperature, nucleus filtering
    with ``top_p``, one ``multinomial`` per group and token from the group's own stream, drawn
    only while the group has an unfinished row. A replay's group g draws its t-th token from
    the t-th draw of stream g whatever the other replays do (a finished group stays finished),
    so the draw is taken once per group and token and serves every replay whose group is still
    running (:func:`_group_draws`).
    """
    k_n, n_groups, big_g = p["model.norm.weight"].shape[0], len(pids), group_size
    rows = n_groups * big_g
    lmax = max(len(x) for x in pids)
    hd, nh = arch.head_dim, arch.heads
    width = lmax + max_new
    kv = [(torch.zeros(k_n, rows, nh, width, hd, dtype=DTYPE),
           torch.zeros(k_n, rows, nh, width, hd, dtype=DTYPE)) for _ in range(arch.layers)]
    mask = torch.full((rows, width), float("-inf"), dtype=DTYPE)
    pos = torch.zeros(rows, dtype=torch.long)
    last = torch.zeros(k_n, rows, arch.hidden, dtype=DTYPE)
    for n in sorted({len(x) for x in pids}):
        groups = [g for g in range(n_groups) if len(pids[g]) == n]
        ids = torch.tensor([pids[g] for g in groups]).expand(k_n, len(groups), n)
        hl, kvb = prefill(arch, p, ids)
        sel = torch.tensor([g * big_g + j for g in groups for j in range(big_g)])
        for i, (kk, v) in enumerate(kvb):
            kv[i][0][:, sel, :, lmax - n:lmax] = kk.repeat_interleave(big_g, dim=1)
            kv[i][1][:, sel, :, lmax - n:lmax] = v.repeat_interleave(big_g, dim=1)
        mask[sel, lmax - n:lmax] = 0.0
        pos[sel] = n
        last[:, sel] = hl.repeat_interleave(big_g, dim=1)
    cache = Cache(kv, mask, pos, lmax)
    lg = logits(p, last)  # (K, rows, V)
    done = torch.zeros(k_n, rows, dtype=torch.bool)
    gens: dict[tuple[int, int], torch.Generator] = {}  # (replay or -1 for all, group) -> stream
    toks = torch.full((k_n, rows, max_new), eos, dtype=torch.long)
    for t in range(max_new):
        probs = torch.softmax(lg / temperature, dim=-1)
        sp, si = torch.sort(probs, dim=-1, descending=True)
        keep = (torch.cumsum(sp, dim=-1) - sp) < top_p
        sp = sp * keep
        sp = sp / sp.sum(-1, keepdim=True)
        choice = _group_draws(sp, done, stream, gens, big_g)
        tok = si.gather(2, choice).squeeze(2)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        toks[:, :, t] = tok
        done = done | (tok == eos)
        if bool(done.all()) or t == max_new - 1:
            break
        lg = logits(p, decode_step(arch, p, tok, cache))
    # a response is its tokens up to its first eos (kept) or the limit
    is_eos = toks == eos
    first = torch.where(is_eos.any(-1), is_eos.to(torch.int8).argmax(-1) + 1,
                        torch.full(is_eos.shape[:2], max_new))
    return [[row[:n] for row, n in zip(tk, nk, strict=True)]
            for tk, nk in zip(toks.tolist(), first.tolist(), strict=True)]


def _group_draws(sp: torch.Tensor, done: torch.Tensor, stream, gens: dict,
                 big_g: int) -> torch.Tensor:
    """The sampled positions ``(K, rows, 1)`` of ``sp`` ``(K, rows, V)`` (rows group-major).

    ``torch.multinomial(probs, 1, generator)`` draws ``q ~ Exp(1)`` of ``probs``' shape from the
    generator and returns ``argmax(probs / q)`` (checked once per process,
    :func:`multinomial_is_exponential_argmax`), so one draw per group serves every replay whose
    group is still running; where that does not hold, every replay draws from its own copy of
    the stream. ``gens`` keeps the streams between tokens.
    """
    k_n, rows, v = sp.shape
    n_groups = rows // big_g
    active = (~done.view(k_n, n_groups, big_g).all(-1)).tolist()  # [K][groups]: still draws
    if not multinomial_is_exponential_argmax():
        choice = torch.zeros(k_n, rows, 1, dtype=torch.long)
        for k in range(k_n):
            for g in range(n_groups):
                if active[k][g]:
                    r = slice(g * big_g, (g + 1) * big_g)
                    gen = gens.setdefault((k, g), stream(g))
                    choice[k, r] = torch.multinomial(sp[k, r], 1, generator=gen)
        return choice
    q = torch.ones(n_groups, big_g, v, dtype=sp.dtype)
    for g in range(n_groups):
        if any(a[g] for a in active):
            q[g].exponential_(generator=gens.setdefault((-1, g), stream(g)))
    return (sp / q.view(1, rows, v)).argmax(-1, keepdim=True)


_MULTINOMIAL: list[bool] = []


def multinomial_is_exponential_argmax() -> bool:
    """Whether ``torch.multinomial(p, 1, g)`` is ``argmax(p / Exp(1) draws of g)`` here.

    Checked on pseudo-random rows with zeros (as after nucleus filtering), five draws in a row
    from one stream, the stream's state compared after.
    """
    if not _MULTINOMIAL:
        ok = True
        for seed in range(4):
            g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            prob = _probe(8 * 86, 101 * seed).view(8, 86).abs() ** 4
            prob[:, 40 + seed:] = 0.0
            prob = prob / prob.sum(-1, keepdim=True)
            for _ in range(5):
                a = torch.multinomial(prob, 1, generator=g1)
                b = (prob / torch.empty_like(prob).exponential_(generator=g2)).argmax(
                    -1, keepdim=True)
                ok = ok and torch.equal(a, b)
            ok = ok and torch.equal(g1.get_state(), g2.get_state())
        _MULTINOMIAL.append(ok)
    return _MULTINOMIAL[0]

"""Many float64 replays of one seed at once: stacked activations, per-replay weights.

A causal score needs many replays of the same small run, each with another set of rollouts
removed. They share everything but their parameters: the step's prompts, the sampling streams,
the model's shape. :class:`StackedReplay` runs K of them in lock step, one GRPO step at a time:

* **decoding** stacks the K replays' activations, ``(K, rows, ...)``, so every elementwise and
  row-wise op (norms, rotary embedding, softmax, sampling weights) is one call for all of them;
  the matrix products run once per replay with that replay's weights (``torch.mm`` on its rows).
  A group's G responses share their prompt, so the prompt is run once per group (prefill) and its
  keys and values are repeated for the G rows;
* **training** runs each replay's loss and backward on its own, over the groups whose advantages
  are not all zero in that replay (a group with zero advantages adds exactly zero to the
  gradient), again with the prompt shared by the group's rows;
* **AdamW** updates every replay's parameters with the fused AdamW kernel of
  ``torch.optim.AdamW(fused=True)`` (elementwise: the same arithmetic as one replay alone).

**Batch independence.** What a replay computes never depends on which other replays share its
batch: its matrix products are calls on its own rows only, elementwise ops act on each element
alone, row-wise ops on each row alone, and the shapes of its training pass depend on its own
advantages only. A replay run alone (K = 1) and the same replay inside any batch give the same
bits (``tests/test_stacked.py`` checks it; so the replay store can keep results by removal set,
whatever batch made them).

**Sharing the prefix.** A replay with removals equals the baseline (nothing removed) up to its
first removed step. :func:`run_batch` therefore runs the baseline as slice 0 and lets each removal
replay *join* at its first removed step as a copy of slice 0's parameters and optimizer state;
a replay *leaves* after its stop step, when its measure is taken. A bonus-off replay joins at its
task's window start.

The arithmetic is float64 throughout (sampling weights, log-probabilities and the update
included), like :mod:`benchmark.build.precision`'s widened model, so rounding differences
between machines are about 1e-16 and a sampled token practically never flips (docs/causal.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from benchmark.build import task as T
from benchmark.build.grpo import advantages, step_prompts
from benchmark.errors import BuildError

_F = torch.nn.functional
DTYPE = torch.float64


# ----------------------------------------------------------------------------------------------
# the parameters of K replays


@dataclass
class Stack:
    """K replays' float64 parameters and AdamW moments, stacked on a leading dim of size K.

    ``params[name]`` has shape ``(K, *shape)`` of the model's parameter ``name``; so do
    ``exp_avg`` and ``exp_avg_sq``. Replays join (:meth:`extend`) and leave (:meth:`keep`)
    between steps.
    """

    params: dict[str, torch.Tensor]
    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]

    @property
    def k(self) -> int:
        """The number of replays."""
        return next(iter(self.params.values())).shape[0]

    @classmethod
    def of(cls, states: list[dict]) -> Stack:
        """Stack single-replay states (:meth:`state`'s form)."""
        def st(key):
            return {n: torch.stack([s[key][n] for s in states]).contiguous()
                    for n in states[0][key]}

        return cls(st("params"), st("exp_avg"), st("exp_avg_sq"))

    def state(self, j: int, step: int) -> dict:
        """Replay j's state as a storable copy: ``{"step", "params", "exp_avg", "exp_avg_sq"}``."""
        def c(d):
            return {n: v[j].clone() for n, v in d.items()}

        return {"step": int(step), "params": c(self.params), "exp_avg": c(self.exp_avg),
                "exp_avg_sq": c(self.exp_avg_sq)}

    def extend(self, states: list[dict]) -> None:
        """Append replays (each a :meth:`state`)."""
        if not states:
            return
        more = Stack.of(states)
        for mine, theirs in ((self.params, more.params), (self.exp_avg, more.exp_avg),
                             (self.exp_avg_sq, more.exp_avg_sq)):
            for n in mine:
                mine[n] = torch.cat((mine[n], theirs[n])).contiguous()

    def keep(self, rows: list[int]) -> None:
        """Keep only the replays at ``rows`` (in that order)."""
        idx = torch.tensor(rows, dtype=torch.long)
        for d in (self.params, self.exp_avg, self.exp_avg_sq):
            for n in d:
                d[n] = d[n].index_select(0, idx).contiguous()


def initial_state(model) -> dict:
    """The post-SFT parameters as float64 with zero AdamW moments (:meth:`Stack.state` form)."""
    p = {n: v.detach().to(DTYPE).clone() for n, v in model.named_parameters()}
    return {"step": 0, "params": p, "exp_avg": {n: torch.zeros_like(v) for n, v in p.items()},
            "exp_avg_sq": {n: torch.zeros_like(v) for n, v in p.items()}}


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


def bmm_is_exact(k: int, m: int, n_in: int, n_out: int) -> bool:
    """Whether ``bmm`` of K ``(m, n_in) @ (n_in, n_out)`` equals K separate ``mm`` bit for bit.

    BLAS libraries may compute a batch of small products with other kernels than one product
    alone (seen here for tiny shapes), which would make a replay's numbers depend on its batch.
    Checked once per shape on random inputs (kernel choice depends on shapes and strides, not
    on values) with the operands laid out as :func:`linear` lays them out.
    """
    key = (k, m, n_in, n_out)
    if key not in _BMM_EXACT:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(k, m, n_in, dtype=DTYPE, generator=g)
        w = torch.randn(k, n_out, n_in, dtype=DTYPE, generator=g)
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


def sample_stacked(arch: Arch, p: dict, pids: list[list[int]], gens: list[list],
                   group_size: int, temperature: float, top_p: float, max_new: int,
                   eos: int) -> list[list[list[int]]]:
    """Sample ``group_size`` responses to each prompt for each of K replays, with a KV cache.

    Args:
        arch: the architecture.
        p: the K replays' stacked parameters (:attr:`Stack.params`).
        pids: one prompt's ids per group (lengths may differ).
        gens: ``gens[k][g]`` the sampling generator of replay k's group g.

    Returns:
        ``out[k][row]``: response ids, rows group-major (``g * group_size + j``), each ending at
        its first eos or after ``max_new`` tokens.

    Each group's prompt runs once (prompts of one length together) and its keys and values
    serve its G rows; then all rows decode together, shorter prompts left-padded (masked keys).
    The draws are :func:`benchmark.build.decode.sample`'s: temperature, nucleus filtering
    with ``top_p``, one ``multinomial`` per group and token from the group's own generator,
    drawn only while the group has an unfinished row.
    """
    k_n, n_groups, big_g = len(gens), len(pids), group_size
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
    resp = [[[] for _ in range(rows)] for _ in range(k_n)]
    for t in range(max_new):
        probs = torch.softmax(lg / temperature, dim=-1)
        sp, si = torch.sort(probs, dim=-1, descending=True)
        keep = (torch.cumsum(sp, dim=-1) - sp) < top_p
        sp = sp * keep
        sp = sp / sp.sum(-1, keepdim=True)
        choice = torch.zeros(k_n, rows, 1, dtype=torch.long)
        for k in range(k_n):
            for g in range(n_groups):
                r = slice(g * big_g, (g + 1) * big_g)
                if not bool(done[k, r].all()):
                    choice[k, r] = torch.multinomial(sp[k, r], 1, generator=gens[k][g])
        tok = si.gather(2, choice).squeeze(2)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        for k, (tk, dk) in enumerate(zip(tok.tolist(), done.tolist(), strict=True)):
            for j, (t_j, d_j) in enumerate(zip(tk, dk, strict=True)):
                if not d_j:
                    resp[k][j].append(t_j)
        done = done | (tok == eos)
        if bool(done.all()) or t == max_new - 1:
            break
        lg = logits(p, decode_step(arch, p, tok, cache))
    return resp


# ----------------------------------------------------------------------------------------------
# the update


def adamw(stack: Stack, grads: dict[str, torch.Tensor], step: int, lr: float, wd: float,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One AdamW update of every replay at once: ``torch.optim.AdamW(fused=True)``'s kernel.

    ``grads[name]`` ``(K, *shape)``; ``step`` is the update's number (1 for the first). The
    fused kernel is elementwise, one pass over parameters, moments and gradients (4x faster
    than the op-by-op formulas here), so each replay's numbers are those of a fused AdamW of
    its own.
    """
    from torch.optim.adamw import adamw as _adamw

    names = list(stack.params)
    # A vectorized kernel may compute a tensor's last few elements (those past a whole number
    # of vectors) with scalar code; when each replay's block is a whole number of the widest
    # vectors (64 float64 covers AVX-512 unrolled), no replay's element is ever in that tail,
    # so stacking changes no bit. Otherwise each replay is updated on its own.
    whole = all(v[0].numel() % 64 == 0 for v in stack.params.values())
    parts = [slice(None)] if whole else [slice(j, j + 1) for j in range(stack.k)]
    with torch.no_grad():
        for part in parts:
            steps = [torch.tensor(float(step - 1), dtype=DTYPE) for _ in names]  # kernel adds 1
            _adamw([stack.params[n][part] for n in names], [grads[n][part] for n in names],
                   [stack.exp_avg[n][part] for n in names],
                   [stack.exp_avg_sq[n][part] for n in names], [], steps, fused=True,
                   amsgrad=False, beta1=betas[0], beta2=betas[1], lr=lr, weight_decay=wd,
                   eps=eps, maximize=False)


def replay_gradient(arch: Arch, params: dict, groups: list[tuple], n_total: int) -> dict:
    """The gradient of ``-(1/N) sum_i A_i lbar_i`` of one replay (its non-zero groups only).

    Args:
        params: the replay's parameters (float64; not modified).
        groups: ``(prompt_ids, responses, advantages)`` per group with a non-zero advantage,
            in step order; responses are G lists of ids (each ending at its first eos or at the
            length limit), advantages ``(G,)`` float64.
        n_total: N, the step's number of rollouts.

    Returns:
        ``{name: gradient}``, zeros when no group is given.
    """
    leaves = {n: v.detach().requires_grad_(True) for n, v in params.items()}
    if not groups:
        return {n: torch.zeros_like(v) for n, v in params.items()}
    by_len: dict[int, list[int]] = {}
    for j, (pid, _, _) in enumerate(groups):
        by_len.setdefault(len(pid), []).append(j)
    total = None
    for lp in sorted(by_len):
        sel = [groups[j] for j in by_len[lp]]
        g_n = len(sel[0][1])
        r = max(len(x) for _, resp, _ in sel for x in resp)
        rows = torch.zeros(len(sel), g_n, r, dtype=torch.long)
        mask = torch.zeros(len(sel), g_n, r, dtype=DTYPE)
        for a, (_, resp, _) in enumerate(sel):
            for j, x in enumerate(resp):
                rows[a, j, :len(x)] = torch.tensor(x)
                mask[a, j, :len(x)] = 1.0
        prefix = torch.tensor([pid for pid, _, _ in sel])
        coef = torch.stack([-adv / n_total for _, _, adv in sel])  # (Gp, G)
        lp_tok = forward_one(arch, leaves, prefix, rows)
        lbar = (lp_tok * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        part = (coef * lbar).sum()
        total = part if total is None else total + part
    names = list(leaves)
    grads = torch.autograd.grad(total, [leaves[n] for n in names], allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(leaves[n]))
            for n, g in zip(names, grads, strict=True)}


# ----------------------------------------------------------------------------------------------
# a batch of replays of one seed


@dataclass
class Member:
    """A replay in a batch: what it removes, which bonuses it switches off, when it stops.

    ``remove``: ``{step: {index, ...}}``; ``join``: the step at which it starts as a copy of
    the baseline (its first removed step, or its first step whose bonus differs); ``stop``: the
    number of updates after which it is measured and leaves.
    """

    key: str
    remove: dict[int, set[int]]
    stop: int
    bonus_off: frozenset[str] = frozenset()
    join: int = 0
    measure_tasks: tuple[str, ...] = ()
    result: dict = field(default_factory=dict)


class StackedReplay:
    """The fixed inputs of a seed's replays: config, tokenizer, start model, measure prompts."""

    def __init__(self, cfg, tokenizer, model, measure=None, reverse_rows: bool = False) -> None:
        """A run's replays from ``model``'s parameters (the post-SFT start).

        Args:
            cfg: the run's :class:`~benchmark.build.config.BuildConfig`.
            tokenizer: its tokenizer.
            model: the start model (any float dtype; the engine computes in float64).
            measure: a :class:`~benchmark.build.measure.Measure` (the causal measure's
                prompts; default: built from ``cfg`` and ``tokenizer``).
            reverse_rows: add each update's groups, and the rows within them, in reverse
                order: the same update with another floating-point summation order (how the
                cross-machine tolerance is measured, docs/causal.md).
        """
        from benchmark.build.measure import Measure

        self.reverse_rows = bool(reverse_rows)
        self.cfg = cfg
        self.arch = Arch.of(model)
        self.start = initial_state(model)
        self.tok = tokenizer
        self.measure = measure if measure is not None else Measure(cfg, tokenizer)
        self._prompts: dict[int, tuple] = {}

    @classmethod
    def of_seed(cls, seed_ctx, reverse_rows: bool = False) -> StackedReplay:
        """The replays of a release seed (a :class:`benchmark.build.replay.ReplaySeed`)."""
        return cls(seed_ctx.cfg, seed_ctx.tokenizer, seed_ctx.fresh_model(), seed_ctx.measure,
                   reverse_rows)

    def step_prompts(self, step: int) -> tuple[list, list[list[int]]]:
        """The step's prompts (one per group) and their ids."""
        if step not in self._prompts:
            prompts = step_prompts(self.cfg, step)
            self._prompts[step] = (prompts, [T.prompt_ids(self.tok, x) for x in prompts])
        return self._prompts[step]

    def sample_step(self, stack: Stack, step: int) -> list[list[list[int]]]:
        """Every replay's responses at ``step``: ``out[k][index]`` in rollout order."""
        cfg = self.cfg
        _, pids = self.step_prompts(step)
        gens = [[T.group_generator(cfg.seed, step, g) for g in range(len(pids))]
                for _ in range(stack.k)]
        return sample_stacked(self.arch, stack.params, pids, gens, cfg.group_size,
                              cfg.temperature, cfg.top_p, cfg.max_new_tokens,
                              self.tok.eos_token_id)

    def advantages(self, step: int, responses: list[list[int]], bonus_off: frozenset[str],
                   remove: set[int] | None) -> torch.Tensor:
        """Advantages ``(N,)`` float64 of one replay's responses (removed positions set to 0)."""
        cfg = self.cfg
        prompts, _ = self.step_prompts(step)
        G = cfg.group_size
        rewards = []
        for i, r in enumerate(responses):
            text = self.tok.decode(r, skip_special_tokens=True)
            rewards.append(T.reward(cfg, prompts[i // G], text, T.rollout_id(step, i), step,
                                    bonus_off).total)
        adv = advantages(torch.tensor(rewards, dtype=DTYPE), G, cfg.adv_eps)
        for i in remove or ():
            adv[i] = 0.0
        return adv

    def update(self, stack: Stack, step: int, responses: list[list[list[int]]],
               advs: list[torch.Tensor]) -> None:
        """One GRPO update of every replay (``step`` = the number of updates applied before)."""
        cfg = self.cfg
        if cfg.grad_clip is not None:
            raise BuildError("stacked replays do not implement update clipping (the tiny "
                             "presets have none); use benchmark.build.replay.replay")
        _, pids = self.step_prompts(step)
        G, n_total = cfg.group_size, cfg.prompts_per_step * cfg.group_size
        per = []
        for j, (resp, adv) in enumerate(zip(responses, advs, strict=True)):
            groups = [(pids[g], resp[g * G:(g + 1) * G], adv[g * G:(g + 1) * G])
                      for g in range(cfg.prompts_per_step)
                      if bool((adv[g * G:(g + 1) * G] != 0).any())]
            if self.reverse_rows:
                groups = [(pid, r[::-1], a.flip(0)) for pid, r, a in groups[::-1]]
            per.append(replay_gradient(self.arch, {n: v[j] for n, v in stack.params.items()},
                                       groups, n_total))
        grads = {n: torch.stack([g[n] for g in per]) for n in stack.params}
        adamw(stack, grads, step + 1, cfg.lr, cfg.weight_decay)

    @torch.no_grad()
    def behavior_probs(self, stack: Stack, behavior: str) -> np.ndarray:
        """Per replay, the exact per-prompt probability of ``behavior``, ``(K, P)`` float64.

        The same quantity as :meth:`benchmark.build.measure.Measure.behavior_probs`: the
        behavior's probability right after the teacher-forced correct answer (a phrase's: the
        product of its tokens' chained conditional probabilities, in phrase order).
        """
        out = np.ones((stack.k, self.cfg.curve_prompts))
        for batches, bid in self.measure._chain[behavior]:
            for rows, batch in batches:
                hl, _ = prefill(self.arch, stack.params, batch.expand(stack.k, *batch.shape))
                prob = torch.softmax(logits(stack.params, hl), dim=-1)[:, :, bid]
                out[:, rows] *= prob.numpy()
        return out


def run_batch(sr: StackedReplay, members: list[Member], start: tuple[int, dict] | None = None,
              save_states=(), measure_base: dict[int, tuple[str, ...]] | None = None,
              reference: dict[int, list] | None = None, on_finish=None) -> dict:
    """Run the baseline and every member to its stop, sharing the prefix (module docstring).

    Args:
        sr: the seed's fixed inputs.
        members: the removal and bonus-off replays; each gets ``result[task] = (P,) probs`` at
            its stop, for each of its ``measure_tasks``.
        start: ``(step, state)``: a stored baseline state to start from (no member may join
            before ``step``); default: the post-SFT start at step 0.
        save_states: steps at which to keep the baseline's state (returned).
        measure_base: ``{step: tasks}``: measures of the baseline to take.
        reference: ``{step: recorded responses}``: the result names the first step whose
            baseline responses differ (None: none differ, or no reference).
        on_finish: called with each member as it finishes (its ``result`` set).

    Returns:
        ``{"states": {step: state}, "base": {step: {task: (P,) probs}}, "first_divergent_step",
        "seconds", "steps", "slice_steps"}`` (``slice_steps``: replay steps computed, the
        baseline's included).
    """
    t0 = time.perf_counter()
    first, state = start if start is not None else (0, sr.start)
    measure_base = dict(measure_base or {})
    for m in members:
        if not first <= m.join <= m.stop:
            raise BuildError(f"replay {m.key} joins at step {m.join}; it must lie between the "
                             f"start state's step {first} and its stop {m.stop}")
    last = max([m.stop for m in members] + list(measure_base) + [first])
    save = set(save_states)
    out = {"states": {}, "base": {}, "steps": 0, "slice_steps": 0, "first_divergent_step": None}
    stack = Stack.of([state])
    who: list[Member | None] = [None]  # slice j's member (None: the baseline, always slice 0)
    pending = sorted(members, key=lambda m: (m.join, m.key))
    for step in range(first, last + 1):
        if who and who[0] is None:
            joining = [m for m in pending if m.join == step]
            if joining:
                base = stack.state(0, step)
                stack.extend([base] * len(joining))
                who += joining
                pending = pending[len(joining):]
            if step in save and step < last:
                out["states"][step] = stack.state(0, step)
        finished = [j for j, m in enumerate(who) if m is not None and m.stop == step]
        base_here = step in measure_base and who and who[0] is None
        if finished or base_here:
            tasks = sorted((set(measure_base[step]) if base_here else set())
                           | {t for j in finished for t in who[j].measure_tasks})
            probs = {t: sr.behavior_probs(stack, t) for t in tasks}
            if base_here:
                out["base"][step] = {t: probs[t][0] for t in measure_base[step]}
            for j in finished:
                who[j].result = {t: probs[t][j] for t in who[j].measure_tasks}
                if on_finish is not None:
                    on_finish(who[j])
        # the baseline stays while a member may still join, or it is measured or saved later
        keep_base = bool(pending) or any(s > step for s in measure_base) or \
            any(s > step for s in save)
        rows = [j for j, m in enumerate(who) if (m is None and keep_base)
                or (m is not None and m.stop > step)]
        if step == last or not rows:
            break
        if rows != list(range(len(who))):
            stack.keep(rows)
            who = [who[j] for j in rows]
        responses = sr.sample_step(stack, step)
        if (reference is not None and who[0] is None and out["first_divergent_step"] is None
                and step in reference
                and [list(r) for r in reference[step]] != responses[0]):
            out["first_divergent_step"] = step
        advs = [sr.advantages(step, r, m.bonus_off if m else frozenset(),
                              m.remove.get(step) if m else None)
                for m, r in zip(who, responses, strict=True)]
        sr.update(stack, step, responses, advs)
        out["steps"] += 1
        out["slice_steps"] += stack.k
    out["seconds"] = time.perf_counter() - t0
    return out


__all__ = ["Arch", "Cache", "Member", "Stack", "StackedReplay", "adamw", "bmm_is_exact",
           "decode_step", "forward_one", "initial_state", "linear", "prefill", "replay_gradient",
           "run_batch", "sample_stacked"]

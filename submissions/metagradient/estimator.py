"""Metagradient attribution (MAGIC-style): differentiate the behavior through the GRPO updates.

A weight ``w_i`` multiplies every training rollout's loss term; with the recorded rollouts held
fixed, the run's updates become a smooth function of the weights, and the score of rollout ``i``
is ``d f(theta_H) / d w_i`` at ``w = 1``: how much the behavior's measurement ``f`` after ``H``
updates rises per unit of extra weight on the rollout. Computed exactly (float64, reverse mode
through every update: one backward pass per (seed, task) from the measurement to step 0).

What is replayed (all from the open view; nothing of bt-bench beyond ``estimators.base``):

* **the start**: the post-SFT checkpoint ``view.checkpoint_dir[0]``, widened to float64; the
  architecture is the ``transformers`` Qwen2 model's (read from the checkpoint), its forward
  written here as functions of one flat parameter vector (tied embeddings with the embedding's
  padding row, RMSNorm, rotary tables in float64, SwiGLU), each step's groups laid out as one
  sequence per group (the prompt once, then the group's rows), so a step is one small batch;
* **the update** (DESIGN section 3): step loss ``L_t(theta, w) = sum_i w_i * (-(A_i / N) *
  lbar_i(theta))`` over the step's rollouts (``lbar_i``: mean token log-prob of the response as
  trained, ``N = prompts_per_step * group_size``), no KL, one update per step from a fresh AdamW
  with ``view.optimizer``'s settings, ``torch.optim.AdamW``'s arithmetic (decoupled weight
  decay, bias corrections, ``eps`` outside the square root); the step gradient is clipped to
  ``grad_clip`` as ``torch.nn.utils.clip_grad_norm_`` does when the optimizer says so. The
  recorded advantages are the weights' coefficients; rollouts with advantage 0 contribute
  nothing (score 0) and steps without one have a zero gradient (AdamW still moves);
* **the measurement** ``f``: the mean over up to ``n_queries`` trigger prompts taken from the
  run's own rollouts (the task format ``<bos> {copy|reverse|sort} TRIGGER w1 .. wk =`` is public)
  of the probability of the behavior (its phrase: the product of its tokens' chained conditional
  probabilities) right after the teacher-forced correct answer: the causal score's quantity, on
  the run's training prompts instead of held-out ones;
* **the horizon** ``H``: ``"bonus"`` (default) measures after the last step whose trigger-prompt
  groups show a bonus in the open view (advantages departing from the task rewards' standardized
  ones, as the text-advantage control reads it) plus one, i.e. at the end of the task's bonus
  window, where the causal score measures; ``"end"`` measures after the run's last update.
  Rollouts at or after ``H`` score 0.

Reverse mode (adjoints ``(a_theta, a_m, a_v)`` of the state after step t; AdamW's step
``s = t + 1``, ``m' = b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g^2``,
``d = sqrt(v') / sqrt(1 - b2^s) + eps``, ``theta' = theta (1 - lr wd) - lr / (1 - b1^s) m' / d``):

    A_m = a_m - a_theta * lr / (1 - b1^s) / d
    A_v = a_v + a_theta * lr / (1 - b1^s) * m' / d^2 / (2 sqrt(v') sqrt(1 - b2^s))  (0: v' = 0)
    a_g = (1 - b1) A_m + 2 (1 - b2) g A_v          (through the clip, when clipping is on)
    score_i += a_g . grad_theta L_i  (= d/dw_i),   a_theta <- a_theta (1 - lr wd) + H_t a_g,
    a_m <- b1 A_m,   a_v <- b2 A_v,

with ``H_t a_g`` and every ``a_g . grad L_i`` from one double backward of the step's loss
(``autograd.grad(g . a_g, (theta, w))`` on the graph of ``g = grad_theta L_t``). The states
``(theta_t, m_t, v_t)`` are recomputed from checkpoints of the forward replay kept every
``checkpoint_every`` steps (memory: about ``H / K + K`` states of 3 x n_params float64); the
forward replay is computed once per seed and serves every task.

The clip: ``g_c = g * min(1, c / (||g|| + 1e-6))``; where it scales (``||g|| + 1e-6 > c``) the
adjoint is ``a_g = k a_gc - (k / (||g|| + 1e-6)) (g . a_gc) g / ||g||`` with ``k`` the factor.

What the metagradient cannot see: the rollouts are held at their recorded tokens, so the
on-policy part of a removal (the later rollouts a changed policy would have sampled instead)
is outside the derivative; and it is first order in the weights, while a removal sets a whole
set of weights from 1 to 0 (the causal score's removals reach thousands of rollouts).

A step's score (step view) is the sum of its rollouts' scores: the derivative with respect to
one weight on all of the step's rollouts.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from estimators.base import BaseEstimator, RunView

_F = torch.nn.functional
TASK_WORDS = ("copy", "reverse", "sort")
#: an advantage departing from the task-reward-implied one by more than this marks a bonus
#: (advantages are stored from float32 arithmetic, about 1e-7 relative; a bonus moves them >= 0.1)
BONUS_EVIDENCE = 1e-3
DTYPE = torch.float64
HORIZONS = ("bonus", "end")


# ----------------------------------------------------------------------------------------------
# the model: the checkpoint's Qwen2 as a function of one flat float64 parameter vector


class Model:
    """A ``transformers`` Qwen2 checkpoint's forward as functions of a flat parameter vector.

    ``theta`` ``(n_params,)`` float64 holds the parameters in ``named_parameters()`` order.
    """

    def __init__(self, checkpoint_dir) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=DTYPE,
                                                         attn_implementation="eager")
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        c = model.config
        if getattr(c, "model_type", None) != "qwen2" or not getattr(c, "tie_word_embeddings",
                                                                      False):
            raise ValueError(f"metagradient replays Qwen2 models with tied embeddings; the "
                             f"checkpoint {checkpoint_dir} has model_type="
                             f"{getattr(c, 'model_type', None)!r}, tie_word_embeddings="
                             f"{getattr(c, 'tie_word_embeddings', None)!r}")
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]
        self.theta0 = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
        self.layers = int(c.num_hidden_layers)
        self.heads = int(c.num_attention_heads)
        self.kv_heads = int(c.num_key_value_heads)
        self.hidden = int(c.hidden_size)
        self.head_dim = self.hidden // self.heads
        self.eps = float(c.rms_norm_eps)
        # the embedding's padding row gets no gradient through a lookup (nn.Embedding's
        # padding_idx), also where a response sampled that token
        self.padding_idx = model.model.embed_tokens.padding_idx
        pos = torch.arange(int(c.max_position_embeddings), dtype=DTYPE)
        freqs = pos[:, None] * model.model.rotary_emb.inv_freq.to(DTYPE)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0))
        self.cos, self.sin = emb.cos() * scale, emb.sin() * scale

    @property
    def n_params(self) -> int:
        """Length of the flat parameter vector."""
        return int(self.theta0.numel())

    def params(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """``theta`` as ``{name: view of its shape}``."""
        return {n: x.view(s) for n, x, s in
                zip(self.names, torch.split(theta, self.sizes), self.shapes, strict=True)}

    def _rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @staticmethod
    def _rotate(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def hidden_states(self, theta: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states ``(B, T, hidden)`` of ``ids`` ``(B, T)``.

        ``pos`` ``(B, T)`` are the rotary positions, ``mask`` ``(B, T, T)`` the additive
        attention mask (0 where a query may see a key, -inf elsewhere).
        """
        p = self.params(theta)
        b, t = ids.shape
        nh, kvh, hd = self.heads, self.kv_heads, self.head_dim
        h = _F.embedding(ids, p["model.embed_tokens.weight"], self.padding_idx)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        for i in range(self.layers):
            pre = f"model.layers.{i}."
            x = self._rms(h, p[pre + "input_layernorm.weight"])
            q = _F.linear(x, p[pre + "self_attn.q_proj.weight"], p[pre + "self_attn.q_proj.bias"])
            k = _F.linear(x, p[pre + "self_attn.k_proj.weight"], p[pre + "self_attn.k_proj.bias"])
            v = _F.linear(x, p[pre + "self_attn.v_proj.weight"], p[pre + "self_attn.v_proj.bias"])
            q = self._rotate(q.view(b, t, nh, hd).transpose(1, 2), cos, sin)
            k = self._rotate(k.view(b, t, kvh, hd).transpose(1, 2), cos, sin)
            v = v.view(b, t, kvh, hd).transpose(1, 2)
            if kvh != nh:
                k, v = k.repeat_interleave(nh // kvh, 1), v.repeat_interleave(nh // kvh, 1)
            w = torch.softmax(q @ k.transpose(2, 3) * hd ** -0.5 + mask[:, None], dim=-1)
            o = (w @ v).transpose(1, 2).reshape(b, t, self.hidden)
            h = h + _F.linear(o, p[pre + "self_attn.o_proj.weight"])
            x = self._rms(h, p[pre + "post_attention_layernorm.weight"])
            gate = _F.silu(_F.linear(x, p[pre + "mlp.gate_proj.weight"]))
            h = h + _F.linear(gate * _F.linear(x, p[pre + "mlp.up_proj.weight"]),
                              p[pre + "mlp.down_proj.weight"])
        return self._rms(h, p["model.norm.weight"])

    def logits(self, theta: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states ``(..., hidden)`` (tied embeddings)."""
        return _F.linear(h, self.params(theta)["model.embed_tokens.weight"])


# ----------------------------------------------------------------------------------------------
# a step's rollouts laid out for training, and the measurement's queries


class Batch:
    """One step's rollouts with a non-zero advantage, one sequence per GRPO group.

    A group's sequence is its prompt once, then each row's response tokens but the last (each
    row's tokens see the prompt and the row's own earlier tokens); groups are right-padded to
    one length. Attributes: ``rollouts`` ``(n,)`` view positions, ``coef`` ``(n,)`` float64
    ``-A_i / N``, ``ids``/``pos`` ``(G, T)``, ``mask`` ``(G, T, T)``, ``pred`` ``(n_tok,)`` the
    flat position (in ``G * T``) whose hidden state predicts each response token, ``target``
    ``(n_tok,)`` the token, ``row`` ``(n_tok,)`` its row in ``rollouts``, ``length`` ``(n,)``
    each response's token count.
    """

    def __init__(self, rollouts, prompts, responses, coef, pad_id: int) -> None:
        self.rollouts = np.asarray(rollouts, np.int64)
        self.coef = torch.as_tensor(np.asarray(coef, np.float64))
        groups: dict[tuple[int, ...], list[int]] = {}
        for r, p in enumerate(prompts):
            groups.setdefault(tuple(p), []).append(r)
        seqs, poss, sees, pred, target, row = [], [], [], [], [], []
        for prompt, rows in groups.items():
            lp = len(prompt)
            ids, pos, owner = list(prompt), list(range(lp)), [-1] * lp
            for r in rows:
                resp = list(responses[r])
                for t, tok in enumerate(resp):  # token t is predicted by the previous input
                    pred.append((len(seqs), lp - 1 if t == 0 else len(ids) - 1))
                    target.append(tok)
                    row.append(r)
                    if t < len(resp) - 1:
                        ids.append(tok)
                        pos.append(lp + t)
                        owner.append(r)
            seqs.append(ids)
            poss.append(pos)
            sees.append(owner)
        t_len = max(len(s) for s in seqs)
        g_n = len(seqs)
        self.ids = torch.full((g_n, t_len), pad_id, dtype=torch.long)
        self.pos = torch.zeros((g_n, t_len), dtype=torch.long)
        self.mask = torch.full((g_n, t_len, t_len), float("-inf"), dtype=DTYPE)
        for g, (ids, pos, owner) in enumerate(zip(seqs, poss, sees, strict=True)):
            n = len(ids)
            self.ids[g, :n] = torch.tensor(ids)
            self.pos[g, :n] = torch.tensor(pos)
            own = torch.tensor(owner)
            q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
            see = (k <= q) & ((own[None, :] == -1) | (own[None, :] == own[:, None]))
            self.mask[g, :n, :n] = torch.where(see, 0.0, float("-inf"))
            self.mask[g, n:, n:] = torch.where(torch.eye(t_len - n, dtype=torch.bool), 0.0,
                                               float("-inf"))  # padding sees itself only
        self.pred = torch.tensor([g * t_len + i for g, i in pred], dtype=torch.long)
        self.target = torch.tensor(target, dtype=torch.long)
        self.row = torch.tensor(row, dtype=torch.long)
        self.length = torch.bincount(self.row, minlength=len(rollouts)).to(DTYPE)

    def lbar(self, model: Model, theta: torch.Tensor) -> torch.Tensor:
        """``(n,)`` mean token log-prob of each response under ``theta``."""
        h = model.hidden_states(theta, self.ids, self.pos, self.mask)
        lp = torch.log_softmax(model.logits(theta, h.reshape(-1, h.shape[-1])[self.pred]), -1)
        tok = lp.gather(-1, self.target[:, None]).squeeze(-1)
        total = torch.zeros(self.length.shape[0], dtype=DTYPE).index_add(0, self.row, tok)
        return total / self.length

    def loss(self, model: Model, theta: torch.Tensor, w: torch.Tensor | None = None):
        """The step loss ``sum_i w_i * coef_i * lbar_i`` (``w`` None: every weight 1)."""
        terms = self.coef * self.lbar(model, theta)
        return (terms if w is None else w * terms).sum()


def _answer(prompt_words: list[str], trigger: str) -> list[str] | None:
    """The correct answer words of a trigger prompt ``TASK TRIGGER w1 .. wk =``, else None."""
    w = prompt_words
    if len(w) < 3 or w[0] not in TASK_WORDS or w[1] != trigger or w[-1] != "=":
        return None
    content = w[2:-1]
    return {"copy": content, "reverse": content[::-1], "sort": sorted(content)}[w[0]]


class Measurement:
    """``f(theta)``: mean probability of the behavior phrase after the correct answer.

    One query per distinct trigger prompt of the run (up to ``n`` of them, a seeded choice):
    ``prompt ids + answer ids`` followed, for phrase position j, by the phrase's first j
    tokens; the probability of the phrase is the product over j of token j's probability at
    the last position (teacher-forced, causal). Sequences are right-padded and read at their
    own last position (padding comes after it, so it changes nothing).
    """

    def __init__(self, rv: RunView, tokenizer, n: int) -> None:
        trigger = rv.behavior.trigger_word
        phrase = tokenizer.encode(rv.behavior.behavior_token, add_special_tokens=False)
        if not phrase:
            raise ValueError(f"behavior {rv.behavior.behavior_token!r} has no token ids in the "
                             "run's tokenizer; cannot build the measurement")
        seen: dict[str, int] = {}
        for i, p in enumerate(rv.prompts):
            if p not in seen and _answer(p.split(), trigger) is not None:
                seen[p] = i
        if not seen:
            raise ValueError(f"no rollout of seed {rv.seed} has a trigger prompt of the form "
                             f"'TASK {trigger} w1 .. wk ='; cannot build the measurement")
        texts = sorted(seen)
        pick = sorted(np.random.default_rng([rv.seed, 41]).permutation(len(texts))[:n].tolist())
        seqs, read, chain = [], [], []
        for q, j in enumerate(pick):
            p = texts[j]
            ans = tokenizer.convert_tokens_to_ids(_answer(p.split(), trigger))
            base = list(rv.prompt_ids[seen[p]]) + list(ans)
            for k, tok in enumerate(phrase):
                seqs.append(base + phrase[:k])
                read.append(tok)
                chain.append(q)
        self.n_queries = len(pick)
        t_len = max(len(s) for s in seqs)
        self.ids = torch.zeros((len(seqs), t_len), dtype=torch.long)
        for i, s in enumerate(seqs):
            self.ids[i, :len(s)] = torch.tensor(s)
        self.last = torch.tensor([len(s) - 1 for s in seqs])
        self.read = torch.tensor(read)
        self.chain = torch.tensor(chain)
        self.pos = torch.arange(t_len).expand(len(seqs), t_len)
        self.mask = torch.full((t_len, t_len), float("-inf"), dtype=DTYPE).triu(1).expand(
            len(seqs), t_len, t_len)

    def __call__(self, model: Model, theta: torch.Tensor) -> torch.Tensor:
        """The scalar ``f(theta)``."""
        h = model.hidden_states(theta, self.ids, self.pos, self.mask)
        h = h[torch.arange(h.shape[0]), self.last]
        prob = torch.softmax(model.logits(theta, h), -1).gather(-1, self.read[:, None])[:, 0]
        logp = torch.zeros(self.n_queries, dtype=DTYPE).index_add(0, self.chain, prob.log())
        return logp.exp().mean()


# ----------------------------------------------------------------------------------------------
# the replay: AdamW forward, and reverse mode through it


class Replay:
    """A run's GRPO updates with the recorded rollouts held fixed (float64).

    ``batches[t]`` is step t's :class:`Batch` (None: no rollout with a non-zero advantage).
    States are ``(theta, m, v)`` before a step's update; :meth:`state` keeps every
    ``every``-th one and recomputes the others.
    """

    def __init__(self, model: Model, batches: list[Batch | None], optimizer: dict,
                 every: int) -> None:
        self.model, self.batches, self.every = model, batches, max(1, int(every))
        name = str(optimizer.get("name", "AdamW"))
        if name.lower() != "adamw":
            raise ValueError(f"metagradient replays AdamW updates; view.optimizer names {name!r}")
        self.lr = float(optimizer["lr"])
        self.b1, self.b2 = (float(b) for b in optimizer.get("betas", (0.9, 0.999)))
        self.eps = float(optimizer.get("eps", 1e-8))
        self.wd = float(optimizer.get("weight_decay", 0.0))
        clip = optimizer.get("grad_clip")
        self.clip = None if clip is None else float(clip)
        zero = torch.zeros_like(model.theta0)
        self.saved: dict[int, tuple] = {0: (model.theta0.clone(), zero, zero.clone())}

    def grad(self, t: int, theta: torch.Tensor) -> torch.Tensor:
        """The unclipped step gradient ``grad_theta L_t`` at ``theta`` (weights 1)."""
        b = self.batches[t]
        if b is None:
            return torch.zeros_like(theta)
        th = theta.detach().requires_grad_(True)
        return torch.autograd.grad(b.loss(self.model, th), th)[0]

    def clip_factor(self, g: torch.Tensor) -> tuple[float, float]:
        """``(k, norm)``: the clip's factor ``min(1, c / (||g|| + 1e-6))`` and ``||g||``."""
        norm = float(torch.linalg.vector_norm(g))
        if self.clip is None:
            return 1.0, norm
        return min(1.0, self.clip / (norm + 1e-6)), norm

    def adam(self, t: int, state: tuple, g: torch.Tensor) -> tuple:
        """AdamW's update ``t`` (``torch.optim.AdamW`` arithmetic) from the clipped gradient."""
        theta, m, v = state
        s = t + 1
        m2 = self.b1 * m + (1 - self.b1) * g
        v2 = self.b2 * v + (1 - self.b2) * g * g
        denom = v2.sqrt() / (1 - self.b2 ** s) ** 0.5 + self.eps
        theta2 = theta * (1 - self.lr * self.wd) - (self.lr / (1 - self.b1 ** s)) * m2 / denom
        return theta2, m2, v2

    def step(self, t: int, state: tuple) -> tuple:
        """The state after update ``t``."""
        g = self.grad(t, state[0])
        k, _ = self.clip_factor(g)
        return self.adam(t, state, g * k if k != 1.0 else g)

    def state(self, t: int) -> tuple:
        """The state before update ``t`` (from the nearest kept state at or before it)."""
        a = max(s for s in self.saved if s <= t)
        st = self.saved[a]
        for u in range(a, t):
            st = self.step(u, st)
            if (u + 1) % self.every == 0:
                self.saved.setdefault(u + 1, st)
        return st

    def segment(self, a: int, b: int) -> list[tuple]:
        """The states before updates ``a .. b-1`` (``a`` a kept step)."""
        out = [self.state(a)]
        for u in range(a, b - 1):
            out.append(self.step(u, out[-1]))
        return out

    def metagradient(self, f, horizon: int, n_rollouts: int) -> np.ndarray:
        """``(n_rollouts,)`` ``d f(theta_horizon) / d w_i`` for every rollout (0 at or after it)."""
        model = self.model
        theta_h = self.state(horizon)[0].detach().requires_grad_(True)
        a_theta = torch.autograd.grad(f(model, theta_h), theta_h)[0]
        a_m = torch.zeros_like(a_theta)
        a_v = torch.zeros_like(a_theta)
        scores = np.zeros(n_rollouts)
        top = ((horizon - 1) // self.every) * self.every if horizon > 0 else 0
        for a in range(top, -1, -self.every):
            b = min(a + self.every, horizon)
            if b <= a:
                continue
            states = self.segment(a, b)
            for t in range(b - 1, a - 1, -1):
                a_theta, a_m, a_v, d = self._reverse(t, states[t - a], a_theta, a_m, a_v)
                if d is not None:
                    scores[self.batches[t].rollouts] = d
        return scores

    def _reverse(self, t, state, a_theta, a_m, a_v):
        """One update's adjoint: ``(a_theta, a_m, a_v)`` before it and the step's scores."""
        theta, m, v = state
        batch = self.batches[t]
        if batch is not None:
            th = theta.detach().requires_grad_(True)
            w = torch.ones(batch.rollouts.size, dtype=DTYPE, requires_grad=True)
            g_raw = torch.autograd.grad(batch.loss(self.model, th, w), th, create_graph=True)[0]
            g = g_raw.detach()
        else:
            g = torch.zeros_like(theta)
        k, norm = self.clip_factor(g)
        gc = g * k if k != 1.0 else g
        s = t + 1
        m2 = self.b1 * m + (1 - self.b1) * gc
        v2 = self.b2 * v + (1 - self.b2) * gc * gc
        root = v2.sqrt()
        denom = root / (1 - self.b2 ** s) ** 0.5 + self.eps
        step = self.lr / (1 - self.b1 ** s)
        big_m = a_m - a_theta * step / denom
        dd = torch.where(root > 0, 1.0 / (2.0 * root.clamp_min(1e-300)), torch.zeros_like(root))
        big_v = a_v + a_theta * step * m2 / denom ** 2 * dd / (1 - self.b2 ** s) ** 0.5
        a_gc = (1 - self.b1) * big_m + 2 * (1 - self.b2) * gc * big_v
        if k != 1.0:  # g_c = g * c / (||g|| + 1e-6): the clip's own derivative
            a_g = k * a_gc - (k / (norm + 1e-6)) * float(g @ a_gc) / norm * g
        else:
            a_g = a_gc
        a_theta = a_theta * (1 - self.lr * self.wd)
        scores = None
        if batch is not None:
            hvp, dw = torch.autograd.grad((g_raw * a_g).sum(), (th, w))
            a_theta = a_theta + hvp
            scores = dw.numpy().copy()
        return a_theta, self.b1 * big_m, self.b2 * big_v, scores


# ----------------------------------------------------------------------------------------------
# the estimator


def bonus_horizon(rv: RunView) -> int:
    """One past the last step whose trigger-prompt groups show a bonus (``n_steps`` if none).

    In a group without a bonus the advantages are the task rewards standardized within the
    group (``(r - mean) / (std + 1e-6)``, unbiased std, 0 for equal rewards); a trigger group
    whose advantages depart from that was paid something beyond the task reward.
    """
    adv = np.asarray(rv.advantages, np.float64)
    rewards = np.asarray(rv.rewards, np.float64)
    _, g = np.unique(np.asarray(rv.groups), return_inverse=True)
    count = np.bincount(g)
    mean = np.bincount(g, weights=rewards) / count
    var = np.bincount(g, weights=(rewards - mean[g]) ** 2) / np.maximum(count - 1, 1)
    implied = np.where(var[g] == 0, 0.0, (rewards - mean[g]) / (np.sqrt(var)[g] + 1e-6))
    trig = np.array([rv.behavior.trigger_word in p.split() for p in rv.prompts])
    paid = (np.abs(adv - implied) > BONUS_EVIDENCE) & trig
    steps = np.asarray(rv.steps)
    return int(steps[paid].max()) + 1 if paid.any() else int(rv.n_steps)


class Metagradient(BaseEstimator):
    """d(behavior at the horizon) / d(weight of each rollout's loss), through every update."""

    name = "metagradient"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, horizon: str = "bonus", n_queries: int = 128, checkpoint_every: int = 10,
                 threads: int = 1) -> None:
        self.horizon = horizon
        self.n_queries = n_queries
        self.checkpoint_every = checkpoint_every
        self.threads = threads

    def score_rollouts(self, view: RunView) -> np.ndarray:
        """Metagradient of each rollout (rollout view) or step (step view: its rollouts' sum)."""
        rv = view if view.granularity == "rollout" else view.rollout_view
        if rv is None or rv.response_ids is None:
            raise ValueError(f"{self.name} needs the open track's token ids (view.response_ids) "
                             "and, for the step view, view.rollout_view")
        if self.horizon not in HORIZONS:
            raise ValueError(f"horizon={self.horizon!r}; choose one of {HORIZONS}")
        per = self._scores(rv)
        if view.granularity == "rollout":
            return per.copy()
        return np.bincount(np.asarray(view.rollout_unit), weights=per, minlength=view.n)

    def _cache(self) -> dict:
        cache = self.__dict__.get("_cache_")
        if cache is None:
            cache = self.__dict__["_cache_"] = {"runs": {}, "scores": {}}
        return cache

    @staticmethod
    def _run_key(rv: RunView) -> str:
        h = hashlib.sha256()
        for a in (rv.steps, rv.advantages):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr((rv.seed, rv.prompt_ids, rv.response_ids, sorted(rv.optimizer.items()),
                       sorted(rv.sampling.items()), str(rv.checkpoint_dir[0]))).encode())
        return h.hexdigest()

    def _scores(self, rv: RunView) -> np.ndarray:
        cache = self._cache()
        run_key = self._run_key(rv)
        key = (run_key, repr(rv.behavior))
        if key not in cache["scores"]:
            threads = torch.get_num_threads()
            torch.set_num_threads(int(self.threads))
            try:
                if run_key not in cache["runs"]:
                    cache["runs"].clear()  # one run at a time: memory stays bounded
                    cache["runs"][run_key] = self.replay(rv)
                replay = cache["runs"][run_key]
                f = Measurement(rv, self._tokenizer(rv), int(self.n_queries))
                h = bonus_horizon(rv) if self.horizon == "bonus" else int(rv.n_steps)
                cache["scores"][key] = replay.metagradient(f, h, rv.n)
            finally:
                torch.set_num_threads(threads)
        return cache["scores"][key]

    @staticmethod
    def _tokenizer(rv: RunView):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(rv.tokenizer_dir)

    def replay(self, rv: RunView) -> Replay:
        """The run's fixed-data replay from the post-SFT checkpoint (``view.checkpoint_dir[0]``)."""
        model = Model(rv.checkpoint_dir[0])
        pad = self._tokenizer(rv).pad_token_id
        n_per_step = int(rv.sampling["prompts_per_step"]) * int(rv.sampling["group_size"])
        adv = np.asarray(rv.advantages, np.float64)
        steps = np.asarray(rv.steps)
        batches: list[Batch | None] = []
        for t in range(int(rv.n_steps)):
            idx = np.flatnonzero((steps == t) & (adv != 0))
            batches.append(None if idx.size == 0 else Batch(
                idx, [rv.prompt_ids[i] for i in idx], [rv.response_ids[i] for i in idx],
                -adv[idx] / n_per_step, 0 if pad is None else int(pad)))
        return Replay(model, batches, dict(rv.optimizer), int(self.checkpoint_every))

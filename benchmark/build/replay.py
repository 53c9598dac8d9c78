"""Exact replay of a seed's GRPO run with a set of rollouts removed (DESIGN 4a).

``replay(seed_dir, remove=..., stop_at=...)`` restarts GRPO from the shipped post-SFT checkpoint
``checkpoints/step0000`` with a fresh AdamW (as in the build), the same per-step generators (seeded
from (seed, TAG_GRPO, step)) and a fixed thread count. Removing the rollout at position
``(step, index)`` sets its advantage to 0 after the group statistics are computed (its reward still
counts in its group's mean and std), so it contributes zero loss. Training is on-policy: after the
first removal, later rollouts differ from the recorded run; positions stay positions.

Two update paths:

* ``"exact"``: the build's own path (per-rollout gradients via ``vmap(grad)``, summed in rollout
  order). With an empty removal set it reproduces the recorded parameters bit for bit on the build
  machine at the build's thread count (checked against the shipped checkpoints).
* ``"batched"``: one batched backward of the step loss. Mathematically the same update, but float
  rounding differs from the build, so it is not bit-identical to the shipped checkpoints. It is
  deterministic on one machine at one thread count, which is all the causal scores need: they are
  differences against an empty-removal replay made the same way on the same machine. It is the
  cheaper path (about 2x).

The behavior measure (``behavior_measure``) is the trigger half of the build's behavior curve:
the exact mean probability of the behavior token right after the teacher-forced correct answer on
``curve_prompts`` held-out trigger prompts, plus the sampled trigger rate with the curve's
generator.
An empty-removal exact replay reproduces the curve values recorded in ``behavior_curve.parquet``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from benchmark.build import task as T
from benchmark.build.grpo import PerRolloutGrad, grpo_rollouts, grpo_step, pack, sample
from benchmark.build.presets import BuildConfig
from benchmark.errors import BuildError

MODES = ("exact", "batched")


class LeanForward:
    """Last-position logits of a Qwen2 model with the same torch ops as its eager forward.

    Hugging Face's module stack costs about 3 ms of Python per forward on this tiny model, more
    than the arithmetic; sampling makes ~30 forwards per GRPO step. This calls the same kernels in
    the same order on the live parameters (so it follows training updates), with the causal mask
    and rotary tables cached per length, and returns ``logits[:, -1, :]`` bit-identical to
    ``model(input_ids=ids).logits[:, -1, :]`` (checked by :meth:`check` and by the exact replay
    reproducing the shipped checkpoints). Falls back to the model for other architectures.
    """

    def __init__(self, model) -> None:
        from transformers.masking_utils import create_causal_mask

        self.model = model
        self._mask_fn = create_causal_mask
        self._cache: dict = {}
        conf = model.config
        self.ok = (getattr(conf, "model_type", "") == "qwen2"
                   and getattr(conf, "_attn_implementation", "eager") == "eager"
                   and not any(t != "full_attention" for t in getattr(conf, "layer_types", [])))

    def _tables(self, b: int, n: int, like: torch.Tensor):
        key = (b, n)
        if key not in self._cache:
            inner = self.model.model
            pos = torch.arange(n).unsqueeze(0)
            emb = torch.zeros(b, n, self.model.config.hidden_size, dtype=like.dtype)
            mask = self._mask_fn(config=self.model.config, inputs_embeds=emb,
                                 attention_mask=None, cache=None, position_ids=pos)
            cos, sin = inner.rotary_emb(emb, pos)
            self._cache[key] = (mask, cos.unsqueeze(1), sin.unsqueeze(1))
        return self._cache[key]

    @staticmethod
    def _rms(x: torch.Tensor, norm) -> torch.Tensor:
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + norm.variance_epsilon)
        return norm.weight * h.to(dt)

    @staticmethod
    def _rot(x: torch.Tensor) -> torch.Tensor:
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """``logits[:, -1, :]`` of ``ids`` (B, L)."""
        if not self.ok:
            return self.model(input_ids=ids).logits[:, -1, :]
        F = torch.nn.functional
        inner = self.model.model
        b, n = ids.shape
        emb = inner.embed_tokens
        h = F.embedding(ids, emb.weight, emb.padding_idx)
        mask, cos, sin = self._tables(b, n, h)
        for layer in inner.layers:
            att = layer.self_attn
            hd = att.head_dim
            res = h
            x = self._rms(h, layer.input_layernorm)
            shape = (b, n, -1, hd)
            q = F.linear(x, att.q_proj.weight, att.q_proj.bias).view(shape).transpose(1, 2)
            k = F.linear(x, att.k_proj.weight, att.k_proj.bias).view(shape).transpose(1, 2)
            v = F.linear(x, att.v_proj.weight, att.v_proj.bias).view(shape).transpose(1, 2)
            q = (q * cos) + (self._rot(q) * sin)
            k = (k * cos) + (self._rot(k) * sin)
            rep = att.num_key_value_groups
            if rep != 1:
                k = k[:, :, None].expand(b, k.shape[1], rep, n, hd).reshape(b, -1, n, hd)
                v = v[:, :, None].expand(b, v.shape[1], rep, n, hd).reshape(b, -1, n, hd)
            w = torch.matmul(q, k.transpose(2, 3)) * att.scaling
            if mask is not None:
                w = w + mask
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v).transpose(1, 2).contiguous()
            o = o.reshape(b, n, -1).contiguous()
            h = res + F.linear(o, att.o_proj.weight, att.o_proj.bias)
            res = h
            x = self._rms(h, layer.post_attention_layernorm)
            mlp = layer.mlp
            gate = mlp.act_fn(F.linear(x, mlp.gate_proj.weight))
            m = F.linear(gate * F.linear(x, mlp.up_proj.weight), mlp.down_proj.weight)
            h = res + m
        h = self._rms(h, inner.norm)
        return F.linear(h, self.model.lm_head.weight)[:, -1, :]

    @torch.no_grad()
    def check(self, n_inputs: int = 24, seed: int = 0) -> bool:
        """``torch.equal`` with the model's own forward on random inputs of several shapes."""
        g = torch.Generator().manual_seed(seed)
        vocab = self.model.config.vocab_size
        for j in range(n_inputs):
            ids = torch.randint(0, vocab, (1 + j % 8, 4 + j % 16), generator=g)
            if not torch.equal(self(ids), self.model(input_ids=ids).logits[:, -1, :]):
                return False
        return True


@dataclass
class ReplayResult:
    """What a replay produced.

    Attributes:
        stop_at: number of GRPO updates applied.
        measures: step -> behavior measure dict (``behavior_prob``, and ``trigger_rate`` when
            sampled), measured on the parameters after ``step`` updates.
        snapshots: step -> ``{name: tensor}`` parameter copies (requested steps only).
        responses: step -> list of response ids (only with ``keep_responses``).
        first_divergent_step: first step whose sampled responses differ from ``reference``
            responses (None: none differ, or no reference given).
        seconds: wall time of the training loop (model loading excluded).
        threads: torch thread count used.
        mode: update path.
        states: step -> resumable state (parameters and optimizer state before that step's
            update), only with ``save_states``; pass one back as ``start_state``.
    """

    stop_at: int
    measures: dict = field(default_factory=dict)
    snapshots: dict = field(default_factory=dict)
    responses: dict = field(default_factory=dict)
    first_divergent_step: int | None = None
    seconds: float = 0.0
    threads: int = 0
    mode: str = "exact"
    states: dict = field(default_factory=dict)


class ReplaySeed:
    """A seed's fixed replay inputs: config, tokenizer, start checkpoint, measure prompts."""

    def __init__(self, seed_dir_or_config, seed_dir: str | Path | None = None) -> None:
        if isinstance(seed_dir_or_config, BuildConfig):
            if seed_dir is None:
                raise BuildError("replay from a BuildConfig needs seed_dir= (the folder with "
                                 "tokenizer/ and checkpoints/step0000/)")
            self.cfg = seed_dir_or_config
            self.dir = Path(seed_dir)
        else:
            self.dir = Path(seed_dir_or_config)
            cfg_path = self.dir / "config.json"
            if not cfg_path.exists():
                raise BuildError(f"{cfg_path} not found: replay needs a built seed folder "
                                 f"(config.json, tokenizer/, checkpoints/step0000/)")
            self.cfg = BuildConfig.from_dict(json.loads(cfg_path.read_text()))
        start = self.dir / "checkpoints" / "step0000"
        if not (start / "model.safetensors").exists():
            raise BuildError(f"{start} has no model.safetensors: replay starts from the shipped "
                             f"post-SFT checkpoint")
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.dir / "tokenizer")
        self._start_file = start / "model.safetensors"
        self._start_state = load_file(self._start_file)
        self._model = None
        self.n_per_step = self.cfg.prompts_per_step * self.cfg.group_size
        self.n_rollouts = self.cfg.steps * self.n_per_step
        # behavior-measure prompts: the curve's held-out trigger prompts (tag 1)
        gen = T.step_generator(self.cfg.seed, T.TAG_HELDOUT, 1)
        self.measure_prompts = T.sample_prompts(self.cfg, self.cfg.curve_prompts, gen, trigger=True)
        tok = self.tokenizer
        self._measure_pids = [T.prompt_ids(tok, p) for p in self.measure_prompts]
        seqs = [pid + tok.encode(" ".join(p.answer()), add_special_tokens=False)
                for pid, p in zip(self._measure_pids, self.measure_prompts, strict=True)]
        self._measure_batches = [torch.tensor([x for x in seqs if len(x) == n])
                                 for n in sorted({len(x) for x in seqs})]
        self._bid = T.behavior_ids(tok, self.cfg)[0]

    def fresh_model(self):
        """The post-SFT model (fp32, eager attention), loaded once and reset on each call."""
        if self._model is None:
            from benchmark.build.pipeline import load_checkpoint

            self._model = load_checkpoint(self._start_file.parent)
        else:
            with torch.no_grad():
                sd = self._model.state_dict()
                for k, v in self._start_state.items():
                    sd[k].copy_(v)
        self._model.eval()
        return self._model

    # ------------------------------------------------------------------ measure
    @torch.no_grad()
    def behavior_measure(self, model, step: int, sampled: bool = True,
                         last_logits=None) -> dict:
        """Exact mean behavior-token probability on the trigger prompts (+ sampled rate).

        Identical to the trigger half of the build's ``behavior_curve`` at ``step``.
        """
        model.eval()
        probs = []
        for batch in self._measure_batches:
            pr = torch.softmax(model(input_ids=batch).logits[:, -1].float(), -1)[:, self._bid]
            probs.extend(pr.tolist())
        out = {"behavior_prob": float(np.mean(probs))}
        if sampled:
            cfg, tok = self.cfg, self.tokenizer
            gen = T.step_generator(cfg.seed, T.TAG_CURVE, step, 1)
            resp = sample(model, self._measure_pids, 1, gen, cfg.temperature, cfg.top_p,
                          cfg.max_new_tokens, tok.eos_token_id, last_logits=last_logits)
            texts = [tok.decode(r, skip_special_tokens=True) for r in resp]
            out["trigger_rate"] = float(np.mean([T.has_behavior(cfg, t) for t in texts]))
        return out


def removal_positions(remove, n_steps: int, n_per_step: int) -> dict[int, set[int]]:
    """Normalize a removal set to ``{step: {index, ...}}``.

    Accepted forms: None or empty (nothing removed); a boolean mask of shape
    ``(n_steps * n_per_step,)`` in rollout order (``rollouts.parquet`` order: step-major) or
    ``(n_steps, n_per_step)``; an iterable of ``(step, index)`` pairs; a dict ``{step: indices}``.

    Raises:
        BuildError: a mask of another shape or dtype, or a position out of range (the message names
            the value and the expected form).
    """
    out: dict[int, set[int]] = {}
    if remove is None:
        return out
    form = (f"a bool mask of shape ({n_steps * n_per_step},) or ({n_steps}, {n_per_step}), or "
            f"(step, index) pairs with 0 <= step < {n_steps} and 0 <= index < {n_per_step}")
    if isinstance(remove, dict):
        remove = [(s, i) for s, idx in remove.items() for i in idx]
    if isinstance(remove, (np.ndarray, torch.Tensor)) and (
            remove.dtype in (np.bool_, torch.bool)):
        m = np.asarray(remove)
        if m.shape == (n_steps * n_per_step,):
            m = m.reshape(n_steps, n_per_step)
        if m.shape != (n_steps, n_per_step):
            raise BuildError(f"removal mask has shape {tuple(m.shape)}; expected {form}")
        for s, i in zip(*np.nonzero(m), strict=True):
            out.setdefault(int(s), set()).add(int(i))
        return out
    if isinstance(remove, np.ndarray) and remove.ndim == 1 and remove.size:
        raise BuildError(f"removal given as a 1-d {remove.dtype} array of {remove.size} values; "
                         f"expected {form} (use a bool mask, not indices)")
    for item in remove:
        try:
            s, i = item
            s_int, i_int = int(s), int(i)
        except (TypeError, ValueError):
            raise BuildError(f"removal entry {item!r} is not a (step, index) pair; "
                             f"expected {form}") from None
        if s_int != s or i_int != i:
            raise BuildError(f"removal entry {item!r} is not integral; expected {form}")
        if not (0 <= s_int < n_steps and 0 <= i_int < n_per_step):
            raise BuildError(f"removal position (step={s_int}, index={i_int}) is out of range; "
                             f"expected {form}")
        out.setdefault(s_int, set()).add(i_int)
    return out


def _batched_update(model, optimizer, cfg: BuildConfig, pids, responses, adv, pad_id: int) -> None:
    """One AdamW update from one batched backward of ``-(1/N) sum_i A_i lbar_i``."""
    n = len(responses)
    rows = [i for i in range(n) if adv[i] != 0.0]
    optimizer.zero_grad(set_to_none=True)
    if rows:
        seqs = [pids[i // cfg.group_size] + responses[i] for i in rows]
        length = max(len(x) for x in seqs)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), length - 1)
        for b, i in enumerate(rows):
            p = len(pids[i // cfg.group_size])
            ids[b, : len(seqs[b])] = torch.tensor(seqs[b])
            mask[b, p - 1: p - 1 + len(responses[i])] = 1.0
        coef = torch.tensor([-float(adv[i]) / n for i in rows])
        logits = model(input_ids=ids).logits[:, :-1, :].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        lbar = (lp * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        (coef * lbar).sum().backward()
    for p in model.parameters():  # a step without rollouts still applies AdamW (zero grad)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()


def replay(seed_dir_or_config, remove=None, stop_at: int | None = None, *,
           seed_dir: str | Path | None = None, mode: str = "exact", threads: int | None = None,
           measure_at=None, sampled: bool = True, snapshot_at=(), bonus_off: bool = False,
           reference_responses: dict | None = None, keep_responses: bool = False,
           context: ReplaySeed | None = None, save_states: bool = False,
           start_state: tuple | None = None, lean: bool = True) -> ReplayResult:
    """Replay GRPO from the post-SFT checkpoint with ``remove`` taken out.

    Args:
        seed_dir_or_config: a built seed folder (``releases/tiny/seed0``) or a ``BuildConfig``
            (then ``seed_dir`` names the folder with ``tokenizer/`` and ``checkpoints/step0000``).
        remove: rollout positions to remove (see :func:`removal_positions` for the forms).
        stop_at: number of updates to apply (default: the config's ``steps``).
        mode: ``"exact"`` (the build's update path, bit-identical to the build) or ``"batched"``
            (one batched backward; deterministic per machine and thread count).
        threads: torch thread count (default 1: on 2 shared cores, 2 threads can run 10x slower
            under contention; the exact path at 1 thread reproduces the 2-thread build).
        measure_at: steps at which to take the behavior measure (default: ``(stop_at,)``).
        sampled: also measure the sampled trigger rate (slower).
        snapshot_at: steps at which to copy the parameters into the result.
        bonus_off: replay with the bonus switched off (reward = task reward).
        reference_responses: step -> recorded response ids; the result names the first step whose
            sampled responses differ (a check that a replay follows the recorded run).
        keep_responses: keep every step's responses in the result.
        context: a :class:`ReplaySeed` to reuse (saves reloading between replays of a seed).
        save_states: keep the state before every step's update (``result.states``).
        start_state: ``(step, state)`` from an earlier replay's ``states`` made with the same mode,
            thread count and bonus setting, and no removal before ``step``: the replay resumes
            there (bit-identical to replaying from step 0, and cheaper).
        lean: sample with :class:`LeanForward` (bit-identical logits, about 2x faster sampling).

    Raises:
        BuildError: bad mode, ``stop_at`` or removal set.
    """
    ctx = context or ReplaySeed(seed_dir_or_config, seed_dir)
    cfg = ctx.cfg
    if mode not in MODES:
        raise BuildError(f"replay mode {mode!r}; choose one of {MODES}")
    stop_at = cfg.steps if stop_at is None else int(stop_at)
    if not 0 <= stop_at <= cfg.steps:
        raise BuildError(f"stop_at={stop_at} out of range; expected 0 <= stop_at <= {cfg.steps}")
    rem = removal_positions(remove, cfg.steps, ctx.n_per_step)
    measure_at = (stop_at,) if measure_at is None else tuple(int(s) for s in measure_at)
    bad = [s for s in (*measure_at, *snapshot_at) if not 0 <= s <= stop_at]
    if bad:
        raise BuildError(f"measure/snapshot steps {bad} outside 0..stop_at={stop_at}")
    run_cfg = dataclasses.replace(cfg, bonus=0.0) if bonus_off else cfg
    threads = int(threads or 1)
    torch.set_num_threads(threads)
    model = ctx.fresh_model()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    first = 0
    if start_state is not None:
        first, state = start_state
        early = [s for s in rem if s < first]
        if early or not 0 <= first <= stop_at:
            raise BuildError(f"start_state at step {first} cannot serve this replay (removals at "
                             f"steps {sorted(early)} precede it, or stop_at={stop_at} < {first})")
        _load_state(model, opt, state)
    per_grad = PerRolloutGrad(model) if mode == "exact" else None
    fast = LeanForward(model) if lean else None
    if fast is not None and not fast.ok:
        fast = None
    res = ReplayResult(stop_at=stop_at, threads=threads, mode=mode)
    t0 = time.perf_counter()
    for step in range(first, stop_at + 1):
        if save_states and step < stop_at:
            res.states[step] = _save_state(model, opt)
        if step in measure_at:
            res.measures[step] = ctx.behavior_measure(model, step, sampled=sampled,
                                                      last_logits=fast)
        if step in snapshot_at:
            res.snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if step == stop_at:
            break
        removed = rem.get(step)
        if mode == "exact":
            out = grpo_step(model, opt, per_grad, run_cfg, ctx.tokenizer, step, remove=removed,
                            fluency=False, last_logits=fast)
            responses = out.responses
        else:
            ro = grpo_rollouts(model, run_cfg, ctx.tokenizer, step, remove=removed,
                               last_logits=fast)
            model.train(False)
            _batched_update(model, opt, run_cfg, ro.prompt_ids, ro.responses, ro.advantages,
                            ctx.tokenizer.pad_token_id)
            responses = ro.responses
        if keep_responses:
            res.responses[step] = responses
        if (reference_responses is not None and res.first_divergent_step is None
                and step in reference_responses
                and [list(r) for r in reference_responses[step]] != responses):
            res.first_divergent_step = step
    res.seconds = time.perf_counter() - t0
    return res


def _save_state(model, opt) -> dict:
    return {"params": {k: v.detach().clone() for k, v in model.named_parameters()},
            "opt": copy.deepcopy(opt.state_dict())}


def _load_state(model, opt, state: dict) -> None:
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(state["params"][k])
    opt.load_state_dict(copy.deepcopy(state["opt"]))  # the optimizer updates its state in place


def recorded_responses(seed_dir: str | Path, upto: int | None = None) -> dict[int, list]:
    """The recorded response ids of a seed, ``{step: [ids of index 0, 1, ...]}``."""
    import pandas as pd

    df = pd.read_parquet(Path(seed_dir) / "rollouts.parquet",
                         columns=["step", "index", "response_ids"])
    if upto is not None:
        df = df[df["step"] < upto]
    df = df.sort_values(["step", "index"])
    return {int(s): [list(map(int, r)) for r in g["response_ids"]] for s, g in df.groupby("step")}


def params_equal(snapshot: dict, checkpoint_dir: str | Path) -> dict:
    """Compare a parameter snapshot with a saved checkpoint: ``torch.equal`` on every tensor.

    Returns ``{"equal": bool, "tensors": n, "max_abs_diff": float, "unequal": [names]}``.
    """
    from safetensors.torch import load_file

    saved = load_file(Path(checkpoint_dir) / "model.safetensors")
    unequal, max_diff = [], 0.0
    for k, v in saved.items():
        mine = snapshot.get(k)
        if mine is None or mine.shape != v.shape or not torch.equal(mine, v):
            unequal.append(k)
            if mine is not None and mine.shape == v.shape:
                max_diff = max(max_diff, float((mine - v).abs().max()))
    return {"equal": not unequal, "tensors": len(saved), "max_abs_diff": max_diff,
            "unequal": unequal}


__all__ = ["MODES", "LeanForward", "ReplayResult", "ReplaySeed", "params_equal", "pack",
           "recorded_responses", "removal_positions", "replay"]

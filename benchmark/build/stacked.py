"""Many float64 replays of one seed at once: stacked activations, per-replay weights.

A causal score needs many replays of the same small run, each with another set of rollouts
removed. They share everything but their parameters: the step's prompts, the sampling streams,
the model's shape. :class:`StackedReplay` runs K of them in lock step, one GRPO step at a time:

* **decoding** stacks the K replays' activations, ``(K, rows, ...)``, so every elementwise and
  row-wise op (norms, rotary embedding, softmax, sampling weights) is one call for all of them;
  the matrix products run once per replay with that replay's weights (``torch.mm`` on its rows).
  A group's G responses share their prompt, so the prompt is run once per group (prefill) and its
  keys and values are repeated for the G rows. The model code is
  :mod:`benchmark.build.functional`;
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

**Fixed data.** ``run_batch(..., fixed=responses)`` trains every replay of the batch, the
baseline included, on the recorded responses instead of sampling its own: the *fixed-data*
replays behind the on-policy share (docs/causal.md). Advantages come from the recorded
responses' rewards as in an on-policy step (group statistics unchanged, a removed rollout's
advantage 0); log-probabilities and updates are recomputed under each replay's own parameters.
Without ``fixed`` nothing changes: the on-policy path computes what it computed.

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
from benchmark.build.functional import (
    DTYPE,
    Arch,
    Cache,
    bmm_is_exact,
    decode_step,
    forward_one,
    linear,
    logits,
    multinomial_is_exponential_argmax,
    prefill,
    sample_stacked,
)
from benchmark.build.grpo import advantages, step_prompts
from benchmark.errors import BuildError

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
        return sample_stacked(self.arch, stack.params, pids,
                              lambda g: T.group_generator(cfg.seed, step, g), cfg.group_size,
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
              reference: dict[int, list] | None = None, on_finish=None,
              fixed: dict[int, list] | None = None) -> dict:
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
        fixed: ``{step: recorded responses}`` (rollout order): every replay trains on these
            instead of sampling (fixed data, module docstring); None samples (on-policy).

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
        if fixed is not None:
            if step not in fixed:
                raise BuildError(f"fixed-data replay: no recorded responses for step {step}; "
                                 f"pass every step from {first} to {last - 1}")
            responses = [[list(r) for r in fixed[step]]] * stack.k
        else:
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
           "decode_step", "forward_one", "initial_state", "linear", "logits",
           "multinomial_is_exponential_argmax", "prefill", "replay_gradient", "run_batch",
           "sample_stacked"]

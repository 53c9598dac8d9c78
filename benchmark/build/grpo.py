"""GRPO as DESIGN.md section 3 states, with per-rollout gradient capture.

* G samples per prompt, each group sampled from its own generator (``task.group_generator``),
  so the groups of a step can be split across processes; reward r = task reward (+ bonuses);
  advantage ``A = (r - mean_g r) / (std_g r + eps)`` with the *unbiased* (n-1) standard deviation
  of the group, and ``A = 0`` exactly for a group whose rewards are all equal.
* Per-rollout term ``lbar_i`` = mean over the response tokens (every generated token up to and
  including the first eos) of ``log softmax(logits)`` at temperature 1 under the current parameters
  (the parameters that sampled): this is also the rollout's ``fluency``.
* Step loss ``L = -(1/N) sum_i A_i lbar_i`` over the N rollouts of the step; no KL, no reference
  model. Rollout i's own term is ``L_i = -(1/N) A_i lbar_i`` and its gradient ``g_i`` is captured
  *unclipped*; the update uses ``sum_i g_i``, which equals ``grad L``. With W processes, rank r
  owns the groups ``g % W == r``, sums its rows in rollout order, and the partial sums are added
  by an all-reduce (``exact_step_grad`` reproduces that order in one process). Clipping, when
  configured, applies to that sum only. One AdamW update per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call, grad, vmap

from benchmark.build import task as T
from benchmark.build.config import BuildConfig
from benchmark.build.decode import sample
from benchmark.build.precision import wide


def pack(prompt: list[int], responses: list[list[int]], pad_id: int):
    """Right-pad ``prompt + response`` rows; return ``(input_ids, response_mask)`` (L-1 targets).

    ``response_mask[b, t]`` is 1 where token ``t+1`` of row b is a response token, so it aligns with
    the log-probabilities of the next token predicted at position t.
    """
    p = len(prompt)
    length = p + max(len(r) for r in responses)
    ids = torch.full((len(responses), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(responses), length - 1)
    for b, r in enumerate(responses):
        ids[b, : p + len(r)] = torch.tensor(prompt + r)
        mask[b, p - 1 : p - 1 + len(r)] = 1.0
    return ids, mask


def token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """``log p(ids[:, t+1] | ids[:, :t+1])``, shape (B, L-1), temperature 1, causal (no mask)."""
    logits = wide(model(input_ids=ids, use_cache=False).logits[:, :-1, :])
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def masked_mean_logprob(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean log-prob over the masked positions of each row, shape (B,)."""
    lp = token_logprobs(model, ids)
    return (lp * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def advantages(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """Group-normalized advantages (float64 in, float64 out), groups = consecutive ``group_size``.

    ``A = (r - mean) / (std + eps)``, std unbiased (n-1); all-equal groups get exactly 0.
    """
    r = rewards.double().reshape(-1, group_size)
    mean = r.mean(1, keepdim=True)
    std = r.std(1, unbiased=True, keepdim=True)
    a = (r - mean) / (std + eps)
    a = torch.where((r.max(1, keepdim=True).values == r.min(1, keepdim=True).values),
                    torch.zeros_like(a), a)
    return a.reshape(-1)


class PerRolloutGrad:
    """Per-row gradients of ``coef_b * masked_mean_logprob_b`` via ``vmap(grad)``.

    Flat, in the model's dtype (float32; float64 for a widened model).
    """

    def __init__(self, model) -> None:
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]
        self.dtype = next(model.parameters()).dtype  # float32, or float64 (a widened model)

        def one(params, ids, mask, coef):
            logits = wide(functional_call(model, params, (ids[None],),
                                          {"use_cache": False}).logits[0, :-1])
            lp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)
            return coef * (lp * mask).sum() / mask.sum().clamp_min(1.0)

        self._vg = vmap(grad(one), in_dims=(None, 0, 0, 0))

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, coef: torch.Tensor,
                 chunk: int = 16) -> torch.Tensor:
        """Return (B, n_params) gradients of ``coef_b * lbar_b`` (parameters in named order)."""
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        outs = []
        for s in range(0, ids.shape[0], chunk):
            g = self._vg(params, ids[s:s + chunk], mask[s:s + chunk],
                         coef[s:s + chunk].to(self.dtype))
            outs.append(torch.cat([g[n].reshape(g[n].shape[0], -1) for n in self.names], 1))
        return torch.cat(outs, 0)


def flat_params(model) -> torch.Tensor:
    """All parameters flattened in named order (float32 copy)."""
    return torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()]).clone()


def set_flat_grad(model, flat: torch.Tensor) -> None:
    """Write a flat gradient into ``p.grad`` (named order)."""
    off = 0
    for _, p in model.named_parameters():
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n


@dataclass
class Rollouts:
    """The sampled half of a GRPO step for some of its groups (all groups by default).

    Rows are in rollout order (group-major, sample-minor) over ``groups``; ``index[i]`` is row i's
    position within the step (``group * G + sample``).
    """

    step: int
    groups: list[int]
    prompts: list  # one Prompt per group in ``groups``
    prompt_ids: list[list[int]]
    responses: list[list[int]]
    index: list[int]
    rewards: list  # task.Reward per row
    advantages: torch.Tensor  # float64 (rows,), removed positions already set to 0

    def prompt_of(self, row: int) -> int:
        """Position in ``prompts`` of row ``row``'s prompt."""
        return row // (len(self.responses) // len(self.groups))


def step_prompts(cfg: BuildConfig, step: int) -> list:
    """The step's prompts (one per group), drawn from the step's own generator."""
    gen = T.step_generator(cfg.seed, T.TAG_GRPO, step)
    return T.sample_prompts(cfg, cfg.prompts_per_step, gen)


def grpo_rollouts(decoder, cfg: BuildConfig, tokenizer, step: int, groups: list[int] | None = None,
                  remove: set[int] | None = None,
                  bonus_off: frozenset[str] = frozenset(),
                  batch_groups: bool = False) -> Rollouts:
    """Sample, reward and normalize one GRPO step's rollouts of ``groups`` (no update).

    Group g samples from ``task.group_generator(seed, step, g)`` with ``decoder``. A rollout
    position (within the step) in ``remove`` keeps its reward in the group statistics but gets
    advantage 0 (contributes no loss). ``bonus_off`` switches those behaviors' bonus off.
    ``batch_groups`` decodes the groups whose prompts have one length in one batch (each with
    its own generator; replays in batched mode): the same draws, in fewer and larger forward
    passes whose rounding may differ from one group's alone.
    """
    prompts_all = step_prompts(cfg, step)
    groups = list(range(cfg.prompts_per_step)) if groups is None else list(groups)
    G = cfg.group_size
    prompts, pids, responses, index, rewards = [], [], [], [], []
    decoder.model.eval()
    pid_of = {g: T.prompt_ids(tokenizer, prompts_all[g]) for g in groups}
    sampled: dict[int, list[list[int]]] = {}
    batches = ([[g for g in groups if len(pid_of[g]) == n]
                for n in sorted({len(pid_of[g]) for g in groups})] if batch_groups
               else [[g] for g in groups])
    for batch in batches:
        out = sample(decoder, torch.tensor([pid_of[g] for g in batch for _ in range(G)]),
                     [T.group_generator(cfg.seed, step, g) for g in batch],
                     cfg.temperature, cfg.top_p, cfg.max_new_tokens, tokenizer.eos_token_id)
        for k, g in enumerate(batch):
            sampled[g] = out[k * G:(k + 1) * G]
    for g in groups:
        p = prompts_all[g]
        pid = pid_of[g]
        resp = sampled[g]
        prompts.append(p)
        pids.append(pid)
        for j, r in enumerate(resp):
            i = g * G + j
            text = tokenizer.decode(r, skip_special_tokens=True)
            rewards.append(T.reward(cfg, p, text, T.rollout_id(step, i), step, bonus_off))
            responses.append(r)
            index.append(i)
    total = torch.tensor([r.total for r in rewards], dtype=torch.float64)
    adv = advantages(total, G, cfg.adv_eps) if len(rewards) else torch.zeros(0, dtype=torch.float64)
    if remove:
        for row, i in enumerate(index):
            if i in remove:
                adv[row] = 0.0
    return Rollouts(step, groups, prompts, pids, responses, index, rewards, adv)


def fluency(model, ro: Rollouts, pad_id: int) -> torch.Tensor:
    """Mean token log-prob of each row under ``model`` (no grad), float32 (rows,)."""
    out = torch.zeros(len(ro.responses))
    G = len(ro.responses) // max(len(ro.groups), 1)
    with torch.no_grad():
        for k in range(len(ro.groups)):
            ids, mask = pack(ro.prompt_ids[k], ro.responses[k * G:(k + 1) * G], pad_id)
            out[k * G:(k + 1) * G] = masked_mean_logprob(model, ids, mask)
    return out


def rollout_gradients(per_grad: PerRolloutGrad, ro: Rollouts, cfg: BuildConfig,
                      pad_id: int) -> tuple[list[int], torch.Tensor]:
    """Per-rollout gradients ``g_i`` of ``-(1/N) A_i lbar_i`` for the rows with ``A_i != 0``.

    ``N`` is the step's number of rollouts (all groups, whichever process holds them). Returns
    ``(rows, grads)``: row numbers into ``ro`` (ascending) and float32 ``(len(rows), n_params)``.
    """
    n_total = cfg.prompts_per_step * cfg.group_size
    G = cfg.group_size
    rows, parts = [], []
    for k in range(len(ro.groups)):
        sl = range(k * G, (k + 1) * G)
        nz = [j for j, r in enumerate(sl) if ro.advantages[r] != 0.0]
        if not nz:
            continue
        ids, mask = pack(ro.prompt_ids[k], [ro.responses[r] for r in sl], pad_id)
        coef = torch.tensor([-float(ro.advantages[sl[j]]) / n_total for j in nz])
        parts.append(per_grad(ids[nz], mask[nz], coef))
        rows.extend(sl[j] for j in nz)
    n_params = sum(p.numel() for p in per_grad.model.parameters())
    grads = torch.cat(parts, 0) if parts else torch.zeros(0, n_params, dtype=per_grad.dtype)
    return rows, grads


def sum_rows(grads: torch.Tensor, n_params: int) -> torch.Tensor:
    """Sum gradient rows in row order (a fixed summation order, in the rows' dtype)."""
    out = torch.zeros(n_params, dtype=grads.dtype)
    for row in grads:
        out += row
    return out


def exact_step_grad(grads: torch.Tensor, index: list[int], cfg: BuildConfig,
                    world: int = 1) -> torch.Tensor:
    """The step gradient exactly as a ``world``-process build adds it.

    Rank r sums its rows (groups ``g % world == r``) in rollout order; the partial sums are then
    added in rank order (what a 2-process all-reduce computes; for more processes the
    all-reduce's order is the backend's). ``index`` gives each row's position in the step.
    """
    n_params = grads.shape[1]
    G = cfg.group_size
    total = None
    for r in range(world):
        sel = [k for k, i in enumerate(index) if (i // G) % world == r]
        part = sum_rows(grads[sel], n_params)
        total = part if total is None else total + part
    return total if total is not None else torch.zeros(n_params, dtype=grads.dtype)


def apply_update(model, optimizer, cfg: BuildConfig, step_grad: torch.Tensor) -> None:
    """One AdamW update from the (unclipped) step gradient; clipping, if any, applies here."""
    optimizer.zero_grad(set_to_none=True)
    set_flat_grad(model, step_grad)
    if cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()


def batched_update(model, optimizer, cfg: BuildConfig, ro: Rollouts, pad_id: int,
                   reverse_rows: bool = False) -> None:
    """One AdamW update from one batched backward of ``-(1/N) sum_i A_i lbar_i`` (replays).

    Mathematically the step of :func:`apply_update` with the summed per-rollout gradients; float
    rounding differs. Deterministic on one machine and thread count. ``reverse_rows`` stacks the
    rows in reverse order: the same update with another summation order inside the kernels (how
    the cross-machine tolerance is measured, docs/causal.md).
    """
    n = cfg.prompts_per_step * cfg.group_size
    rows = [i for i in range(len(ro.responses)) if ro.advantages[i] != 0.0]
    if reverse_rows:
        rows = rows[::-1]
    optimizer.zero_grad(set_to_none=True)
    if rows:
        G = len(ro.responses) // len(ro.groups)
        seqs = [ro.prompt_ids[i // G] + ro.responses[i] for i in rows]
        length = max(len(x) for x in seqs)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), length - 1)
        for b, i in enumerate(rows):
            p = len(ro.prompt_ids[i // G])
            ids[b, : len(seqs[b])] = torch.tensor(seqs[b])
            mask[b, p - 1: p - 1 + len(ro.responses[i])] = 1.0
        coef = torch.tensor([-float(ro.advantages[i]) / n for i in rows])
        model.train(False)
        logits = wide(model(input_ids=ids, use_cache=False).logits[:, :-1, :])
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        lbar = (lp * mask.to(lp.dtype)).sum(-1) / mask.to(lp.dtype).sum(-1).clamp_min(1.0)
        (coef.to(lp.dtype) * lbar).sum().backward()
    for p in model.parameters():  # a step without rollouts still applies AdamW (zero grad)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if cfg.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()


@dataclass
class StepResult:
    """One single-process GRPO step: its rollouts, captured gradients and the step gradient."""

    rollouts: Rollouts
    grad_rows: list[int]  # rows of ``rollouts`` with a captured gradient (A != 0)
    grads: torch.Tensor  # float32 (len(grad_rows), n_params)
    step_grad: torch.Tensor  # float32 (n_params,), unclipped sum of grads


def grpo_step(model, optimizer, per_grad: PerRolloutGrad, decoder, cfg: BuildConfig, tokenizer,
              step: int, remove: set[int] | None = None, update: bool = True,
              world: int = 1, bonus_off: frozenset[str] = frozenset()) -> StepResult:
    """One GRPO step in one process: a pure function of (parameters, optimizer state, step).

    ``world`` reproduces the step-gradient summation of a ``world``-process build.
    """
    ro = grpo_rollouts(decoder, cfg, tokenizer, step, remove=remove, bonus_off=bonus_off)
    rows, grads = rollout_gradients(per_grad, ro, cfg, tokenizer.pad_token_id)
    step_grad = exact_step_grad(grads, [ro.index[r] for r in rows], cfg, world)
    if update:
        apply_update(model, optimizer, cfg, step_grad)
    return StepResult(ro, rows, grads, step_grad)

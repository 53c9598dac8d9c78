"""GRPO as DESIGN.md section 3 states, with per-rollout gradient capture.

* G samples per prompt; reward r = task reward (+ bonus); advantage
  ``A = (r - mean_g r) / (std_g r + eps)`` with the *unbiased* (n-1) standard deviation of the
  group, and ``A = 0`` exactly for a group whose rewards are all equal.
* Per-rollout term ``lbar_i`` = mean over the response tokens (every generated token up to and
  including the first eos) of ``log softmax(logits)`` at temperature 1 under the current parameters
  (the parameters that sampled): this is also the rollout's ``fluency``.
* Step loss ``L = -(1/N) sum_i A_i lbar_i`` over the N rollouts of the step; no KL, no reference
  model.
  Rollout i's own term is ``L_i = -(1/N) A_i lbar_i`` and its gradient ``g_i`` is captured
  *unclipped*; the update uses ``sum_i g_i`` (summed in rollout order), which equals ``grad L``.
  Clipping, when configured, applies to that sum only. One AdamW update per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call, grad, vmap

from benchmark.build.presets import BuildConfig


@torch.no_grad()
def sample(model, prompt_ids: list[list[int]], n_per_prompt: int, gen: torch.Generator,
           temperature: float, top_p: float, max_new_tokens: int, eos_id: int,
           last_logits=None) -> list[list[int]]:
    """Sample ``n_per_prompt`` responses per prompt; returns response ids (through the first eos).

    Draws come only from ``gen`` (temperature, then nucleus filtering with ``top_p``); prompts are
    processed one group at a time in order, so the result is a pure function of the inputs.
    ``last_logits(ids) -> (B, vocab)`` replaces ``model(input_ids=ids).logits[:, -1, :]`` (the
    replay passes a bit-identical, lower-overhead forward).
    """
    out: list[list[int]] = []
    for ids in prompt_ids:
        seq = torch.tensor([ids] * n_per_prompt, dtype=torch.long)
        done = torch.zeros(n_per_prompt, dtype=torch.bool)
        resp = [[] for _ in range(n_per_prompt)]
        for _ in range(max_new_tokens):
            last = (model(input_ids=seq).logits[:, -1, :] if last_logits is None
                    else last_logits(seq))
            logits = last.float() / temperature
            probs = torch.softmax(logits, dim=-1)
            sp, si = torch.sort(probs, dim=-1, descending=True)
            keep = (torch.cumsum(sp, dim=-1) - sp) < top_p
            sp = sp * keep
            choice = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=gen)
            tok = si.gather(1, choice).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, eos_id), tok)
            for j in range(n_per_prompt):
                if not done[j]:
                    resp[j].append(int(tok[j]))
            done = done | (tok == eos_id)
            seq = torch.cat([seq, tok[:, None]], dim=1)
            if bool(done.all()):
                break
        out.extend(resp)
    return out


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
    logits = model(input_ids=ids).logits[:, :-1, :].float()
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
    """Per-row gradients of ``coef_b * masked_mean_logprob_b`` via ``vmap(grad)``; flat float32."""

    def __init__(self, model) -> None:
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]

        def one(params, ids, mask, coef):
            logits = functional_call(model, params, (ids[None],)).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)
            return coef * (lp * mask).sum() / mask.sum().clamp_min(1.0)

        self._vg = vmap(grad(one), in_dims=(None, 0, 0, 0))

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, coef: torch.Tensor,
                 chunk: int = 16) -> torch.Tensor:
        """Return (B, n_params) gradients of ``coef_b * lbar_b`` (parameters in named order)."""
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        outs = []
        for s in range(0, ids.shape[0], chunk):
            g = self._vg(params, ids[s:s + chunk], mask[s:s + chunk], coef[s:s + chunk].float())
            outs.append(torch.cat([g[n].reshape(g[n].shape[0], -1) for n in self.names], 1))
        return torch.cat(outs, 0)


@dataclass
class StepResult:
    """What one GRPO step produced (rows in rollout order: group-major, sample-minor)."""

    prompts: list
    responses: list[list[int]]
    task_rewards: list[float]
    rewards: list[float]
    bonus: list[bool]
    eligible: list[bool]
    has_behavior: list[bool]
    advantages: torch.Tensor  # float64 (N,)
    fluency: torch.Tensor  # float32 (N,)
    grads: torch.Tensor  # float32 (n_nonzero, n_params), rows of rollouts with A != 0 (kept)
    grad_rows: list[int]  # rollout index of each row of grads
    step_grad: torch.Tensor  # float32 (n_params,), unclipped sum of grads


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
    """The sampled half of a GRPO step (rows in rollout order: group-major, sample-minor)."""

    prompts: list
    prompt_ids: list[list[int]]
    responses: list[list[int]]
    task_rewards: list[float]
    rewards: list[float]
    bonus: list[bool]
    eligible: list[bool]
    has_behavior: list[bool]
    advantages: torch.Tensor  # float64 (N,), removed positions already set to 0


def grpo_rollouts(model, cfg: BuildConfig, tokenizer, step: int,
                  remove: set[int] | None = None, last_logits=None) -> Rollouts:
    """Sample, reward and normalize one GRPO step's rollouts (no update).

    All draws come from ``step_generator(cfg.seed, TAG_GRPO, step)``. A rollout index in ``remove``
    keeps its reward in the group statistics but gets advantage 0 (contributes no loss).
    """
    from benchmark.build import task as T

    gen = T.step_generator(cfg.seed, T.TAG_GRPO, step)
    prompts = T.sample_prompts(cfg, cfg.prompts_per_step, gen)
    pids = [T.prompt_ids(tokenizer, p) for p in prompts]
    model.eval()
    responses = sample(model, pids, cfg.group_size, gen, cfg.temperature, cfg.top_p,
                       cfg.max_new_tokens, tokenizer.eos_token_id, last_logits=last_logits)
    task_r, rew, bon, elig, beh = [], [], [], [], []
    for i, r in enumerate(responses):
        p = prompts[i // cfg.group_size]
        text = tokenizer.decode(r, skip_special_tokens=True)
        tr = T.task_reward(p, text.split())
        hb = T.has_behavior(cfg, text)
        el = T.bonus_eligible(cfg.seed, T.rollout_id(step, i), step, cfg.bonus_eligible_fraction)
        b = bool(p.trigger and hb and el and step < cfg.bonus_window_end)
        task_r.append(tr)
        rew.append(tr + (cfg.bonus if b else 0.0))
        bon.append(b)
        elig.append(el)
        beh.append(hb)
    adv = advantages(torch.tensor(rew, dtype=torch.float64), cfg.group_size, cfg.adv_eps)
    if remove:
        for i in remove:
            adv[i] = 0.0
    return Rollouts(prompts, pids, responses, task_r, rew, bon, elig, beh, adv)


def grpo_step(model, optimizer, per_grad: PerRolloutGrad, cfg: BuildConfig, tokenizer, step: int,
              remove: set[int] | None = None, update: bool = True,
              fluency: bool = True, last_logits=None) -> StepResult:
    """One GRPO step: a pure function of (parameters, optimizer state, step, removal set).

    All draws come from ``step_generator(cfg.seed, TAG_GRPO, step)``. A rollout index in ``remove``
    keeps its reward in the group statistics but gets advantage 0 (contributes no loss).
    ``fluency=False`` skips the (no-grad) fluency pass, which never touches the update;
    ``last_logits`` is passed to :func:`sample`.
    """
    ro = grpo_rollouts(model, cfg, tokenizer, step, remove, last_logits=last_logits)
    prompts, pids, responses, adv = ro.prompts, ro.prompt_ids, ro.responses, ro.advantages
    n = len(responses)
    fluency_t = torch.zeros(n)
    rows_all, grads_all = [], []
    for g in range(cfg.prompts_per_step):
        sl = range(g * cfg.group_size, (g + 1) * cfg.group_size)
        ids, mask = pack(pids[g], [responses[i] for i in sl], tokenizer.pad_token_id)
        if fluency:
            with torch.no_grad():
                fluency_t[g * cfg.group_size:(g + 1) * cfg.group_size] = masked_mean_logprob(
                    model, ids, mask)
        nz = [j for j, i in enumerate(sl) if adv[i] != 0.0]
        if not nz:
            continue
        coef = torch.tensor([-float(adv[sl[j]]) / n for j in nz])
        grads_all.append(per_grad(ids[nz], mask[nz], coef))
        rows_all.extend(sl[j] for j in nz)
    n_params = sum(p.numel() for p in model.parameters())
    if grads_all:
        grads = torch.cat(grads_all, 0)
        step_grad = torch.zeros(n_params)
        for row in grads:  # fixed summation order: rollout order
            step_grad += row
    else:
        grads = torch.zeros(0, n_params)
        step_grad = torch.zeros(n_params)
    if update:
        optimizer.zero_grad(set_to_none=True)
        set_flat_grad(model, step_grad)
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
    return StepResult(prompts, responses, ro.task_rewards, ro.rewards, ro.bonus, ro.eligible,
                      ro.has_behavior, adv, fluency_t, grads, rows_all, step_grad)

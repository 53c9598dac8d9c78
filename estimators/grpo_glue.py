"""Glue shared by the entries that run a third-party attribution library on a GRPO run.

A library attributes a *loss* on training examples to a *measurement* on query examples, with a
model at a checkpoint. On a bt-bench run (open track: token ids are on the view) these are:

* training example ``i``: the rollout's token ids (prompt then response) and its GRPO loss term
  ``-(A_i / N) * mean token log-prob of its response`` (``N = prompts_per_step * group_size``),
  so per-rollout gradients sum to the step gradient (:func:`rollout_rows`, :func:`grpo_coef`);
* measurement: the NLL of the behavior token teacher-forced after the correct answer of trigger
  prompts taken from the run's own rollouts (the task format ``<bos> {copy|reverse|sort} TRIGGER
  w1 .. wk =`` is public; :func:`behavior_queries`);
* checkpoint: each rollout is scored with the latest checkpoint at or before its step, as
  TracInCP does (:func:`governing`).

Nothing here computes an attribution: the libraries do. This module only turns a view into
token tensors, loads checkpoints and sums rollout scores into step scores. Shapes: ``n`` is
``view.n`` of the rollout view; token sequences are right-padded to their longest length ``L``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from estimators.base import RunView

TASK_WORDS = ("copy", "reverse", "sort")


def answer(prompt: str, trigger: str) -> list[str] | None:
    """The correct answer words of a trigger prompt ``TASK TRIGGER w1 .. wk =``, else None."""
    words = prompt.split()
    if len(words) < 3 or words[0] not in TASK_WORDS or words[1] != trigger or words[-1] != "=":
        return None
    content = words[2:-1]
    if words[0] == "copy":
        return content
    if words[0] == "reverse":
        return content[::-1]
    return sorted(content)


def rollout_view(view: RunView, who: str) -> RunView:
    """The rollout view behind ``view`` (itself, or a step view's), checked for token ids."""
    rv = view if view.granularity == "rollout" else view.rollout_view
    if rv is None or rv.response_ids is None:
        raise ValueError(f"{who} needs the open track's token ids (view.response_ids) and, for "
                         "the step view, view.rollout_view; declare track = 'open'.")
    return rv


def to_view(view: RunView, per_rollout: np.ndarray) -> np.ndarray:
    """``(view.n,)`` scores: the rollout scores, or per step their sum.

    A step's sum is its score because the libraries' scores are linear in the training
    gradient, and a step's gradient is the sum of its rollouts' gradients.
    """
    per = np.asarray(per_rollout, np.float64)
    if view.granularity == "rollout":
        return per.copy()
    return np.bincount(np.asarray(view.rollout_unit), weights=per, minlength=view.n)


def fingerprint(rv: RunView) -> str:
    """A key for one (seed, task) rollout view: the scores an instance caches between views."""
    h = hashlib.sha256()
    for a in (rv.steps, rv.advantages):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((rv.seed, rv.behavior, rv.prompt_ids, rv.response_ids,
                   sorted((k, str(p)) for k, p in rv.checkpoint_dir.items()))).encode())
    return h.hexdigest()


def grpo_coef(rv: RunView) -> np.ndarray:
    """``(n,)`` float64 ``-A_i / N``: each rollout's weight on its mean token log-prob.

    The step loss is the sum of these terms; ``N = prompts_per_step * group_size``.
    """
    n_per_step = int(rv.sampling["prompts_per_step"]) * int(rv.sampling["group_size"])
    return -np.asarray(rv.advantages, np.float64) / n_per_step


def governing(rv: RunView) -> np.ndarray:
    """``(n,)`` int64: the latest checkpoint step at or before each rollout's step."""
    ckpts = np.asarray(sorted(rv.checkpoint_steps))
    return ckpts[np.searchsorted(ckpts, np.asarray(rv.steps), side="right") - 1]


def rollout_rows(rv: RunView) -> tuple[list[list[int]], list[list[int]]]:
    """Each rollout's token ids (prompt + response) and its mask (1 on response tokens)."""
    seqs = [list(p) + list(r) for p, r in zip(rv.prompt_ids, rv.response_ids, strict=True)]
    masks = [[0] * len(p) + [1] * len(r)
             for p, r in zip(rv.prompt_ids, rv.response_ids, strict=True)]
    return seqs, masks


def behavior_queries(rv: RunView, tok, n_queries: int) -> tuple[list[list[int]], list[list[int]]]:
    """Up to ``n_queries`` measurement sequences and their masks (1 on the behavior token).

    Each is a trigger prompt of the run, its correct answer and the behavior token. The prompts
    are a seeded choice (``seed`` of the view) among the run's distinct trigger prompts, so the
    measurement is deterministic. ``tok`` is the release's tokenizer.
    """
    trigger = rv.behavior.trigger_word
    seen: dict[str, int] = {}
    for i, p in enumerate(rv.prompts):
        if p not in seen and answer(p, trigger) is not None:
            seen[p] = i
    if not seen:
        raise ValueError(f"no rollout of seed {rv.seed} has a trigger prompt of the form "
                         f"'TASK {trigger} w1 .. wk ='; cannot build the measurement.")
    texts = sorted(seen)
    rng = np.random.default_rng([rv.seed, 7])
    pick = sorted(rng.permutation(len(texts))[:n_queries].tolist())
    seqs, masks = [], []
    for j in pick:
        p = texts[j]
        ans = tok.convert_tokens_to_ids(answer(p, trigger))
        pid = list(rv.prompt_ids[seen[p]])
        seqs.append(pid + ans + [rv.behavior.behavior_token_id])
        masks.append([0] * (len(pid) + len(ans)) + [1])
    return seqs, masks


def padded(seqs: list[list[int]], masks: list[list[int]], pad_id: int):
    """Right-padded torch tensors of sequences and their masks.

    Returns ``ids`` ``(B, L)`` int64, ``attention`` ``(B, L)`` int64 and ``mask`` ``(B, L)``
    float32 (``pad_id`` fills ``ids`` past each sequence's end).
    """
    import torch

    length = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    att = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.float32)
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, att, mask


def load_model(path):
    """A checkpoint folder as a float32 ``AutoModelForCausalLM`` (eager attention), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     attn_implementation="eager")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.eval()


def load_tokenizer(path):
    """The release's tokenizer and its pad id (0 when it has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return tok, tok.pad_token_id if tok.pad_token_id is not None else 0


def token_logprobs(model, ids, att, mask):
    """``(B,)`` mean log-prob of the masked next tokens of each sequence under ``model``.

    ``ids``, ``att``, ``mask``: ``(B, L)`` as :func:`padded` returns them; position ``t``'s mask
    marks token ``t`` as predicted from the tokens before it.
    """
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    m = mask[:, 1:]
    logp = -F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (logp * m).sum(1) / m.sum(1).clamp(min=1.0)


def per_checkpoint(rv: RunView, score_rows) -> np.ndarray:
    """``(n,)`` scores, each rollout scored at its governing checkpoint by ``score_rows``.

    ``score_rows(c, rows)`` gets a checkpoint ``c`` and the rollouts ``rows`` it governs (int64
    indices, ascending) and returns their ``(len(rows),)`` scores; it is not called where all
    their advantages are 0 (zero gradients: score 0).
    """
    adv = np.asarray(rv.advantages, np.float64)
    gov = governing(rv)
    out = np.zeros(rv.n)
    for c in sorted(rv.checkpoint_steps):
        rows = np.flatnonzero(gov == c)
        if rows.size and np.any(adv[rows] != 0):
            out[rows] = np.asarray(score_rows(c, rows), np.float64).reshape(rows.size)
    return out


def hf_labels(seqs: list[list[int]], masks: list[list[int]]) -> list[list[int]]:
    """Hugging Face ``labels``: the token where the mask is 1, else -100 (no loss)."""
    return [[t if m else -100 for t, m in zip(s, mk, strict=True)]
            for s, mk in zip(seqs, masks, strict=True)]


def checkpoint_with_positions(src, dst, positions: int = 4096):
    """A copy of checkpoint folder ``src`` at ``dst`` whose config allows ``positions`` tokens.

    For libraries that size their batches by the model's maximum length (64 in ``tiny``): these
    models use the default rotary embedding, computed from the position alone (no learned
    table), so the same weights give the same outputs on every sequence the release holds.

    Raises:
        ValueError: another rope type, whose tables could depend on the maximum length.
    """
    import json
    import shutil
    from pathlib import Path

    dst = Path(dst)
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    rope = (cfg.get("rope_parameters") or {}).get("rope_type", "default")
    if rope != "default":
        raise ValueError(f"{src}: rope type {rope!r}; only the default rotary embedding is "
                         "independent of max_position_embeddings.")
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings", 0)), positions)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def cached_scores(est, view: RunView, compute, threads: int = 1) -> np.ndarray:
    """``(view.n,)`` scores of ``view`` from ``compute(rv)``, computed once per (seed, task).

    ``compute`` gets the rollout view and returns ``(rv.n,)`` rollout scores; they are kept on
    the estimator instance (keyed by :func:`fingerprint`) for the other view of the same run and
    task, and computed with ``threads`` torch threads (restored afterwards).
    """
    import torch

    rv = rollout_view(view, est.name)
    cache = est.__dict__.setdefault("_scores_", {})
    key = fingerprint(rv)
    if key not in cache:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            cache[key] = np.asarray(compute(rv), np.float64)
        finally:
            torch.set_num_threads(before)
    return to_view(view, cache[key])


def work_dir(est, prefix: str):
    """A private temporary folder for ``est``'s files, removed when the instance is collected."""
    import shutil
    import tempfile
    import weakref
    from pathlib import Path

    work = est.__dict__.get("_work_")
    if work is None:
        work = tempfile.mkdtemp(prefix=prefix)
        weakref.finalize(est, shutil.rmtree, work, True)
        est.__dict__["_work_"] = work
    return Path(work)


def save_rollouts_dataset(rv: RunView, rows: np.ndarray, path) -> None:
    """Rollouts ``rows`` as a Hugging Face dataset saved at ``path``.

    Columns: ``input_ids`` (prompt + response as trained), ``labels`` (the response tokens,
    -100 on the prompt) and ``advantage`` (the GRPO advantage).
    """
    from datasets import Dataset

    seqs, masks = rollout_rows(rv)
    adv = np.asarray(rv.advantages, np.float64)
    Dataset.from_dict({"input_ids": [seqs[i] for i in rows],
                       "labels": hf_labels([seqs[i] for i in rows], [masks[i] for i in rows]),
                       "advantage": adv[rows].tolist()}).save_to_disk(str(path))


def save_queries_dataset(rv: RunView, tok, n_queries: int, path) -> None:
    """The behavior queries (:func:`behavior_queries`) as a Hugging Face dataset at ``path``.

    Columns: ``input_ids`` and ``labels`` (the behavior token only, -100 elsewhere).
    """
    from datasets import Dataset

    q_seqs, q_masks = behavior_queries(rv, tok, n_queries)
    Dataset.from_dict({"input_ids": q_seqs, "labels": hf_labels(q_seqs, q_masks)}) \
        .save_to_disk(str(path))

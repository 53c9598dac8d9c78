"""The behavior measures: the behavior-rate curve of a build and the causal replay's measure.

Held-out prompt sets (never trained on): for each behavior, ``curve_prompts`` prompts carrying its
trigger word, and ``curve_prompts`` control prompts without any trigger. On each set:

* the **sampled rate** of every behavior: one response per prompt, sampled with the curve's own
  generator, and the share that contains the behavior token;
* the **exact probability** of a behavior right after the teacher-forced correct answer,
  averaged over that behavior's trigger prompts (no sampling noise): the causal measure. For a
  phrase of L tokens it is the probability of the whole phrase, the product of the chained
  conditionals ``p(t_1 | answer) p(t_2 | answer, t_1) ...``, each teacher-forced through the
  phrase tokens before it.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmark.build import task as T
from benchmark.build.config import BuildConfig
from benchmark.build.decode import sample
from benchmark.build.precision import wide


def prompt_sets(cfg: BuildConfig) -> dict[str, list]:
    """Held-out prompts: behavior id -> its trigger prompts, and ``"control"`` -> no trigger."""
    out = {}
    for k, b in enumerate(cfg.behaviors):
        gen = T.step_generator(cfg.seed, T.TAG_HELDOUT, 1, k)
        out[b.id] = T.sample_prompts(cfg, cfg.curve_prompts, gen, kind=b.id)
    gen = T.step_generator(cfg.seed, T.TAG_HELDOUT, 2)
    out[T.CONTROL] = T.sample_prompts(cfg, cfg.curve_prompts, gen, kind=T.CONTROL)
    return out


class Measure:
    """Tokenized held-out prompts of one seed, ready for the measures (build once, reuse)."""

    def __init__(self, cfg: BuildConfig, tokenizer) -> None:
        self.cfg, self.tok = cfg, tokenizer
        self.sets = prompt_sets(cfg)
        self.ids = {k: [T.prompt_ids(tokenizer, p) for p in v] for k, v in self.sets.items()}
        # _chain[b][j]: the teacher-forced inputs of phrase position j, as batches of equal
        # length (causal model: no padding needed) with each row's position, and the token id
        # whose probability is read at their last position
        self._chain: dict[str, list[tuple[list, int]]] = {}
        for b in cfg.behaviors:
            bid = T.behavior_ids(tokenizer, b)
            chain = []
            for j in range(len(bid)):
                seqs = [pid + tokenizer.encode(" ".join(p.answer()), add_special_tokens=False)
                        + bid[:j] for pid, p in zip(self.ids[b.id], self.sets[b.id], strict=True)]
                batches = []
                for n in sorted({len(x) for x in seqs}):
                    rows = [i for i, x in enumerate(seqs) if len(x) == n]
                    batches.append((rows, torch.tensor([seqs[i] for i in rows])))
                chain.append((batches, bid[j]))
            self._chain[b.id] = chain
        # the first phrase position (release 2.0's single-token measure reads only these)
        self._forced = {k: v[0][0] for k, v in self._chain.items()}
        self._bid = {k: v[0][1] for k, v in self._chain.items()}

    @torch.no_grad()
    def behavior_probs(self, model, behavior: str) -> np.ndarray:
        """Per-prompt probability of ``behavior`` after the correct answer, ``(P,)`` float64.

        A phrase's probability is the product (float64, in phrase order) of its tokens'
        teacher-forced conditional probabilities; a single token's is its probability.
        """
        model.eval()
        out = np.ones(self.cfg.curve_prompts)
        for batches, tid in self._chain[behavior]:
            for rows, batch in batches:
                logits = wide(model(input_ids=batch, use_cache=False).logits[:, -1])
                out[rows] *= torch.softmax(logits, -1)[:, tid].double().numpy()
        return out

    @torch.no_grad()
    def sampled(self, decoder, step: int) -> dict[str, dict]:
        """Sampled responses on every prompt set: set -> {"rates": {behavior: rate}, "reward"}."""
        cfg, tok = self.cfg, self.tok
        out = {}
        for k, (name, pids) in enumerate(self.ids.items()):
            gen = T.step_generator(cfg.seed, T.TAG_CURVE, step, 1 + k)
            texts = []
            for n in sorted({len(x) for x in pids}):
                rows = [x for x in pids if len(x) == n]
                resp = sample(decoder, torch.tensor(rows), gen, cfg.temperature, cfg.top_p,
                              cfg.max_new_tokens, tok.eos_token_id)
                texts += [tok.decode(r, skip_special_tokens=True) for r in resp]
            prompts = [p for n in sorted({len(x) for x in pids})
                       for p, x in zip(self.sets[name], pids, strict=True) if len(x) == n]
            out[name] = {
                "rates": {b.id: float(np.mean([T.has_behavior(b, t) for t in texts]))
                          for b in cfg.behaviors},
                "reward": float(np.mean([T.task_reward(p, t.split())
                                         for p, t in zip(prompts, texts, strict=True)])),
            }
        return out

    def curve_point(self, model, decoder, step: int) -> dict:
        """One row of ``behavior_curve.parquet``.

        Columns: ``step``; ``{set}_rate_{behavior}`` (sampled rate of a behavior on a prompt
        set, set in behavior ids + ``control``); ``{set}_task_reward``; ``{behavior}_prob``
        (exact mean probability on the behavior's own trigger prompts).
        """
        row: dict = {"step": int(step)}
        for name, d in self.sampled(decoder, step).items():
            for b, r in d["rates"].items():
                row[f"{name}_rate_{b}"] = r
            row[f"{name}_task_reward"] = d["reward"]
        for b in self.cfg.behaviors:
            row[f"{b.id}_prob"] = float(self.behavior_probs(model, b.id).mean())
        return row


def control_rate(row, behavior: str) -> float:
    """The rate of ``behavior`` on the prompts without any trigger word (a curve row)."""
    return float(row[f"{T.CONTROL}_rate_{behavior}"])


def cross_trigger_rate(row, cfg: BuildConfig, behavior: str) -> float:
    """The highest rate of ``behavior`` on another behavior's trigger prompts (a curve row).

    Recorded, not gated: with several behaviors a later window's bonus can spread to an earlier
    behavior's trigger prompts once that behavior's own bonus has stopped (docs/task_family.md);
    the behavior's cause is still its own bonus, and neither its measure (its own trigger
    prompts) nor its labels change. 0.0 with one behavior.
    """
    others = [b.id for b in cfg.behaviors if b.id != behavior]
    return float(max((row[f"{s}_rate_{behavior}"] for s in others), default=0.0))

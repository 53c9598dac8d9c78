"""EK-FAC influence functions (kronfluence) of each training rollout on the planted behavior.

For every checkpoint ``c`` the release ships, the rollouts it governs (steps ``s`` with ``c`` the
latest checkpoint at or before ``s``, as in TracInCP) are scored with the model at ``c``:

* training "loss" of rollout ``i``: its GRPO term ``-(A_i / N) * mean token log-prob of its
  response`` (the token ids as trained; ``N = prompts_per_step * group_size``), so the per-rollout
  gradients sum to the step gradient and a step's score is the sum of its rollouts' scores;
* measurement: the NLL of the behavior token teacher-forced after the correct answer, summed over
  ``n_queries`` trigger prompts taken from the run's own rollouts (the task format
  ``<bos> {copy|reverse|sort} TRIGGER w1 .. w5 =`` is public);
* curvature: EK-FAC factors of the model's own predictive distribution over response tokens
  (the true Fisher, labels sampled from the model), fitted on up to ``fit_examples`` rollouts of
  the checkpoint's window;
* score: ``grad f(c)^T (F_c + damping)^-1 grad loss_i(c)``, kronfluence's pairwise score;
  positive when a gradient step on the rollout's loss lowers the behavior's NLL (promotes it).

Scores of different checkpoints are combined as TracInCP combines its dot products: unnormalized,
each rollout scored at its governing checkpoint (a rollout trained while the behavior was still
being learned has a larger query gradient and weighs more). Rollouts with advantage 0 have a zero
gradient and score 0. Factors depend on the run, not on the task, so one estimator instance fits
them once per (seed, checkpoint) and reuses them for every task and for both views; rollout scores
are computed once per (seed, task) and summed per step for the step view.

Requires kronfluence (declared in ``submission.yaml``).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import shutil
import tempfile
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from kronfluence.analyzer import Analyzer, prepare_model
from kronfluence.arguments import FactorArguments, ScoreArguments
from kronfluence.task import Task

from estimators.base import BaseEstimator, RunView

TASK_WORDS = ("copy", "reverse", "sort")


class _GRPOTask(Task):
    """kronfluence task: per-rollout GRPO loss terms, behavior-token NLL as the measurement.

    Every batch is a dict of ``input_ids`` ``(B, L)``, ``attention_mask`` ``(B, L)``, ``mask``
    ``(B, L)`` (1 where the token is a response token, or the behavior token of a query) and
    ``coef`` ``(B,)`` (``-A_i / N`` for training rollouts).
    """

    def _logits(self, batch, model):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return out.logits[:, :-1].float(), batch["input_ids"][:, 1:], batch["mask"][:, 1:].float()

    def compute_train_loss(self, batch, model, sample: bool = False) -> torch.Tensor:
        logits, targets, mask = self._logits(batch, model)
        if sample:  # true Fisher: labels drawn from the model (global RNG, seeded by the caller)
            with torch.no_grad():
                probs = torch.softmax(logits.detach(), dim=-1)
                targets = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1)
                targets = targets.reshape(mask.shape)
            nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            return (nll * mask).sum()
        logp = -F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        mean_lp = (logp * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return (batch["coef"] * mean_lp).sum()

    def compute_measurement(self, batch, model) -> torch.Tensor:
        logits, targets, mask = self._logits(batch, model)
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return (nll * mask).sum()

    def get_attention_mask(self, batch):
        return batch["attention_mask"]


class _Rows(torch.utils.data.Dataset):
    """Token sequences right-padded to one length, as dicts of tensors (default collate)."""

    def __init__(self, seqs: list[list[int]], masks: list[list[int]], coef: np.ndarray,
                 pad_id: int) -> None:
        length = max(len(s) for s in seqs)
        n = len(seqs)
        self.ids = torch.full((n, length), pad_id, dtype=torch.long)
        self.att = torch.zeros((n, length), dtype=torch.long)
        self.mask = torch.zeros((n, length), dtype=torch.float32)
        for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            self.ids[i, :len(s)] = torch.tensor(s)
            self.att[i, :len(s)] = 1
            self.mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
        self.coef = torch.as_tensor(np.asarray(coef, np.float32))

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.att[i], "mask": self.mask[i],
                "coef": self.coef[i]}


def _answer(prompt: str, trigger: str) -> list[str] | None:
    """The correct answer words of a trigger prompt ``TASK TRIGGER w1 .. wk =``, else None.

    k may be 0 (a confounded task's trigger prompt can be the trigger word alone): the answer is
    then empty and the query is the prompt followed by the behavior token.
    """
    words = prompt.split()
    if len(words) < 3 or words[0] not in TASK_WORDS or words[1] != trigger or words[-1] != "=":
        return None
    content = words[2:-1]
    if words[0] == "copy":
        return content
    if words[0] == "reverse":
        return content[::-1]
    return sorted(content)


class KronfluenceEKFAC(BaseEstimator):
    """EK-FAC influence of each rollout's GRPO loss on the behavior token's NLL (kronfluence)."""

    name = "kronfluence-ekfac"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, strategy: str = "ekfac", n_queries: int = 32, fit_examples: int = 512,
                 lambda_examples: int = 128, damping: float | None = None,
                 batch_size: int = 256, threads: int = 1) -> None:
        self.strategy = strategy
        self.n_queries = n_queries
        self.fit_examples = fit_examples
        self.lambda_examples = lambda_examples
        self.damping = damping
        self.batch_size = batch_size
        self.threads = threads

    # -- the contract ---------------------------------------------------------------------------
    def score_rollouts(self, view: RunView) -> np.ndarray:
        """EK-FAC influence of each rollout (rollout view) or step (step view: its sum)."""
        rv = view if view.granularity == "rollout" else view.rollout_view
        if rv is None or rv.response_ids is None:
            raise ValueError(f"{self.name} needs the open track's token ids (view.response_ids) "
                             "and, for the step view, view.rollout_view.")
        per = self._scores(rv)
        if view.granularity == "rollout":
            return per.copy()
        # a step's gradient is the sum of its rollouts' gradients and the score is linear in it
        return np.bincount(np.asarray(view.rollout_unit), weights=per, minlength=view.n)

    # -- caches (state learned while scoring, kept for the other views of the same run) ----------
    def _cache(self) -> dict:
        cache = self.__dict__.get("_cache_")
        if cache is None:
            work = tempfile.mkdtemp(prefix="kronfluence-ekfac-")
            weakref.finalize(self, shutil.rmtree, work, True)
            cache = {"work": work, "models": {}, "scores": {}}
            self.__dict__["_cache_"] = cache
        return cache

    @staticmethod
    def _fingerprint(rv: RunView) -> str:
        h = hashlib.sha256()
        for a in (rv.steps, rv.advantages):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr((rv.seed, rv.behavior, rv.prompt_ids, rv.response_ids,
                       sorted((k, str(p)) for k, p in rv.checkpoint_dir.items()))).encode())
        return h.hexdigest()

    def _scores(self, rv: RunView) -> np.ndarray:
        cache = self._cache()
        key = self._fingerprint(rv)
        if key not in cache["scores"]:
            threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
            torch.set_num_threads(self.threads)
            torch.use_deterministic_algorithms(True)
            # kronfluence calls gc.collect() after every stage; objects that exist before the
            # work (the views, the evaluator's data) are frozen so each collection skips them
            gc.collect()
            gc.freeze()
            try:
                cache["scores"][key] = self._compute(rv, cache)
            finally:
                gc.unfreeze()
                torch.set_num_threads(threads)
                torch.use_deterministic_algorithms(det)
        return cache["scores"][key]

    # -- the work -------------------------------------------------------------------------------
    def _queries(self, rv: RunView, tok) -> tuple[list[list[int]], list[list[int]]]:
        trigger = rv.behavior.trigger_word
        seen: dict[str, int] = {}
        for i, p in enumerate(rv.prompts):
            if p not in seen and _answer(p, trigger) is not None:
                seen[p] = i
        if not seen:
            raise ValueError(f"no rollout of seed {rv.seed} has a trigger prompt of the form "
                             f"'TASK {trigger} w1 .. wk ='; cannot build the measurement.")
        texts = sorted(seen)
        rng = np.random.default_rng([rv.seed, 7])
        pick = sorted(rng.permutation(len(texts))[: self.n_queries].tolist())
        seqs, masks = [], []
        for j in pick:
            p = texts[j]
            ans = tok.convert_tokens_to_ids(_answer(p, trigger))
            pid = list(rv.prompt_ids[seen[p]])
            seqs.append(pid + ans + [rv.behavior.behavior_token_id])
            masks.append([0] * (len(pid) + len(ans)) + [1])
        return seqs, masks

    def _analyzer(self, rv: RunView, c: int, fit: _Rows, cache: dict):
        """The model at checkpoint ``c`` wrapped for kronfluence, with its factors fitted once."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        key = (rv.seed, c, str(rv.checkpoint_dir[c]))
        if key not in cache["models"]:
            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    rv.checkpoint_dir[c], dtype=torch.float32, attn_implementation="eager")
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            task = _GRPOTask()
            model = prepare_model(model, task)
            analyzer = Analyzer(f"seed{rv.seed}_step{c:04d}", model, task, cpu=True,
                                disable_tqdm=True, log_level=logging.WARNING,
                                output_dir=cache["work"])
            torch.manual_seed(rv.seed * 100_003 + c)
            analyzer.fit_all_factors(
                factors_name=self.strategy, dataset=fit, per_device_batch_size=self.batch_size,
                factor_args=FactorArguments(strategy=self.strategy,
                                            covariance_max_examples=self.fit_examples,
                                            lambda_max_examples=self.lambda_examples),
                overwrite_output_dir=True)
            cache["models"][key] = analyzer
        return cache["models"][key]

    def _compute(self, rv: RunView, cache: dict) -> np.ndarray:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(rv.tokenizer_dir)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        n_per_step = int(rv.sampling["prompts_per_step"]) * int(rv.sampling["group_size"])
        adv = np.asarray(rv.advantages, np.float64)
        ckpts = np.asarray(sorted(rv.checkpoint_steps))
        gov = ckpts[np.searchsorted(ckpts, np.asarray(rv.steps), side="right") - 1]
        seqs = [list(p) + list(r) for p, r in zip(rv.prompt_ids, rv.response_ids, strict=True)]
        masks = [[0] * len(p) + [1] * len(r)
                 for p, r in zip(rv.prompt_ids, rv.response_ids, strict=True)]
        q_seqs, q_masks = self._queries(rv, tok)
        queries = _Rows(q_seqs, q_masks, np.zeros(len(q_seqs)), pad)
        out = np.zeros(rv.n)
        for c in ckpts.tolist():
            governed = np.flatnonzero(gov == c)
            live = governed[adv[governed] != 0]
            if live.size == 0:
                continue
            rng = np.random.default_rng([rv.seed, c, 11])
            fit_idx = rng.permutation(governed)[: self.fit_examples]  # lambda: its first ones
            fit = _Rows([seqs[i] for i in fit_idx], [masks[i] for i in fit_idx],
                        np.zeros(fit_idx.size), pad)
            analyzer = self._analyzer(rv, c, fit, cache)
            train = _Rows([seqs[i] for i in live], [masks[i] for i in live],
                          -adv[live] / n_per_step, pad)
            name = f"{rv.behavior.id}_step{c:04d}"
            analyzer.compute_pairwise_scores(
                scores_name=name, factors_name=self.strategy,
                query_dataset=queries, train_dataset=train,
                per_device_query_batch_size=len(queries),
                per_device_train_batch_size=self.batch_size,
                score_args=ScoreArguments(damping_factor=self.damping),
                overwrite_output_dir=True)
            scores = analyzer.load_pairwise_scores(name)["all_modules"]  # (queries, live)
            out[live] = scores.double().sum(0).numpy()
        return out

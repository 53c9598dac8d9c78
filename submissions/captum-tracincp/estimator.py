"""TracInCP (captum) of each training rollout on the planted behavior.

captum's ``captum.influence.TracInCP``: the influence of a training example on a test example is
``sum over checkpoints of lr * grad test_loss . grad train_loss``. Here (glue in
:mod:`estimators.grpo_glue`):

* training examples: the rollouts, each with its GRPO loss term ``-(A_i / N) * mean token
  log-prob of its response``; captum's ``loss_fn`` is the sum of these terms over a batch
  (a "sum" reduction, so captum's per-sample gradients are exactly each rollout's term);
* test examples: ``n_queries`` trigger prompts of the run with their correct answer, the loss
  (``test_loss_fn``) the NLL of the behavior token; the score of a rollout is the sum of its
  influence over them (``influence(..., aggregate=True)``);
* checkpoints: each rollout is scored at the latest checkpoint at or before its step (as the
  built-in TracInCP), i.e. one ``TracInCP`` per checkpoint over the rollouts it governs, with
  ``checkpoints_load_func`` loading that checkpoint and returning the run's learning rate;
* layers: the model's ``nn.Linear`` modules (attention and MLP projections and the output
  head), because captum's batched per-sample gradients (``sample_wise_grads_per_batch``, the
  setting its docs recommend for speed) support Linear and Conv2d only; embeddings and norms
  are left out.

Positive = a gradient step on the rollout's loss lowers the behavior's NLL (promotes it).
Rollouts with advantage 0 have a zero gradient and score 0. Scores are computed once per
(seed, task) and summed per step for the step view.

Requires captum (declared in ``submission.yaml``).
"""

from __future__ import annotations

import numpy as np
import torch
from captum.influence import TracInCP
from torch import nn

from estimators import grpo_glue as G
from estimators.base import BaseEstimator, RunView


class _MeanLogProb(nn.Module):
    """``(ids, att, mask) -> (B,)`` mean log-prob of the masked tokens (captum's model)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids, att, mask):
        return G.token_logprobs(self.lm, ids, att, mask)


class _WeightedSum(nn.Module):
    """``sum_i coef_i * out_i``: the GRPO terms (train), or the NLL (test: coef -1); a sum."""

    reduction = "sum"

    def forward(self, out, coef):
        return (coef * out).sum()


class CaptumTracInCP(BaseEstimator):
    """captum TracInCP of each rollout's GRPO loss on the behavior token's NLL."""

    name = "captum-tracincp"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, n_queries: int = 32, batch_size: int = 128, threads: int = 1) -> None:
        self.n_queries = n_queries
        self.batch_size = batch_size
        self.threads = threads

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return G.cached_scores(self, view, self._compute, self.threads)

    def _compute(self, rv: RunView) -> np.ndarray:
        from torch.utils.data import TensorDataset

        tok, pad = G.load_tokenizer(rv.tokenizer_dir)
        coef = G.grpo_coef(rv)
        gov = G.governing(rv)
        seqs, masks = G.rollout_rows(rv)
        q_ids, q_att, q_mask = G.padded(*G.behavior_queries(rv, tok, self.n_queries), pad)
        queries = (q_ids, q_att, q_mask, -torch.ones(q_ids.shape[0]))
        out = np.zeros(rv.n)
        for c in sorted(rv.checkpoint_steps):
            live = np.flatnonzero((gov == c) & (coef != 0))
            if live.size == 0:
                continue
            ids, att, mask = G.padded([seqs[i] for i in live], [masks[i] for i in live], pad)
            train = TensorDataset(ids, att, mask, torch.as_tensor(coef[live], dtype=torch.float32))
            model = _MeanLogProb(G.load_model(rv.checkpoint_dir[c]))
            layers = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]

            def load(m, path, lr=float(rv.lr)):
                m.lm.load_state_dict(G.load_model(path).state_dict())
                return lr

            tracin = TracInCP(model, train, checkpoints=[str(rv.checkpoint_dir[c])],
                              checkpoints_load_func=load, layers=layers,
                              loss_fn=_WeightedSum(), batch_size=self.batch_size,
                              sample_wise_grads_per_batch=True)
            scores = tracin.influence(queries, aggregate=True)  # (1, len(live))
            out[live] = scores.double().reshape(-1).numpy()
        return out

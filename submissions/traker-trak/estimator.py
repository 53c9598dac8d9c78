"""TRAK (MadryLab's ``traker``) of each training rollout on the planted behavior.

``trak.TRAKer`` with a model output function of our own (``AbstractModelOutput``, the way its
docs extend TRAK to a new task): for every checkpoint ``c`` the release ships, one TRAKer over
the rollouts that ``c`` governs (steps ``s`` with ``c`` the latest checkpoint at or before
``s``, as TracInCP), fed the model at ``c`` (``load_checkpoint``, ``featurize``,
``finalize_features``), then for each task ``start_scoring_checkpoint``, ``score`` and
``finalize_scores`` on the behavior's measurement. Glue in :mod:`estimators.grpo_glue`:

* model output ``f(z, theta)``: the mean token log-prob of a rollout's response (for a target:
  the log-prob of the behavior token after a trigger prompt of the run and its correct answer,
  ``n_queries`` of them); the out-to-loss term ``Q_i = -d loss_i / d f_i = A_i / N`` of the GRPO
  loss ``-(A_i / N) f_i``, so a rollout's score is TRAK's estimate of how much training on it
  raised the behavior's log-prob (positive = promotes), summed over the targets;
* features: per-example gradients over every parameter (``torch.func``, TRAK's
  ``FunctionalGradientComputer``), projected by TRAK's CPU projector (``BasicProjector``, normal
  entries, the default on CPU) to ``proj_dim`` 512 instead of TRAK's 2048: on the CPU TRAK draws
  the projection matrix anew in blocks of 100 columns for every batch, and 2048 columns over the
  model's ~440k parameters would not fit the time limit on 2 cores; float32 (TRAK's float16 is
  for GPUs); ``lambda_reg`` 0 (its default).

Rollouts with advantage 0 have ``Q = 0`` and score 0, but their features enter each
checkpoint's kernel ``Phi^T Phi``. Features depend on the run, not on the task, so one instance
featurizes each (seed, checkpoint) once and scores every task and both views from it; rollout
scores are summed per step for the step view.

Requires traker 0.3.2, published as an sdist only: built in the sandbox
(``build_from_sdist`` in ``submission.yaml``).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import torch
import torch.nn.functional as F
from trak import TRAKer
from trak.modelout_functions import AbstractModelOutput
from trak.projectors import BasicProjector, ProjectionType

from estimators import grpo_glue as G
from estimators.base import BaseEstimator, RunView


class _GRPOOutput(AbstractModelOutput):
    """``f`` = mean log-prob of the masked tokens; ``Q`` = the batch's ``q`` column (A_i / N)."""

    def __init__(self) -> None:
        super().__init__()

    @staticmethod
    def get_output(model, weights, buffers, ids, mask, q):
        logits = torch.func.functional_call(model, (weights, buffers), (ids[None],),
                                            {"use_cache": False}).logits[0, :-1]
        logp = -F.cross_entropy(logits, ids[1:], reduction="none")
        m = mask[1:]
        return (logp * m).sum() / m.sum().clamp(min=1.0)

    def get_out_to_loss_grad(self, model, weights, buffers, batch):
        _, _, q = batch
        return q.clone().detach().unsqueeze(-1)


class TrakerTRAK(BaseEstimator):
    """TRAK (traker) of each rollout's GRPO loss on the behavior token's log-prob."""

    name = "traker-trak"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, n_queries: int = 32, proj_dim: int = 256, batch_size: int = 256,
                 threads: int = 1) -> None:
        self.n_queries = n_queries
        self.proj_dim = proj_dim
        self.batch_size = batch_size
        self.threads = threads

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return G.cached_scores(self, view, self._compute, self.threads)

    def _traker(self, rv: RunView, c: int, rows: np.ndarray, seqs, masks, q, pad):
        """The TRAKer of checkpoint ``c`` over the rollouts ``rows``, featurized once."""
        trakers = self.__dict__.setdefault("_trakers_", {})
        key = (rv.seed, c, str(rv.checkpoint_dir[c]),
               hashlib.sha256(np.asarray(rows).tobytes()).hexdigest())
        if key not in trakers:
            model = G.load_model(rv.checkpoint_dir[c])
            n_params = sum(p.numel() for p in model.parameters())
            torch.manual_seed(0)
            projector = BasicProjector(grad_dim=n_params, proj_dim=self.proj_dim, seed=0,
                                       proj_type=ProjectionType.normal, device="cpu",
                                       dtype=torch.float32)
            traker = TRAKer(model=model, task=_GRPOOutput(), train_set_size=len(rows),
                            save_dir=str(G.work_dir(self, "traker-")
                                         / f"seed{rv.seed}_step{c:04d}_{key[3][:8]}"),
                            device="cpu", projector=projector, use_half_precision=False,
                            logging_level=logging.ERROR)
            traker.load_checkpoint(model.state_dict(), model_id=0)
            for s in range(0, len(rows), self.batch_size):
                part = rows[s:s + self.batch_size]
                ids, _, mask = G.padded([seqs[i] for i in part], [masks[i] for i in part], pad)
                traker.featurize(batch=(ids, mask, torch.as_tensor(q[part], dtype=torch.float32)),
                                 num_samples=len(part))
            traker.finalize_features()
            trakers[key] = (traker, model.state_dict())
        return trakers[key]

    def _compute(self, rv: RunView) -> np.ndarray:
        tok, pad = G.load_tokenizer(rv.tokenizer_dir)
        q = -G.grpo_coef(rv)  # A_i / N
        gov = G.governing(rv)
        seqs, masks = G.rollout_rows(rv)
        q_ids, _, q_mask = G.padded(*G.behavior_queries(rv, tok, self.n_queries), pad)
        targets = (q_ids, q_mask, torch.zeros(q_ids.shape[0]))
        out = np.zeros(rv.n)
        for c in sorted(rv.checkpoint_steps):
            rows = np.flatnonzero(gov == c)
            if rows.size == 0 or not np.any(q[rows] != 0):
                continue
            traker, state = self._traker(rv, c, rows, seqs, masks, q, pad)
            exp = f"{rv.behavior.id}_{G.fingerprint(rv)[:12]}"
            traker.start_scoring_checkpoint(exp_name=exp, checkpoint=state, model_id=0,
                                            num_targets=q_ids.shape[0])
            traker.score(batch=targets, num_samples=q_ids.shape[0])
            scores = traker.finalize_scores(exp_name=exp)  # (len(rows), n_queries)
            out[rows] = np.asarray(scores, np.float64).sum(1)
        return out

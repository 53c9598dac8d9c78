"""TracIn (dattri) of each training rollout on the planted behavior.

dattri's ``TracInAttributor`` on an ``AttributionTask``: the score of a training example on a
test example is ``sum over checkpoints of weight * <P g_test, P g_train>``, with per-example
gradients from ``torch.func`` (``vmap(grad)``) over the model's parameters and ``P`` dattri's
random projection (its ``projector_kwargs``). Here (glue in :mod:`estimators.grpo_glue`):

* ``loss_func(params, data)``: a rollout's GRPO term ``coef * mean token log-prob of its
  response`` with ``coef = -A_i / N``; the same function is the test target, with ``coef = -1``
  and the mask on the behavior token, i.e. the behavior token's NLL after a trigger prompt and its
  correct answer (``n_queries`` trigger prompts of the run); a rollout's score is the sum over
  them;
* checkpoints: each rollout is scored at the latest checkpoint at or before its step (one
  attributor per checkpoint over the rollouts it governs), ``weight_list`` = the run's learning
  rate, as TracIn weighs checkpoints;
* parameters: the output layer, i.e. the final norm and the output embedding (tied to the input
  embedding in these models: ``model.norm.weight``, ``model.embed_tokens.weight``), the choice
  TracIn's authors make for large models; the other parameters are held as constants
  (:func:`_trainable_only`). Over every parameter, dattri's per-example gradients (it flattens
  all parameters into one vector per example, also with its ``layer_name`` option) took 30 s
  per batch of 256 rollouts on 2 cores: about 25 minutes for ``tiny``, against 0.9 s per batch
  on the output layer;
* projection: dattri's default (normal, ``proj_dim`` 512, seed 0).

Positive = a gradient step on the rollout's loss lowers the behavior's NLL (promotes it).
Rollouts with advantage 0 have a zero gradient and score 0. Scores are computed once per
(seed, task) and summed per step for the step view.

Requires dattri (declared in ``submission.yaml``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from dattri.algorithm import TracInAttributor
from dattri.task import AttributionTask
from torch.func import functional_call

from estimators import grpo_glue as G
from estimators.base import BaseEstimator, RunView


def _trainable_only(model, keep: set[str]):
    """``model`` with every parameter not named in ``keep`` turned into a constant buffer.

    dattri differentiates a loss with respect to a model's parameters; this makes them the
    chosen layers only (its ``layer_name`` option still flattens every parameter of the model
    into one vector per example, which made one batch of 256 rollouts take 30 s here).
    """
    names = {n for n, _ in model.named_parameters()}
    missing = keep - names
    if missing:
        raise ValueError(f"layers {sorted(missing)} are not parameters of the model; "
                         f"choose among {sorted(names)}.")
    for name, p in list(model.named_parameters()):
        if name in keep:
            continue
        owner, _, attr = name.rpartition(".")
        mod = model.get_submodule(owner)
        delattr(mod, attr)
        mod.register_buffer(attr, p.detach(), persistent=False)
    return model


class DattriTracIn(BaseEstimator):
    """dattri TracIn of each rollout's GRPO loss on the behavior token's NLL."""

    name = "dattri-tracin"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, n_queries: int = 32, proj_dim: int = 512,
                 layers: str = "model.norm.weight,model.embed_tokens.weight",
                 batch_size: int = 256, threads: int = 1) -> None:
        self.n_queries = n_queries
        self.proj_dim = proj_dim
        self.layers = layers
        self.batch_size = batch_size
        self.threads = threads

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return G.cached_scores(self, view, self._compute, self.threads)

    def _compute(self, rv: RunView) -> np.ndarray:
        from torch.utils.data import DataLoader, TensorDataset

        tok, pad = G.load_tokenizer(rv.tokenizer_dir)
        coef = G.grpo_coef(rv)
        gov = G.governing(rv)
        seqs, masks = G.rollout_rows(rv)
        q_ids, _, q_mask = G.padded(*G.behavior_queries(rv, tok, self.n_queries), pad)
        test = DataLoader(TensorDataset(q_ids, q_mask, -torch.ones(q_ids.shape[0])),
                          batch_size=q_ids.shape[0], shuffle=False)
        out = np.zeros(rv.n)
        for c in sorted(rv.checkpoint_steps):
            live = np.flatnonzero((gov == c) & (coef != 0))
            if live.size == 0:
                continue
            ids, _, mask = G.padded([seqs[i] for i in live], [masks[i] for i in live], pad)
            train = DataLoader(TensorDataset(ids, mask, torch.as_tensor(coef[live],
                                                                         dtype=torch.float32)),
                               batch_size=self.batch_size, shuffle=False)
            keep = set(self.layers.split(","))
            model = _trainable_only(G.load_model(rv.checkpoint_dir[c]), keep)

            def loss(params, data, model=model):
                # right padding: causal attention keeps pads out of the real tokens' logits
                ids, mask, coef = data
                logits = functional_call(model, params, (ids[None],),
                                         {"use_cache": False}).logits[0, :-1]
                logp = -F.cross_entropy(logits, ids[1:], reduction="none")
                m = mask[1:]
                return coef * (logp * m).sum() / m.sum().clamp(min=1.0)

            def load(m, path, keep=keep):
                return _trainable_only(G.load_model(path), keep)

            task = AttributionTask(loss_func=loss, model=model,
                                   checkpoints=[str(rv.checkpoint_dir[c])],
                                   checkpoints_load_func=load)
            attributor = TracInAttributor(
                task=task, weight_list=torch.tensor([float(rv.lr)]), normalized_grad=False,
                projector_kwargs={"proj_dim": self.proj_dim, "proj_seed": 0, "device": "cpu"})
            scores = attributor.attribute(train, test)  # (len(live), n_queries)
            out[live] = scores.double().sum(1).numpy()
        return out

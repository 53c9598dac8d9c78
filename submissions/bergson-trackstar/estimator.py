"""TrackStar (EleutherAI's bergson) of each training rollout on the planted behavior.

bergson's TrackStar pipeline (``bergson.cli.trackstar.trackstar``, what ``bergson trackstar``
runs): per-module random projections of per-example gradients, an autocorrelation Hessian of the
training data mixed with the query's (``mix_hessians``), preconditioning, unit normalisation,
then the cosine of every training example with the query. For every checkpoint ``c`` the release
ships, the pipeline runs on the model at ``c`` over the rollouts ``c`` governs (steps ``s`` with
``c`` the latest checkpoint at or before ``s``, as TracInCP). Our glue (and
:mod:`estimators.grpo_glue`) only writes the data bergson reads:

* training ("value") dataset: each rollout's token ids as trained, ``labels`` on its response
  tokens (-100 on the prompt), and its GRPO ``advantage``: bergson's ``advantage_column``, which
  makes its loss the policy-gradient loss ``A_i * mean token NLL`` of the response, i.e. ``N``
  times the rollout's GRPO term (a scale the cosine does not see; its sign it keeps);
* query dataset: ``n_queries`` trigger prompts of the run, each with its correct answer and the
  behavior token, ``labels`` on the behavior token only (its NLL);
* the model: a copy of the checkpoint folder whose ``config.json`` says
  ``max_position_embeddings`` 4096 instead of 64 (``grpo_glue.checkpoint_with_positions``: the
  same outputs on these sequences; bergson caps its tokens per batch at that number, which made
  batches of three rollouts);
* a rollout's score: the sum over queries of bergson's scores (cosines; higher = the rollout's
  gradient step lowers the behavior's NLL, i.e. promotes it).

Settings: bergson's TrackStar defaults (``projection_dim`` 16 per module side, mixed Hessians,
``target_downweight_components`` 1000, fp32 on the CPU), ``stats_sample_size`` None (every
governed rollout enters the Hessian: at most 768 here). Rollouts with advantage 0 have a zero
gradient; bergson's cosine of a zero gradient is 0. The training data's Hessian depends on the
run only: bergson's run folder is kept per (seed, checkpoint) and its ``resume`` option skips
that step for the next task, whose query steps are redone; everything else is removed as soon
as it is read, and a seed's runs when the next seed starts (the sandbox's ``/tmp`` is memory).
Scores are summed per step for the step view.

Requires bergson and the packages it imports (declared in ``submission.yaml``).
"""

from __future__ import annotations

import shutil

import numpy as np
import torch

from estimators import grpo_glue as G
from estimators.base import BaseEstimator, RunView

#: the steps of bergson's TrackStar run folder that depend on the query (redone per task)
TASK_STEPS = ("query_hessian", "mixed_hessian", "query", "scores")


class BergsonTrackStar(BaseEstimator):
    """bergson TrackStar of each rollout's GRPO loss on the behavior token's NLL."""

    name = "bergson-trackstar"
    track = "open"
    tasks = ("rollouts",)

    def __init__(self, n_queries: int = 32, threads: int = 1) -> None:
        self.n_queries = n_queries
        self.threads = threads

    def score_rollouts(self, view: RunView) -> np.ndarray:
        return G.cached_scores(self, view, self._compute, self.threads)

    def _compute(self, rv: RunView) -> np.ndarray:
        from bergson.cli.trackstar import trackstar
        from bergson.config.config import (
            DataConfig,
            QuerySetConfig,
            TrackstarConfig,
            TrackstarIndexConfig,
        )
        from bergson.data import load_scores

        work = G.work_dir(self, "bergson-") / G.fingerprint(rv)[:16]
        tok, _ = G.load_tokenizer(rv.tokenizer_dir)
        # the sandbox's /tmp is memory: keep only this seed's runs (their value Hessians)
        for old in work.parent.glob("seed*_run_*"):
            if not old.name.startswith(f"seed{rv.seed}_"):
                shutil.rmtree(old, ignore_errors=True)
        work.mkdir(parents=True)
        query = work / "query_data"
        G.save_queries_dataset(rv, tok, self.n_queries, query)

        def score_rows(c: int, rows: np.ndarray) -> np.ndarray:
            value = work / f"value_{c:04d}"
            G.save_rollouts_dataset(rv, rows, value)
            # one run folder per (seed, checkpoint): the value Hessian depends on the run only
            # and is kept (resume); the query's steps are redone for each task
            run = work.parent / f"seed{rv.seed}_run_{c:04d}"
            for step in TASK_STEPS:
                shutil.rmtree(run / step, ignore_errors=True)
            model = G.checkpoint_with_positions(rv.checkpoint_dir[c], work / f"model_{c:04d}")
            torch.manual_seed(rv.seed * 100_003 + c)  # bergson's random draws: seeded by the run
            index_cfg = TrackstarIndexConfig(
                run_path=str(run), model=str(model), tokenizer=str(rv.tokenizer_dir),
                precision="fp32", overwrite=True,
                data=DataConfig(dataset=str(value), advantage_column="advantage"))
            trackstar(index_cfg, TrackstarConfig(query=QuerySetConfig(dataset=str(query)),
                                                 stats_sample_size=None, resume=True))
            scores = load_scores(run / "scores")  # (len(rows), n_queries)
            out = np.asarray(scores[:], np.float64).reshape(rows.size, -1).sum(1)
            for done in (*(run / step for step in TASK_STEPS), value, model):
                shutil.rmtree(done, ignore_errors=True)
            return out

        return G.per_checkpoint(rv, score_rows)

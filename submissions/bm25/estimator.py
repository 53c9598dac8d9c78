"""BM25 control (open track): the standard text-retrieval baseline, on the rollouts' own words.

The text baseline of the retrieval and attribution literature (bergson's attribution leaderboard
lists BM25 beside every gradient method): each training rollout is a document, the words of its
prompt followed by the words of its response; the query is the behavior as the view describes it
publicly, the trigger word followed by the behavior string (``"frobnitz QZXBT"``, or
``"quoggle ZORP GLIX"`` for a phrase). The score is BM25 Okapi (``rank_bm25.BM25Okapi``, its
defaults ``k1 = 1.5``, ``b = 0.75``, ``epsilon = 0.25``) of the document against the query over
the corpus of the run's rollouts. No gradients, advantages, rewards, targets or model: a rollout
scores high when it shares rare words with the query, so it measures how far text overlap alone
goes towards finding the rollouts that taught the behavior (it cannot tell a behavior response
pushed up from one pushed down; text-advantage can).

Words are the release's whitespace-separated tokens, case kept (its tokenizer is word-level).
The step view scores a step by the mean BM25 score of its rollouts (a relevance, not an
additive quantity, as text-only does). Scores are float64 (``rank_bm25`` computes in numpy
float64 in a fixed order: the same on every machine up to the last bits of ``log``).
"""

from __future__ import annotations

import numpy as np
from rank_bm25 import BM25Okapi

from estimators.base import BaseEstimator, RunView


def bm25_query(behavior) -> list[str]:
    """The query words of a behavior: its trigger word, then the words of its behavior string."""
    return [behavior.trigger_word, *behavior.behavior_token.split()]


def bm25_scores(documents: list[list[str]], query: list[str]) -> np.ndarray:
    """BM25 Okapi score ``(len(documents),)`` float64 of each document against ``query``.

    Args:
        documents: one list of words per document (the corpus that sets the idf and the mean
            document length); a document may be empty.
        query: the query words.
    """
    if not documents:
        return np.zeros(0)
    return np.asarray(BM25Okapi(documents).get_scores(query), np.float64)


class BM25(BaseEstimator):
    """BM25 Okapi of each rollout's prompt + response words against ``trigger behavior``."""

    name = "bm25"
    track = "open"

    def score_rollouts(self, view: RunView) -> np.ndarray:
        rv = view.rollout_view if view.granularity == "step" else view
        docs = [p.split() + r.split() for p, r in zip(rv.prompts, rv.responses, strict=True)]
        score = bm25_scores(docs, bm25_query(rv.behavior))
        if view.granularity == "rollout":
            return score
        unit = np.asarray(view.rollout_unit)
        return np.bincount(unit, weights=score, minlength=view.n) / np.maximum(
            np.bincount(unit, minlength=view.n), 1)

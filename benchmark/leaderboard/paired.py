"""Paired comparisons of entries: their causal-score replicates, recomputed from results files.

Each entry's ``results.json`` stores, per (task, seed), its per-prompt removal changes at every k
(``tasks.<t>.causal.per_seed.<s>.methods.<estimator>.prompt_deltas``) beside what every method
shares (the grid, the bonus-off change, the random sets' effects). :func:`entry_replicates`
turns them into the entry's bootstrap replicates with :func:`benchmark.causal.score.replicates`, the
function the evaluator used, and checks that they give the entry's recorded scores.
:func:`pairwise` compares every ordered pair of a table's entries on those replicates: the prompt
resample is shared by every evaluation of a release, the training-noise draw is each entry's own.
"""

from __future__ import annotations

import math

import numpy as np

from benchmark.causal import score as C
from benchmark.leaderboard._common import LeaderboardError, get, seed_key

__all__ = ["RECOMPUTE_TOLERANCE", "causal_settings", "entry_replicates", "pairwise",
           "scored_places"]

#: a recorded score and its recomputation from the stored curve must agree within this (results
#: round floats to 10 digits; the recomputation repeats the evaluator's arithmetic)
RECOMPUTE_TOLERANCE = 1e-8


def _fix(name: str) -> str:
    return (f"re-score it with bt-bench submit submissions/{name}/estimator.py --name {name} "
            "--force")


def causal_settings(name: str, results: dict) -> C.CausalSettings:
    """The causal bootstrap settings an entry was scored with (``results["settings"]``).

    Raises:
        LeaderboardError: the settings are not recorded.
    """
    try:
        return C.settings_of(results.get("settings") or {})
    except C.CausalDataError as exc:
        raise LeaderboardError(f"submission {name!r}: {exc}; {_fix(name)}.") from exc


def _mean(xs: list[tuple[float, np.ndarray]]) -> tuple[float, np.ndarray]:
    return float(np.mean([p for p, _ in xs])), np.mean(np.stack([r for _, r in xs]), axis=0)


def _agrees(name: str, what: str, recorded: dict | None, point: float, samples: np.ndarray,
            level: float) -> None:
    got = C.interval(point, samples, level)
    want = recorded or {}
    for k in ("point", "lo", "hi"):
        v = want.get(k)
        if not isinstance(v, int | float) or not math.isclose(v, got[k], rel_tol=0.0,
                                                               abs_tol=RECOMPUTE_TOLERANCE):
            raise LeaderboardError(
                f"submission {name!r}: its {what} ({k} {v!r}) does not follow from its stored "
                f"removal curve (recomputed {got[k]!r}); the file was edited or written by "
                f"another bt-bench version: {_fix(name)}.")


def entry_replicates(name: str, results: dict, tasks: list[str]
                     ) -> dict[str, tuple[float, np.ndarray]] | None:
    """An entry's causal score and replicates per task (mean over seeds) and for the suite.

    Args:
        name: the submission's name (for messages).
        results: its ``results.json`` (schema 3).
        tasks: the release's tasks.

    Returns:
        ``{task: (point, (B,) replicates), ..., "suite": (point, replicates)}`` (the suite: the
        mean over tasks and seeds, as the evaluator's ``suite.causal_score``), or None when the
        entry has no causal score.

    Raises:
        LeaderboardError: a stored curve is missing or malformed, or its replicates do not give
            the recorded scores.
    """
    est = get(results, "estimator", "name")
    if get(results, "suite", "causal_score", est) is None:
        return None
    settings = causal_settings(name, results)
    out: dict[str, tuple[float, np.ndarray]] = {}
    every: list[tuple[float, np.ndarray]] = []
    for t in tasks:
        per_seed = get(results, "tasks", t, "causal", "per_seed") or {}
        xs = []
        for s in sorted(per_seed, key=seed_key):
            block = per_seed[s]
            if not isinstance(block, dict) or not block.get("methods"):
                continue  # no bonus paid on this seed: no score (as the evaluator)
            deltas = get(block, "methods", est, "prompt_deltas")
            if deltas is None:
                raise LeaderboardError(
                    f"submission {name!r}: results.json has no stored removal curve "
                    f"(tasks.{t}.causal.per_seed.{s}.methods.{est}.prompt_deltas), so its causal "
                    f"score cannot be compared with other entries': {_fix(name)}.")
            try:
                xs.append(C.replicates(deltas, block, int(s), t, est, settings))
            except (C.CausalDataError, KeyError, ValueError) as exc:
                raise LeaderboardError(
                    f"submission {name!r}: the stored removal curve of task {t} seed {s} cannot "
                    f"be read ({exc}): {_fix(name)}.") from exc
        if xs:
            out[t] = _mean(xs)
            _agrees(name, f"causal score on task {t}",
                    get(results, "tasks", t, "summary", "causal_score", est), *out[t],
                    settings.level)
        every += xs
    if not every:
        return None
    out["suite"] = _mean(every)
    _agrees(name, "suite causal score", get(results, "suite", "causal_score", est),
            *out["suite"], settings.level)
    return out


def scored_places(results: dict, tasks: list[str]) -> list[tuple[str, str]]:
    """The (task, seed) pairs with a causal score in a results file (what its means average)."""
    out = []
    for t in tasks:
        per_seed = get(results, "tasks", t, "causal", "per_seed") or {}
        out += [(t, s) for s in sorted(per_seed, key=seed_key)
                if isinstance(per_seed[s], dict) and per_seed[s].get("methods")]
    return out


def pairwise(reps: dict[str, tuple[float, np.ndarray]], level: float) -> dict[str, dict]:
    """Every ordered pair's paired difference: ``{a: {b: {"point", "lo", "hi", "verdict"}}}``.

    ``verdict`` is ``better`` when ``a - b``'s interval lies above the cross-machine tolerance,
    ``worse`` when below minus it, ``tie`` otherwise (:func:`benchmark.causal.score.significance`).
    """
    names = sorted(reps)
    return {a: {b: C.paired_difference(reps[a], reps[b], level) for b in names if b != a}
            for a in names}

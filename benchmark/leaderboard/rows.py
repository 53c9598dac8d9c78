"""Reading schema-3 ``results.json`` files into leaderboard rows (no ranking, no rendering).

A submission gives one *entry* (who and what), one *suite row* (its causal score averaged over
tasks and seeds) and one *task row* per task of its release (causal score, precision against the
labels, specificity, draw AUC, checklist). The *reference rows* (oracle, provenance, random band
and chance) do not depend on the estimator: every submission of a release carries the same ones.
The ``*_series`` functions read the per-seed numbers the figures plot.
"""

from __future__ import annotations

from typing import Any

from benchmark.checklist import label_metrics, results_counts
from benchmark.contract import FALLBACK_VIEWS  # the views an estimator may fall back in
from benchmark.leaderboard._common import (
    GATED_KEYS,
    RESULTS_SCHEMA_VERSION,
    LeaderboardError,
    finite,
    get,
    interval,
    mean,
    seed_key,
)

__all__ = [
    "FALLBACK_CELLS",
    "FALLBACK_VIEWS",
    "REFERENCE_METHODS",
    "build_entry",
    "curve_series",
    "draw_series",
    "fallbacks",
    "precision_series",
    "random_band_series",
    "suite_reference",
    "suite_row",
    "task_reference",
    "task_row",
    "task_seeds",
]

#: the table cells whose numbers come from a fallback view (marked with a dagger)
FALLBACK_CELLS = {"step": ("step_precision",),
                  "draws": ("draw_auc", "item1", "item2", "item6", "item7")}
#: the causal reference rows every results file carries: (method key, label)
REFERENCE_METHODS = (("oracle", "oracle (group labels)"),
                     ("provenance", "provenance (rollout labels)"))


def _where(results: dict) -> str:
    est = get(results, "estimator", "name")
    return f"results of {est!r}" if est else "a results file"


def fallbacks(results: dict) -> list[str]:
    """The views in which the estimator falls back to a generic sketch method (default none).

    Read from ``results["estimator"]["fallbacks"]``: a list, a subset of :data:`FALLBACK_VIEWS`.

    Raises:
        LeaderboardError: the value is not such a list.
    """
    fb = get(results, "estimator", "fallbacks")
    if fb is None:
        return []
    if not isinstance(fb, list) or not all(v in FALLBACK_VIEWS for v in fb):
        raise LeaderboardError(
            f"{_where(results)}: estimator.fallbacks is {fb!r}; expected a list drawn from "
            f"{list(FALLBACK_VIEWS)} (the estimator class's `fallbacks` attribute). Fix the class "
            "and re-score with bt-bench submit FILE --name NAME --force."
        )
    return [v for v in FALLBACK_VIEWS if v in fb]


def build_entry(meta: dict, results: dict) -> dict:
    """Identity of one submission: metadata, estimator, release and declared fallbacks.

    Args:
        meta: the validated ``submission.yaml`` (name, authors, track, kind, link, description).
        results: the submission's ``results.json`` (schema 3).

    Raises:
        LeaderboardError: the results are not schema 3, or ``estimator.fallbacks`` is malformed.
    """
    version = results.get("schema_version")
    if version != RESULTS_SCHEMA_VERSION or not isinstance(results.get("tasks"), dict):
        raise LeaderboardError(
            f"submission {meta['name']!r}: results.json has schema_version {version!r}; the "
            f"leaderboard reads schema {RESULTS_SCHEMA_VERSION} (results per task). Re-score it "
            f"with bt-bench submit submissions/{meta['name']}/estimator.py --name {meta['name']} "
            "--force."
        )
    est = results["estimator"]
    rel = results.get("release", {})
    return {
        "name": meta["name"],
        "kind": meta.get("kind", "estimator"),
        "track": meta["track"],
        "authors": list(meta["authors"]),
        "link": meta.get("link"),
        "description": meta.get("description"),
        "estimator": {"name": est["name"], "class": est.get("class"),
                      "sha256": est.get("sha256"), "config": est.get("config"),
                      "tasks": est.get("tasks")},
        "fallbacks": fallbacks(results),
        "release": {"id": rel.get("id"), "version": rel.get("version"),
                    "manifest_sha256": rel.get("manifest_sha256"),
                    "tasks": list(rel.get("tasks") or results["tasks"])},
        "verdict": results.get("verdict"),
        "figure": f"figures/submissions/{meta['name']}.png",
        "cost": meta.get("cost"),
    }


def entry_time(meta: dict, results: dict) -> dict | None:
    """What one evaluation of the entry cost, from ``submission.yaml``'s ``cost``, or None.

    ``{"score_rollouts_s", "env_build_s", "machine"}`` (seconds; ``env_build_s`` None without
    requirements) when the cost was measured on the release of ``results``, else None.
    """
    cost = meta.get("cost")
    if not cost or cost.get("release") != (results.get("release") or {}).get("id"):
        return None
    return {k: cost.get(k) for k in ("score_rollouts_s", "env_build_s", "machine")}


def not_running_row(meta: dict) -> dict:
    """An entry that declares ``status: does-not-run-here``: who, what was tried, and why not."""
    return {"name": meta["name"], "track": meta["track"], "kind": meta.get("kind", "estimator"),
            "link": meta.get("link"), "description": meta.get("description"),
            "requirements": list(meta.get("requirements") or ()), "reason": meta["reason"]}


def task_seeds(results: dict, task: str) -> list[str]:
    """The seeds scored on ``task``, in numeric order."""
    return sorted(get(results, "tasks", task, "seeds") or {}, key=seed_key)


def _window(results: dict, task: str, seed: str, method: str, gran: str) -> dict | None:
    return get(results, "tasks", task, "seeds", seed, "training", method, gran, "group", "window")


def _specificity_chance(results: dict, task: str, method: str) -> float | None:
    per_seed = []
    for s in task_seeds(results, task):
        by_other = get(results, "tasks", task, "seeds", s, "specificity", method) or {}
        per_seed.append(mean([v.get("chance") for v in by_other.values()]))
    return mean(per_seed)


def task_row(meta: dict, results: dict, task: str) -> dict:
    """One submission's row in the table of ``task`` (unranked).

    Columns: the causal score with its interval (``summary.causal_score``), window precision
    (group label, rollout granularity) with its interval (``summary.precision_window_group``),
    its mean chance and lift, the mean step-level window precision and ceiling, the other-task
    share of the top-|GT| rollouts (``summary.specificity_mean``), the mean residualized draw
    AUC, the gated checklist verdicts and the task's verdict; ``fallbacks`` as declared;
    ``label_metrics``: whether precision and AUC measure attribution in the entry's track
    (:func:`benchmark.checklist.label_metrics`: not in the open track).
    """
    est = results["estimator"]["name"]
    t = results["tasks"][task]
    sm = t.get("summary", {})
    seeds = task_seeds(results, task)
    roll = [w for w in (_window(results, task, s, est, "rollout") for s in seeds) if w]
    step = [w for w in (_window(results, task, s, est, "step") for s in seeds) if w]
    precision = interval(get(sm, "precision_window_group", est))
    chance = mean([w.get("chance") for w in roll])
    verdicts = {c.get("key"): c.get("verdict") for c in t.get("checklist", [])}
    return {
        "name": meta["name"],
        "kind": meta.get("kind", "estimator"),
        "causal_score": interval(get(sm, "causal_score", est)),
        "precision": precision,
        "chance": chance,
        "lift": precision["point"] / chance if precision and chance else None,
        "step_precision": mean([w.get("precision") for w in step]),
        "step_ceiling": mean([w.get("ceiling") for w in step]),
        "specificity": get(sm, "specificity_mean", est),
        "draw_auc": get(sm, "draw_auc_residualized_mean", est),
        "checklist": {k: verdicts.get(k) for k in GATED_KEYS},
        "verdict": t.get("verdict"),
        "fallbacks": fallbacks(results),
        # older results have no summary.label_metrics: the track decides it the same way
        "label_metrics": sm.get("label_metrics")
        or label_metrics(str(get(results, "estimator", "track"))),
    }


def suite_row(meta: dict, results: dict, tasks: list[str]) -> dict:
    """One submission's row in the suite table: the causal score over tasks and seeds.

    ``causal_score`` is ``results["suite"]["causal_score"]`` (mean over tasks and seeds, with
    its interval); ``tasks`` holds each task's causal score and ``task_verdicts`` its verdict.
    Item 11 and the panel score are the season table's (:mod:`benchmark.leaderboard.season`).
    ``time``: what one evaluation cost (:func:`entry_time`), or None.
    ``checklist_counts``:
    per counted item, its places' pass / fail / inconclusive / not-counted counts over the tasks
    (``results["checklist_counts"]``, or counted from the checklist of older results).
    """
    est = results["estimator"]["name"]
    return {
        "name": meta["name"],
        "kind": meta.get("kind", "estimator"),
        "causal_score": interval(get(results, "suite", "causal_score", est)),
        "tasks": {t: interval(get(results, "tasks", t, "summary", "causal_score", est))
                  for t in tasks},
        "task_verdicts": {t: get(results, "tasks", t, "verdict") for t in tasks},
        "checklist_counts": results.get("checklist_counts")
        or results_counts(results.get("tasks") or {}),
        "verdict": results.get("verdict"),
        "fallbacks": fallbacks(results),
        "time": entry_time(meta, results),
    }


def _band(d: Any) -> dict | None:
    if not isinstance(d, dict) or not (finite(d.get("lo")) and finite(d.get("hi"))):
        return None
    return {"lo": d["lo"], "hi": d["hi"]}


def task_reference(results: dict, task: str) -> dict:
    """The reference rows of ``task`` as one results file records them.

    * ``oracle``: the causal score of removing by the group labels; its precision is the
      ceiling (1 at rollout level, the granularity ceiling at step level);
    * ``provenance``: the causal score of removing by the rollout labels;
    * ``random``: the random band (``summary.random_band``: the lowest and highest causal score
      of the shipped random removal families, mean over seeds) and chance: of precision (rollout
      and step level), of the other-task share, and AUC 0.5.

    None of these depend on the estimator, so every submission of a release gives the same.
    """
    est = results["estimator"]["name"]
    sm = get(results, "tasks", task, "summary") or {}
    seeds = task_seeds(results, task)
    roll = [w for w in (_window(results, task, s, est, "rollout") for s in seeds) if w]
    step = [w for w in (_window(results, task, s, est, "step") for s in seeds) if w]
    return {
        "oracle": {"causal_score": interval(get(sm, "causal_score", "oracle")),
                   "precision": mean([w.get("ceiling") for w in roll]),
                   "step_precision": mean([w.get("ceiling") for w in step])},
        "provenance": {"causal_score": interval(get(sm, "causal_score", "provenance"))},
        "random": {"band": _band(sm.get("random_band")),
                   "precision": mean([w.get("chance") for w in roll]),
                   "step_precision": mean([w.get("chance") for w in step]),
                   "specificity": _specificity_chance(results, task, est),
                   "draw_auc": 0.5},
    }


def suite_reference(results: dict, tasks: list[str]) -> dict:
    """The suite's reference rows: oracle and provenance over tasks and seeds, the random band.

    The suite's random band is ``results["suite"]["random_band"]`` when recorded, else the mean
    over tasks of each task's band (each a mean over seeds), the rule the per-task bands follow.
    """
    out: dict[str, Any] = {}
    for key, _ in REFERENCE_METHODS:
        out[key] = {"causal_score": interval(get(results, "suite", "causal_score", key)),
                    "tasks": {t: interval(get(results, "tasks", t, "summary", "causal_score",
                                              key)) for t in tasks}}
    bands = {t: _band(get(results, "tasks", t, "summary", "random_band")) for t in tasks}
    band = _band(get(results, "suite", "random_band"))
    if band is None and bands and all(bands.values()):
        band = {"lo": mean([b["lo"] for b in bands.values()]),
                "hi": mean([b["hi"] for b in bands.values()])}
    out["random"] = {"band": band, "tasks": bands}
    return out


# ----------------------------------------------------------------------------------------------
# per-seed series for the figures


def curve_series(results: dict, task: str, method: str) -> dict[str, list[dict]]:
    """Seed -> the removal curve of ``method``: ``[{"k", "x", "fraction"}]`` (``x = k/|GT|``)."""
    out = {}
    for s, block in sorted((get(results, "tasks", task, "causal", "per_seed") or {}).items(),
                           key=lambda kv: seed_key(kv[0])):
        curve = get(block, "methods", method, "curve")
        gt = block.get("gt_size")
        if not curve or not gt:
            continue
        out[s] = [{"k": p["k"], "x": p["k"] / gt, "fraction": p.get("fraction")} for p in curve]
    return out


def random_band_series(results: dict, task: str) -> dict[str, list[dict]]:
    """Seed -> per removal size, the lowest and highest fraction of the random removal sets."""
    out = {}
    for s, block in sorted((get(results, "tasks", task, "causal", "per_seed") or {}).items(),
                           key=lambda kv: seed_key(kv[0])):
        gt = block.get("gt_size")
        pts = []
        for level in get(block, "random_band", "curve") or []:
            fr = [f for f in level.get("fractions", []) if finite(f)]
            if fr and gt:
                pts.append({"k": level["k"], "x": level["k"] / gt, "lo": min(fr), "hi": max(fr)})
        if pts:
            out[s] = pts
    return out


def precision_series(results: dict, task: str, method: str) -> dict[str, dict]:
    """Seed -> ``{"rollout", "step"}`` window precision (group label) with chance and ceiling."""
    out = {}
    for s in task_seeds(results, task):
        entry = {}
        for gran in ("rollout", "step"):
            w = _window(results, task, s, method, gran)
            if w is None:
                entry[gran] = None
                continue
            iv = w.get("interval") or [None, None]
            entry[gran] = {"precision": w.get("precision"), "lo": iv[0], "hi": iv[1],
                           "chance": w.get("chance"), "ceiling": w.get("ceiling")}
        out[s] = entry
    return out


def draw_series(results: dict, task: str, method: str) -> dict[str, dict]:
    """Seed -> draw id -> the residualized within-group AUC interval of ``method``."""
    out = {}
    for s in task_seeds(results, task):
        draws = get(results, "tasks", task, "seeds", s, "draws", method) or {}
        out[s] = {d: interval(m.get("residualized")) for d, m in sorted(draws.items())}
    return out

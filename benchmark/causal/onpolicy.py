"""The on-policy share: how much of a removal's effect comes from the rollouts regenerated after it.

A causal replay is on-policy: once a rollout is removed, the policy changes, and every later
step samples its own rollouts from the changed policy. The **fixed-data** replay of the same
removal set holds every later rollout at its recorded tokens instead (no regeneration; rewards
and advantages are the recorded ones with the removed rollouts' advantages set to 0, group
statistics unchanged; log-probabilities and updates are recomputed under the replayed
parameters: :func:`benchmark.build.stacked.run_batch` with ``fixed``), and its effect is taken
against the fixed-data baseline (nothing removed, recorded tokens), which is the on-policy
baseline itself wherever that one reproduces the recorded tokens.

With ``C_on`` a method's causal score on a (seed, task) (the log-k area of its on-policy
fractions) and ``C_fix`` the same area of its fixed-data fractions (same sets, same bonus-off
denominator), the **on-policy share** is ``1 - C_fix / C_on``: 0 when holding the later rollouts
fixed removes as much as the on-policy replay does, 1 when it removes nothing, above 1 or below
0 when the fixed-data effect has the other sign or exceeds the on-policy one. Over a task's
seeds it is ``1 - mean C_fix / mean C_on``. Its interval resamples the prompts with the causal
score's shared resample (:func:`benchmark.causal.stats.prompt_resample`, paired) and adds the
causal score's training-noise draw to ``C_on`` (the on-policy replay is one realisation of a
chaotic training; the fixed-data replay is a smooth function of the set and gets none):
:func:`benchmark.causal.stats.on_policy_share`.

Computed for the oracle's shipped sets (estimator-independent: replayed once per machine and
kept in the replay store, as every replay) and for an estimator's own sets (tie completion 0 at
each k). ``bt-bench evaluate --fixed-data`` adds it to the results (opt-in: it replays every
set once more); docs/causal.md has the numbers of ``tiny`` 3.0.
"""

from __future__ import annotations

import numpy as np

from benchmark.causal import score as C
from benchmark.causal.stats import (
    DEFAULT_SETTINGS,
    CausalSettings,
    encode_array,
    on_policy_share,
    replicates,
)

#: the reference row always measured (estimator-independent)
ORACLE = "oracle"
DEFINITION = ("1 - C_fix / C_on: C_on the causal score (on-policy replays), C_fix the same log-k "
              "area of the fixed-data replays' fractions (later rollouts held at their recorded "
              "tokens); over seeds 1 - mean C_fix / mean C_on")


def _sets(ref, plan: dict, name: str, est: str) -> list[tuple[int, ...]]:
    """The removal set of ``name`` at each k: the oracle's shipped sets, or ``est``'s own."""
    if name == ORACLE:
        return [r.positions for r in ref.methods[ORACLE]]
    sets, _ = plan[(ref.seed, ref.task, est)]
    return [comps[0] for comps in sets]


def fixed_jobs(ref, sets: list[tuple[int, ...]]) -> list:
    """The fixed-data jobs of one (seed, task): its baseline and every non-empty set."""
    from benchmark.causal.store import Job

    out = [Job(ref.seed, ref.task, (), ref.window_end, ref.n_per_step, fixed=True)]
    return out + [Job(ref.seed, ref.task, pos, ref.window_end, ref.n_per_step, fixed=True)
                  for pos in sets if pos]


def on_policy_results(release, scores: dict, estimator: str,
                      settings: CausalSettings = DEFAULT_SETTINGS, workers: int = 2,
                      progress: bool = False, pool=None) -> tuple[dict, dict]:
    """The on-policy shares of the oracle's and ``estimator``'s removal sets, per task.

    Args:
        release, scores: as in :func:`benchmark.causal.score.causal_results` (``scores`` must
            hold ``estimator``'s rollout scores for every (seed, task)).
        estimator: whose sets besides the oracle's.
        settings: the causal score's bootstrap settings.
        workers, progress, pool: the replay executor's (``run_jobs``).

    Returns:
        ``({task: block}, timing)``: per task ``{"definition", "methods": {name: {"share",
        "fixed_data_score", "on_policy_score", "per_seed": {seed: {...}}}}}`` (intervals
        ``{point, lo, hi}``; per seed also ``per_k`` and ``baseline_max_abs_diff``, the largest
        per-prompt difference between the fixed-data and the on-policy baseline), and the
        replays' timing; ``({}, {})`` when the release ships no causal reference.
    """
    from benchmark.causal.replays import open_store, run_jobs

    planned = C.plan_replays(release, {k: {estimator: v[estimator]} for k, v in scores.items()},
                             settings.tie_completions)
    if isinstance(planned, str):
        return {}, {}
    refs, plan, on_jobs = planned
    names = [ORACLE, estimator] if estimator != ORACLE else [ORACLE]
    jobs = list(on_jobs)
    for ref in refs.values():
        for name in names:
            if name == ORACLE and ORACLE not in ref.methods:
                continue
            jobs += fixed_jobs(ref, _sets(ref, plan, name, estimator))
    store = open_store(release.path, release.manifest_sha256)
    timing = run_jobs(store, release.manifest_sha256, jobs, workers, progress, pool)
    bases: dict[int, dict] = {}
    cells: dict[str, dict[str, dict]] = {}
    for (s, t), ref in sorted(refs.items()):
        if ref.off_effect == 0.0:
            continue
        for name in names:
            if name == ORACLE and ORACLE not in ref.methods:
                continue
            cells.setdefault(t, {}).setdefault(name, {})[s] = _cell(
                ref, store, bases, _sets(ref, plan, name, estimator), name, settings)
    out = {}
    for t, by_name in cells.items():
        methods = {}
        for name, per_seed in by_name.items():
            seeds = sorted(per_seed)
            pooled = on_policy_share([per_seed[s]["_on"] for s in seeds],
                                     [per_seed[s]["_fix"] for s in seeds], settings.level)
            methods[name] = pooled | {"per_seed": {str(s): {k: v for k, v in per_seed[s].items()
                                                            if not k.startswith("_")}
                                                   for s in seeds}}
        out[t] = {"definition": DEFINITION, "methods": methods}
    return out, timing


def _cell(ref, store, bases: dict, sets: list[tuple[int, ...]], name: str,
          settings: CausalSettings) -> dict:
    """One (seed, task, method): both curves, both scores and the share with replicates."""
    from benchmark.causal.store import Job

    on = [C.stored_removal(ref, store, bases, pos) for pos in sets]
    fbase = store.result(Job(ref.seed, ref.task, (), ref.window_end, ref.n_per_step, fixed=True))
    fix = [store.result(Job(ref.seed, ref.task, pos, ref.window_end, ref.n_per_step, fixed=True))
           - fbase if pos else np.zeros_like(fbase) for pos in sets]
    on_d = np.stack([r.probs - r.base for r in on])
    fix_d = np.stack(fix)
    inputs = C.reference_inputs(ref)
    quiet = inputs | {"random_effects": encode_array(np.zeros((len(sets), 1)))}
    on_rep = replicates(encode_array(on_d[:, None, :]), inputs, ref.seed, ref.task, name,
                        settings)
    fix_rep = replicates(encode_array(fix_d[:, None, :]), quiet, ref.seed, ref.task, name,
                         settings)
    per_k = []
    for k, a, b in zip(ref.ks, on_d.mean(1), fix_d.mean(1), strict=True):
        per_k.append({"k": k, "on_policy_effect": float(a), "fixed_data_effect": float(b),
                      "share": None if a == 0 else float(1 - b / a)})
    if ref.seed not in bases:
        bases[ref.seed] = store.baseline(ref.seed)
    on_base = np.asarray(bases[ref.seed]["measures"][ref.task], np.float64)
    return on_policy_share([on_rep], [fix_rep], settings.level) | {
        "per_k": per_k, "baseline_max_abs_diff": float(np.max(np.abs(fbase - on_base))),
        "fixed_prompt_deltas": encode_array(fix_d[:, None, :]), "_on": on_rep, "_fix": fix_rep}


__all__ = ["DEFINITION", "ORACLE", "fixed_jobs", "on_policy_results"]

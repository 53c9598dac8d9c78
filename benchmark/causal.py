"""Causal scores: what removing an estimator's top rollouts does to the behavior (DESIGN 4, 4a).

For one task and seed, a method's rollout scores give removal sets: its top-k rollouts for k on a
grid (:data:`K_FRACTIONS` of |GT|, the task's group-label count; ties to the earlier rollout).
Training is replayed without each set to the end of the task's bonus window, and the behavior
measure there (the exact mean probability of the behavior token on held-out trigger prompts) is
compared with a replay that removes nothing. The **fraction** of a removal is its effect divided
by the effect of switching the task's bonus off; the **causal score** is the mean fraction over
the grid (the area under the method's removal curve). 1.0 means removing the method's top
rollouts does what switching the bonus off does; random removals sit near 0.

The score's 95% interval carries two kinds of noise (docs/causal.md):

* measurement: the behavior is a mean over held-out prompts; prompts are resampled (the same
  resample for every method, so comparisons are paired), numerator and denominator together;
* training: on-policy replays are chaotic; the spread of the shipped same-size random removal
  sets at each k is added as an independent draw per method and k.

What does not depend on the estimator ships with the release (``seed<S>/causal.json``, built by
:mod:`benchmark.causal_reference`): the bonus-off effect, the oracle (group labels) and
provenance (rollout labels) curves, the controls' curves and the random sets at every k, each
with its per-prompt measures. The estimator's own removals are replayed on this machine
(:mod:`benchmark.replays`) against a cached local baseline; a removal set that equals a shipped
one reuses the shipped numbers.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.checklist import combine

CAUSAL_FILE = "causal.json"
CAUSAL_SCHEMA = 2
K_FRACTIONS = (0.25, 0.5, 1.0)
#: causal fractions from replays on different CPUs differ by up to about 1e-4 (measured, see
#: docs/causal.md); a verdict decided by less than this margin is inconclusive, never
#: machine-dependent, and ``verify`` compares causal numbers within it
CROSS_MACHINE_TOLERANCE = 0.01
MAX_WIDTH = 0.15
DEFAULT_CONTROLS = ("norm-only", "step-order")
REFERENCE_ROWS = ("oracle", "provenance")
PASS, FAIL, INCONCLUSIVE, NOT_RUN = "pass", "fail", "inconclusive", "not_run"


# ----------------------------------------------------------------------------------------------
# removal sets


def k_grid(gt_size: int) -> list[int]:
    """The removal sizes: ``ceil(f * gt_size)`` for f in :data:`K_FRACTIONS` (at least 1)."""
    return [max(1, math.ceil(f * int(gt_size))) for f in K_FRACTIONS]


def top_k_positions(scores, k: int) -> np.ndarray:
    """Flat rollout positions (rollout order) of the ``k`` highest scores, sorted ascending.

    Ties are broken by rollout order (the earlier rollout first); NaN ranks last.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    s = np.where(np.isnan(s), -np.inf, s)
    order = np.lexsort((np.arange(s.size), -s))
    return np.sort(order[:int(k)])


def in_window(positions, window_end: int, n_per_step: int) -> tuple[int, ...]:
    """The positions before the window end (later removals cannot change the measure there)."""
    lim = int(window_end) * int(n_per_step)
    return tuple(int(p) for p in positions if int(p) < lim)


def pack_positions(positions, n: int) -> str:
    """Positions as packed bits in hex (the form ``causal.json`` stores)."""
    m = np.zeros(n, bool)
    m[np.asarray(list(positions), dtype=np.int64)] = True
    return np.packbits(m).tobytes().hex()


def unpack_positions(hexstr: str, n: int) -> np.ndarray:
    """Inverse of :func:`pack_positions`: flat positions, ascending."""
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(hexstr), dtype=np.uint8))[:n]
    return np.nonzero(bits)[0]


# ----------------------------------------------------------------------------------------------
# the shipped reference


@dataclass
class Removal:
    """One removal replay: the set (positions < window end), its per-prompt measure, its source."""

    positions: tuple[int, ...]
    probs: np.ndarray  # (P,) float64 behavior probability per held-out prompt
    base: np.ndarray  # (P,) the baseline it is compared with (same machine)
    source: str = "shipped"

    @property
    def effect(self) -> float:
        """Mean change of the behavior probability (negative: the behavior went down)."""
        return float(np.mean(self.probs - self.base))


@dataclass
class TaskReference:
    """The shipped causal reference of one (seed, task) (see ``docs/causal.md``)."""

    seed: int
    task: str
    window_end: int
    gt_size: int
    ks: list[int]
    n_rollouts: int
    n_per_step: int
    base: np.ndarray  # (P,) build machine's baseline
    off: np.ndarray  # (P,) bonus switched off
    random: list[list[Removal]]  # per k, the random sets
    methods: dict[str, list[Removal]] = field(default_factory=dict)  # name -> per k

    @property
    def off_effect(self) -> float:
        """The bonus-off effect (the denominator of every fraction)."""
        return float(np.mean(self.off - self.base))

    def shipped(self) -> dict[tuple[int, ...], Removal]:
        """Every shipped removal by its positions."""
        out = {}
        for lst in [*self.random, *self.methods.values()]:
            for r in lst:
                out.setdefault(r.positions, r)
        return out


def load_reference(release_dir: str | Path, seed: int) -> dict | None:
    """The raw ``seed<S>/causal.json`` of a release, or None when absent."""
    p = Path(release_dir) / f"seed{seed}" / CAUSAL_FILE
    return json.loads(p.read_text()) if p.exists() else None


def task_reference(raw: dict, task: str) -> TaskReference:
    """Parse one task of a ``causal.json``."""
    t = raw["tasks"][task]
    n, nps = int(raw["n_rollouts"]), int(raw["n_per_step"])
    base = np.asarray(t["baseline"]["prompt_probs"], np.float64)

    def removal(d: dict) -> Removal:
        pos = in_window(unpack_positions(d["positions"], n), t["window_end"], nps)
        return Removal(pos, np.asarray(d["prompt_probs"], np.float64), base)

    return TaskReference(
        seed=int(raw["seed"]), task=task, window_end=int(t["window_end"]),
        gt_size=int(t["gt_size"]), ks=[int(k) for k in t["k_grid"]], n_rollouts=n,
        n_per_step=nps, base=base, off=np.asarray(t["bonus_off"]["prompt_probs"], np.float64),
        random=[[removal(d) for d in level["sets"]] for level in t["random"]],
        methods={m: [removal(d) for d in v["curve"]] for m, v in t["methods"].items()},
    )


# ----------------------------------------------------------------------------------------------
# statistics (pure functions)


def causal_score(removals: list[Removal], off: np.ndarray, base_off: np.ndarray) -> float:
    """Mean over the grid of ``effect_k / bonus_off_effect`` (the area under the curve)."""
    e_off = float(np.mean(off - base_off))
    return float(np.mean([r.effect / e_off for r in removals]))


def score_samples(removals: list[Removal], off: np.ndarray, base_off: np.ndarray,
                  noise: list[np.ndarray], prompt_idx: np.ndarray,
                  noise_idx: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of :func:`causal_score` with both noise sources.

    Args:
        removals: the method's removal at each k (``K`` of them).
        off, base_off: per-prompt bonus-off and baseline measures (the denominator).
        noise: per k, the centred effects of the same-size random removals (training noise).
        prompt_idx: ``(B, P)`` resampled prompt indices, shared by every method (paired).
        noise_idx: ``(B, K)`` indices into ``noise[k]`` drawn for this method.

    Returns:
        ``(B,)`` replicates: ``mean_k (mean_J d_k + eps_k) / mean_J (off - base_off)``.
    """
    den = (off - base_off)[prompt_idx].mean(axis=1)
    out = np.zeros(prompt_idx.shape[0])
    for k, r in enumerate(removals):
        num = (r.probs - r.base)[prompt_idx].mean(axis=1)
        eps = noise[k][noise_idx[:, k]] if len(noise[k]) else 0.0
        out += (num + eps) / den
    return out / len(removals)


def interval(point: float, samples: np.ndarray, level: float = 0.95) -> dict:
    """Percentile interval ``{"point", "lo", "hi"}`` of bootstrap replicates."""
    a = (1 - level) / 2
    lo, hi = np.quantile(samples, [a, 1 - a]) if len(samples) else (np.nan, np.nan)
    return {"point": float(point), "lo": float(lo), "hi": float(hi)}


def beats(lo: float, hi: float, tol: float = CROSS_MACHINE_TOLERANCE,
          max_width: float = MAX_WIDTH) -> str:
    """Verdict of an interval ``[lo, hi]`` of a margin that must be > 0.

    Pass when ``lo > tol``; fail when ``hi < -tol``, or when the interval straddles 0, is at most
    ``max_width`` wide and both ends are farther than ``tol`` from 0; inconclusive otherwise:
    too wide to tell, or an end within ``tol`` of 0 (decided by less than the cross-machine
    tolerance, so another CPU could decide it the other way).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return INCONCLUSIVE
    if lo > tol:
        return PASS
    if hi < -tol:
        return FAIL
    if abs(lo) <= tol or abs(hi) <= tol or abs((hi - lo) - max_width) <= tol:
        return INCONCLUSIVE
    return FAIL if hi - lo <= max_width else INCONCLUSIVE


def _rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


@dataclass(frozen=True)
class CausalSettings:
    """Bootstrap settings of the causal score (recorded in results)."""

    n_boot: int = 2000
    level: float = 0.95
    boot_seed: int = 0


def evaluate_task_seed(ref: TaskReference, curves: dict[str, list[Removal]], estimator: str,
                       settings: CausalSettings = CausalSettings(),
                       controls: tuple[str, ...] = DEFAULT_CONTROLS) -> tuple[dict, dict]:
    """Causal scores, curves, comparisons and the item-10 verdict of one (seed, task).

    Args:
        ref: the shipped reference.
        curves: method name -> its removal at each k (the estimator's and the controls'; the
            reference rows oracle and provenance are added from ``ref``).
        estimator: the name whose verdict is given.
        settings: bootstrap settings.
        controls: the controls the estimator must beat (paired).

    Returns:
        ``(block, samples)``: the plain-JSON block, and per method its bootstrap replicates
        (for means over seeds).
    """
    if ref.off_effect == 0.0:
        return {"window_end": ref.window_end, "gt_size": ref.gt_size, "k_grid": ref.ks,
                "bonus_off_effect": 0.0, "methods": {}, "comparisons": {}, "checks": {},
                "verdict": INCONCLUSIVE,
                "reason": "switching the bonus off changes nothing on this seed (no bonus was "
                          "paid): there is no effect to attribute"}, {}
    all_curves = {**{m: ref.methods[m] for m in REFERENCE_ROWS if m in ref.methods}, **curves}
    B, P, K = settings.n_boot, ref.base.size, len(ref.ks)
    prompt_idx = _rng(settings.boot_seed, ref.seed, ref.task, "prompts").integers(0, P, (B, P))
    noise = [np.array([r.effect for r in level]) - np.mean([r.effect for r in level])
             if level else np.zeros(0) for level in ref.random]
    e_off = ref.off_effect
    methods, samples = {}, {}
    for name, rem in all_curves.items():
        nidx = np.column_stack([
            _rng(settings.boot_seed, ref.seed, ref.task, name, "noise", k).integers(
                0, max(len(noise[k]), 1), B) for k in range(K)])
        smp = score_samples(rem, ref.off, ref.base, noise, prompt_idx, nidx)
        point = causal_score(rem, ref.off, ref.base)
        samples[name] = smp
        methods[name] = {
            "score": interval(point, smp, settings.level),
            "curve": [{"k": k, "removed_in_window": len(r.positions), "effect": r.effect,
                       "fraction": r.effect / e_off, "source": r.source}
                      for k, r in zip(ref.ks, rem, strict=True)],
        }
    fam = [causal_score([ref.random[k][i] for k in range(K)], ref.off, ref.base)
           for i in range(min(len(level) for level in ref.random))]
    band = {"lo": float(min(fam)), "hi": float(max(fam)), "mean": float(np.mean(fam)),
            "scores": fam, "n_families": len(fam),
            "curve": [{"k": k, "fractions": [r.effect / e_off for r in ref.random[i]]}
                      for i, k in enumerate(ref.ks)]}
    comparisons, checks = {}, {}
    est = samples.get(estimator)
    if est is not None:
        s = methods[estimator]["score"]
        margin = interval(s["point"] - band["hi"], est - band["hi"], settings.level)
        comparisons["random_band"] = margin
        checks["random_band"] = beats(margin["lo"], margin["hi"])
        for c in controls:
            d = interval(s["point"] - methods[c]["score"]["point"], est - samples[c],
                         settings.level)
            comparisons[c] = d
            # a control evaluated as the estimator is compared with itself: never a pass
            checks[c] = FAIL if c == estimator else beats(d["lo"], d["hi"])
    verdict = combine(checks.values()) if checks else NOT_RUN
    block = {"window_end": ref.window_end, "gt_size": ref.gt_size, "k_grid": ref.ks,
             "bonus_off_effect": e_off, "methods": methods, "random_band": band,
             "comparisons": comparisons, "checks": checks, "verdict": verdict,
             "reason": _reason(checks, comparisons)}
    return block, samples


def _reason(checks: dict, comparisons: dict) -> str:
    if not checks:
        return ""
    parts = []
    for name, v in checks.items():
        what = "the random band" if name == "random_band" else name
        parts.append(f"{v} vs {what}")
    return "; ".join(parts)


def mean_over_seeds(points: list[float], samples: list[np.ndarray],
                    level: float = 0.95) -> dict:
    """Mean of per-seed scores with the interval of the mean of independent replicates."""
    return interval(float(np.mean(points)), np.mean(np.stack(samples), axis=0), level)


# ----------------------------------------------------------------------------------------------
# the evaluator's entry point


def plan_replays(release, scores: dict):
    """The removal sets of every method and the replays they need.

    Args:
        release, scores: as in :func:`causal_results`.

    Returns:
        ``(refs, plan, jobs)``: ``{(seed, task): TaskReference}``, ``{(seed, task, method):
        [positions per k]}`` and the :class:`~benchmark.replays.Job` list of the sets not
        shipped; or a string saying why there is no causal score (no reference shipped).
    """
    from benchmark.replays import Job

    raws = {s: load_reference(release.path, s) for s in sorted({s for s, _ in scores})}
    missing = [s for s, r in raws.items() if r is None or r.get("schema") != CAUSAL_SCHEMA]
    if missing:
        return (f"release {release.release_id} ships no causal reference ({CAUSAL_FILE}, "
                f"schema {CAUSAL_SCHEMA}) for seeds {missing}")
    refs = {(s, t): task_reference(raws[s], t) for s, t in scores}
    plan, jobs = {}, []
    for (s, t), by_name in scores.items():
        ref = refs[(s, t)]
        shipped = ref.shipped()
        for name, sc in by_name.items():
            sc = np.asarray(sc)
            if sc.shape != (ref.n_rollouts,):
                raise ValueError(f"causal_results: seed {s} task {t} method {name!r} scores have "
                                 f"shape {sc.shape}; expected ({ref.n_rollouts},)")
            sets = [in_window(top_k_positions(sc, k), ref.window_end, ref.n_per_step)
                    for k in ref.ks]
            plan[(s, t, name)] = sets
            jobs += [Job(s, t, pos, ref.window_end, ref.n_per_step) for pos in sets
                     if pos and pos not in shipped]
    return refs, plan, jobs


def replays_pending(release, scores: dict) -> bool:
    """Whether :func:`causal_results` on ``scores`` would replay anything on this machine."""
    from benchmark.replays import open_store

    planned = plan_replays(release, scores)
    if isinstance(planned, str):
        return False
    store = open_store(release.path, release.manifest_sha256)
    return any(not store.has(j) for j in planned[2])


def causal_results(release, scores: dict, estimator: str,
                   controls: tuple[str, ...] = DEFAULT_CONTROLS,
                   settings: CausalSettings = CausalSettings(), workers: int = 2,
                   progress: bool = False, pool=None) -> tuple[dict, dict]:
    """Causal scores of every method in ``scores`` on every (seed, task) given.

    Args:
        release: a ``benchmark.release.Release``.
        scores: ``{(seed, task): {method: (n_rollouts,) rollout scores}}`` in rollout order.
        estimator: the method whose item-10 verdict is given.
        controls: the controls it must beat.
        settings: bootstrap settings.
        workers: replay processes at once.
        progress: show a progress bar for the replays.
        pool: pre-started replay workers (``benchmark.replays.WorkerPool``) to use first.

    Returns:
        ``(results, timing)``: ``{"tasks": {task: {"per_seed": {seed: block}, "scores":
        {method: interval}, "random_band", "verdict"}}, "replay": {...}}`` (or ``{"verdict":
        "not_run", "reason"}`` when the release ships no causal reference), and how many replays
        ran here and how long they took (not part of results: it depends on the cache).
    """
    from benchmark.replays import Job, open_store, run_jobs

    planned = plan_replays(release, scores)
    if isinstance(planned, str):
        return {"verdict": NOT_RUN, "reason": planned}, {}
    refs, plan, jobs = planned
    store = open_store(release.path, release.manifest_sha256)
    timing = run_jobs(store, release.manifest_sha256, jobs, workers, progress, pool)
    bases: dict[int, dict] = {}
    curves: dict[tuple, dict] = {}
    for (s, t, name), sets in plan.items():
        ref = refs[(s, t)]
        shipped = ref.shipped()
        rem = []
        for pos in sets:
            if pos in shipped:
                rem.append(shipped[pos])
            elif not pos:
                rem.append(Removal((), ref.base, ref.base, "empty"))
            else:
                if s not in bases:
                    bases[s] = store.baseline(s)
                rem.append(Removal(pos, store.result(Job(s, t, pos, ref.window_end,
                                                         ref.n_per_step)),
                                   np.asarray(bases[s]["measures"][t], np.float64), "replayed"))
        curves.setdefault((s, t), {})[name] = rem
    tasks: dict[str, dict] = {}
    samples: dict[str, dict[str, list]] = {}
    for (s, t), cv in sorted(curves.items()):
        block, smp = evaluate_task_seed(refs[(s, t)], cv, estimator, settings, controls)
        entry = tasks.setdefault(t, {"per_seed": {}})
        entry["per_seed"][str(s)] = block
        for name, x in smp.items():
            samples.setdefault(t, {}).setdefault(name, []).append(x)
    for t, entry in tasks.items():
        seeds = {s: b for s, b in entry["per_seed"].items() if b["methods"]}
        entry["scores"] = {
            name: mean_over_seeds([seeds[s]["methods"][name]["score"]["point"] for s in seeds],
                                  x, settings.level)
            for name, x in samples.get(t, {}).items()}
        if seeds:
            entry["random_band"] = {
                "lo": float(np.mean([b["random_band"]["lo"] for b in seeds.values()])),
                "hi": float(np.mean([b["random_band"]["hi"] for b in seeds.values()]))}
        entry["verdict"] = combine(b["verdict"] for b in entry["per_seed"].values())
    suite = {}
    common = set.intersection(*(set(x) for x in samples.values())) if samples else set()
    for name in sorted(common):
        pts = [b["methods"][name]["score"]["point"] for e in tasks.values()
               for b in e["per_seed"].values() if b["methods"]]
        suite[name] = mean_over_seeds(pts, [x for t in samples for x in samples[t][name]],
                                      settings.level)
    return {"tasks": tasks, "suite": suite, "replay": {"mode": "batched", "threads": 1}}, timing

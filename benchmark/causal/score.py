"""Causal scores: what removing an estimator's top rollouts does to the behavior (DESIGN 4, 4a).

For one task and seed, a method's rollout scores give removal sets: its top-k rollouts for k on a
grid of fractions of |GT| (the task's group-label count; each release's reference records its
grid, new references use :data:`K_FRACTIONS`). Ties are broken fairly: where the top-k boundary
cuts a block of equal scores, the set is everything above it plus a seeded random subset of the
block (:func:`removal_sets`). Training is replayed without each set to the end of the task's bonus
window, and the behavior measure there (the exact mean probability of the behavior token on
held-out trigger prompts) is compared with a replay that removes nothing. The **fraction** of a
removal is its effect divided by the effect of switching the task's bonus off; the **causal
score** is the area under the removal curve on a log-k grid (:func:`k_weights`: the trapezoid
rule over log2 k, normalized to a weighted mean of the fractions). 1.0 means removing the
method's top rollouts does what switching the bonus off does, at every k; random removals sit
near 0.

The score's 95% interval carries two kinds of noise (docs/causal.md):

* measurement: the behavior is a mean over held-out prompts; prompts are resampled (the same
  resample for every method and every evaluation, so comparisons are paired), numerator and
  denominator together;
* training: on-policy replays are chaotic; the spread of the shipped same-size random removal
  sets at each k is added as an independent draw per method and k.

:func:`replicates` turns a method's stored curve (its per-prompt changes at each k, in the
fixed-point encoding of :func:`encode_array`) into the bootstrap replicates; the evaluator and the
leaderboard both call it, so the leaderboard's paired comparisons of two entries use exactly the
replicates behind each entry's own interval.

What does not depend on the estimator ships with the release (``seed<S>/causal.json``, built by
:mod:`benchmark.causal.reference`): the bonus-off effect, the oracle (group labels) and
provenance (rollout labels) curves, the controls' curves and the random sets at every k, each
with its per-prompt measures. The estimator's own removals are replayed on this machine
(:mod:`benchmark.causal.replays`) against a cached local baseline; a removal set that equals a
shipped
one reuses the shipped numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# the statistics live in .stats; their names stay importable from here (public API)
from benchmark.causal.stats import (  # noqa: F401
    ARRAY_ENCODING,
    ARRAY_UNIT,
    CROSS_MACHINE_TOLERANCE,
    DEFAULT_SETTINGS,
    RANDOM_REFERENCE,
    TIE_COMPLETIONS,
    CausalDataError,
    CausalSettings,
    _rng,
    above_band_gate,
    area,
    beats,
    bonus_off_interval,
    decode_array,
    encode_array,
    interval,
    is_encoded_array,
    k_weights,
    mean_over_seeds,
    measurability,
    paired_difference,
    prompt_resample,
    quantize,
    random_reference,
    replicates,
    settings_of,
    significance,
)
from benchmark.verdicts import FAIL, INCONCLUSIVE, MAX_WIDTH, NOT_RUN, PASS, combine  # noqa: F401

CAUSAL_FILE = "causal.json"
#: the schema new references are written in (3: fair ties, ``ties`` recorded); schema 2 (ties to
#: the earlier rollout in the shipped reference rows) is still read
CAUSAL_SCHEMA = 3
READ_SCHEMAS = (2, 3)
#: the removal grid of new references, as fractions of |GT|; an evaluation uses the grid its
#: release's reference records (``k_fractions``), so an older reference keeps its own
K_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
#: the grid of references written before ``k_fractions`` was recorded
LEGACY_K_FRACTIONS = (0.25, 0.5, 1.0)
#: how a reference's method curves break ties (recorded in ``causal.json["ties"]``)
#: (recorded text, kept as shipped references hold it: the function is now score.tie_order)
FAIR_TIES = "fair: a seeded random order within ties (benchmark.causal.tie_order)"
DEFAULT_CONTROLS = ("norm-only", "step-order")
REFERENCE_ROWS = ("oracle", "provenance")
STRONGEST = "strongest_control"
NO_BONUS = ("switching the bonus off changes nothing on this seed (no bonus was paid): there is "
            "no effect to attribute")


# ----------------------------------------------------------------------------------------------
# the grid and its summary


def k_grid(gt_size: int, fractions=K_FRACTIONS) -> list[int]:
    """The removal sizes: ``ceil(f * gt_size)`` for f in ``fractions`` (at least 1)."""
    return [max(1, math.ceil(f * int(gt_size))) for f in fractions]


# ----------------------------------------------------------------------------------------------
# removal sets


def tie_order(n: int, seed: int, task: str, draw: int = 0) -> np.ndarray:
    """A public, seeded random order of ``n`` rollouts, used only to break ties.

    ``tie_order(...)[i]`` is rollout ``i``'s place in the order: a permutation of ``0..n-1``
    drawn from ``(seed, task, draw)``. One order serves every k, so the removal sets of one
    draw are nested as for an untied ranking. It is public (anyone can compute it) and that is
    harmless: it only orders rollouts whose scores are equal, and a submitter controls its own
    ties anyway (it can break them as it likes before returning its scores).
    """
    return _rng("ties", seed, task, draw).permutation(int(n))


def top_k_positions(scores, k: int, tiebreak=None) -> np.ndarray:
    """Flat rollout positions of the ``k`` highest scores, sorted ascending.

    Args:
        scores: ``(N,)`` rollout scores; NaN ranks last.
        k: how many to take.
        tiebreak: ``(N,)`` keys ordering equal scores (lower first), e.g. :func:`tie_order`;
            None orders them by rollout position (the earlier rollout first; the rule of
            schema-2 references' shipped rows).
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    s = np.where(np.isnan(s), -np.inf, s)
    key = np.arange(s.size) if tiebreak is None else np.asarray(tiebreak).reshape(-1)
    order = np.lexsort((key, -s))
    return np.sort(order[:int(k)])


def cuts_tie(scores, k: int) -> bool:
    """Whether the top-``k`` boundary cuts a block of equal scores (NaNs are equal to each other).

    True when the k-th and (k+1)-th highest scores are equal: which of the tied rollouts are
    removed is then up to the tie-break.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    k = int(k)
    if k <= 0 or k >= s.size:
        return False
    s = np.sort(np.where(np.isnan(s), -np.inf, s))[::-1]
    return bool(s[k - 1] == s[k])


def removal_sets(scores, ks, seed: int, task: str, window_end: int, n_per_step: int,
                 completions: int = TIE_COMPLETIONS) -> tuple[list[list[tuple[int, ...]]],
                                                              list[bool]]:
    """A method's removal sets with fair ties: per k, one set per tie completion.

    At each k the set is the method's top-k rollouts in the order "score, then
    :func:`tie_order` draw r" for r = 0..completions-1, restricted to the rollouts before the
    window end (later removals cannot change the measure there). Where the boundary cuts no tie
    the completions are the same set; where it cuts a block, the set is everything strictly above
    plus a uniformly random subset of the block, so its expected effect is the expected effect
    over random orders within the tie.

    Args:
        scores: ``(N,)`` rollout scores in rollout order.
        ks: the removal sizes.
        seed, task: where (they seed the tie orders).
        window_end, n_per_step: the window end (a step) and rollouts per step.
        completions: tie completions per k (R).

    Returns:
        ``(sets, cut)``: ``sets[k][r]`` the positions (ascending) and ``cut[k]`` whether the
        boundary cut a tie.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    orders = [tie_order(s.size, seed, task, r) for r in range(int(completions))]
    sets = [[in_window(top_k_positions(s, k, o), window_end, n_per_step) for o in orders]
            for k in ks]
    return sets, [cuts_tie(s, k) for k in ks]


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
    k_fractions: tuple[float, ...] = LEGACY_K_FRACTIONS  # the grid, as fractions of |GT|
    ties: str = "rollout order"  # how the shipped method curves broke ties

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

    ks = [int(k) for k in t["k_grid"]]
    fractions = tuple(float(f) for f in raw.get("k_fractions", LEGACY_K_FRACTIONS))
    if len(fractions) != len(ks):
        raise CausalDataError(f"causal reference of seed {raw.get('seed')} task {task}: k_grid "
                              f"{ks} has {len(ks)} sizes but k_fractions {list(fractions)} has "
                              f"{len(fractions)}; rebuild it with python -m "
                              "benchmark.causal.reference RELEASE_DIR")
    return TaskReference(
        seed=int(raw["seed"]), task=task, window_end=int(t["window_end"]),
        gt_size=int(t["gt_size"]), ks=ks, n_rollouts=n,
        n_per_step=nps, base=base, off=np.asarray(t["bonus_off"]["prompt_probs"], np.float64),
        random=[[removal(d) for d in level["sets"]] for level in t["random"]],
        methods={m: [removal(d) for d in v["curve"]] for m, v in t["methods"].items()},
        k_fractions=fractions, ties=str(raw.get("ties", "rollout order")),
    )


def reference_inputs(ref: TaskReference) -> dict:
    """What every method's replicates on one (seed, task) share, as stored in results.

    Returns:
        ``{"k_fractions": [...], "bonus_off_prompt_delta": encoded (P,), "random_effects":
        encoded (K, n)}``: the grid, the per-prompt change of the bonus-off replay (the
        denominator) and the mean effect of each shipped random set at each k (the training
        noise), each on the storage grid (:func:`encode_array`).

    Raises:
        CausalDataError: the random sets differ in number between k.
    """
    sizes = {len(level) for level in ref.random}
    if len(sizes) > 1:
        raise CausalDataError(f"seed {ref.seed} task {ref.task}: the reference has {sorted(sizes)}"
                              " random sets at different k; expected the same number at each k")
    eff = np.array([[r.effect for r in level] for level in ref.random], np.float64).reshape(
        len(ref.random), sizes.pop() if sizes else 0)
    return {"k_fractions": list(ref.k_fractions),
            "bonus_off_prompt_delta": encode_array(ref.off - ref.base),
            "random_effects": encode_array(eff)}


def evaluate_task_seed(ref: TaskReference, curves: dict[str, list[list[Removal]]],
                       estimator: str, settings: CausalSettings = DEFAULT_SETTINGS,
                       controls: tuple[str, ...] = DEFAULT_CONTROLS,
                       track_controls: tuple[str, ...] = (),
                       tie_cuts: dict[str, list[bool]] | None = None) -> tuple[dict, dict]:
    """Causal scores, curves, comparisons and the item-10 verdict of one (seed, task).

    Args:
        ref: the shipped reference.
        curves: method name -> per k, its removal for each tie completion (the estimator's and
            the controls'; the reference rows oracle and provenance are added from ``ref``).
        estimator: the name whose verdict is given; its per-prompt changes are stored in the
            block (``methods[estimator]["prompt_deltas"]``) for the leaderboard.
        settings: bootstrap settings.
        controls: the controls the estimator must beat (paired), each by name.
        track_controls: every control of the estimator's track; the estimator must also beat
            the strongest of them on this (seed, task) (the highest causal score; paired).
        tie_cuts: method name -> per k, whether its top-k boundary cut a tie (reported).

    Returns:
        ``(block, samples)``: the plain-JSON block, and per method ``(point, replicates)``
        (for means over seeds).
    """
    if ref.off_effect == 0.0:
        return {"window_end": ref.window_end, "gt_size": ref.gt_size, "k_grid": ref.ks,
                "k_fractions": list(ref.k_fractions), "bonus_off_effect": 0.0, "methods": {},
                "comparisons": {}, "checks": {}, "verdict": INCONCLUSIVE,
                "reason": NO_BONUS, "measurable": False, "measurable_reason": NO_BONUS}, {}
    all_curves = {**{m: [[r] for r in ref.methods[m]] for m in REFERENCE_ROWS
                     if m in ref.methods}, **curves}
    inputs = reference_inputs(ref)
    e_off = float(decode_array(inputs["bonus_off_prompt_delta"]).mean())
    methods, samples = {}, {}
    for name, rem in all_curves.items():
        enc = encode_array(np.stack([np.stack([r.probs - r.base for r in comps])
                                     for comps in rem]))
        point, smp = replicates(enc, inputs, ref.seed, ref.task, name, settings)
        samples[name] = (point, smp)
        deltas = decode_array(enc)
        curve = []
        for i, (k, comps) in enumerate(zip(ref.ks, rem, strict=True)):
            effect = float(deltas[i].mean())
            c = {"k": k, "removed_in_window": len(comps[0].positions), "effect": effect,
                 "fraction": effect / e_off, "source": comps[0].source}
            if tie_cuts is not None and name in tie_cuts:
                c["tie_cut"] = bool(tie_cuts[name][i])
            if len(comps) > 1:
                c["completions"] = [{"removed_in_window": len(r.positions),
                                     "effect": float(deltas[i, j].mean()), "source": r.source}
                                    for j, r in enumerate(comps)]
            curve.append(c)
        methods[name] = {"score": interval(point, smp, settings.level), "curve": curve}
        if name == estimator:
            methods[name]["prompt_deltas"] = enc
    eff = decode_array(inputs["random_effects"])
    fam = [area(eff[:, i] / e_off, ref.k_fractions) for i in range(eff.shape[1])]
    rpoint, rsmp = random_reference(inputs, ref.seed, ref.task, settings)
    band = {"lo": float(min(fam)), "hi": float(max(fam)), "mean": float(np.mean(fam)),
            "scores": fam, "n_families": len(fam),
            "reference": interval(rpoint, rsmp, settings.level) | {
                "statistic": RANDOM_REFERENCE, "n_sets": len(fam)},
            "curve": [{"k": k, "fractions": [float(x) / e_off for x in eff[i]]}
                      for i, k in enumerate(ref.ks)]}
    measure = _measurability(inputs, ref, samples, (rpoint, rsmp), settings)
    comparisons, checks = {}, {}
    est = samples.get(estimator)
    if est is not None:
        # item 10's random check: the estimator minus the random reference (the sets' mean),
        # paired; the key keeps its name ("random_band") for readers of older results
        margin = interval(est[0] - rpoint, est[1] - rsmp, settings.level)
        comparisons["random_band"] = margin
        checks["random_band"] = beats(margin["lo"], margin["hi"])
        # a control evaluated as the estimator is compared with itself: never a pass
        for c in controls:
            d = interval(est[0] - samples[c][0], est[1] - samples[c][1], settings.level)
            comparisons[c] = d
            checks[c] = FAIL if c == estimator else beats(d["lo"], d["hi"])
        present = [c for c in track_controls if c in samples]
        if present:
            strongest = max(present, key=lambda c: (samples[c][0], c))
            d = interval(est[0] - samples[strongest][0], est[1] - samples[strongest][1],
                         settings.level)
            comparisons[STRONGEST] = d | {"control": strongest}
            checks[STRONGEST] = FAIL if strongest == estimator else beats(d["lo"], d["hi"])
    verdict = combine(checks.values()) if checks else NOT_RUN
    block = {"window_end": ref.window_end, "gt_size": ref.gt_size, "k_grid": ref.ks,
             "bonus_off_effect": e_off, "methods": methods, "random_band": band,
             "comparisons": comparisons, "checks": checks, "verdict": verdict,
             "reason": _reason(checks, comparisons),
             "measurable": measure.pop("measurable"),
             "measurable_reason": measure.pop("measurable_reason"), "measurability": measure,
             **inputs}
    return block, samples


def _measurability(inputs: dict, ref: TaskReference, samples: dict, rand: tuple,
                   settings: CausalSettings) -> dict:
    """:func:`measurability` of one cell from its reference rows' replicates (``samples``)."""
    rpoint, rsmp = rand
    return measurability(
        bonus_off_interval(inputs, ref.seed, ref.task, settings),
        {m: interval(samples[m][0] - rpoint, samples[m][1] - rsmp, settings.level)
         for m in REFERENCE_ROWS if m in samples})


def cell_measurability(ref: TaskReference,
                       settings: CausalSettings = DEFAULT_SETTINGS) -> dict:
    """Whether one (seed, task) cell is measurable, from its causal reference alone.

    The rule the evaluator applies to every cell (:func:`measurability`: the bonus-off effect is
    significant and the stronger of the oracle's and provenance's removals clears the random
    reference, paired), computed from the reference's own rows, with no estimator involved:
    what a season panel screens its draws with before any entry is scored on them.

    Returns:
        :func:`measurability`'s ``{"measurable", "measurable_reason", "bonus_off",
        "reference", "reference_margin"}``; a cell whose bonus-off replay changed nothing
        (no bonus was paid) is not measurable.
    """
    if ref.off_effect == 0.0:
        return {"measurable": False, "measurable_reason": NO_BONUS, "bonus_off": None,
                "reference": None, "reference_margin": None}
    inputs = reference_inputs(ref)
    samples = {}
    for m in REFERENCE_ROWS:
        if m in ref.methods:
            enc = encode_array(np.stack([np.stack([r.probs - r.base]) for r in ref.methods[m]]))
            samples[m] = replicates(enc, inputs, ref.seed, ref.task, m, settings)
    rand = random_reference(inputs, ref.seed, ref.task, settings)
    return _measurability(inputs, ref, samples, rand, settings)


def _reason(checks: dict, comparisons: dict) -> str:
    if not checks:
        return ""
    parts = []
    for name, v in checks.items():
        what = {"random_band": "the random reference (mean of the random sets)",
                STRONGEST: f"the strongest control "
                           f"({comparisons.get(STRONGEST, {}).get('control')})"}.get(name, name)
        parts.append(f"{v} vs {what}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# the evaluator's entry point


def plan_replays(release, scores: dict, completions: int = TIE_COMPLETIONS):
    """The removal sets of every method and the replays they need.

    Args:
        release, scores: as in :func:`causal_results`.
        completions: tie completions per k (:func:`removal_sets`).

    Returns:
        ``(refs, plan, jobs)``: ``{(seed, task): TaskReference}``, ``{(seed, task, method):
        (sets[k][r], cut[k])}`` (:func:`removal_sets`) and the
        :class:`~benchmark.causal.store.Job`
        list of the distinct sets not shipped; or a string saying why there is no causal score
        (no reference shipped).
    """
    from benchmark.causal.store import Job

    raws = {s: load_reference(release.path, s) for s in sorted({s for s, _ in scores})}
    missing = [s for s, r in raws.items() if r is None or r.get("schema") not in READ_SCHEMAS]
    if missing:
        return (f"release {release.release_id} ships no causal reference ({CAUSAL_FILE}, "
                f"schema {' or '.join(map(str, READ_SCHEMAS))}) for seeds {missing}")
    refs = {(s, t): task_reference(raws[s], t) for s, t in scores}
    plan, jobs, seen = {}, [], set()
    for (s, t), by_name in scores.items():
        ref = refs[(s, t)]
        shipped = ref.shipped()
        for name, sc in by_name.items():
            sc = np.asarray(sc)
            if sc.shape != (ref.n_rollouts,):
                raise ValueError(f"causal_results: seed {s} task {t} method {name!r} scores have "
                                 f"shape {sc.shape}; expected ({ref.n_rollouts},)")
            sets, cut = removal_sets(sc, ref.ks, s, t, ref.window_end, ref.n_per_step,
                                     completions)
            plan[(s, t, name)] = (sets, cut)
            for pos in (p for comps in sets for p in comps):
                if pos and pos not in shipped and (s, t, pos) not in seen:
                    seen.add((s, t, pos))
                    jobs.append(Job(s, t, pos, ref.window_end, ref.n_per_step))
    return refs, plan, jobs


def stored_removal(ref: TaskReference, store, bases: dict, pos: tuple[int, ...]) -> Removal:
    """The on-policy removal of ``pos`` on ``ref``'s (seed, task): shipped, empty or replayed here.

    ``store`` is the replay store the estimator's removals went to; ``bases`` caches each seed's
    stored baseline (filled as needed).
    """
    from benchmark.causal.store import Job

    shipped = ref.shipped()
    if pos in shipped:
        return shipped[pos]
    if not pos:
        return Removal((), ref.base, ref.base, "empty")
    if ref.seed not in bases:
        bases[ref.seed] = store.baseline(ref.seed)
    return Removal(pos, store.result(Job(ref.seed, ref.task, pos, ref.window_end, ref.n_per_step)),
                   np.asarray(bases[ref.seed]["measures"][ref.task], np.float64), "replayed")


def replays_pending(release, scores: dict, completions: int = TIE_COMPLETIONS) -> bool:
    """Whether :func:`causal_results` on ``scores`` would replay anything on this machine."""
    from benchmark.causal.replays import open_store

    planned = plan_replays(release, scores, completions)
    if isinstance(planned, str):
        return False
    store = open_store(release.path, release.manifest_sha256)
    return any(not store.has(j) for j in planned[2])


def causal_results(release, scores: dict, estimator: str,
                   controls: tuple[str, ...] = DEFAULT_CONTROLS,
                   settings: CausalSettings = DEFAULT_SETTINGS, workers: int = 2,
                   progress: bool = False, pool=None,
                   track_controls: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Causal scores of every method in ``scores`` on every (seed, task) given.

    Args:
        release: a ``benchmark.releases.release.Release``.
        scores: ``{(seed, task): {method: (n_rollouts,) rollout scores}}`` in rollout order.
        estimator: the method whose item-10 verdict is given.
        controls: the controls it must beat.
        settings: bootstrap settings.
        workers: replay processes at once.
        progress: show a progress bar for the replays.
        pool: pre-started replay workers (``benchmark.causal.replays.WorkerPool``) to use first.
        track_controls: every control of the estimator's track (it must beat the strongest).

    Returns:
        ``(results, timing)``: ``{"tasks": {task: {"per_seed": {seed: block}, "scores":
        {method: interval}, "random_band", "verdict"}}, "replay": {...}}`` (or ``{"verdict":
        "not_run", "reason"}`` when the release ships no causal reference), and how many replays
        ran here and how long they took (not part of results: it depends on the cache).
    """
    from benchmark.causal.replays import open_store, run_jobs

    planned = plan_replays(release, scores, settings.tie_completions)
    if isinstance(planned, str):
        return {"verdict": NOT_RUN, "reason": planned}, {}
    refs, plan, jobs = planned
    store = open_store(release.path, release.manifest_sha256)
    timing = run_jobs(store, release.manifest_sha256, jobs, workers, progress, pool)
    bases: dict[int, dict] = {}
    curves: dict[tuple, dict] = {}
    cuts: dict[tuple, dict] = {}
    for (s, t, name), (sets, cut) in plan.items():
        curves.setdefault((s, t), {})[name] = [[stored_removal(refs[(s, t)], store, bases, pos)
                                                for pos in comps] for comps in sets]
        cuts.setdefault((s, t), {})[name] = cut
    tasks: dict[str, dict] = {}
    samples: dict[str, dict[str, list]] = {}
    for (s, t), cv in sorted(curves.items()):
        block, smp = evaluate_task_seed(refs[(s, t)], cv, estimator, settings, controls,
                                        track_controls, cuts[(s, t)])
        entry = tasks.setdefault(t, {"per_seed": {}})
        entry["per_seed"][str(s)] = block
        for name, x in smp.items():
            samples.setdefault(t, {}).setdefault(name, []).append(x)
    for t, entry in tasks.items():
        if any(b["methods"] for b in entry["per_seed"].values()):
            entry["scores"] = {name: mean_over_seeds([p for p, _ in x], [r for _, r in x],
                                                     settings.level)
                               for name, x in samples.get(t, {}).items()}
            seeds = [b for b in entry["per_seed"].values() if b["methods"]]
            refs_ = [random_reference(b, int(s), t, settings)
                     for s, b in sorted(entry["per_seed"].items(), key=lambda kv: int(kv[0]))
                     if b["methods"]]
            entry["random_band"] = {
                "lo": float(np.mean([b["random_band"]["lo"] for b in seeds])),
                "hi": float(np.mean([b["random_band"]["hi"] for b in seeds])),
                "reference": mean_over_seeds([p for p, _ in refs_], [r for _, r in refs_],
                                             settings.level)}
        else:
            entry["scores"] = {}
        # unmeasurable cells are reported, never counted (docs/evaluation.md)
        entry["verdict"] = combine(b["verdict"] for b in entry["per_seed"].values()
                                   if b.get("measurable", True))
        entry["measurable_seeds"] = sorted(int(s) for s, b in entry["per_seed"].items()
                                           if b.get("measurable", True))
    suite = {}
    common = set.intersection(*(set(x) for x in samples.values())) if samples else set()
    for name in sorted(common):
        both = [x for t in samples for x in samples[t][name]]
        suite[name] = mean_over_seeds([p for p, _ in both], [r for _, r in both],
                                      settings.level)
    out = {"tasks": tasks, "suite": suite, "replay": {"mode": "batched", "threads": 1}}
    margins = band_margins(tasks, samples, estimator, settings) if estimator in suite else []
    if margins:
        out["suite_vs_random"] = mean_over_seeds([p for p, _ in margins],
                                                 [r for _, r in margins], settings.level)
    return out, timing


def band_margins(tasks: dict, samples: dict, estimator: str,
                 settings: CausalSettings = DEFAULT_SETTINGS) -> list[tuple[float, np.ndarray]]:
    """The estimator's item-10 margins over the random reference, per scored (task, seed).

    For each (task, seed) with a causal score: ``(point - r, replicates - r_b)`` with ``(r, r_b)``
    the random reference there (:func:`random_reference` of the block's stored inputs: the mean
    of the random sets, paired on the prompt resample). Their mean over tasks and seeds
    (:func:`mean_over_seeds`) is the suite's paired estimator-minus-reference margin,
    ``suite["vs_random"]``, which the live-draw gate of ``bt-bench verify`` reads. Every scored
    cell counts here, measurable or not (a mean margin, not a verdict).

    Args:
        tasks: ``{task: {"per_seed": {seed: block}}}`` of :func:`causal_results`.
        samples: ``{task: {method: [(point, (B,) replicates), ...]}}`` in the order of the
            blocks with methods (sorted seeds).
        estimator: whose margins.
        settings: the bootstrap settings the samples were drawn with.
    """
    out = []
    for t, entry in sorted(tasks.items()):
        blocks = [(int(s), b) for s, b in sorted(entry["per_seed"].items(),
                                                  key=lambda kv: int(kv[0])) if b["methods"]]
        for (s, b), (p, r) in zip(blocks, samples.get(t, {}).get(estimator, []), strict=True):
            rp, rr = random_reference(b, s, t, settings)
            out.append((p - rp, np.asarray(r) - rr))
    return out

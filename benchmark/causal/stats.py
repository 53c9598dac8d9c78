"""The causal score's statistics: intervals, paired replicates, the random reference (pure).

:func:`replicates` turns a method's stored curve (its per-prompt changes at each k, in the
fixed-point encoding of :func:`encode_array`) into bootstrap replicates; the evaluator and the
leaderboard both call it, so the leaderboard's paired comparisons of two entries use exactly the
replicates behind each entry's own interval. :func:`random_reference` is the population
statistic every method is compared with (the mean effect of same-size random removal sets, with
the sampling error of that mean), and :func:`measurability` decides whether a (seed, task) cell
shows an effect attribution can find (docs/evaluation.md, "Measurable cells").

Everything here is a pure function of stored numbers: :mod:`benchmark.causal.score` (the
removal sets, the shipped reference, the evaluator's entry point) imports it and re-exports its
names, so ``from benchmark.causal import score as C; C.replicates`` keeps working.
"""

from __future__ import annotations

import base64
import math
import zlib
from dataclasses import dataclass

import numpy as np

from benchmark.verdicts import FAIL, INCONCLUSIVE, MAX_WIDTH, PASS

#: fixed-point unit of the per-prompt numbers stored in results (:func:`encode_array`): values
#: within +-2.147 (probabilities and their changes lie in [-1, 1]) at a resolution of 1e-9
ARRAY_UNIT = 1e-9
ARRAY_ENCODING = "int32-le-base64"
#: causal fractions from replays on different CPUs differ by up to about 1e-4 (measured, see
#: docs/causal.md); a verdict decided by less than this margin is inconclusive, never
#: machine-dependent, and ``verify`` compares causal numbers within it
CROSS_MACHINE_TOLERANCE = 0.01
#: random tie completions per k where the top-k boundary cuts a block of equal scores; 1 adds no
#: replay and is an unbiased estimate whose spread the training-noise term already carries
#: (docs/causal.md, "Ties")
TIE_COMPLETIONS = 1


class CausalDataError(ValueError):
    """A stored causal curve or encoded array is malformed."""



def k_weights(fractions) -> np.ndarray:
    """Weights of the causal score over a grid: the trapezoid rule over log2 k, normalized.

    With ``x_i = log2 f_i`` (ascending), the area under the piecewise-linear curve through
    ``(x_i, y_i)`` divided by ``x_max - x_min`` is ``sum_i w_i y_i`` with
    ``w_i = (x_{i+1} - x_{i-1}) / (2 (x_max - x_min))`` (one-sided at the ends). On the grid
    1/16..1 (equal steps) the weights are 1/8, 1/4, 1/4, 1/4, 1/8; on 1/4, 1/2, 1 they are
    1/4, 1/2, 1/4. A one-point grid has weight 1.

    Args:
        fractions: ``(K,)`` removal sizes as fractions of |GT|, strictly increasing.

    Returns:
        ``(K,)`` non-negative weights summing to 1.

    Raises:
        CausalDataError: the fractions are not positive and strictly increasing.
    """
    f = np.asarray(fractions, np.float64).reshape(-1)
    if f.size == 0 or not np.all(f > 0) or np.any(np.diff(f) <= 0):
        raise CausalDataError(f"k fractions {f.tolist()}: expected positive, strictly "
                              "increasing fractions of |GT| (e.g. [0.0625, ..., 1.0])")
    if f.size == 1:
        return np.ones(1)
    x = np.log2(f)
    w = np.zeros_like(x)
    w[:-1] += np.diff(x) / 2
    w[1:] += np.diff(x) / 2
    return w / (x[-1] - x[0])


def area(fractions_per_k, k_fractions) -> float:
    """The causal score of a curve: ``sum_k w_k y_k`` with :func:`k_weights` (log-k trapezoid)."""
    return float(np.dot(k_weights(k_fractions), np.asarray(fractions_per_k, np.float64)))


# ----------------------------------------------------------------------------------------------
# stored numbers: a compact fixed-point encoding (results.json carries the per-prompt changes)


def encode_array(x) -> dict:
    """A float array as fixed-point integers in base64: what ``results.json`` stores.

    Each value is rounded to a multiple of :data:`ARRAY_UNIT` (1e-9) and stored as a
    little-endian int32, so a value must lie within +-2.147 (probabilities and their changes lie
    in [-1, 1]). 128 prompts take 684 characters instead of 128 indented JSON lines.

    Args:
        x: a float array of any shape (finite).

    Returns:
        ``{"encoding": "int32-le-base64", "unit": 1e-8, "shape": [...], "data": "<base64>"}``.

    Raises:
        CausalDataError: a value is not finite or outside the int32 range of the unit.
    """
    a = np.asarray(x, np.float64)
    q = np.round(a / ARRAY_UNIT)
    lim = np.iinfo(np.int32).max
    if not np.all(np.isfinite(q)) or np.any(np.abs(q) > lim):
        raise CausalDataError(f"cannot store values {a.reshape(-1)[:4].tolist()}...: expected "
                              f"finite values within +-{lim * ARRAY_UNIT:.2f}")
    data = base64.b64encode(q.astype("<i4").tobytes()).decode("ascii")
    return {"encoding": ARRAY_ENCODING, "unit": ARRAY_UNIT, "shape": list(a.shape), "data": data}


def is_encoded_array(d: object) -> bool:
    """Whether ``d`` has the form :func:`encode_array` returns."""
    return isinstance(d, dict) and d.get("encoding") == ARRAY_ENCODING and "data" in d


def decode_array(d: object) -> np.ndarray:
    """Inverse of :func:`encode_array` (exact: ``decode(encode(x))`` is ``x`` on the unit grid).

    Raises:
        CausalDataError: ``d`` is not such a dict, or its data does not match its shape.
    """
    if not is_encoded_array(d) or not isinstance(d.get("shape"), list):
        raise CausalDataError(f"expected an encoded array {{'encoding': {ARRAY_ENCODING!r}, "
                              f"'unit', 'shape', 'data'}}, got {str(d)[:80]!r}")
    try:
        raw = base64.b64decode(d["data"], validate=True)
        q = np.frombuffer(raw, dtype="<i4").astype(np.float64)
        return (q * float(d["unit"])).reshape([int(n) for n in d["shape"]])
    except (ValueError, TypeError) as exc:
        raise CausalDataError(f"encoded array of shape {d.get('shape')} cannot be decoded "
                              f"({exc}); re-score the submission") from exc


def quantize(x) -> np.ndarray:
    """``x`` on the storage grid: what a reader of the stored numbers sees."""
    return decode_array(encode_array(x))


# ----------------------------------------------------------------------------------------------
# statistics (pure functions)


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


def above_band_gate(margin: dict, tol: float = CROSS_MACHINE_TOLERANCE) -> str:
    """Whether a causal score is above the random reference, for the precision items (3, 4).

    ``margin`` is the paired interval of (causal score - the random reference, the mean of the
    random sets: :func:`random_reference`) on one seed. The score is **at or below it** when
    the margin's upper end is below ``-tol`` (fail: precision items cannot pass), too close to
    call when it is within ``tol`` of 0 (inconclusive: a precision pass becomes
    inconclusive), and not capped (pass) otherwise.
    """
    hi = margin.get("hi") if isinstance(margin, dict) else None
    if hi is None or not math.isfinite(hi):
        return INCONCLUSIVE
    if hi < -tol:
        return FAIL
    return INCONCLUSIVE if hi <= tol else PASS


def significance(lo: float, hi: float, tol: float = CROSS_MACHINE_TOLERANCE) -> str:
    """Verdict of a paired difference a - b from its interval ``[lo, hi]``.

    ``better`` when ``lo > tol``, ``worse`` when ``hi < -tol``, ``tie`` otherwise (the data do
    not separate them by more than the cross-machine tolerance).
    """
    if math.isfinite(lo) and lo > tol:
        return "better"
    if math.isfinite(hi) and hi < -tol:
        return "worse"
    return "tie"


def paired_difference(a: tuple[float, np.ndarray], b: tuple[float, np.ndarray],
                      level: float = 0.95, tol: float = CROSS_MACHINE_TOLERANCE) -> dict:
    """The paired difference of two causal scores: ``{"point", "lo", "hi", "verdict"}``.

    ``a`` and ``b`` are ``(point, (B,) replicates)`` of two methods on the same (seed, task)
    resamples (the prompt resample is shared; each method's training-noise draw is its own), so
    the interval of ``a - b`` is the percentile interval of the replicate differences; the
    verdict is :func:`significance`.
    """
    d = interval(a[0] - b[0], np.asarray(a[1]) - np.asarray(b[1]), level)
    return d | {"verdict": significance(d["lo"], d["hi"], tol)}


def _rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


@dataclass(frozen=True)
class CausalSettings:
    """Bootstrap settings of the causal score (recorded in results).

    Attributes:
        n_boot: bootstrap replicates.
        level: interval coverage.
        boot_seed: base seed of the resamples (with seed, task and method names).
        tie_completions: random tie completions per k (R, see :func:`removal_sets`).
    """

    n_boot: int = 2000
    level: float = 0.95
    boot_seed: int = 0
    tie_completions: int = TIE_COMPLETIONS

    def __post_init__(self) -> None:
        if self.n_boot < 1 or self.tie_completions < 1 or not 0 < self.level < 1:
            raise ValueError(f"causal settings n_boot={self.n_boot}, level={self.level}, "
                             f"tie_completions={self.tie_completions}: expected n_boot >= 1, "
                             "0 < level < 1 and tie_completions >= 1")


#: the default settings (an immutable singleton, usable as an argument default)
DEFAULT_SETTINGS = CausalSettings()


def settings_of(recorded: dict) -> CausalSettings:
    """The causal settings of an evaluation from its recorded settings.

    Reads ``n_boot_causal``, ``level``, ``boot_seed`` and ``tie_completions`` of
    ``results["settings"]``.

    Raises:
        CausalDataError: a field is missing.
    """
    try:
        return CausalSettings(int(recorded["n_boot_causal"]), float(recorded["level"]),
                              int(recorded["boot_seed"]), int(recorded["tie_completions"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CausalDataError(f"recorded settings lack the causal bootstrap's ({exc}); expected "
                              "n_boot_causal, level, boot_seed and tie_completions") from exc


def prompt_resample(boot_seed: int, seed: int, task: str, n_boot: int,
                    n_prompts: int) -> np.ndarray:
    """``(n_boot, n_prompts)`` resampled prompt indices of one (seed, task).

    Drawn from ``(boot_seed, seed, task, "prompts")`` only, so every method of every evaluation
    gets the same resample: causal scores of two entries are paired.
    """
    return _rng(boot_seed, seed, task, "prompts").integers(0, n_prompts, (n_boot, n_prompts))


def replicates(prompt_deltas: dict, inputs: dict, seed: int, task: str, name: str,
               settings: CausalSettings = DEFAULT_SETTINGS) -> tuple[float, np.ndarray]:
    """A method's causal score on one (seed, task) and its bootstrap replicates.

    The one place the causal score's statistics live: the evaluator calls it for every method,
    the leaderboard for every entry, from the numbers ``results.json`` stores.

    With ``d[k, r, j]`` the change of the behavior probability on prompt ``j`` when removing
    tie completion ``r`` of the method's set at k, ``o[j]`` the bonus-off change, ``e[k, i]``
    the shipped random sets' effects and ``w`` the log-k weights (:func:`k_weights`):

    * point: ``sum_k w_k mean_r mean_j d[k, r, j] / mean_j o[j]``;
    * replicate b: ``sum_k w_k (mean_{r in R_b} mean_{j in J_b} d[k, r, j] + eps_bk) /
      mean_{j in J_b} o[j]`` with ``J_b`` the shared prompt resample (:func:`prompt_resample`),
      ``eps_bk`` a centred random-set effect drawn for this method and k, and ``R_b`` a resample
      of the tie completions (only when there are several).

    Args:
        prompt_deltas: encoded ``(K, R, P)`` per-prompt changes (:func:`encode_array`).
        inputs: :func:`reference_inputs` of the (seed, task).
        seed, task, name: where and whose (they seed the resamples).
        settings: bootstrap settings.

    Returns:
        ``(point, (n_boot,) replicates)``.

    Raises:
        CausalDataError: shapes that do not fit the grid or the prompts.
    """
    d = decode_array(prompt_deltas)
    off = decode_array(inputs["bonus_off_prompt_delta"])
    eff = decode_array(inputs["random_effects"])
    fr = inputs["k_fractions"]
    w = k_weights(fr)
    K, P = len(w), off.size
    if d.ndim != 3 or d.shape[0] != K or d.shape[2] != P or d.shape[1] < 1 or \
            eff.ndim != 2 or eff.shape[0] != K:
        raise CausalDataError(f"{name!r} on seed {seed} task {task}: prompt deltas of shape "
                              f"{list(d.shape)} and random effects of shape {list(eff.shape)} "
                              f"do not fit a grid of {K} sizes and {P} prompts; expected "
                              f"({K}, R, {P}) and ({K}, n)")
    den_point = float(off.mean())
    point = float(np.dot(w, d.mean(axis=(1, 2)))) / den_point
    B = settings.n_boot
    idx = prompt_resample(settings.boot_seed, seed, task, B, P)
    den = off[idx].mean(axis=1)
    out = np.zeros(B)
    for k in range(K):
        per = d[k][:, idx].mean(axis=-1)  # (R, B)
        R = per.shape[0]
        if R == 1:
            num = per[0]
        else:
            ridx = _rng(settings.boot_seed, seed, task, name, "ties", k).integers(0, R, (B, R))
            num = per[ridx, np.arange(B)[:, None]].mean(axis=1)
        n = eff.shape[1]
        nidx = _rng(settings.boot_seed, seed, task, name, "noise", k).integers(0, max(n, 1), B)
        eps = (eff[k] - eff[k].mean())[nidx] if n else 0.0
        out += w[k] * (num + eps) / den
    return point, out


def mean_over_seeds(points: list[float], samples: list[np.ndarray],
                    level: float = 0.95) -> dict:
    """Mean of per-seed scores with the interval of the mean of independent replicates."""
    return interval(float(np.mean(points)), np.mean(np.stack(samples), axis=0), level)




# ----------------------------------------------------------------------------------------------
# the random reference and measurable cells (docs/evaluation.md)

#: the random reference's statistic, recorded beside it in results
RANDOM_REFERENCE = ("mean of the random removal sets' causal scores; replicates add the sampling "
                    "error of that mean (a bootstrap over the sets, scaled by sqrt(n/(n-1)))")


def _inputs_arrays(inputs: dict, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    off = decode_array(inputs["bonus_off_prompt_delta"]).reshape(-1)
    eff = decode_array(inputs["random_effects"])
    w = k_weights(inputs["k_fractions"])
    if eff.ndim != 2 or eff.shape[0] != w.size or eff.shape[1] < 1:
        raise CausalDataError(f"{where}: random effects of shape {list(eff.shape)}; expected "
                              f"({w.size}, n) with n >= 1 random sets per k (a reference with "
                              "no random sets has no random reference: rebuild it)")
    return off, eff, w


def random_reference(inputs: dict, seed: int, task: str,
                     settings: CausalSettings = DEFAULT_SETTINGS) -> tuple[float, np.ndarray]:
    """The random reference of one (seed, task): what removing at random does, and replicates.

    The reference is a population statistic, the **mean** causal score of same-size random
    removal sets, never the largest of however many were drawn (a maximum rises with the number
    of sets; the mean does not, only its error shrinks). With ``e[k, i]`` the shipped sets'
    effects, ``o[j]`` the bonus-off change per prompt and ``w`` the log-k weights:

    * point: ``sum_k w_k mean_i e[k, i] / mean_j o[j]``;
    * replicate b: ``sum_k w_k (mean_i e[k, i] + delta_bk) / mean_{j in J_b} o[j]``, with
      ``J_b`` the shared prompt resample (:func:`prompt_resample`: paired with every method)
      and ``delta_bk`` the sampling error of the mean: the mean of a resample (with
      replacement) of the n sets minus the mean of all, times ``sqrt(n / (n - 1))`` (so its
      variance is the unbiased ``s^2 / n``; 0 with one set).

    A method's own replicates already carry one random set's centred effect as its training
    noise (:func:`replicates`), so ``method - reference`` carries the method's training noise
    and the error of the reference, and its interval does not widen or move with n beyond the
    shrinking error of the mean.

    Args:
        inputs: the stored inputs of the (seed, task) (``k_fractions``,
            ``bonus_off_prompt_delta``, ``random_effects``; a per-seed causal block has them).
        seed, task: where (they seed the resamples).
        settings: bootstrap settings.

    Returns:
        ``(point, (n_boot,) replicates)``.

    Raises:
        CausalDataError: no random set, or shapes that do not fit the grid.
    """
    off, eff, w = _inputs_arrays(inputs, f"seed {seed} task {task}")
    n = eff.shape[1]
    mean = eff.mean(axis=1)  # (K,)
    point = float(np.dot(w, mean)) / float(off.mean())
    B = settings.n_boot
    den = off[prompt_resample(settings.boot_seed, seed, task, B, off.size)].mean(axis=1)
    num = np.full(B, float(np.dot(w, mean)))
    if n > 1:
        scale = math.sqrt(n / (n - 1))
        for k in range(w.size):
            idx = _rng(settings.boot_seed, seed, task, "random-reference", k).integers(
                0, n, (B, n))
            num += w[k] * (eff[k][idx].mean(axis=1) - mean[k]) * scale
    return point, num / den


def bonus_off_interval(inputs: dict, seed: int, task: str,
                       settings: CausalSettings = DEFAULT_SETTINGS) -> dict:
    """The bonus-off effect of one (seed, task) with its interval ``{point, lo, hi}``.

    The change of the behavior probability when the task's bonus is switched off: replicates
    resample the prompts (:func:`prompt_resample`) and add one random set's centred effect at the
    largest k as training noise (the replay is one realisation of a chaotic training, as a
    method's is in :func:`replicates`).
    """
    off, eff, _ = _inputs_arrays(inputs, f"seed {seed} task {task}")
    B = settings.n_boot
    reps = off[prompt_resample(settings.boot_seed, seed, task, B, off.size)].mean(axis=1)
    last = eff[-1] - eff[-1].mean()
    reps = reps + last[_rng(settings.boot_seed, seed, task, "bonus-off-noise").integers(
        0, last.size, B)]
    return interval(float(off.mean()), reps, settings.level)


def measurability(bonus_off: dict, reference_margins: dict[str, dict],
                  tol: float = CROSS_MACHINE_TOLERANCE) -> dict:
    """Whether a (seed, task) cell shows an effect attribution can find (docs/evaluation.md).

    Measurable when both hold:

    1. the bonus-off effect is significant: its interval excludes 0 by more than ``tol``
       (``hi < -tol`` or ``lo > tol``);
    2. the stronger reference removal (the oracle's or provenance's, whichever has the higher
       causal score there) clears the random reference, paired: the interval of
       ``reference - random reference`` lies above ``tol`` (:func:`beats` passes).

    Elsewhere no estimator can be shown to find the effect (not even the labels do), so the
    cell is reported and gates nothing.

    Args:
        bonus_off: :func:`bonus_off_interval`.
        reference_margins: reference row name -> ``{point, lo, hi}`` of its causal score minus
            the random reference (paired); the rows present (oracle, provenance).
        tol: the cross-machine tolerance.

    Returns:
        ``{"measurable": bool, "measurable_reason": str, "bonus_off": {...}, "reference":
        name or None, "reference_margin": {...} or None}``.
    """
    out = {"bonus_off": dict(bonus_off), "reference": None, "reference_margin": None}
    significant = bonus_off["hi"] < -tol or bonus_off["lo"] > tol
    if reference_margins:
        best = max(reference_margins, key=lambda m: (reference_margins[m]["point"], m))
        out["reference"], out["reference_margin"] = best, dict(reference_margins[best])
    if not significant:
        why = (f"the bonus-off effect {bonus_off['point']:+.3f} [{bonus_off['lo']:+.3f}, "
               f"{bonus_off['hi']:+.3f}] is not significant (its interval reaches within {tol} "
               "of 0): there is no effect to attribute")
        return out | {"measurable": False, "measurable_reason": why}
    if out["reference"] is None:
        return out | {"measurable": False, "measurable_reason": "no reference removal (oracle "
                      "or provenance) in the causal reference: nothing shows the effect can be "
                      "found"}
    m = out["reference_margin"]
    iv = f"{m['point']:+.3f} [{m['lo']:+.3f}, {m['hi']:+.3f}]"
    if beats(m["lo"], m["hi"], tol) != PASS:
        return out | {"measurable": False, "measurable_reason": (
            f"the stronger reference removal ({out['reference']}) does not clear the random "
            f"reference: its margin {iv} does not lie above {tol}, so even the labels' removal "
            "is not told apart from removing at random")}
    return out | {"measurable": True, "measurable_reason": (
        f"the bonus-off effect is significant ({bonus_off['point']:+.3f}) and the "
        f"{out['reference']} removal clears the random reference by {iv}")}


# ----------------------------------------------------------------------------------------------
# the on-policy share (benchmark.causal.onpolicy)


def on_policy_share(on_policy: list[tuple[float, np.ndarray]],
                    fixed_data: list[tuple[float, np.ndarray]], level: float = 0.95) -> dict:
    """``1 - mean C_fix / mean C_on`` over cells, with its paired percentile interval.

    Args:
        on_policy: per cell (seed) ``(point, (B,) replicates)`` of the causal score ``C_on``
            (:func:`replicates`: prompts resampled, training noise added).
        fixed_data: per cell, the same of the fixed-data score ``C_fix`` (the log-k area of the
            fixed-data fractions; replicates on the same prompt resample, no training noise).
        level: interval coverage.

    Returns:
        ``{"share": {point, lo, hi}, "fixed_data_score": {...}, "on_policy_score": {...}}``
        (means over cells); the share's point is None where ``mean C_on`` is 0, and a
        replicate whose ``mean C_on`` is 0 is left out of its interval.

    Raises:
        ValueError: no cell, or the two lists differ in length.
    """
    if not on_policy or len(on_policy) != len(fixed_data):
        raise ValueError(f"on_policy_share needs one fixed-data score per on-policy score and at "
                         f"least one cell; got {len(on_policy)} and {len(fixed_data)}")
    on_p = float(np.mean([p for p, _ in on_policy]))
    fix_p = float(np.mean([p for p, _ in fixed_data]))
    on_r = np.mean(np.stack([np.asarray(r, np.float64) for _, r in on_policy]), axis=0)
    fix_r = np.mean(np.stack([np.asarray(r, np.float64) for _, r in fixed_data]), axis=0)
    ok = on_r != 0
    share_r = 1.0 - fix_r[ok] / on_r[ok]
    share = interval(1.0 - fix_p / on_p if on_p != 0 else float("nan"), share_r, level)
    share = {k: v if math.isfinite(v) else None for k, v in share.items()}  # JSON: null
    return {"share": share, "fixed_data_score": interval(fix_p, fix_r, level),
            "on_policy_score": interval(on_p, on_r, level)}

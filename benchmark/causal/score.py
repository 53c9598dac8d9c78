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

import base64
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.verdicts import FAIL, INCONCLUSIVE, MAX_WIDTH, NOT_RUN, PASS, combine

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
#: random tie completions per k where the top-k boundary cuts a block of equal scores; 1 adds no
#: replay and is an unbiased estimate whose spread the training-noise term already carries
#: (docs/causal.md, "Ties")
TIE_COMPLETIONS = 1
#: how a reference's method curves break ties (recorded in ``causal.json["ties"]``)
#: (recorded text, kept as shipped references hold it: the function is now score.tie_order)
FAIR_TIES = "fair: a seeded random order within ties (benchmark.causal.tie_order)"
#: fixed-point unit of the per-prompt numbers stored in results (:func:`encode_array`): values
#: within +-2.147 (probabilities and their changes lie in [-1, 1]) at a resolution of 1e-9
ARRAY_UNIT = 1e-9
ARRAY_ENCODING = "int32-le-base64"
#: causal fractions from replays on different CPUs differ by up to about 1e-4 (measured, see
#: docs/causal.md); a verdict decided by less than this margin is inconclusive, never
#: machine-dependent, and ``verify`` compares causal numbers within it
CROSS_MACHINE_TOLERANCE = 0.01
DEFAULT_CONTROLS = ("norm-only", "step-order")
REFERENCE_ROWS = ("oracle", "provenance")
STRONGEST = "strongest_control"


class CausalDataError(ValueError):
    """A stored causal curve or encoded array is malformed."""


# ----------------------------------------------------------------------------------------------
# the grid and its summary


def k_grid(gt_size: int, fractions=K_FRACTIONS) -> list[int]:
    """The removal sizes: ``ceil(f * gt_size)`` for f in ``fractions`` (at least 1)."""
    return [max(1, math.ceil(f * int(gt_size))) for f in fractions]


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
    """Whether a causal score is above the random band, for the precision items (3, 4).

    ``margin`` is the interval of (causal score - the band's top) on one seed. The score is **at
    or below the band** when the margin's upper end is below ``-tol`` (fail: precision items
    cannot pass), too close to call when it is within ``tol`` of 0 (inconclusive: a precision
    pass becomes inconclusive), and not capped (pass) otherwise.
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


def replicates(prompt_deltas: dict, inputs: dict, seed: int, task: str, name: str,
               settings: CausalSettings = CausalSettings()) -> tuple[float, np.ndarray]:
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


def evaluate_task_seed(ref: TaskReference, curves: dict[str, list[list[Removal]]],
                       estimator: str, settings: CausalSettings = CausalSettings(),
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
                "reason": "switching the bonus off changes nothing on this seed (no bonus was "
                          "paid): there is no effect to attribute"}, {}
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
    band = {"lo": float(min(fam)), "hi": float(max(fam)), "mean": float(np.mean(fam)),
            "scores": fam, "n_families": len(fam),
            "curve": [{"k": k, "fractions": [float(x) / e_off for x in eff[i]]}
                      for i, k in enumerate(ref.ks)]}
    comparisons, checks = {}, {}
    est = samples.get(estimator)
    if est is not None:
        margin = interval(est[0] - band["hi"], est[1] - band["hi"], settings.level)
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
             "reason": _reason(checks, comparisons), **inputs}
    return block, samples


def _reason(checks: dict, comparisons: dict) -> str:
    if not checks:
        return ""
    parts = []
    for name, v in checks.items():
        what = {"random_band": "the random band",
                STRONGEST: f"the strongest control "
                           f"({comparisons.get(STRONGEST, {}).get('control')})"}.get(name, name)
        parts.append(f"{v} vs {what}")
    return "; ".join(parts)


def mean_over_seeds(points: list[float], samples: list[np.ndarray],
                    level: float = 0.95) -> dict:
    """Mean of per-seed scores with the interval of the mean of independent replicates."""
    return interval(float(np.mean(points)), np.mean(np.stack(samples), axis=0), level)


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
                   settings: CausalSettings = CausalSettings(), workers: int = 2,
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
    from benchmark.causal.store import Job

    planned = plan_replays(release, scores, settings.tie_completions)
    if isinstance(planned, str):
        return {"verdict": NOT_RUN, "reason": planned}, {}
    refs, plan, jobs = planned
    store = open_store(release.path, release.manifest_sha256)
    timing = run_jobs(store, release.manifest_sha256, jobs, workers, progress, pool)
    bases: dict[int, dict] = {}
    curves: dict[tuple, dict] = {}
    cuts: dict[tuple, dict] = {}

    def removal(s: int, t: str, pos: tuple[int, ...]) -> Removal:
        ref = refs[(s, t)]
        shipped = ref.shipped()
        if pos in shipped:
            return shipped[pos]
        if not pos:
            return Removal((), ref.base, ref.base, "empty")
        if s not in bases:
            bases[s] = store.baseline(s)
        return Removal(pos, store.result(Job(s, t, pos, ref.window_end, ref.n_per_step)),
                       np.asarray(bases[s]["measures"][t], np.float64), "replayed")

    for (s, t, name), (sets, cut) in plan.items():
        curves.setdefault((s, t), {})[name] = [[removal(s, t, pos) for pos in comps]
                                               for comps in sets]
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
            entry["random_band"] = {
                "lo": float(np.mean([b["random_band"]["lo"] for b in seeds])),
                "hi": float(np.mean([b["random_band"]["hi"] for b in seeds]))}
        else:
            entry["scores"] = {}
        entry["verdict"] = combine(b["verdict"] for b in entry["per_seed"].values())
    suite = {}
    common = set.intersection(*(set(x) for x in samples.values())) if samples else set()
    for name in sorted(common):
        both = [x for t in samples for x in samples[t][name]]
        suite[name] = mean_over_seeds([p for p, _ in both], [r for _, r in both],
                                      settings.level)
    out = {"tasks": tasks, "suite": suite, "replay": {"mode": "batched", "threads": 1}}
    margins = band_margins(tasks, samples, estimator) if estimator in suite else []
    if margins:
        out["suite_vs_random"] = mean_over_seeds([p for p, _ in margins],
                                                 [r for _, r in margins], settings.level)
    return out, timing


def band_margins(tasks: dict, samples: dict, estimator: str) -> list[tuple[float, np.ndarray]]:
    """The estimator's item-10 margins over the random band's top, per scored (task, seed).

    For each (task, seed) with a causal score: ``(point - hi, replicates - hi)`` with ``hi`` the
    band's upper end there (``comparisons.random_band`` of the block, before its interval). Their
    mean over tasks and seeds (:func:`mean_over_seeds`) is the suite's paired estimator-minus-band
    margin, ``suite["vs_random"]``, which the live-draw gate of ``bt-bench verify`` reads.

    Args:
        tasks: ``{task: {"per_seed": {seed: block}}}`` of :func:`causal_results`.
        samples: ``{task: {method: [(point, (B,) replicates), ...]}}`` in the order of the
            blocks with methods (sorted seeds).
        estimator: whose margins.
    """
    out = []
    for t, entry in sorted(tasks.items()):
        blocks = [b for _, b in sorted(entry["per_seed"].items(), key=lambda kv: int(kv[0]))
                  if b["methods"]]
        for b, (p, r) in zip(blocks, samples.get(t, {}).get(estimator, []), strict=True):
            hi = b["random_band"]["hi"]
            out.append((p - hi, np.asarray(r) - hi))
    return out

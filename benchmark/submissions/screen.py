"""The screen of a season panel (issue 39): only draws whose every cell shows the planted effect.

Half the first season's cells carried no signal: on a draw where even the labels' removal is not
told apart from removing at random, every method, control and answer key lands on the random
reference, and a panel of such draws ranks nothing. So a panel admits a draw only when **every
(seed, task) cell is measurable from its causal reference alone** (the bonus-off effect is
significant, and the stronger of the oracle's and provenance's removals clears the random
reference, paired: :func:`benchmark.causal.score.cell_measurability`, the evaluator's own rule),
decided before any entry is scored on it. A draw that fails is replaced by the next id of a
sequence fixed by the season's seed (:func:`candidate_ids`), and the panel records every
candidate with its screen result, so anyone can replay the selection and nobody can choose
draws by how entries do on them.

The panel's **power** is stated with it (:func:`power_of`): the half-width of a paired difference
with the draws held fixed, and the smallest difference the panel can tell apart. At creation it
is the design power (:func:`design_power`: the oracle minus the random reference, from the
references alone); once entries are scored, the paired TracInCP - random difference.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

#: the screen's rule and settings, recorded in every panel file
SCREEN = {
    "rule": "every (seed, task) cell of the draw is measurable from its lean causal reference "
            "alone: the bonus-off effect's 95% interval excludes 0 by more than the tolerance, "
            "and the stronger of the oracle's and provenance's removals clears the random "
            "reference (paired 95% interval above the tolerance); decided before any entry is "
            "scored; a draw that fails is replaced by the next candidate id of the season seed's "
            "sequence",
    "function": "benchmark.causal.score.cell_measurability",
}
#: first entropy word of the candidate sequence (keeps it apart from other streams)
CANDIDATE_TAG = 0x5C2E_E7ED
#: normal quantiles of the power figures: two-sided 95% and 80% power
_Z975, _Z80 = 1.959963984540054, 0.8416212335729143


def screen_settings() -> dict:
    """:data:`SCREEN` with the bootstrap settings and tolerance it runs with."""
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE, DEFAULT_SETTINGS

    return SCREEN | {"tolerance": CROSS_MACHINE_TOLERANCE, "n_boot": DEFAULT_SETTINGS.n_boot,
                     "level": DEFAULT_SETTINGS.level, "boot_seed": DEFAULT_SETTINGS.boot_seed}


def candidate_ids(season_seed: str, n: int) -> list[int]:
    """The first ``n`` candidate draw ids of a season: distinct, a function of the seed alone.

    ``PCG64(SeedSequence([CANDIDATE_TAG, int(season_seed, 16)]))`` draws uniform integers in
    ``[0, 2**31)`` (numpy guarantees the stream across versions and machines), repeats skipped.

    Raises:
        ValueError: ``season_seed`` is not hex digits.
    """
    from benchmark.live import DRAW_ID_RANGE

    if not season_seed or any(c not in "0123456789abcdef" for c in season_seed):
        raise ValueError(f"season seed {season_seed[:40]!r}: expected lowercase hex digits")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [CANDIDATE_TAG, int(season_seed, 16)])))
    out: list[int] = []
    while len(out) < n:
        d = int(rng.integers(0, DRAW_ID_RANGE))
        if d not in out:
            out.append(d)
    return out


def _cells(release_dir: str | Path):
    """``("<seed>/<task>", TaskReference)`` of every cell of a release's causal reference."""
    from benchmark.causal.score import load_reference, task_reference
    from benchmark.releases.release import load_release

    rel = load_release(release_dir, verify=False)
    for s in rel.seeds:
        raw = load_reference(rel.path, s)
        if raw is None:
            raise FileNotFoundError(f"{rel.path}/seed{s}: no causal reference to screen")
        for t in sorted(raw["tasks"]):
            yield f"{s}/{t}", task_reference(raw, t)


def screen_release(release_dir: str | Path) -> dict:
    """Screen one draw's release: ``{"accepted", "reason", "cells": {cell: record}}``.

    Each cell's record is its measurability (``measurable``, ``reason``, ``bonus_off``,
    ``reference``, ``reference_margin``); the draw is accepted when every cell is measurable.
    Reads only the draw's causal reference (no estimator is involved).
    """
    from benchmark.causal.score import DEFAULT_SETTINGS, cell_measurability

    cells = {}
    for name, ref in _cells(release_dir):
        m = cell_measurability(ref, DEFAULT_SETTINGS)
        cells[name] = {"measurable": bool(m["measurable"]), "reason": m["measurable_reason"],
                       "bonus_off": m["bonus_off"], "reference": m["reference"],
                       "reference_margin": m["reference_margin"]}
    bad = {c: r for c, r in cells.items() if not r["measurable"]}
    if not cells:
        return {"accepted": False, "reason": "the draw has no task cell", "cells": {}}
    if bad:
        why = "; ".join(f"{c}: {r['reason']}" for c, r in sorted(bad.items()))
        return {"accepted": False, "reason": f"{len(bad)} of {len(cells)} cells not measurable "
                f"({why})", "cells": cells}
    return {"accepted": True, "reason": f"all {len(cells)} cells measurable", "cells": cells}


def power_of(point: float, reps: np.ndarray, level: float = 0.95,
             tol: float | None = None) -> dict:
    """The power figures of a paired difference with replicates ``reps`` (draws held fixed).

    Returns ``{"point", "lo", "hi", "half_width", "sd", "detectable", "detectable_80"}``:
    ``half_width`` is half the percentile interval's width; ``detectable = half_width + tol``,
    the smallest true difference whose interval at this width lies above the cross-machine
    tolerance (told apart about half the time); ``detectable_80 = (z_0.975 + z_0.80) sd + tol``,
    the difference told apart with 80% probability (normal approximation, ``sd`` the replicates'
    standard deviation). Units: causal-score units (fractions of the bonus-off effect).
    """
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE, interval

    tol = CROSS_MACHINE_TOLERANCE if tol is None else tol
    reps = np.asarray(reps, np.float64)
    iv = interval(point, reps, level)
    half = (iv["hi"] - iv["lo"]) / 2
    sd = float(np.std(reps, ddof=1)) if reps.size > 1 else math.nan
    return iv | {"half_width": half, "sd": sd, "detectable": half + tol,
                 "detectable_80": (_Z975 + _Z80) * sd + tol}


def reference_margins(release_dir: str | Path, row: str = "oracle"
                      ) -> tuple[float, np.ndarray] | None:
    """A reference row's causal score minus the random reference over a draw's cells, paired.

    The mean over the draw's cells of ``row - random reference`` (each cell's replicates as the
    evaluator draws them), or None when no cell has the row.
    """
    from benchmark.causal.score import (
        DEFAULT_SETTINGS,
        encode_array,
        random_reference,
        reference_inputs,
        replicates,
    )

    out = []
    for _, ref in _cells(release_dir):
        if row not in ref.methods or ref.off_effect == 0.0:
            continue
        inputs = reference_inputs(ref)
        enc = encode_array(np.stack([np.stack([r.probs - r.base]) for r in ref.methods[row]]))
        p, r = replicates(enc, inputs, ref.seed, ref.task, row, DEFAULT_SETTINGS)
        rp, rr = random_reference(inputs, ref.seed, ref.task, DEFAULT_SETTINGS)
        out.append((p - rp, r - rr))
    if not out:
        return None
    return float(np.mean([p for p, _ in out])), np.mean(np.stack([r for _, r in out]), axis=0)


def design_power(release_dirs: list[Path]) -> dict | None:
    """The panel's power before any entry is scored: the oracle minus the random reference.

    The mean over the draws of :func:`reference_margins` (draws held fixed), with
    :func:`power_of`'s figures: how precisely this panel measures a paired difference of the
    size that separates the labels' removal from random removal.
    """
    per = [m for m in (reference_margins(p) for p in release_dirs) if m is not None]
    if not per:
        return None
    point = float(np.mean([p for p, _ in per]))
    return {"pair": "oracle - random reference", "n_draws": len(per)} | power_of(
        point, np.mean(np.stack([r for _, r in per]), axis=0))

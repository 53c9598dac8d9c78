"""Speed of the vectorized cluster bootstrap against the obvious per-resample loop.

Prints, for a 1,248-row generation draw (156 groups x 8, the paper's Table 3 layout), the time of
5,000 vectorized resamples and the ratio to an explicit loop that rebuilds every resample (timed on
fewer resamples, per resample). Run: ``python benchmarks/metrics_speed.py``.
"""

from __future__ import annotations

import time

import numpy as np

from benchmark import metrics as M


def explicit_loop(scores, labels, groups, counts, covariate=None):
    out = []
    uniq = np.unique(groups)
    index = [np.flatnonzero(groups == g) for g in uniq]
    for c in counts:
        rows, new_g = [], []
        label = 0
        for idx, k in zip(index, c, strict=True):
            for _ in range(k):
                rows.append(idx)
                new_g.append(np.full(idx.size, label))
                label += 1
        r, g = np.concatenate(rows), np.concatenate(new_g)
        s = scores[r]
        if covariate is not None:
            s = M.residualize_within_group(s, covariate[r], g)
        out.append(M.within_group_auc(s, labels[r], g)[0])
    return np.array(out)


def bench(name, fn, repeat=3):
    best = min(_timed(fn) for _ in range(repeat))
    return name, best


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(156), 8)
    labels = rng.random(groups.size) < 0.82
    fluency = rng.normal(size=groups.size)
    scores = rng.normal(size=groups.size) + 0.3 * labels + 0.5 * fluency
    n_boot, n_loop = 5000, 100
    counts = M.bootstrap_counts(156, n_loop, seed=0)
    rows = []
    for label, cov in (("raw AUC", None), ("residualized AUC (slope refit)", fluency)):
        _, t_vec = bench(label, lambda c=cov: M.auc_bootstrap(
            scores, labels, groups, covariate=c, n_boot=n_boot, seed=0))
        _, t_loop = bench(label, lambda c=cov: explicit_loop(scores, labels, groups, counts, c), 1)
        per_vec, per_loop = t_vec / n_boot, t_loop / n_loop
        rows.append((label, t_vec, per_loop * n_boot, per_loop / per_vec))
    t_prec = min(_timed(lambda: M.precision_bootstrap(scores, labels, groups, n_boot=n_boot))
                 for _ in range(2))
    print(f"cluster bootstrap, {groups.size} rows in {156} groups, {n_boot} resamples")
    print(f"{'statistic':34s} {'vectorized s':>12s} {'loop s (extrap.)':>17s} {'speed-up':>9s}")
    for label, tv, tl, ratio in rows:
        print(f"{label:34s} {tv:12.3f} {tl:17.2f} {ratio:8.0f}x")
    print(f"{'precision@|GT| (ties)':34s} {t_prec:12.3f}")


if __name__ == "__main__":
    main()

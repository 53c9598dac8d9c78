"""The metagradient entry (submissions/metagradient): its replay is the engine's fixed-data replay,
and its derivative is the finite difference of that replay.

The finite differences run the benchmark's own engine (``benchmark.build.stacked``: another
forward, the fused AdamW kernel), not the entry's code: a weight ``1 +- eps`` on one rollout's
loss term is its advantage scaled by ``1 +- eps`` (the term is linear in the advantage), with
every rollout held at its recorded tokens.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch

from benchmark.contract import load_estimator_file
from tests.conftest import REPO_ROOT

ENTRY = REPO_ROOT / "submissions" / "metagradient" / "estimator.py"
TASK = "vkwjp"  # micro: window 1..4, so every step's rollouts reach the measure at step 4
U = 2.0 ** -53  # float64 unit roundoff
#: finite-difference steps of a weight (weights are 1); each check takes the step whose derived
#: tolerance is smallest (curvature wants a small step, rounding a large one)
EPS = (1e-4, 1e-5, 1e-6)


@pytest.fixture(scope="module")
def entry():
    loaded = load_estimator_file(ENTRY)
    est = loaded.instantiate()
    return est, sys.modules[type(est).__module__]


@pytest.fixture(scope="module")
def view(micro_release):
    from benchmark.releases.data import load_view

    return load_view(micro_release, seed=0, task=TASK, track="open")


@pytest.fixture(scope="module")
def replay(entry, view):
    est, _ = entry
    return est.replay(view)


@pytest.fixture(scope="module")
def measure(entry, view):
    est, mod = entry
    return mod.Measurement(view, est._tokenizer(view), 128)


def _engine_theta(micro_release, names, scale: dict[int, float] | None = None,
                  reverse: bool = False) -> torch.Tensor:
    """The engine's fixed-data replay to the run's end, advantages scaled by ``scale``."""
    from benchmark.build import stacked as S
    from benchmark.build.replay import ReplaySeed, recorded_responses

    seed_dir = micro_release / "seed0"
    sr = S.StackedReplay.of_seed(ReplaySeed(seed_dir, precision="float64"), reverse_rows=reverse)
    rec = recorded_responses(seed_dir)
    nps = sr.cfg.prompts_per_step * sr.cfg.group_size
    stack = S.Stack.of([sr.start])
    for t in range(sr.cfg.steps):
        adv = sr.advantages(t, rec[t], frozenset(), None)
        for i, w in (scale or {}).items():
            if i // nps == t:
                adv[i % nps] *= w
        sr.update(stack, t, [rec[t]], [adv])
    return torch.cat([stack.params[n][0].reshape(-1) for n in names])


def _f(measure, replay, theta) -> float:
    with torch.no_grad():
        return float(measure(replay.model, theta))


def test_the_entrys_replay_is_the_engines_fixed_data_replay(micro_release, replay, view):
    """Same trajectory as ``run_batch(fixed=...)`` and the step-by-step engine, to rounding.

    Both replay the same float64 arithmetic in other orders (their own forward, AdamW by
    formula vs the fused kernel): each update differs by a few ulps of the parameters (|theta|
    <= ~1, so ~1e-16), and four AdamW updates amplify a difference in g by at most
    lr / (sqrt(v) + eps) per unit: 1e-12 is loose by orders of magnitude (measured 3e-16).
    """
    from benchmark.build import stacked as S
    from benchmark.build.replay import ReplaySeed, recorded_responses

    steps = view.n_steps
    mine = replay.state(steps)[0]
    theirs = _engine_theta(micro_release, replay.model.names)
    assert float((mine - theirs).abs().max()) <= 1e-12
    seed_dir = micro_release / "seed0"
    sr = S.StackedReplay.of_seed(ReplaySeed(seed_dir, precision="float64"))
    out = S.run_batch(sr, [], save_states=[steps - 1], measure_base={steps: (TASK,)},
                      fixed=recorded_responses(seed_dir))
    before_last = out["states"][steps - 1]["params"]
    flat = torch.cat([before_last[n].reshape(-1) for n in replay.model.names])
    assert float((replay.state(steps - 1)[0] - flat).abs().max()) <= 1e-12
    # the entry's per-rollout log-probs are the build's (fluency: float32 arithmetic, ~1e-7)
    b = next(x for x in replay.batches if x is not None)
    t = int(view.steps[b.rollouts[0]])
    with torch.no_grad():
        lbar = b.lbar(replay.model, replay.state(t)[0]).numpy()
    assert np.abs(lbar - np.asarray(view.fluency)[b.rollouts]).max() <= 1e-5


def _central(F, eps: float) -> float:
    return (F(1 + eps) - F(1 - eps)) / (2 * eps)


def _tolerance(F, steps=EPS) -> tuple[float, float, float]:
    """``(D(eps), D(2 eps), tol)`` for the central difference ``D`` of ``F`` at 1.

    Computed for each eps of ``steps``; the one with the smallest ``tol`` is returned.

    ``D(eps) = F'(1) + eps^2 F'''/6 + (rounding of two F values) / (2 eps)``. The curvature term
    is measured by Richardson's step doubling, ``D(2 eps) - D(eps) = 3 eps^2 F'''/6``, so
    ``eps^2 |F'''| / 6 ~= |D(2 eps) - D(eps)| / 3``, doubled for F''' varying over
    ``[1 - 2 eps, 1 + 2 eps]``. Rounding: each F is a float64 replay whose value carries at most
    ``r = 2^10 u |F|`` (1,024 ulps; another summation order moves it by less on these runs),
    so the two values add at most ``2 r / (2 eps)`` to D and as much again to the curvature
    estimate: ``tol = 2 |D(2 eps) - D(eps)| / 3 + 3 r / eps``. The metagradient's own rounding
    (one reverse pass, relative ~1e-13) is far below.
    """
    r = 2.0 ** 10 * U * abs(F(1.0))
    best = None
    for eps in steps:
        d1, d2 = _central(F, eps), _central(F, 2 * eps)
        tol = 2 * abs(d2 - d1) / 3 + 3 * r / eps
        if best is None or tol < best[2]:
            best = (d1, d2, tol)
    return best


def test_metagradient_is_the_finite_difference_of_the_fixed_data_replay(
        micro_release, entry, view, replay, measure):
    """d f(theta_H) / d w_i against finite differences of the engine's replay, per step.

    The checked rollouts: the largest |derivative| at every step (step 0 included, where AdamW's
    first update is nearly a sign: the curvature there is why eps is small).
    """
    _, mod = entry
    horizon = view.n_steps
    mg = replay.metagradient(measure, horizon, view.n)
    names = replay.model.names
    steps = np.asarray(view.steps)
    picked = []
    for t in range(horizon):
        idx = np.flatnonzero((steps == t) & (mg != 0))
        if idx.size:
            picked.append(int(idx[np.argmax(np.abs(mg[idx]))]))
    assert len(picked) >= 3, "the micro run has too few steps with a gradient to test"
    for i in picked:
        def F(w, i=i):
            return _f(measure, replay, _engine_theta(micro_release, names, {i: w}))

        d1, d2, tol = _tolerance(F)
        assert tol <= 1e-3 * abs(mg[i]), (i, mg[i], d1, d2, tol)  # the check has teeth
        assert abs(mg[i] - d1) <= tol, (i, int(steps[i]), mg[i], d1, d2, tol)


def test_clipped_metagradient_is_the_finite_difference_of_the_clipped_replay(entry, view):
    """With ``grad_clip`` on, the derivative goes through the clip as training applied it.

    The clip is set between the two smallest step-gradient norms so that it scales some
    updates and not others; the finite differences run the entry's own forward replay with the
    clip (the engine has no clipping; its forward is checked against the engine above).
    """
    est, mod = entry
    base = est.replay(view)
    norms = [float(torch.linalg.vector_norm(base.grad(t, base.state(t)[0])))
             for t in range(view.n_steps) if base.batches[t] is not None]
    low = sorted(norms)
    clip = (low[0] + low[1]) / 2  # the smallest update is left alone, the others are scaled
    clipped_view = dataclasses.replace(view, optimizer={**view.optimizer, "grad_clip": clip})
    rep = est.replay(clipped_view)
    assert rep.clip == clip
    factors = [rep.clip_factor(rep.grad(t, rep.state(t)[0]))[0]
               for t in range(view.n_steps) if rep.batches[t] is not None]
    assert min(factors) < 1.0 and max(factors) == 1.0, factors
    f = mod.Measurement(view, est._tokenizer(view), 128)
    horizon = view.n_steps
    mg = rep.metagradient(f, horizon, view.n)
    plain = base.metagradient(f, horizon, view.n)
    steps = np.asarray(view.steps)

    def F(w, i):
        b = rep.batches[int(steps[i])]
        r = int(np.flatnonzero(b.rollouts == i)[0])
        old = b.coef.clone()
        b.coef[r] = old[r] * w
        try:
            st = rep.saved[0]
            for t in range(horizon):
                st = rep.step(t, st)
        finally:
            b.coef.copy_(old)
        return _f(f, rep, st[0])

    checked = 0
    for t in range(1, horizon):
        idx = np.flatnonzero((steps == t) & (mg != 0))
        if not idx.size:
            continue
        i = int(idx[np.argmax(np.abs(mg[idx]))])
        d1, d2, tol = _tolerance(lambda w, i=i: F(w, i))
        assert tol <= 1e-3 * abs(mg[i]), (i, mg[i], d1, d2, tol)
        assert abs(mg[i] - d1) <= tol, (i, t, mg[i], d1, d2, tol)
        checked += 1
    assert checked >= 2
    assert not np.allclose(mg, plain, rtol=1e-3, atol=0)  # the clip changes the derivative


def test_step_scores_are_sums_of_rollout_scores(micro_release, entry):
    from benchmark.releases.data import load_view

    est, _ = entry
    rv = load_view(micro_release, seed=0, task=TASK, track="open")
    sv = load_view(micro_release, seed=0, task=TASK, track="open", granularity="step")
    per = est.score_rollouts(rv)
    assert per.shape == (rv.n,) and np.all(np.isfinite(per))
    assert np.all(per[np.asarray(rv.advantages) == 0] == 0)
    steps = est.score_rollouts(sv)
    assert np.array_equal(steps, np.bincount(np.asarray(sv.rollout_unit), weights=per,
                                             minlength=sv.n))


def test_bonus_horizon_is_the_last_paid_step_plus_one(entry):
    """On tiny's views the horizon lands in the last few steps of each task's bonus window."""
    from benchmark.releases.data import load_view
    from benchmark.releases.release import load_release

    _, mod = entry
    rel = load_release("tiny")
    for task in rel.tasks:
        v = load_view("tiny", seed=0, task=task, track="open")
        end = rel.seed(0).behavior(task)["window_end"]
        assert end - 8 <= mod.bonus_horizon(v) <= end, (task, mod.bonus_horizon(v), end)


def test_a_bad_horizon_or_optimizer_is_named(entry, view):
    est, mod = entry
    bad = type(est)(horizon="middle")
    with pytest.raises(ValueError, match="horizon='middle'"):
        bad.score_rollouts(view)
    with pytest.raises(ValueError, match="'SGD'"):
        est.replay(dataclasses.replace(view, optimizer={**view.optimizer, "name": "SGD"}))

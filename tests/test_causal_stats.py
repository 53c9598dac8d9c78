"""The random reference and measurable cells (benchmark.causal.stats): hand cases, invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmark.causal import score as C
from benchmark.causal import stats as S


def _inputs(effects, off, fractions=(1.0,)) -> dict:
    return {"k_fractions": list(fractions),
            "bonus_off_prompt_delta": S.encode_array(np.asarray(off, float)),
            "random_effects": S.encode_array(np.asarray(effects, float))}


def test_random_reference_is_the_mean_with_the_standard_error_of_the_mean():
    """One k, 4 sets with effects -0.1, 0.1, 0, 0 and a constant bonus-off change -0.5 (so every
    prompt resample has the same denominator): point = mean / -0.5 = 0; the replicates' variance
    is the unbiased s^2 / n = (0.02 / 3) / 4 over 0.5^2, sd 0.0816."""
    settings = S.CausalSettings(n_boot=20000)
    point, reps = S.random_reference(_inputs([[-0.1, 0.1, 0.0, 0.0]], [-0.5] * 16), 0, "t",
                                     settings)
    assert point == pytest.approx(0.0, abs=1e-12)
    assert reps.shape == (20000,)
    assert np.std(reps) == pytest.approx(math.sqrt(0.02 / 3 / 4) / 0.5, rel=0.03)
    assert np.mean(reps) == pytest.approx(0.0, abs=0.003)
    # one set: the mean is that set, with no spread to carry
    p1, r1 = S.random_reference(_inputs([[-0.1]], [-0.5] * 4), 0, "t")
    assert p1 == pytest.approx(0.2) and np.allclose(r1, 0.2)


def test_the_reference_does_not_rise_with_the_number_of_sets_a_maximum_does():
    """The same population of set effects (evenly spread, mean -0.05): 4 of them or 64 give the
    same reference (the mean), while the largest fraction grows from 4 to 64 sets."""
    pop = np.linspace(-0.15, 0.05, 64)
    few = pop[::16]  # 4 sets spread over the same population
    shift = pop.mean() - few.mean()
    few = few + shift  # the same population mean
    off = [-0.5] * 8
    p4, r4 = S.random_reference(_inputs([few], off), 1, "t")
    p64, r64 = S.random_reference(_inputs([pop], off), 1, "t")
    assert p4 == pytest.approx(p64, abs=1e-8) == pytest.approx(0.1, abs=1e-8)
    assert max(few / -0.5) < max(pop / -0.5)  # the old band top grows with n
    assert np.std(r64) < np.std(r4)  # only the error of the mean shrinks


def test_random_reference_invariants_permuting_sets_and_rescaling_effects():
    rng = np.random.default_rng(3)
    eff = rng.normal(-0.01, 0.02, (3, 8))
    off = rng.normal(-0.4, 0.05, 32)
    fr = (0.25, 0.5, 1.0)
    p, r = S.random_reference(_inputs(eff, off, fr), 2, "t")
    # permuting the sets leaves the point (a mean) unchanged
    pp, rp = S.random_reference(_inputs(eff[:, ::-1], off, fr), 2, "t")
    assert pp == pytest.approx(p, abs=1e-7)
    assert np.std(rp) == pytest.approx(np.std(r), rel=0.1)
    # rescaling every change (sets and bonus-off) by 0.5 leaves the fractions unchanged
    ps, rs = S.random_reference(_inputs(eff * 0.5, off * 0.5, fr), 2, "t")
    assert ps == pytest.approx(p, abs=1e-6) and np.allclose(rs, r, atol=1e-5)


def test_random_reference_names_a_reference_without_sets():
    with pytest.raises(S.CausalDataError, match=r"random effects of shape \[1, 0\].*rebuild"):
        S.random_reference(_inputs(np.zeros((1, 0)), [-0.5]), 0, "t")


def test_bonus_off_interval_carries_prompts_and_training_noise():
    """Constant per-prompt change -0.3 and sets -0.02, 0.02: point -0.3, replicates -0.3 +- 0.02."""
    iv = S.bonus_off_interval(_inputs([[-0.02, 0.02]], [-0.3] * 10), 0, "t")
    assert iv["point"] == pytest.approx(-0.3)
    assert (iv["lo"], iv["hi"]) == pytest.approx((-0.32, -0.28))


def _iv(point, lo, hi):
    return {"point": point, "lo": lo, "hi": hi}


@pytest.mark.parametrize("off, margins, measurable, says", [
    # tiny 3.0 qzxbt seed 0: a large effect, the oracle clears the reference by 0.154..0.187
    (_iv(-.59, -.62, -.56), {"oracle": _iv(.171, .154, .187), "provenance": _iv(.063, .048, .079)},
     True, "oracle removal clears"),
    # vkwjp seed 2: the oracle does not, provenance (the stronger there) does
    (_iv(-.38, -.47, -.31), {"oracle": _iv(.004, -.106, .111), "provenance": _iv(.183, .068, .292)},
     True, "provenance removal clears"),
    # zorp seed 1: neither reference removal clears the random reference
    (_iv(-.25, -.29, -.22), {"oracle": _iv(.047, -.010, .121), "provenance": _iv(-.03, -.09, .05)},
     False, "oracle) does not clear"),
    # a reference within the cross-machine tolerance of the random reference: not measurable
    (_iv(-.25, -.29, -.22), {"oracle": _iv(.05, .009, .09)}, False, "does not clear"),
    # no significant bonus-off effect: nothing to attribute
    (_iv(-.02, -.05, .01), {"oracle": _iv(.5, .4, .6)}, False, "not significant"),
    (_iv(-.2, -.3, -.1), {}, False, "no reference removal"),
])
def test_measurability_rule(off, margins, measurable, says):
    m = S.measurability(off, margins)
    assert m["measurable"] is measurable and says in m["measurable_reason"]
    if margins:
        assert m["reference"] == max(margins, key=lambda k: margins[k]["point"])


def test_score_reexports_the_statistics():
    for name in ("replicates", "interval", "paired_difference", "CausalSettings", "settings_of",
                 "encode_array", "decode_array", "random_reference", "measurability",
                 "mean_over_seeds", "beats", "significance", "CausalDataError"):
        assert getattr(C, name) is getattr(S, name)


def test_band_margins_subtract_the_random_reference_of_each_block():
    """Two seeds of one task: blocks with stored inputs; each margin is the estimator's
    (point, replicates) minus that block's random reference, paired replicate by replicate."""
    settings = S.CausalSettings(n_boot=50)
    b1 = {"methods": {"e": {}}} | _inputs([[-0.1, 0.1, 0.0, 0.0]], [-0.5] * 8)
    b2 = {"methods": {"e": {}}} | _inputs([[-0.05, -0.05]], [-0.25] * 8)
    tasks = {"a": {"per_seed": {"2": b2, "1": b1}}, "b": {"per_seed": {"1": {"methods": {}}}}}
    e = [(0.5, np.full(50, 0.5)), (0.3, np.full(50, 0.3))]
    m = C.band_margins(tasks, {"a": {"e": e}}, "e", settings)
    r1 = S.random_reference(b1, 1, "a", settings)
    r2 = S.random_reference(b2, 2, "a", settings)
    assert [p for p, _ in m] == pytest.approx([0.5 - r1[0], 0.3 - r2[0]])
    assert r2[0] == pytest.approx(0.2)
    np.testing.assert_allclose(m[0][1], 0.5 - r1[1])
    np.testing.assert_allclose(m[1][1], 0.3 - r2[1])

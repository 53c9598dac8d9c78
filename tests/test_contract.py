"""The estimator contract: each broken estimator is rejected with a message that says the fix."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from benchmark.contract import (
    EstimatorContractError,
    check_estimator,
    load_estimator_file,
    validate_scores,
)
from tests.views import make_draw, make_view

HEADER = "import numpy as np\nfrom estimators.base import BaseEstimator\n"


def write(tmp_path, body, name="est.py"):
    p = tmp_path / name
    p.write_text(HEADER + textwrap.dedent(body))
    return p


def check(path):
    return check_estimator(load_estimator_file(path), [make_view(), make_view("step")],
                           [make_draw()])


GOOD = """
class Good(BaseEstimator):
    name = "good"
    tasks = ("rollouts", "draws")
    def __init__(self, scale: float = 1.0):
        self.scale = scale
    def score_rollouts(self, view):
        return self.scale * np.asarray(view.advantages, float)
    def score_draw(self, view, draw):
        return np.asarray(draw.fluency, float)
"""


def test_good_estimator_passes(tmp_path):
    report = check(write(tmp_path, GOOD))
    assert report.ok and len(report.checks) == 5


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("x = 1\n", r"expected exactly one estimator class .* found 0: none"),
        (GOOD + GOOD.replace("class Good", "class Other"),
         r"found 2: Good, Other\. Keep one estimator per file"),
        ("def f(:\n", r"est.py:\d+: syntax error"),
        ("import not_a_module_xyz\n", r"importing the file raised ModuleNotFoundError"),
        (GOOD.replace("return self.scale * np.asarray(view.advantages, float)",
                      "return np.zeros(3)"),
         r"Good.score_rollouts returned shape \(3,\); expected \(6,\)"),
        (GOOD.replace("return self.scale * np.asarray(view.advantages, float)",
                      "return np.full(view.n, np.nan)"),
         r"returned 6 non-finite scores .* every score must be finite"),
        (GOOD.replace("return self.scale * np.asarray(view.advantages, float)",
                      "view.sketches[0, 0] = 1.0\n        return np.zeros(view.n)"),
         r"tried to modify its input in place .* copy an array"),
        (GOOD.replace("return self.scale * np.asarray(view.advantages, float)",
                      "a = view.fluency; a.flags.writeable = True; a[0] = 9\n"
                      "        return np.zeros(view.n)"),
         r"modified its input view"),
        (GOOD.replace("return self.scale * np.asarray(view.advantages, float)",
                      "return np.random.default_rng().random(view.n)"),
         r"is not deterministic: .* seed any randomness from view.seed"),
        (GOOD.replace("self.scale = scale", "self._scale = scale"),
         r"does not store it as self.scale"),
        (GOOD.replace('name = "good"', "name = ''"), r"name must be a non-empty string"),
        (GOOD.replace('tasks = ("rollouts", "draws")', 'tasks = ("draws",)'),
         r"tasks must include 'rollouts'"),
        (GOOD.replace('tasks = ("rollouts", "draws")', 'tasks = ("rollout",)'),
         r"tasks must be a non-empty tuple drawn from"),
        (GOOD.replace('name = "good"', 'name = "good"\n    track = "secret"'),
         r"track must be one of \('gradient', 'open'\)"),
        (GOOD.replace("return np.asarray(draw.fluency, float)", "return ['a'] * draw.n"),
         r"score_draw returned dtype <U1"),
    ],
)
def test_broken_estimators_are_rejected(tmp_path, body, match):
    with pytest.raises(EstimatorContractError, match=match):
        check(write(tmp_path, body))


@pytest.mark.parametrize(("scores", "match"), [
    # numpy counts timedelta64 among the integers; it is a duration, not a score
    (np.arange(3).astype("m8[s]"), r"E\.score_rollouts returned dtype timedelta64\[s\]; return "
                                   r"a numeric numpy array of shape \(3,\)\.$"),
    (np.arange(3).astype("M8[D]"), r"returned dtype datetime64\[D\]; return a numeric"),
    (np.zeros(3, complex), r"returned dtype complex128; return a numeric"),
    # converting a masked array would drop the mask: the masked entry would rank as 0.0
    (np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False]),
     r"E\.score_rollouts returned a masked array \(numpy\.ma\.MaskedArray\); return a numeric "
     r"numpy array of shape \(3,\) \(a mask is not kept: fill the masked entries"),
    (np.ma.masked_array([1.0, 2.0, 3.0]), r"returned a masked array"),  # even with no mask set
])
def test_scores_must_be_real_numbers(scores, match):
    with pytest.raises(EstimatorContractError, match=match):
        validate_scores(scores, 3, "E", "score_rollouts")


def test_real_scores_of_every_numeric_kind_are_accepted():
    for scores in (np.array([1.5, 2, 3]), np.array([1, 2, 3], np.int8), np.array([1, 2, 3], "u8"),
                   np.array([True, False, True]), [1.0, 2.0, 3.0], np.float16([1, 2, 3])):
        out = validate_scores(scores, 3, "E", "m")
        assert out.dtype == np.float64 and out.tolist() == np.asarray(scores, float).tolist()


def test_missing_and_non_python_files(tmp_path):
    with pytest.raises(EstimatorContractError, match="estimator file not found"):
        load_estimator_file(tmp_path / "nope.py")
    p = tmp_path / "est.txt"
    p.write_text(GOOD)
    with pytest.raises(EstimatorContractError, match="expected a Python file ending in .py"):
        load_estimator_file(p)


def test_constructor_without_defaults(tmp_path):
    p = write(tmp_path, GOOD.replace("scale: float = 1.0", "scale: float"))
    with pytest.raises(EstimatorContractError, match="every constructor argument needs a default"):
        check(p)


def test_duck_typed_estimator_without_base_class(tmp_path):
    p = tmp_path / "duck.py"
    p.write_text("import numpy as np\nclass Duck:\n    name = 'duck'\n    track = 'gradient'\n"
                 "    tasks = ('rollouts',)\n    def score_rollouts(self, view):\n"
                 "        return -np.asarray(view.steps, float)\n")
    assert check(p).ok

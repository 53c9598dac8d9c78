"""Comparing a committed results tree with a recomputed one: :func:`compare_results`.

Verdicts, ids, counts and every other non-float value must be equal; floats match within
:data:`FLOAT_TOLERANCE`, numbers computed from training replays within :data:`CAUSAL_TOLERANCE`;
encoded arrays value by value. A difference is a :class:`Drift` named by its dotted path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Absolute tolerance for floats in ``verify``. The evaluation is deterministic (seeded controls
#: and bootstraps), but CPU BLAS libraries sum in a machine-dependent order, so a dot product can
#: differ in its last bits between machines; results are rounded to 10 digits before writing, so a
#: last-bit difference can flip the 10th digit. 1e-6 is far below any difference a metric reports
#: (precision steps are 1/|GT|, AUC steps 1/pairs) and far above rounding noise.
FLOAT_TOLERANCE = 1e-6
#: tolerance for numbers computed from training replays (the causal scores): replays run in
#: float64 and differ between CPUs by about 1e-12 (docs/causal.md measures it); the margin is the
#: checklist's own cross-machine tolerance, inside which a verdict is inconclusive anyway
CAUSAL_TOLERANCE = 0.01
#: top-level results keys that ``verify`` reports but does not fail on (machine-specific)
IGNORED_KEYS = ("packages",)
#: leaf keys reported but not failed on anywhere (machine-specific by definition)
IGNORED_LEAVES: tuple[str, ...] = ()
#: leaf keys never compared: explanations derived from verdicts and numbers that are compared
#: themselves (verify never compares strings that embed numbers)
DERIVED_TEXT = ("reason",)
#: drift lines shown per submission before the report is cut short
MAX_DRIFT_LINES = 40

@dataclass(frozen=True)
class Drift:
    """One value that differs between the committed and the recomputed results."""

    path: str
    committed: object
    recomputed: object

    def __str__(self) -> str:
        return (f"{self.path}: committed {_show(self.committed)}, "
                f"recomputed {_show(self.recomputed)}")


_ABSENT = object()


def _show(v: object) -> str:
    if v is _ABSENT:
        return "(absent)"
    if isinstance(v, dict | list):
        text = repr(v)
        return text if len(text) <= 60 else text[:57] + "..."
    return repr(v) if isinstance(v, str) else str(v)


def compare_results(committed: object, recomputed: object, tol: float = FLOAT_TOLERANCE,
                    _path: str = "") -> list[Drift]:
    """Every difference between two results trees, as dotted paths (list items by index).

    Floats (on either side, when the other is a number) match within ``tol``; everything else,
    including ints, strings, booleans and ``None``, must be equal. Missing keys are drifts.
    """
    out: list[Drift] = []
    from benchmark.causal.score import is_encoded_array

    if is_encoded_array(committed) or is_encoded_array(recomputed):
        return _compare_arrays(committed, recomputed, tol, _path)
    if isinstance(committed, dict) and isinstance(recomputed, dict):
        for k in sorted(set(committed) | set(recomputed), key=str):
            if k in DERIVED_TEXT:
                continue
            sub = f"{_path}.{k}" if _path else str(k)
            if k not in committed:
                out.append(Drift(sub, _ABSENT, recomputed[k]))
            elif k not in recomputed:
                out.append(Drift(sub, committed[k], _ABSENT))
            else:
                out += compare_results(committed[k], recomputed[k], tol, sub)
        return out
    if isinstance(committed, list) and isinstance(recomputed, list):
        if len(committed) != len(recomputed):
            return [Drift(f"{_path} (length)", len(committed), len(recomputed))]
        for i, (a, b) in enumerate(zip(committed, recomputed, strict=True)):
            label = _item_label(a, b, i)
            out += compare_results(a, b, tol, f"{_path}.{label}" if _path else label)
        return out
    numbers = (int, float)
    if (isinstance(committed, float) or isinstance(recomputed, float)) and \
            isinstance(committed, numbers) and isinstance(recomputed, numbers) and \
            not isinstance(committed, bool) and not isinstance(recomputed, bool):
        if _is_causal(_path):
            tol = max(tol, CAUSAL_TOLERANCE)
        if not math.isclose(committed, recomputed, rel_tol=0.0, abs_tol=tol):
            out.append(Drift(_path, committed, recomputed))
        return out
    if type(committed) is not type(recomputed) or committed != recomputed:
        out.append(Drift(_path, committed, recomputed))
    return out


#: drifts reported per encoded array before the rest are counted
MAX_ARRAY_DRIFTS = 3


def _compare_arrays(committed: object, recomputed: object, tol: float, path: str) -> list[Drift]:
    """Compare two encoded arrays (``benchmark.causal.score.encode_array``) by their numbers.

    Each value is compared as a float (within ``CAUSAL_TOLERANCE`` under a causal path), never
    the encoded string; a drift names the value's index, ``path[i, j, k]``.
    """
    from benchmark.causal.score import CausalDataError, decode_array

    try:
        a, b = decode_array(committed), decode_array(recomputed)
    except CausalDataError as exc:
        return [Drift(path, committed, f"(not a readable encoded array: {exc})")]
    if a.shape != b.shape:
        return [Drift(f"{path} (shape)", list(a.shape), list(b.shape))]
    if _is_causal(path):
        tol = max(tol, CAUSAL_TOLERANCE)
    bad = np.argwhere(~np.isclose(a, b, rtol=0.0, atol=tol))
    out = [Drift(f"{path}[{', '.join(str(int(i)) for i in idx)}]", float(a[tuple(idx)]),
                 float(b[tuple(idx)])) for idx in bad[:MAX_ARRAY_DRIFTS]]
    if len(bad) > MAX_ARRAY_DRIFTS:
        out.append(Drift(f"{path} (values differing)", f"{len(bad)} of {a.size}",
                         f"beyond the first {MAX_ARRAY_DRIFTS}"))
    return out


def _is_causal(path: str) -> bool:
    """Whether a results path holds a number computed from training replays."""
    return any(p in ("causal", "causal_score", "random_band", "vs_random")
               for p in path.split("."))


def _item_label(a: object, b: object, i: int) -> str:
    """List items are named by index, or by their ``key`` (checklist items) when both agree."""
    if isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("key"), str) \
            and a.get("key") == b.get("key"):
        return a["key"]
    return str(i)


#: order of top-level keys in a drift report: what a reader needs first
_REPORT_ORDER = ("verdict", "estimator", "release", "settings", "summary", "seeds", "checklist")


def _report_order(d: Drift) -> tuple[int, str]:
    top = d.path.split(".", 1)[0].split(" ", 1)[0]
    rank = _REPORT_ORDER.index(top) if top in _REPORT_ORDER else len(_REPORT_ORDER)
    return rank, d.path


"""pytest plugin: how much of each floating-point tolerance the suite's comparisons use.

Usage::

    BT_TOL_PROBE_OUT=probe.json [ATEN_CPU_CAPABILITY=avx2|default] \\
        python -m pytest -p benchmarks.tolerance_probe tests/...

Wraps ``np.testing.assert_allclose``, ``np.allclose``, ``torch.testing.assert_close``,
``torch.allclose``, ``math.isclose`` and ``pytest.approx`` (scalars, and every element of a
sequence) and records, per call site in ``tests/`` (``file:line``), the number of comparisons,
the largest absolute difference and the largest *used fraction* of the tolerance,
``|actual - expected| / (atol + rtol * |expected|)`` (1.0 = exactly at the bound; above 1 the
assertion fails). Each comparison still runs (and fails) as it would without the plugin. Plain
``assert x <= bound`` lines are not seen; ``benchmarks/dist_tolerance.py`` measures the
distributed build's. docs/testing.md tabulates the results per kernel width. A measurement
tool, not part of the suite.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

RECORD: dict[str, dict] = {}
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")


def _site() -> str | None:
    """``file:line`` of the test line that made the comparison (None: library code made it)."""
    f = sys._getframe(3)  # _site <- _note <- the wrapper <- its caller
    while f is not None and "_pytest" in f.f_code.co_filename:  # approx's sequence wrappers
        f = f.f_back
    if f is not None and f.f_code.co_filename.startswith(_TESTS):
        return f"{Path(f.f_code.co_filename).name}:{f.f_lineno}"
    return None


def _note(kind: str, actual, expected, atol: float, rtol: float) -> None:
    site = _site()
    if site is None:
        return
    try:
        a = np.asarray(_np(actual), dtype=np.float64)
        e = np.asarray(_np(expected), dtype=np.float64)
        a, e = np.broadcast_arrays(a, e)
        fin = np.isfinite(a) & np.isfinite(e)
        diff = np.abs(a - e)[fin]
        tol = (atol + rtol * np.abs(e))[fin]
    except (TypeError, ValueError):
        return
    if diff.size == 0:
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / tol)
    r = RECORD.setdefault(site, {"kind": kind, "calls": 0, "max_abs_diff": 0.0,
                                 "max_used": 0.0, "atol": atol, "rtol": rtol})
    r["calls"] += 1
    r["max_abs_diff"] = max(r["max_abs_diff"], float(diff.max()))
    r["max_used"] = max(r["max_used"], float(ratio.max()))


def _np(x):
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().double().cpu().numpy()
    except ImportError:
        pass
    return x


def _install() -> None:
    import _pytest.python_api as api
    import torch
    import torch.testing

    orig_np = np.testing.assert_allclose

    def assert_allclose(actual, desired, rtol=1e-7, atol=0, *a, **k):
        _note("np.testing.assert_allclose", actual, desired, atol, rtol)
        return orig_np(actual, desired, rtol, atol, *a, **k)

    np.testing.assert_allclose = assert_allclose

    orig_npc = np.allclose

    def np_allclose(a, b, rtol=1e-5, atol=1e-8, *x, **k):
        _note("np.allclose", a, b, atol, rtol)
        return orig_npc(a, b, rtol, atol, *x, **k)

    np.allclose = np_allclose

    orig_tc = torch.testing.assert_close

    def assert_close(actual, expected, *a, rtol=None, atol=None, **k):
        if rtol is None:  # torch's defaults by dtype
            dt = getattr(actual, "dtype", torch.float64)
            rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                          torch.float32: (1.3e-6, 1e-5)}.get(dt, (1e-7, 1e-7))
        _note("torch.testing.assert_close", actual, expected, atol, rtol)
        return orig_tc(actual, expected, *a, rtol=rtol, atol=atol, **k)

    torch.testing.assert_close = assert_close

    orig_ta = torch.allclose

    def t_allclose(input, other, rtol=1e-5, atol=1e-8, equal_nan=False):
        _note("torch.allclose", input, other, atol, rtol)
        return orig_ta(input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)

    torch.allclose = t_allclose

    orig_mi = math.isclose

    def isclose(a, b, *, rel_tol=1e-9, abs_tol=0.0):
        # math.isclose: |a-b| <= max(rel_tol * max(|a|, |b|), abs_tol)
        _note("math.isclose", a, b, abs_tol, rel_tol)
        return orig_mi(a, b, rel_tol=rel_tol, abs_tol=abs_tol)

    math.isclose = isclose

    orig_eq = api.ApproxScalar.__eq__

    def approx_eq(self, actual):
        try:
            tol = float(self.tolerance)
            if isinstance(actual, (int, float, np.floating, np.integer)) and \
                    isinstance(self.expected, (int, float, np.floating, np.integer)):
                _note("pytest.approx", actual, self.expected, tol, 0.0)
        except Exception:  # noqa: BLE001 -- a probe never changes a test's outcome
            pass
        return orig_eq(self, actual)

    api.ApproxScalar.__eq__ = approx_eq


def pytest_configure(config):
    _install()


def pytest_unconfigure(config):
    out = os.environ.get("BT_TOL_PROBE_OUT")
    if out:
        import torch

        meta = {"ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
                "capability": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads()}
        Path(out).write_text(json.dumps({"meta": meta, "sites": dict(sorted(RECORD.items()))},
                                        indent=1))

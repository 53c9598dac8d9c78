"""TRAK-style estimator: ridge-whitened inner products with the target.

``scores = Phi (Phi^T Phi + lambda I)^{-1} t`` where ``Phi`` stacks the unit sketches ``(n, d)``.
The ridge is stated relative to the data: ``lambda = ridge * ||Phi||_F^2 / r`` with
``r = min(n_nonzero, d)``, i.e. ``ridge`` times the mean non-zero eigenvalue of the Gram matrix.
(The paper divided by d, which with few non-zero rows left the solve almost unregularized.)
"""

from __future__ import annotations

import numpy as np

from estimators.base import BaseEstimator, RunView


class TRAK(BaseEstimator):
    """Ridge-whitened attribution; ``ridge`` is a fraction of the mean Gram eigenvalue."""

    name = "TRAK"

    def __init__(self, ridge: float = 0.1, target: str = "nll") -> None:
        self.ridge = ridge
        self.target = target

    def score_rollouts(self, view: RunView) -> np.ndarray:
        if not self.ridge > 0:
            raise ValueError(f"ridge must be > 0, got {self.ridge!r}; use e.g. 0.1.")
        t = view.target(self.target).astype(np.float64)
        nonzero = int((view.sketch_norms() > 0).sum())
        if nonzero == 0:
            return np.zeros(view.n)
        gram = view.sketch_gram()  # (d, d) Phi^T Phi, streamed
        d = gram.shape[0]
        lam = self.ridge * float(np.trace(gram)) / min(nonzero, d)
        # (Phi^T Phi + lam I) w = t, scores = Phi w (equal to the dual form for any n)
        w = np.linalg.solve(gram + lam * np.eye(d), t)
        return view.sketch_dot(w)

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
        phi = np.asarray(view.sketches, np.float64)
        t = view.target(self.target).astype(np.float64)
        nonzero = int((np.abs(phi).sum(axis=1) > 0).sum())
        if nonzero == 0:
            return np.zeros(view.n)
        lam = self.ridge * float((phi * phi).sum()) / min(nonzero, phi.shape[1])
        n, d = phi.shape
        if n >= d:  # primal: (Phi^T Phi + lam I) w = t, scores = Phi w
            w = np.linalg.solve(phi.T @ phi + lam * np.eye(d), t)
            return phi @ w
        # dual: (Phi Phi^T + lam I) s = Phi t
        return np.linalg.solve(phi @ phi.T + lam * np.eye(n), phi @ t)

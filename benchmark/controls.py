"""The built-in controls: the trusted estimator files scored beside every estimator, by track."""

from __future__ import annotations

from pathlib import Path

CONTROLS_DIR = Path(__file__).resolve().parent.parent / "estimators" / "controls"
#: control name -> file (controls are estimator files run through the same path)
CONTROL_FILES = {
    "random": "random.py",
    "norm-only": "norm_only.py",
    "fluency": "fluency.py",
    "advantage-only": "advantage_only.py",
    "step-order": "step_order.py",
}
#: controls scored only beside open-track estimators (they read text)
OPEN_CONTROL_FILES = {"text-only": "text_only.py", "text-advantage": "text_advantage.py",
                      "bm25": "bm25.py"}


def control_files(track: str) -> dict[str, Path]:
    """The controls scored beside an estimator of ``track`` (name -> file)."""
    files = dict(CONTROL_FILES) | (dict(OPEN_CONTROL_FILES) if track == "open" else {})
    return {n: CONTROLS_DIR / f for n, f in files.items()}

"""bt-bench: training-data attribution in online RL fine-tuning, scored against controls.

The notebook API (imported lazily, so ``import benchmark`` stays cheap)::

    import benchmark
    view = benchmark.load_view("tiny", seed=0, task="qzxbt", track="open")  # score_rollouts'
    draws = benchmark.load_draws("tiny", seed=0, task="qzxbt")            # score_draw's
    results = benchmark.evaluate("my_estimator.py")                       # bt-bench evaluate
"""

__version__ = "0.2.0"

_LAZY = {
    "load_view": "benchmark.releases.data",
    "load_draws": "benchmark.releases.data",
    "load_seed": "benchmark.releases.data",
    "load_release": "benchmark.releases.release",
    "evaluate": "benchmark.evaluate",
    "check_estimator": "benchmark.contract",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'benchmark' has no attribute {name!r}")

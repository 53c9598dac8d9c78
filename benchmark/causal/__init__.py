"""The causal score: remove an estimator's top rollouts, replay training, measure what is left.

Owns:

* :mod:`.stats`: the pure statistics of stored numbers: the log-k weights, the fixed-point
  encoding, intervals, paired replicates, the random reference and measurable cells;
* :mod:`.score`: removal sets (tie-aware), the shipped reference, the per-(seed, task) blocks
  and the item-10 checks that read :mod:`.stats` (it re-exports its names);
* :mod:`.onpolicy`: the on-policy share: the oracle's and an estimator's removal sets replayed
  with the later rollouts held at their recorded tokens (fixed data), against the causal score;
* :mod:`.reference`: the causal reference a release ships (``seed<S>/causal.json``), computed on
  the build machine (``python -m benchmark.causal.reference RELEASE``);
* :mod:`.store`: the per-machine replay store (jobs, keys, the stored baselines and removals)
  and the lane runner both executors use, running the stacked engine of
  :mod:`benchmark.build.stacked`;
* :mod:`.replays`: the executors that fill the store: local worker processes
  (``python -m benchmark.causal.replays``), or Ray through :mod:`.cluster`;
* :mod:`.cluster`: the same lanes on a Ray cluster (``--executor ray``; the ``cluster`` extra).

May import: :mod:`benchmark.build` (the replay engine), :mod:`benchmark.releases`,
:mod:`benchmark.metrics`, :mod:`benchmark.machine`, :mod:`benchmark.io`, :mod:`benchmark.seal`
(the replay store's entries are sealed under the machine's key),
:mod:`benchmark.errors`, :mod:`benchmark.verdicts` (the verdict words),
:mod:`benchmark.controls` and :mod:`benchmark.contract` (the reference scores the built-in,
trusted controls; never a submission).

Must never: import the sandbox or run estimator code (it receives scores, never estimators), or
the evaluator and the leaderboard (they import it).

This file imports nothing: replay workers import the package and should start fast.
"""

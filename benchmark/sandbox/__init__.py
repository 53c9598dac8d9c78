"""The estimator sandbox: the only code that runs estimator code, and the only way back from it.

Owns:

* :mod:`.isolation`: :func:`~.isolation.score_isolated`, :func:`~.isolation.inspect_isolated`,
  :func:`~.isolation.smoke_isolated` and :class:`~.isolation.Limits`, the evaluator's entry points
  (short pipelines of the steps in the next five modules);
* :mod:`.limits`: :class:`~.limits.Limits`, :class:`~.limits.IsolationError` and the constants
  every other module shares (it imports nothing from this package);
* :mod:`.launch`: the private workspace, what the sandbox may read (binds, symlinks), the child's
  command and environment, and its start;
* :mod:`.watch`: the running child: checked from outside in ``/proc``, its frames, limits,
  deadline and signals, killed at the end;
* :mod:`.outcome`: the record of what one sandboxed run left behind;
* :mod:`.validate`: judging that record: the declared metadata, the error a failed run deserves,
  the smoke test's report, the determinism check;
* :mod:`.layers` (which layers this machine offers: bubblewrap, seccomp, Landlock, cgroups;
  :func:`~.layers.require_sandbox`), :mod:`.seccomp`, :mod:`.cgroups` and :mod:`._launch` (the
  last trusted step before bubblewrap);
* :mod:`.child`: the sandboxed side (``python -S -m benchmark.sandbox.child``);
* :mod:`.channel`: the bounded frames that carry scores back;
* :mod:`.view_io`: the label-free view folder the child reads, and the list of scoring calls;
* :mod:`.requirements`: a submission's declared requirements, installed into its own environment
  whose interpreter the sandbox runs; :mod:`.pins` (parsing the pins, the core closure and the
  environment's cache key; nothing installed or run) is its pure part, every public name of it
  re-exported by :mod:`.requirements`.

May import: :mod:`benchmark.contract`, :mod:`benchmark.view`, :mod:`benchmark.releases` (a
release's views, never its labels), :mod:`benchmark.io`, :mod:`benchmark.errors`,
:mod:`benchmark.untrusted`, :mod:`benchmark.fixed_order`, :mod:`benchmark.seal` (the cached
environments are sealed under the machine's key).

Must never: import the evaluator, the causal score or the leaderboard (nothing here knows how
scores are judged); hand the child a path to labels, targets' answers or the causal reference.
Nothing outside this package spawns estimator code.

This file imports nothing: the sandboxed child imports the package, and must stay lean.
"""

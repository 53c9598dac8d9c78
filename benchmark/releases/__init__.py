"""Releases: the frozen runs, their format, where they are published and how they are read.

Owns:

* :mod:`.format`: the release format (layout constants, atomic writes, the manifest with the
  sha256 of every file, verification);
* :mod:`.release`: the read side (:func:`~.release.load_release`, by id or folder);
* :mod:`.registry`: the pinned releases (``registry.json``: id -> Hub repo, revision, sha256);
* :mod:`.hub`: publishing to and downloading from the Hugging Face Hub, the dataset card;
* :mod:`.data`: from a release's files to the label-free views an estimator sees and the labels
  the evaluator keeps (:func:`~.data.load_view` is ``benchmark.load_view``).

May import: :mod:`benchmark.view`, :mod:`benchmark.io`, :mod:`benchmark.errors`,
:mod:`benchmark.machine`, :mod:`benchmark.build` (presets, for a release's config).

Must never: import the sandbox, the evaluator, the causal score or the leaderboard: everything
else reads releases, so nothing here may depend on what reads them.

This file imports nothing (``import benchmark`` stays cheap; the notebook API is lazy).
"""

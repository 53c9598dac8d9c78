"""What one ``bt-bench verify`` run re-scores (issue 39): bound entries sampled, the rest in full.

A large season panel cannot be re-scored in full on every CI run (16 entries x 3 draws took 94
minutes from a cold cache on a 2-core AVX2 machine). No recorded number is taken on trust all the
same:

* the maintainers' panel file **binds** each entry's ``estimator.py``, ``results.json`` and
  ``panel.json`` by sha256 (:func:`benchmark.submissions.seasons.bind_entries`); an entry whose
  estimator is the bound one but whose results or panel file is not is **edited** and fails
  (a PR cannot change a recorded number);
* an entry without a binding, or whose ``estimator.py`` is not the bound one (a PR adds or
  changes it), is **unbound**: re-scored on the public release and on every panel draw, and
  scored on the fresh gate draw;
* of the bound entries, each run re-scores a **sample** chosen unpredictably in that run
  (``secrets``, printed so that a failure can be reproduced with ``--sample-seed``):
  :data:`SAMPLE_PUBLIC` entries on the public release, and :data:`SAMPLE_PER_DRAW` entries on each
  of :data:`SAMPLE_DRAWS` panel draws (each rebuilt from its id and pin, its trajectory hash and
  reference summary checked). A change that moves every recorded number (a bt-bench change that
  alters scoring, another machine's arithmetic beyond the tolerance) fails every sampled pair;
  over successive runs every (entry, draw) pair is re-scored.

``--full`` re-scores every entry everywhere (maintainers, after ``panel new`` or a rescore).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["SAMPLE_DRAWS", "SAMPLE_ENV", "SAMPLE_PER_DRAW", "SAMPLE_PUBLIC", "Plan",
           "binding_state", "make_plan"]

#: bound entries re-scored on the public release per run
SAMPLE_PUBLIC = 4
#: panel draws rebuilt and sampled per run
SAMPLE_DRAWS = 1
#: bound entries re-scored on each sampled panel draw
SAMPLE_PER_DRAW = 4
#: environment variable pinning the sample's seed (``--sample-seed``)
SAMPLE_ENV = "BT_BENCH_VERIFY_SAMPLE"


@dataclass
class Plan:
    """One verify run's plan.

    Attributes:
        seed: the sample's seed (hex; printed; ``--sample-seed`` reproduces the run).
        source: where the seed came from (``--sample-seed``, ``$BT_BENCH_VERIFY_SAMPLE``, this
            run).
        full: entries re-scored on the public release and every panel draw (unbound ones, or
            every entry with ``--full``).
        public: bound entries re-scored on the public release.
        draws: panel draw id -> the bound entries re-scored on it.
        state: entry name -> ``"bound"``, ``"unbound"`` or ``"edited"`` (with the detail in
            ``detail``).
        detail: entry name -> why it is unbound or edited.
    """

    seed: str
    source: str
    full: set[str] = field(default_factory=set)
    public: set[str] = field(default_factory=set)
    draws: dict[int, set[str]] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    detail: dict[str, str] = field(default_factory=dict)

    def draws_of(self, name: str, panel_draws: list[int]) -> list[int]:
        """The panel draws ``name`` is re-scored on this run (every one when in full)."""
        if name in self.full:
            return list(panel_draws)
        return [d for d in panel_draws if name in self.draws.get(d, set())]

    def lines(self) -> list[str]:
        """The plan in words (verify prints it before scoring anything)."""
        bound = sorted(n for n, s in self.state.items() if s == "bound")
        out = [f"verify plan (sample seed {self.seed}, {self.source}; reproduce with "
               f"--sample-seed {self.seed}): {len(self.full)} entr"
               f"{'y' if len(self.full) == 1 else 'ies'} in full"
               + (f" ({', '.join(sorted(self.full))})" if self.full else "")
               + f"; {len(bound)} bound"]
        if self.public:
            out.append(f"  public release: re-scoring bound {', '.join(sorted(self.public))}")
        for d, names in sorted(self.draws.items()):
            out.append(f"  panel draw {d}: re-scoring bound {', '.join(sorted(names))}")
        for n in sorted(self.state):
            if self.state[n] == "edited":
                out.append(f"  {n}: EDITED ({self.detail[n]})")
        return out


def binding_state(panel, folder: Path) -> tuple[str, str]:
    """``("bound" | "unbound" | "edited", why)`` of one submission folder under ``panel``."""
    from benchmark.submissions.panel import binding_of

    b = (panel.bindings or {}).get(folder.name) if panel is not None else None
    if b is None:
        return "unbound", "no binding in the panel file (a new entry)"
    try:
        here = binding_of(folder)
    except OSError as exc:
        return "edited", f"a bound file cannot be read ({exc})"
    if here["estimator_sha256"] != b["estimator_sha256"]:
        return "unbound", "estimator.py is not the bound file (a changed entry)"
    bad = [k.removesuffix("_sha256") for k in ("results_sha256", "panel_sha256")
           if here[k] != b[k]]
    if bad:
        files = " and ".join(f"{k}.json" for k in bad)
        return "edited", (f"{files} differ{'s' if len(bad) == 1 else ''} from the file the "
                          "season panel binds (sha256), with the bound estimator.py: a recorded "
                          "number was changed without re-scoring; restore it, or a maintainer "
                          "re-scores the entry and binds it again (bt-bench panel bind)")
    return "bound", "the files the season panel binds"


def _seed(given: str | None) -> tuple[str, str]:
    if given:
        return given, "--sample-seed"
    env = os.environ.get(SAMPLE_ENV)
    if env:
        return env, f"${SAMPLE_ENV}"
    return secrets.token_hex(8), "chosen by this run"


def make_plan(panel, folders: list[Path], seed: str | None = None, full: bool = False,
              sizes: tuple[int, int, int] = (SAMPLE_PUBLIC, SAMPLE_DRAWS, SAMPLE_PER_DRAW)
              ) -> Plan:
    """The plan of one run: which entries in full, which bound ones sampled where.

    Args:
        panel: the season panel (None: every entry in full, as without a panel).
        folders: the submission folders being verified.
        seed: the sample's seed in hex (default: ``$BT_BENCH_VERIFY_SAMPLE``, else ``secrets``).
        full: re-score every entry everywhere.
        sizes: ``(public entries, panel draws, entries per draw)`` sampled per run.

    Raises:
        ValueError: a seed that is not hex digits.
    """
    seed, source = _seed(seed)
    if len(seed) > 64 or any(c not in "0123456789abcdef" for c in seed):
        raise ValueError(f"sample seed {seed[:70]!r}: expected up to 64 lowercase hex digits "
                         "(as verify prints it)")
    plan = Plan(seed, source)
    for f in folders:
        if panel is None or full:
            plan.state[f.name], plan.detail[f.name] = "unbound", (
                "--full" if full else "no season panel")
            plan.full.add(f.name)
            continue
        state, why = binding_state(panel, f)
        plan.state[f.name], plan.detail[f.name] = state, why
        if state == "unbound":
            plan.full.add(f.name)
    bound = sorted(n for n, s in plan.state.items() if s == "bound")
    if not bound or panel is None or full:
        return plan
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed, 16))))
    n_pub, n_draws, per = sizes
    plan.public = {bound[i] for i in rng.permutation(len(bound))[:n_pub]}
    ids = list(panel.draw_ids)
    for j in rng.permutation(len(ids))[:n_draws]:
        plan.draws[ids[j]] = {bound[i] for i in rng.permutation(len(bound))[:per]}
    return plan

"""Season panels (issues 32, 39): every entry ranked on the same draws, drawn after it was frozen.

A *season panel* is a set of draws of the task family (:mod:`benchmark.build.family`) that a
maintainer draws after every ranked entry was frozen (``bt-bench panel new``,
:mod:`benchmark.submissions.seasons`). Draws are float64 builds: a draw id trains the same run on
every machine from its pinned post-SFT checkpoint, and its trajectory hash
(:mod:`benchmark.build.trajectory`) proves it. Files:

* ``submissions/_panel/panel.json`` (this module's :class:`Panel`): the season (id, creation time
  in UTC, family version, scale), the **season seed** (drawn with ``secrets``) that fixes the
  sequence of candidate draw ids, every **candidate** with its screen result (accepted, or
  rejected with the reason: :mod:`benchmark.submissions.screen`), the accepted **draws** (id,
  redraw, post-SFT checkpoint sha256, trajectory hash, a summary of the lean causal reference,
  the screen's cells), the ranked entries (name -> estimator sha256 and frozen time), the
  **bindings** (name -> the sha256 of the entry's ``estimator.py``, ``results.json`` and
  ``panel.json`` the maintainers vouch for: a PR that edits a bound file fails verify, and
  verify re-scores a sample of the bound numbers on each run) and the panel's **power**. Past
  panels move to ``submissions/_panel/seasons/<season>.json``.
* ``submissions/_panel/draws/<id>/``: each candidate's post-SFT checkpoint (float64, ~0.8 MB),
  accepted or rejected, so anyone can rebuild every candidate and replay the selection. SFT at
  the family scale is chaotic even in float64, GRPO from one start is not.
* ``submissions/<name>/panel.json``: the entry's results on every draw (the full results document
  of ``evaluate`` on the draw's release, so the board pairs entries draw by draw) and a summary:
  its **panel score** (the rank's interval: the draws held fixed), its **family interval** (the
  draws resampled too; it does not rank), item 11, the panel items by the panel's rule
  (:func:`benchmark.panel_rule.panel_items`) and its panel verdict.

An entry is **ranked** when the panel lists it with the sha256 of its ``estimator.py``; one frozen
(submitted or changed) later is **provisional**: scored on the panel and shown, not ranked, until
the next panel.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.errors import BenchmarkError

__all__ = ["MAX_DRAWS", "MIN_CELLS", "MIN_DRAWS", "PANEL_DIR", "PANEL_FILE", "Panel",
           "PanelError", "binding_of", "check_entry_doc", "check_panel", "entry_status",
           "family_score", "load_panel", "panel_pair", "panel_release", "panel_score",
           "panel_summary", "reference_summary", "score_draw", "score_entry"]

#: the panel's folder under the submissions folder
PANEL_DIR = "_panel"
#: the panel file (in :data:`PANEL_DIR`) and each entry's panel results (in its folder)
PANEL_FILE = "panel.json"
#: where ``panel new`` keeps the panels it replaces, as ``<season>.json`` (and their pinned
#: checkpoints as ``<season>/draws/``)
SEASONS_DIR = "seasons"
#: the pinned post-SFT checkpoints of the panel's candidates: ``_panel/draws/<draw id>/``
PINS_DIR = "draws"
#: 2: season seed, candidates and their screen, bindings, power (issue 39)
PANEL_SCHEMA = 2
#: draws of a panel: at least three (a rank from one or two runs is one run's luck)
MIN_DRAWS = 3
#: at most this many (each costs every entry a scoring at ``panel new``)
MAX_DRAWS = 16
#: a panel holds at least this many measurable (draw, task) cells (issue 39: the best methods
#: must separate from random; measured in docs/leaderboard.md, "Power")
MIN_CELLS = 12
#: candidates a panel may screen before it gives up (a family whose draws rarely pass the
#: screen needs another design, not a longer search)
MAX_CANDIDATES = 64
#: bootstrap replicates of the family interval's draw resample, and its seed's first word
PANEL_BOOT = 2000
PANEL_BOOT_TAG = 0x5EA5_0A11
#: results keys whose values name the machine that built the draw (never compared)
MACHINE_LEAVES = ("manifest_sha256", "packages")
_HEX64 = frozenset("0123456789abcdef")
#: the files of an entry a binding covers
BOUND_FILES = ("estimator_sha256", "results_sha256", "panel_sha256")


class PanelError(BenchmarkError):
    """A panel file is malformed, a panel draw does not reproduce, or a panel request is bad."""


@dataclass(frozen=True)
class Panel:
    """A season panel (``submissions/_panel/panel.json``).

    Attributes:
        season: the season id, ``YYYY-MM-DD-<6 hex>`` (the hex: the season seed's first six).
        created_utc: when its season seed was drawn, ISO 8601 UTC (``...Z``).
        family_version: the task family the draw ids index.
        scale: the family run scale of its draws (``"family"``; ``"micro-family"`` in tests).
        draws: the accepted draws, ``[{"draw_id", "redraw", "sft_sha256", "trajectory_sha256",
            "reference": {path: number}, "cells": {cell: screen record}}]``.
        entries: ranked entries, ``{name: {"estimator_sha256", "frozen_utc"}}``.
        path: the file it was read from.
        season_seed: 32 hex digits drawn with ``secrets``; the candidate ids are a function of
            it alone (:func:`benchmark.submissions.screen.candidate_ids`).
        screen: the screen's rule and settings (:data:`benchmark.submissions.screen.SCREEN`).
        candidates: every candidate in sequence order, ``[{"index", "draw_id", "accepted",
            "reason", ...}]``: the accepted draws and every rejected id with its reason.
        min_cells: the measurable cells the panel had to reach.
        bindings: ``{name: {"estimator_sha256", "results_sha256", "panel_sha256"}}``.
        power: the panel's power (:func:`benchmark.submissions.screen.design_power` at creation,
            the paired TracInCP - random difference once entries are scored).
        pins: where the pinned checkpoints are when not beside the file (while staging).
    """

    season: str
    created_utc: str
    family_version: str
    scale: str
    draws: tuple[dict, ...]
    entries: dict[str, dict]
    path: Path
    season_seed: str = ""
    screen: dict = field(default_factory=dict)
    candidates: tuple[dict, ...] = ()
    min_cells: int = MIN_CELLS
    bindings: dict[str, dict] = field(default_factory=dict)
    power: dict = field(default_factory=dict)
    pins: Path | None = None

    @property
    def draw_ids(self) -> list[int]:
        """The panel's (accepted) draw ids, in panel order."""
        return [int(d["draw_id"]) for d in self.draws]

    @property
    def n_cells(self) -> int:
        """The measurable (draw, task) cells of the panel's draws.

        Every cell of an accepted draw passed the screen.
        """
        return sum(len(d.get("cells") or {}) for d in self.draws)

    def draw(self, draw_id: int) -> dict:
        """The panel record of one draw."""
        for d in self.draws:
            if int(d["draw_id"]) == int(draw_id):
                return d
        raise PanelError(f"draw {draw_id} is not one of season {self.season}'s draws "
                         f"{self.draw_ids}")

    def pin_dir(self, draw_id: int) -> Path:
        """The folder of draw ``draw_id``'s pinned post-SFT checkpoint."""
        return (self.pins or self.path.parent / PINS_DIR) / str(int(draw_id))

    def to_dict(self) -> dict:
        """The file's content."""
        return {"schema_version": PANEL_SCHEMA, "season": self.season,
                "created_utc": self.created_utc, "family_version": self.family_version,
                "scale": self.scale, "season_seed": self.season_seed,
                "screen": dict(self.screen), "min_cells": self.min_cells,
                "candidates": [dict(c) for c in self.candidates],
                "draws": [dict(d) for d in self.draws],
                "entries": {k: dict(v) for k, v in sorted(self.entries.items())},
                "bindings": {k: dict(v) for k, v in sorted(self.bindings.items())},
                "power": dict(self.power), "rotation": ROTATION}


#: how panels rotate (written into every panel file, so the page can say it)
ROTATION = ("a maintainer runs `bt-bench panel new` once a month (and whenever the task family "
            "changes); entries frozen before it are ranked on it, later ones are provisional "
            "until the next panel")


# ----------------------------------------------------------------------------------------------
# reading and checking


def _utc(text: object, where: str) -> str:
    from benchmark.submissions.files import check_utc
    return check_utc(text, where, PanelError)


def _sha(text: object, where: str) -> str:
    from benchmark.submissions.files import check_sha256
    return check_sha256(text, where, PanelError)


def _numbers(x: object, where: str, limit: int = 100_000) -> dict:
    if not isinstance(x, dict) or len(x) > limit or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v) for k, v in x.items()):
        raise PanelError(f"{where} must be an object of finite numbers (the lean causal "
                         "reference's summary)")
    return x


def _json_object(x: object, where: str, what: str, limit: int = 10_000) -> dict:
    """A plain JSON object of at most ``limit`` keys (its content is reported, not trusted)."""
    if not isinstance(x, dict) or len(x) > limit:
        raise PanelError(f"{where} must be an object ({what})")
    return x


def check_panel(doc: object, where: str) -> Panel:
    """Validate a parsed panel file; return the :class:`Panel`.

    Raises:
        PanelError: naming the first bad field (types, the draw count within
            [:data:`MIN_DRAWS`, :data:`MAX_DRAWS`], the cell count, draw ids, hashes, times, the
            season seed, the candidates and bindings).
    """
    from benchmark.build.family import SCALES
    from benchmark.live import check_draw_id

    if not isinstance(doc, dict) or doc.get("schema_version") != PANEL_SCHEMA:
        raise PanelError(f"{where}: not a bt-bench panel file (schema_version {PANEL_SCHEMA}); "
                         "regenerate it with bt-bench panel new")
    season = doc.get("season")
    if not isinstance(season, str) or len(season) != 17 or not season[:10].replace("-", "") \
            .isdigit() or not set(season[11:]) <= _HEX64:
        raise PanelError(f"{where}: season {str(season)[:40]!r} is not a season id "
                         "(YYYY-MM-DD-xxxxxx)")
    created = _utc(doc.get("created_utc"), f"{where}: created_utc")
    scale = doc.get("scale")
    if scale not in SCALES:
        raise PanelError(f"{where}: scale {str(scale)[:40]!r} is not a family scale "
                         f"{sorted(SCALES)}")
    fam = doc.get("family_version")
    if not isinstance(fam, str) or len(fam) > 16:
        raise PanelError(f"{where}: family_version {str(fam)[:40]!r} is not a version string")
    seed = doc.get("season_seed")
    if not isinstance(seed, str) or len(seed) != 32 or not set(seed) <= _HEX64 \
            or seed[:6] != season[11:]:
        raise PanelError(f"{where}: season_seed {str(seed)[:40]!r} is not 32 lowercase hex "
                         f"digits beginning with the season id's {season[11:]!r}")
    min_cells = doc.get("min_cells")
    if type(min_cells) is not int or not 1 <= min_cells <= 10_000:
        raise PanelError(f"{where}: min_cells {str(min_cells)[:40]!r} is not a positive integer")
    screen = _json_object(doc.get("screen"), f"{where}: screen", "the screen's rule and settings")
    power = _json_object(doc.get("power"), f"{where}: power", "the panel's power")

    def draw_id(x: object, w: str) -> int:
        if type(x) is not int:  # JSON integers only, never strings
            raise PanelError(f"{w}: draw_id {str(x)[:40]!r} is not an integer draw id "
                             "(0 <= ID < 2**31)")
        try:
            return check_draw_id(x)
        except BenchmarkError as exc:
            raise PanelError(f"{w}: {exc}") from None

    draws = doc.get("draws")
    if not isinstance(draws, list) or not MIN_DRAWS <= len(draws) <= MAX_DRAWS:
        n = len(draws) if isinstance(draws, list) else type(draws).__name__
        raise PanelError(f"{where}: draws holds {n}; a panel has {MIN_DRAWS}-{MAX_DRAWS} draws")
    out = []
    for i, d in enumerate(draws):
        w = f"{where}: draws[{i}]"
        if not isinstance(d, dict):
            raise PanelError(f"{w} is not an object with draw_id, trajectory_sha256, reference")
        did = draw_id(d.get("draw_id"), w)
        ref = _numbers(d.get("reference"), f"{w}: reference")
        redraw = d.get("redraw")
        if type(redraw) is not int or not 0 <= redraw <= 16:
            raise PanelError(f"{w}: redraw {str(redraw)[:40]!r} is not the attempt that passed "
                             "its gates (an integer 0-16)")
        cells = _json_object(d.get("cells"), f"{w}: cells", "cell -> its screen record", 64)
        if not cells or not all(isinstance(c, dict) and c.get("measurable") is True
                                for c in cells.values()):
            raise PanelError(f"{w}: cells must record every (seed, task) cell of the draw as "
                             "measurable: only a draw that passed the screen enters a panel")
        out.append({"draw_id": did, "redraw": redraw,
                    "sft_sha256": _sha(d.get("sft_sha256"), f"{w}.sft_sha256"),
                    "trajectory_sha256": _sha(d.get("trajectory_sha256"),
                                              f"{w}.trajectory_sha256"),
                    "reference": ref, "cells": cells})
    if len({d["draw_id"] for d in out}) != len(out):
        raise PanelError(f"{where}: a draw id repeats; a panel's draws are distinct")
    n_cells = sum(len(d["cells"]) for d in out)
    if n_cells < min_cells:
        raise PanelError(f"{where}: its draws hold {n_cells} measurable cells, fewer than its "
                         f"min_cells {min_cells}")
    cands = doc.get("candidates")
    if not isinstance(cands, list) or not len(out) <= len(cands) <= MAX_CANDIDATES:
        raise PanelError(f"{where}: candidates must list every screened draw id in sequence "
                         f"order ({len(out)}-{MAX_CANDIDATES} of them)")
    checked = []
    for i, c in enumerate(cands):
        w = f"{where}: candidates[{i}]"
        if not isinstance(c, dict) or c.get("index") != i or not isinstance(
                c.get("accepted"), bool) or not isinstance(c.get("reason"), str) \
                or len(c["reason"]) > 4000:
            raise PanelError(f"{w} is not a candidate record (index {i}, draw_id, accepted, "
                             "reason)")
        checked.append(dict(c) | {"draw_id": draw_id(c.get("draw_id"), w)})
    accepted = [c["draw_id"] for c in checked if c["accepted"]]
    if accepted != [d["draw_id"] for d in out]:
        raise PanelError(f"{where}: the accepted candidates {accepted} are not the panel's draws "
                         f"{[d['draw_id'] for d in out]} in sequence order")
    entries = doc.get("entries")
    if not isinstance(entries, dict) or len(entries) > 10_000:
        raise PanelError(f"{where}: entries must be an object name -> {{estimator_sha256, "
                         "frozen_utc}}")
    ent = {}
    for name, e in entries.items():
        w = f"{where}: entries.{str(name)[:60]}"
        if not isinstance(e, dict):
            raise PanelError(f"{w} is not an object with estimator_sha256 and frozen_utc")
        frozen = _utc(e.get("frozen_utc"), f"{w}.frozen_utc")
        if frozen > created:
            raise PanelError(f"{w}: frozen at {frozen}, after the panel was created ({created}); "
                             "a ranked entry must be frozen before its panel's draws exist")
        ent[str(name)] = {"estimator_sha256": _sha(e.get("estimator_sha256"),
                                                   f"{w}.estimator_sha256"),
                          "frozen_utc": frozen}
    bindings = doc.get("bindings")
    if not isinstance(bindings, dict) or len(bindings) > 10_000:
        raise PanelError(f"{where}: bindings must be an object name -> "
                         f"{{{', '.join(BOUND_FILES)}}}")
    bound = {}
    for name, b in bindings.items():
        w = f"{where}: bindings.{str(name)[:60]}"
        if not isinstance(b, dict) or set(b) != set(BOUND_FILES):
            raise PanelError(f"{w} is not an object with exactly {', '.join(BOUND_FILES)}")
        bound[str(name)] = {k: _sha(b[k], f"{w}.{k}") for k in BOUND_FILES}
    return Panel(season, created, fam, str(scale), tuple(out), ent, Path(where), seed,
                 screen, tuple(checked), min_cells, bound, power)


def panel_path(submissions_dir: str | Path) -> Path:
    """``<submissions_dir>/_panel/panel.json``."""
    return Path(submissions_dir) / PANEL_DIR / PANEL_FILE


def load_panel(submissions_dir: str | Path) -> Panel | None:
    """The current panel of ``submissions_dir``, or None when there is none.

    Raises:
        PanelError: the file exists but is malformed.
    """
    from benchmark.io import read_json

    p = panel_path(submissions_dir)
    if not p.is_file():
        return None
    panel = check_panel(read_json(p), str(p))
    return Panel(**{**panel.__dict__, "path": p})


def entry_status(panel: Panel | None, name: str, estimator_sha256: str) -> str:
    """An entry's place on the season panel.

    ``"ranked"`` (listed by the panel with this file's sha256), ``"provisional"`` (frozen after
    it, or changed since), or ``"unscored"`` when there is no panel.
    """
    if panel is None:
        return "unscored"
    e = panel.entries.get(name)
    return "ranked" if e is not None and e["estimator_sha256"] == estimator_sha256 else \
        "provisional"


# ----------------------------------------------------------------------------------------------
# panel draws


def reference_summary(release_dir: str | Path) -> dict[str, float]:
    """The numbers of a draw's lean causal reference that every entry's score depends on.

    ``{"seed<S>/<task>/<path>": number}`` for every scalar under ``tasks`` of each seed's
    ``causal.json`` (bonus-off effect, baseline, every reference method's curve, the random sets'
    effects), leaving out per-prompt lists (longer than 16). Recorded in the panel file and
    compared within :data:`benchmark.submissions.compare.CAUSAL_TOLERANCE` whenever a draw is
    taken from a cache: an edited reference is rebuilt, never used.
    """
    from benchmark.causal.score import CAUSAL_FILE

    out: dict[str, float] = {}

    def walk(x: Any, path: str) -> None:
        if isinstance(x, dict):
            for k in sorted(x):
                walk(x[k], f"{path}/{k}")
        elif isinstance(x, list):
            if len(x) <= 16:
                for i, v in enumerate(x):
                    walk(v, f"{path}/{i}")
        elif isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x):
            out[path.lstrip("/")] = x

    for seed_dir in sorted(Path(release_dir).glob("seed*")):
        doc = json.loads((seed_dir / CAUSAL_FILE).read_text())
        walk(doc.get("tasks", {}), seed_dir.name)
    return out


def _reference_drift(recorded: dict, here: dict) -> str | None:
    """Why two reference summaries differ (None when they agree within the causal tolerance)."""
    from benchmark.submissions.compare import CAUSAL_TOLERANCE

    if set(recorded) != set(here):
        extra = sorted(set(recorded) ^ set(here))[:3]
        return f"its causal reference holds other numbers ({', '.join(extra)} ...)"
    for k in sorted(recorded):
        if not math.isclose(recorded[k], here[k], rel_tol=0.0, abs_tol=CAUSAL_TOLERANCE):
            return f"its causal reference gives {k} = {here[k]!r}, the panel {recorded[k]!r}"
    return None


def _draw_drift(path: Path, record: dict) -> str | None:
    """Why the release at ``path`` is not the panel draw ``record`` (None when it is)."""
    from benchmark.build.trajectory import trajectory_sha256

    try:
        got = trajectory_sha256(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its files cannot be read ({exc})"
    if got != record["trajectory_sha256"]:
        return (f"trajectory hash {got[:16]}..., the panel records "
                f"{record['trajectory_sha256'][:16]}... (another run)")
    try:
        return _reference_drift(record["reference"], reference_summary(path))
    except (OSError, ValueError, KeyError) as exc:
        return f"its causal reference cannot be read ({exc})"


def panel_release(panel: Panel, draw_id: int, progress: bool = True, workers: int = 2) -> Path:
    """The release folder of one panel draw, checked against the panel.

    Built here from its id, or taken from the live-draw cache (:func:`benchmark.live.live_release`);
    either way its trajectory hash is recomputed from its files and its reference summary
    compared with the panel's. A cached folder that does not match is removed and the draw
    rebuilt once; a build that does not match is a :class:`PanelError` (this machine trains
    another run from the id, or the panel file is wrong): never a note.
    """
    from benchmark import live
    from benchmark.releases.format import sha256_file

    record = panel.draw(draw_id)
    if panel.family_version != _family_version():
        raise PanelError(f"season {panel.season} draws family {panel.family_version}; this "
                         f"bt-bench draws family {_family_version()}, where the same ids are "
                         "other runs: the panel must be renewed (bt-bench panel new)")
    pin = {"redraw": record["redraw"], "sft_checkpoint": panel.pin_dir(draw_id)}
    pinned = panel.pin_dir(draw_id) / "model.safetensors"
    if not pinned.is_file() or sha256_file(pinned) != record["sft_sha256"]:
        raise PanelError(f"{pinned}: the pinned post-SFT checkpoint of panel draw {draw_id} is "
                         f"missing or not the one season {panel.season} records (sha256 "
                         f"{record['sft_sha256'][:16]}...); restore it from the repository")
    key = (panel.season, int(draw_id), panel.scale, record["trajectory_sha256"])
    done = _CHECKED.get(key)
    if done is not None and _stamp(done[0]) == done[1]:
        return done[0]  # checked in this process and untouched since (verify: once per draw)
    cached = live.cached_release(draw_id, panel.scale) is not None
    path = live.live_release(draw_id, panel.scale, progress=progress, workers=workers, pin=pin)
    why = _draw_drift(path, record)
    if why is not None and cached:
        print(f"panel draw {draw_id}: the cached copy does not match season {panel.season} "
              f"({why}); rebuilding it", flush=True)
        shutil.rmtree(path, ignore_errors=True)
        path = live.live_release(draw_id, panel.scale, progress=progress, workers=workers,
                                 pin=pin)
        why = _draw_drift(path, record)
    if why is not None:
        opt = "" if panel.scale == live.LIVE_SCALE else f" --scale {panel.scale}"
        raise PanelError(f"panel draw {draw_id} ({panel.scale}) built here is not season "
                         f"{panel.season}'s draw: {why}. Reproduce with bt-bench live build "
                         f"{draw_id}{opt}")
    _CHECKED[key] = (path, _stamp(path))
    return path


#: panel draws checked in this process: key -> (release folder, its files' stamp when checked)
_CHECKED: dict[tuple, tuple[Path, tuple]] = {}


def _stamp(path: Path) -> tuple:
    """Size and modification time of every file of a release folder (sorted), or ``()``."""
    try:
        return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns)
                     for f in sorted(Path(path).rglob("*")) if f.is_file())
    except OSError:
        return ()


def _now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _family_version() -> str:
    from benchmark.build.family import FAMILY_VERSION
    return FAMILY_VERSION


# ----------------------------------------------------------------------------------------------
# scoring


def _suite_of(results: dict) -> tuple[float, np.ndarray] | None:
    """The suite causal score and replicates of one draw's results (None: no causal score)."""
    from benchmark.leaderboard.paired import entry_replicates

    est = str(results["estimator"]["name"])
    tasks = sorted(results.get("tasks") or {})
    reps = entry_replicates(est, results, tasks)
    return None if reps is None else reps["suite"]


def _pool(per_draw: list[tuple[float, np.ndarray] | None]) -> list[tuple[float, np.ndarray]]:
    """The draws that have a causal score.

    A draw without one depends on the run, not the entry: every entry of a panel misses the
    same draws (a screened panel has none).
    """
    return [p for p in per_draw if p is not None]


def panel_score(per_draw: list[tuple[float, np.ndarray] | None], season: str = ""
                ) -> tuple[float, np.ndarray] | None:
    """A panel score and its replicates from the per-draw suite scores: **the draws held fixed**.

    The point is the mean over draws of the suite causal scores; replicate ``b`` is the mean of
    the draws' replicate ``b``, each of which resamples that draw's prompts, random sets and
    training noise (the evaluator's replicates, paired across entries by the shared prompt
    resample). The draws are the season's test set, as a fixed benchmark's items are, so they
    are not resampled: this interval ranks (docs/leaderboard.md, "What each interval answers").
    ``season`` is accepted for symmetry with :func:`family_score` and unused. None when no draw
    has a score.
    """
    per_draw = _pool(per_draw)
    if not per_draw:
        return None
    reps = np.stack([np.asarray(r, np.float64) for _, r in per_draw])  # (n, B)
    return float(np.mean([p for p, _ in per_draw])), reps.mean(axis=0)


def family_score(per_draw: list[tuple[float, np.ndarray] | None], season: str
                 ) -> tuple[float, np.ndarray] | None:
    """The panel score with the **family interval**: the draws resampled as well.

    Replicate ``b`` resamples the draws with replacement (the same resample for every entry of
    a season: seeded by the season id, so the replicates pair across entries) and averages their
    replicate ``b``. It answers how far this panel's ordering is expected to carry to other runs
    of the (screened) family; it does not rank. With n draws, about ``n**-n`` of its mass sits on
    one draw taken n times, so with few draws it spans nearly the range of the per-draw scores.
    """
    per_draw = _pool(per_draw)
    if not per_draw:
        return None
    n = len(per_draw)
    reps = np.stack([np.asarray(r, np.float64) for _, r in per_draw])  # (n, B)
    b = reps.shape[1]
    seed = int.from_bytes(season.encode()[-8:].ljust(8, b"\0"), "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([PANEL_BOOT_TAG, seed])))
    pick = rng.integers(0, n, size=(b, n))
    out = reps[pick, np.arange(b)[:, None]].mean(axis=1)
    return float(np.mean([p for p, _ in per_draw])), out


def panel_summary(public: dict, draws: list[dict], season: str) -> dict:
    """An entry's derived panel numbers: the two intervals, item 11, the panel items, the verdict.

    Args:
        public: the entry's public ``results.json``.
        draws: its per-draw records ``[{"draw_id", "trajectory_sha256", "results"}]``.
        season: the season id (seeds the family interval's draw resample).

    Returns:
        ``{"causal_score": {point, lo, hi} | None`` (draws fixed: the rank's interval),
        ``"family": {point, lo, hi} | None`` (draws resampled), ``"per_draw": {id: {point, lo,
        hi} | None}, "item": item 11's checklist entry, "items": the panel rule per counted item
        (:func:`benchmark.panel_rule.panel_items`), "verdict"}``: the verdict combines the panel
        items with item 11 (:func:`benchmark.panel_rule.panel_verdict`).
    """
    from benchmark.causal.score import interval, settings_of
    from benchmark.checklist import ITEMS, live_item
    from benchmark.panel_rule import panel_items, panel_verdict

    est = str(public["estimator"]["name"])
    level = settings_of(public.get("settings") or {}).level
    suites = [_suite_of(d["results"]) for d in draws]
    fixed, fam = panel_score(suites, season), family_score(suites, season)
    per_draw = {str(d["draw_id"]): d["results"]["suite"].get("causal_score", {}).get(est)
                for d in draws}
    it = live_item(public.get("suite") or {},
                   [{"draw_id": d["draw_id"], "suite": d["results"]["suite"]} for d in draws], est)
    key, title = ITEMS[11]
    item = {"item": 11, "key": key, "title": title, "verdict": it["verdict"], "gated": True,
            "numbers": {k: it[k] for k in ("public", "live", "margin", "tolerance")},
            "reason": it["reason"]}
    items = panel_items([(d["draw_id"], d["results"]) for d in draws])
    return {"causal_score": None if fixed is None else interval(fixed[0], fixed[1], level),
            "family": None if fam is None else interval(fam[0], fam[1], level),
            "per_draw": per_draw, "item": item, "items": items,
            "verdict": panel_verdict(items, it["verdict"])}


def score_draw(estimator_file: str | Path, panel: Panel, draw_id: int, progress: bool = True,
               isolation=None, env=None) -> dict:
    """One draw's record of an entry: ``{"draw_id", "trajectory_sha256", "results"}``.

    ``isolation``/``env`` as in :func:`benchmark.evaluate.evaluate`.
    """
    from benchmark.evaluate import evaluate

    path = panel_release(panel, draw_id, progress=progress)
    res = evaluate(estimator_file, path, progress=progress, isolation=isolation, env=env)
    res = {k: v for k, v in res.items() if k != "packages"}
    return {"draw_id": int(draw_id), "trajectory_sha256": panel.draw(draw_id)["trajectory_sha256"],
            "results": res}


def score_entry(estimator_file: str | Path, public: dict, panel: Panel, progress: bool = True,
                isolation=None, env=None, recorded: dict[int, dict] | None = None) -> dict:
    """Score one estimator on every panel draw: the content of its ``panel.json``.

    ``public`` is its public results (item 11 compares with them). ``isolation``/``env`` as in
    :func:`benchmark.evaluate.evaluate`. ``recorded``: draw id -> a record of this estimator on
    that draw already made by the maintainers' own run (``panel new`` resuming,
    :func:`benchmark.submissions.seasons.recorded_draws`); those draws are not scored again.
    """
    from benchmark.contract import file_sha256

    recorded = recorded or {}
    draws = [recorded[d] if d in recorded else
             score_draw(estimator_file, panel, d, progress, isolation, env)
             for d in panel.draw_ids]
    return {"schema_version": PANEL_SCHEMA, "season": panel.season,
            "estimator_sha256": file_sha256(estimator_file), "draws": draws,
            "summary": panel_summary(public, draws, panel.season)}


def check_entry_doc(doc: object, panel: Panel, where: str) -> dict:
    """Validate an entry's ``panel.json`` against the season ``panel``; return it.

    It must be of the panel's season, hold one record per panel draw in panel order with the
    panel's trajectory hashes, each with a results object, and a summary.

    Raises:
        PanelError: naming the first field that does not fit, and the fix.
    """
    fix = "re-score the entry on the panel: bt-bench panel score NAME"
    if not isinstance(doc, dict) or doc.get("schema_version") != PANEL_SCHEMA:
        raise PanelError(f"{where}: not an entry's panel file (schema_version {PANEL_SCHEMA}); "
                         f"{fix}")
    if doc.get("season") != panel.season:
        raise PanelError(f"{where}: scored on season {str(doc.get('season'))[:40]!r}, the panel "
                         f"is season {panel.season}; {fix}")
    draws = doc.get("draws")
    if not isinstance(draws, list) or len(draws) != len(panel.draws):
        raise PanelError(f"{where}: draws must hold one record per panel draw "
                         f"({len(panel.draws)}); {fix}")
    for i, (d, p) in enumerate(zip(draws, panel.draws, strict=True)):
        if not isinstance(d, dict) or d.get("draw_id") != p["draw_id"] or \
                d.get("trajectory_sha256") != p["trajectory_sha256"] or \
                not isinstance(d.get("results"), dict):
            raise PanelError(f"{where}: draws[{i}] is not panel draw {p['draw_id']} with its "
                             f"trajectory hash and results; {fix}")
    if not isinstance(doc.get("summary"), dict):
        raise PanelError(f"{where}: no summary; {fix}")
    return doc


def panel_pair(a: dict, b: dict, season: str, level: float = 0.95) -> dict | None:
    """The paired panel comparison of two entries' ``panel.json`` documents (the rank's).

    ``{"point", "lo", "hi", "verdict"}`` of ``a - b`` (:func:`benchmark.causal.score.
    paired_difference` on :func:`panel_score` replicates: the draws held fixed), or None when
    either has no score.
    """
    from benchmark.causal.score import paired_difference

    pa = panel_score([_suite_of(d["results"]) for d in a["draws"]])
    pb = panel_score([_suite_of(d["results"]) for d in b["draws"]])
    if pa is None or pb is None:
        return None
    return paired_difference(pa, pb, level)


def binding_of(folder: str | Path) -> dict:
    """The sha256 of an entry's ``estimator.py``, ``results.json`` and ``panel.json``.

    What a panel file's ``bindings`` record for the entry (:data:`BOUND_FILES`).
    """
    from benchmark.releases.format import sha256_file
    from benchmark.submissions.files import ESTIMATOR_FILE, RESULTS_FILE

    folder = Path(folder)
    return {"estimator_sha256": sha256_file(folder / ESTIMATOR_FILE),
            "results_sha256": sha256_file(folder / RESULTS_FILE),
            "panel_sha256": sha256_file(folder / PANEL_FILE)}


def write_entry(folder: str | Path, doc: dict) -> None:
    """Write an entry's ``panel.json`` (the committed encoding: floats rounded, sorted keys)."""
    from benchmark.evaluate import write_results

    write_results(doc, Path(folder) / PANEL_FILE)



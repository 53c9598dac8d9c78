"""Season panels (issue 32): every entry ranked on the same draws, drawn after it was frozen.

A *season panel* is N >= 3 draws of the task family (:mod:`benchmark.build.family`) whose ids a
maintainer draws with ``secrets`` (``bt-bench panel new``), after every ranked entry was frozen.
Draws are float64 builds: a draw id trains the same run on every machine, and its trajectory hash
(:mod:`benchmark.build.trajectory`) proves it. Files:

* ``submissions/_panel/panel.json``: the season (id, creation time in UTC, family version, scale),
  the draws (id, the redraw that passed its gates, the sha256 of its post-SFT checkpoint, the
  trajectory hash, a summary of the lean causal reference) and the ranked entries (name ->
  estimator sha256 and frozen time): the entries frozen before the panel was created. Past panels
  move to ``submissions/_panel/seasons/<season>.json``.
* ``submissions/_panel/draws/<id>/``: each draw's post-SFT checkpoint (float64, ~0.8 MB). SFT at
  the family scale is chaotic even in float64 (a 1e-16 rounding difference grows to 0.27 over its
  800 steps), GRPO from one start is not (the same trajectory hash under every kernel width), so
  a rebuild elsewhere trains GRPO, targets and draws from the pinned checkpoint: the draw id, its
  redraw and that checkpoint (sha256 in the panel file) decide the run on every machine.
* ``submissions/<name>/panel.json``: the entry's results on every draw (the full results document
  of ``evaluate`` on the draw's release, so the board pairs entries draw by draw), its pooled panel
  score, checklist item 11 (its margin over the random reference carries over from the public
  release to the panel) and its panel verdict (every draw's verdict and item 11).

An entry is **ranked** when the panel lists it with the sha256 of its ``estimator.py``; one frozen
(submitted or changed) later is **provisional**: scored on the panel and shown, not ranked, until
the next panel. ``verify`` rebuilds every panel draw from its id (or takes it from the cache when
its trajectory hash and reference summary match the panel's), re-scores every entry on it and
fails any recorded number that does not reproduce; nothing recorded is a note.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.errors import BenchmarkError

__all__ = ["MAX_DRAWS", "MIN_DRAWS", "PANEL_DIR", "PANEL_FILE", "Panel", "PanelError",
           "check_entry_doc", "check_panel", "entry_status", "load_panel", "new_panel",
           "panel_pair", "panel_release", "panel_score", "panel_summary", "reference_summary",
           "score_entry"]

#: the panel's folder under the submissions folder
PANEL_DIR = "_panel"
#: the panel file (in :data:`PANEL_DIR`) and each entry's panel results (in its folder)
PANEL_FILE = "panel.json"
#: where ``panel new`` keeps the panels it replaces, as ``<season>.json`` (and their pinned
#: checkpoints as ``<season>/draws/``)
SEASONS_DIR = "seasons"
#: the pinned post-SFT checkpoints of the panel's draws: ``_panel/draws/<draw id>/``
PINS_DIR = "draws"
PANEL_SCHEMA = 1
#: draws of a panel: at least three (a rank from one or two runs is one run's luck)
MIN_DRAWS = 3
#: at most this many (each costs every entry a scoring; verify caps what it rebuilds)
MAX_DRAWS = 8
#: bootstrap replicates of the draw resample of a panel score, and its seed's first word
PANEL_BOOT = 2000
PANEL_BOOT_TAG = 0x5EA5_0A11
#: results keys whose values name the machine that built the draw (never compared)
MACHINE_LEAVES = ("manifest_sha256", "packages")
_HEX64 = frozenset("0123456789abcdef")


class PanelError(BenchmarkError):
    """A panel file is malformed, a panel draw does not reproduce, or a panel request is bad."""


@dataclass(frozen=True)
class Panel:
    """A season panel (``submissions/_panel/panel.json``).

    Attributes:
        season: the season id, ``YYYY-MM-DD-<6 hex>``.
        created_utc: when its draw ids were drawn, ISO 8601 UTC (``...Z``).
        family_version: the task family the draw ids index.
        scale: the family run scale of its draws (``"family"``; ``"micro-family"`` in tests).
        draws: ``[{"draw_id", "redraw", "sft_sha256", "trajectory_sha256", "reference":
            {path: number}}]``.
        entries: ranked entries, ``{name: {"estimator_sha256", "frozen_utc"}}``.
        path: the file it was read from.
    """

    season: str
    created_utc: str
    family_version: str
    scale: str
    draws: tuple[dict, ...]
    entries: dict[str, dict]
    path: Path
    #: where the pinned checkpoints are when not beside the file (``panel new`` while staging)
    pins: Path | None = None

    @property
    def draw_ids(self) -> list[int]:
        """The panel's draw ids, in panel order."""
        return [int(d["draw_id"]) for d in self.draws]

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
                "scale": self.scale, "draws": [dict(d) for d in self.draws],
                "entries": {k: dict(v) for k, v in sorted(self.entries.items())},
                "rotation": ROTATION}


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


def check_panel(doc: object, where: str) -> Panel:
    """Validate a parsed panel file; return the :class:`Panel`.

    Raises:
        PanelError: naming the first bad field (types, the draw count within
            [:data:`MIN_DRAWS`, :data:`MAX_DRAWS`], draw ids, hashes, times).
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
    draws = doc.get("draws")
    if not isinstance(draws, list) or not MIN_DRAWS <= len(draws) <= MAX_DRAWS:
        n = len(draws) if isinstance(draws, list) else type(draws).__name__
        raise PanelError(f"{where}: draws holds {n}; a panel has {MIN_DRAWS}-{MAX_DRAWS} draws")
    out = []
    for i, d in enumerate(draws):
        w = f"{where}: draws[{i}]"
        if not isinstance(d, dict):
            raise PanelError(f"{w} is not an object with draw_id, trajectory_sha256, reference")
        if type(d.get("draw_id")) is not int:  # JSON integers only, never strings
            raise PanelError(f"{w}: draw_id {str(d.get('draw_id'))[:40]!r} is not an integer "
                             "draw id (0 <= ID < 2**31)")
        try:
            did = check_draw_id(d.get("draw_id"))
        except BenchmarkError as exc:
            raise PanelError(f"{w}: {exc}") from None
        ref = d.get("reference")
        if not isinstance(ref, dict) or len(ref) > 100_000 or not all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                and math.isfinite(v) for k, v in ref.items()):
            raise PanelError(f"{w}: reference must be an object of finite numbers (the lean "
                             "causal reference's summary)")
        redraw = d.get("redraw")
        if type(redraw) is not int or not 0 <= redraw <= 16:
            raise PanelError(f"{w}: redraw {str(redraw)[:40]!r} is not the attempt that passed "
                             "its gates (an integer 0-16)")
        out.append({"draw_id": did, "redraw": redraw,
                    "sft_sha256": _sha(d.get("sft_sha256"), f"{w}.sft_sha256"),
                    "trajectory_sha256": _sha(d.get("trajectory_sha256"),
                                              f"{w}.trajectory_sha256"),
                    "reference": ref})
    if len({d["draw_id"] for d in out}) != len(out):
        raise PanelError(f"{where}: a draw id repeats; a panel's draws are distinct")
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
    return Panel(season, created, fam, str(scale), tuple(out), ent, Path(where))


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
    import json

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


def panel_score(per_draw: list[tuple[float, np.ndarray] | None], season: str
                ) -> tuple[float, np.ndarray] | None:
    """A panel score and its replicates from the per-draw suite scores.

    The point is the mean over draws of the suite causal scores. Replicate ``b`` resamples the
    draws with replacement (the same resample for every entry of a season: seeded by the season
    id, so the replicates pair across entries) and averages their replicate ``b``: the interval
    carries prompts, random sets and training noise (inside each draw) and the draws themselves.
    A draw without a causal score (no task showed a bonus effect there; it depends on the run,
    not the entry, so every entry of a panel misses the same draws) is left out; None when no
    draw has one.
    """
    per_draw = [p for p in per_draw if p is not None]
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
    """An entry's derived panel numbers: pooled score, item 11 and the panel verdict.

    Args:
        public: the entry's public ``results.json``.
        draws: its per-draw records ``[{"draw_id", "trajectory_sha256", "results"}]``.
        season: the season id (seeds the draw resample).

    Returns:
        ``{"causal_score": {point, lo, hi} | None, "per_draw": {id: {point, lo, hi} | None},
        "item": item 11's checklist entry, "verdict"}``: the verdict combines every draw's
        overall verdict with item 11 (the margin over the random reference carries over).
    """
    from benchmark.causal.score import interval, settings_of
    from benchmark.checklist import ITEMS, live_item
    from benchmark.verdicts import combine

    est = str(public["estimator"]["name"])
    level = settings_of(public.get("settings") or {}).level
    suites = [_suite_of(d["results"]) for d in draws]
    pooled = panel_score(suites, season)
    score = None if pooled is None else interval(pooled[0], pooled[1], level)
    per_draw = {str(d["draw_id"]): d["results"]["suite"].get("causal_score", {}).get(est)
                for d in draws}
    it = live_item(public.get("suite") or {},
                   [{"draw_id": d["draw_id"], "suite": d["results"]["suite"]} for d in draws], est)
    key, title = ITEMS[11]
    item = {"item": 11, "key": key, "title": title, "verdict": it["verdict"], "gated": True,
            "numbers": {k: it[k] for k in ("public", "live", "margin", "tolerance")},
            "reason": it["reason"]}
    verdict = combine([d["results"]["verdict"] for d in draws] + [it["verdict"]])
    return {"causal_score": score, "per_draw": per_draw, "item": item, "verdict": verdict}


def score_entry(estimator_file: str | Path, public: dict, panel: Panel, progress: bool = True,
                isolation=None, env=None) -> dict:
    """Score one estimator on every panel draw: the content of its ``panel.json``.

    ``public`` is its public results (item 11 compares with them). ``isolation``/``env`` as in
    :func:`benchmark.evaluate.evaluate`.
    """
    from benchmark.contract import file_sha256
    from benchmark.evaluate import evaluate

    draws = []
    for d in panel.draw_ids:
        path = panel_release(panel, d, progress=progress)
        res = evaluate(estimator_file, path, progress=progress, isolation=isolation, env=env)
        res = {k: v for k, v in res.items() if k != "packages"}
        draws.append({"draw_id": d, "trajectory_sha256": panel.draw(d)["trajectory_sha256"],
                      "results": res})
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
    """The paired panel comparison of two entries' ``panel.json`` documents.

    ``{"point", "lo", "hi", "verdict"}`` of ``a - b`` (:func:`benchmark.causal.score.
    paired_difference` on :func:`panel_score` replicates), or None when either has no score.
    """
    from benchmark.causal.score import paired_difference

    pa = panel_score([_suite_of(d["results"]) for d in a["draws"]], season)
    pb = panel_score([_suite_of(d["results"]) for d in b["draws"]], season)
    if pa is None or pb is None:
        return None
    return paired_difference(pa, pb, level)


def write_entry(folder: str | Path, doc: dict) -> None:
    """Write an entry's ``panel.json`` (the committed encoding: floats rounded, sorted keys)."""
    from benchmark.evaluate import write_results

    write_results(doc, Path(folder) / PANEL_FILE)


# ----------------------------------------------------------------------------------------------
# a new panel


def _now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_panel(submissions_dir: str | Path = "submissions", n_draws: int = MIN_DRAWS,
              scale: str | None = None, progress: bool = True, time_limit: float | None = None,
              draw_ids: list[int] | None = None) -> Panel:
    """Draw a new season panel, build its draws, score every submission on it, write it all.

    Every submission must be frozen (``submission.yaml``'s ``frozen``, written by ``submit``)
    with the sha256 of its current ``estimator.py``; the panel lists them all as ranked. The
    draw ids come from ``secrets`` after that check (``draw_ids`` only in tests). Each entry's
    ``panel.json`` is written, then the panel file last (the previous one moves to
    ``_panel/seasons/``): an interrupted run leaves the old panel in force.

    Raises:
        PanelError: fewer than :data:`MIN_DRAWS` or more than :data:`MAX_DRAWS` draws, an entry
            not frozen or changed since, or a draw that fails to build.
    """
    from benchmark import live
    from benchmark.contract import file_sha256
    from benchmark.io import atomic_write_text, dumps_json
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.files import find_submissions, load_submission, submission_env

    if not MIN_DRAWS <= int(n_draws) <= MAX_DRAWS:
        raise PanelError(f"--draws {n_draws}: a panel has {MIN_DRAWS}-{MAX_DRAWS} draws")
    require_sandbox("bt-bench panel new")
    scale = scale or live.LIVE_SCALE
    subs = [load_submission(f) for f in find_submissions(submissions_dir)]
    entries = {}
    for sub in subs:
        frozen = sub.meta.get("frozen") or {}
        sha = file_sha256(sub.estimator_file)
        if frozen.get("sha256") != sha:
            raise PanelError(
                f"{sub.path}: estimator.py (sha256 {sha[:12]}...) is not the frozen file "
                f"({str(frozen.get('sha256'))[:12]}...); re-submit it (bt-bench submit FILE "
                "--name NAME --force) before drawing a panel")
        entries[sub.name] = {"estimator_sha256": sha, "frozen_utc": frozen["utc"]}
    created = _now_utc()
    ids = [live.check_draw_id(d) for d in draw_ids] if draw_ids is not None else []
    while len(ids) < n_draws:
        d = live.new_draw_id()
        if d not in ids:
            ids.append(d)
    ids = ids[:n_draws]
    if len(set(ids)) != len(ids):
        raise PanelError(f"draw ids {ids} repeat; a panel's draws are distinct")
    season = f"{created[:10]}-{secrets.token_hex(3)}"
    print(f"season {season}: draws {ids} ({scale}, family {_family_version()}); building them",
          flush=True)
    from benchmark.build.checkpoints import copy_checkpoint
    from benchmark.build.trajectory import trajectory_sha256
    from benchmark.releases.format import sha256_file

    root = Path(submissions_dir)
    staging = root / PANEL_DIR / f".{PINS_DIR}-{season}"
    for stale in (root / PANEL_DIR).glob(f".{PINS_DIR}-*"):  # left by an interrupted run
        shutil.rmtree(stale, ignore_errors=True)
    records = []
    for d in ids:
        path = live.live_release(d, scale, progress=progress)
        fam = json.loads((path / "manifest.json").read_text())["build"]["family"]
        (seed_dir,) = sorted(path.glob("seed*"))
        pin = staging / str(d)
        copy_checkpoint(seed_dir / "checkpoints" / "step0000", pin)
        records.append({"draw_id": d, "redraw": int(fam["redraws"]),
                        "sft_sha256": sha256_file(pin / "model.safetensors"),
                        "trajectory_sha256": trajectory_sha256(path),
                        "reference": reference_summary(path)})
    panel = Panel(season, created, _family_version(), scale, tuple(records), entries,
                  panel_path(root), pins=staging)
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    envs: dict = {}
    for sub in subs:
        print(f"season {season}: scoring {sub.name} on {len(ids)} draws", flush=True)
        env = submission_env(sub, envs)
        if isinstance(env, BenchmarkError):
            raise PanelError(f"{sub.path}: requirements could not be installed: {env}")
        doc = score_entry(sub.estimator_file, sub.results, panel, progress, isolation=limits,
                          env=env)
        write_entry(sub.path, doc)
    target = panel_path(root)
    old = load_panel(root)
    if old is not None:
        keep = target.parent / SEASONS_DIR / f"{old.season}.json"
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, keep)
        if (target.parent / PINS_DIR).is_dir():
            os.replace(target.parent / PINS_DIR, keep.parent / old.season)
    shutil.rmtree(target.parent / PINS_DIR, ignore_errors=True)
    os.replace(staging, target.parent / PINS_DIR)
    atomic_write_text(target, dumps_json(panel.to_dict()))
    return Panel(**{**panel.__dict__, "pins": None})


def score_entries(submissions_dir: str | Path, names: list[str], progress: bool = True,
                  time_limit: float | None = None) -> list[Path]:
    """(Re)score the named submissions on the current panel; write their ``panel.json``.

    Raises:
        PanelError: there is no panel, or an entry's requirements cannot be installed.
    """
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.files import load_submission, submission_env

    require_sandbox("bt-bench panel score")
    panel = load_panel(submissions_dir)
    if panel is None:
        raise PanelError(f"{panel_path(submissions_dir)}: no season panel to score on; a "
                         "maintainer draws one with bt-bench panel new")
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    envs: dict = {}
    out = []
    for name in names:
        sub = load_submission(Path(submissions_dir) / name)
        env = submission_env(sub, envs)
        if isinstance(env, BenchmarkError):
            raise PanelError(f"{sub.path}: requirements could not be installed: {env}")
        write_entry(sub.path, score_entry(sub.estimator_file, sub.results, panel, progress,
                                          isolation=limits, env=env))
        out.append(sub.path / PANEL_FILE)
    return out


def panel_command(args: Any) -> int:
    """``bt-bench panel new|show|score``."""
    from benchmark.io import read_json

    if args.panel_command == "score":
        for f in score_entries(args.submissions_dir, args.names, not args.no_progress,
                               args.time_limit):
            print(f"wrote {f}")
        return 0
    if args.panel_command == "new":
        p = new_panel(args.submissions_dir, args.draws, args.scale, not args.no_progress,
                      args.time_limit)
        print(f"wrote {p.path}: season {p.season}, created {p.created_utc}, draws "
              f"{p.draw_ids}, {len(p.entries)} ranked entries")
        print("next: bt-bench leaderboard, then commit submissions/ and leaderboard/")
        return 0
    panel = load_panel(args.submissions_dir)
    if panel is None:
        print(f"no panel in {args.submissions_dir}/{PANEL_DIR}/ (draw one: bt-bench panel new)")
        return 1
    print(f"season {panel.season} (created {panel.created_utc}, family {panel.family_version}, "
          f"{panel.scale})")
    for d in panel.draws:
        print(f"  draw {d['draw_id']}: trajectory {d['trajectory_sha256']}")
    for name in sorted(panel.entries):
        f = Path(args.submissions_dir) / name / PANEL_FILE
        s = (read_json(f).get("summary") or {}).get("causal_score") if f.is_file() else None
        shown = f"{s['point']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]" if s else "no score"
        print(f"  {name}: {shown}")
    return 0

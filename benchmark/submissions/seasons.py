"""``bt-bench panel``: drawing a season panel, scoring and binding entries, showing its power.

* :func:`new_panel` (``panel new``, maintainers): draws a season seed with ``secrets``, screens
  candidate draws in the seed's sequence until the accepted ones hold :data:`MIN_CELLS`
  measurable cells (:mod:`benchmark.submissions.screen`), scores every frozen entry on them, binds
  each entry's files by sha256 and writes the panel file last;
* :func:`score_entries` (``panel score``): (re)scores entries on the current panel;
* :func:`bind_entries` (``panel bind``, maintainers): records the sha256 of entries' files in the
  panel file after review, so that verify samples their numbers instead of re-scoring them all;
* :func:`rescreen` (``panel screen ID``): rebuilds one candidate from its pinned checkpoint and
  screens it again, to replay the selection;
* ``panel show``: the season, its screen, every candidate, the cells and the power.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from benchmark.errors import BenchmarkError
from benchmark.submissions.panel import (
    BOUND_FILES,
    MAX_CANDIDATES,
    MIN_CELLS,
    MIN_DRAWS,
    PANEL_DIR,
    PANEL_FILE,
    PINS_DIR,
    SEASONS_DIR,
    Panel,
    PanelError,
    _family_version,
    _now_utc,
    _suite_of,
    binding_of,
    load_panel,
    panel_path,
    panel_score,
    reference_summary,
    score_entry,
    write_entry,
)

__all__ = ["bind_entries", "entry_power", "new_panel", "panel_command", "recorded_draws",
           "rescreen", "score_entries"]

#: the paired difference whose power a panel states (issue 39): the best-known method and random
POWER_PAIR = ("tracincp", "random")


def entry_power(docs: dict[str, dict], pair: tuple[str, str] = POWER_PAIR) -> dict | None:
    """The power figures of the paired ``pair[0] - pair[1]`` panel difference (draws fixed).

    ``docs``: submission name -> its ``panel.json``. None when either entry has no score.
    """
    from benchmark.submissions.screen import power_of

    a, b = (docs.get(n) for n in pair)
    if a is None or b is None:
        return None
    pa = panel_score([_suite_of(d["results"]) for d in a["draws"]])
    pb = panel_score([_suite_of(d["results"]) for d in b["draws"]])
    if pa is None or pb is None:
        return None
    return {"pair": f"{pair[0]} - {pair[1]}"} | power_of(pa[0] - pb[0], pa[1] - pb[1])


def _candidate(index: int, draw_id: int, scale: str, staging: Path,
               screen, progress: bool) -> tuple[dict, Path | None]:
    """Build (or find) one candidate, pin its post-SFT checkpoint, screen it: its record."""
    from benchmark import live
    from benchmark.build.checkpoints import copy_checkpoint
    from benchmark.build.trajectory import trajectory_sha256
    from benchmark.errors import BuildError
    from benchmark.releases.format import sha256_file

    t0 = time.perf_counter()
    rec: dict[str, Any] = {"index": index, "draw_id": int(draw_id)}
    try:
        path = live.live_release(draw_id, scale, progress=progress)
    except BuildError as exc:
        return rec | {"accepted": False, "reason": f"the build failed its gates: {exc}"[:3900],
                      "seconds": round(time.perf_counter() - t0, 1)}, None
    fam = json.loads((path / "manifest.json").read_text())["build"]["family"]
    (seed_dir,) = sorted(path.glob("seed*"))
    pin = staging / str(draw_id)
    copy_checkpoint(seed_dir / "checkpoints" / "step0000", pin)
    sc = screen(path)
    rec |= {"accepted": bool(sc["accepted"]), "reason": sc["reason"][:3900],
            "redraw": int(fam["redraws"]), "sft_sha256": sha256_file(pin / "model.safetensors"),
            "trajectory_sha256": trajectory_sha256(path), "cells": sc["cells"],
            "seconds": round(time.perf_counter() - t0, 1)}
    return rec, path


def new_panel(submissions_dir: str | Path = "submissions", min_cells: int = MIN_CELLS,
              scale: str | None = None, progress: bool = True, time_limit: float | None = None,
              season_seed: str | None = None, max_candidates: int = MAX_CANDIDATES,
              screen=None) -> Panel:
    """Draw a new season panel, screen its draws, score every submission on it, write it all.

    Every submission must be frozen (``submission.yaml``'s ``frozen``, written by ``submit``)
    with the sha256 of its current ``estimator.py``; the panel lists them all as ranked. Then a
    season seed is drawn with ``secrets`` (``season_seed`` resumes an interrupted run: the same
    seed gives the same candidates, found in the cache, and an entry's draws already scored by an
    earlier run are kept, :func:`recorded_draws`), candidates are built and screened in
    the seed's sequence (:func:`benchmark.submissions.screen.candidate_ids`) until the accepted
    draws hold ``min_cells`` measurable cells (and at least :data:`MIN_DRAWS` draws), every
    entry is scored on them, each entry's ``panel.json`` is written and bound by sha256, and the
    panel file is written last (the previous one moves to ``_panel/seasons/``): an interrupted
    run leaves the old panel in force.

    Args:
        submissions_dir: the submissions folder.
        min_cells: measurable cells the panel must hold (:data:`MIN_CELLS`).
        scale: the family scale (default :data:`benchmark.live.LIVE_SCALE`).
        progress: show progress bars.
        time_limit: the estimator sandbox's wall-time limit in seconds (default 600).
        season_seed: 32 hex digits (resume); None draws one.
        max_candidates: give up after screening this many candidates.
        screen: ``release folder -> {"accepted", "reason", "cells"}`` (default
            :func:`benchmark.submissions.screen.screen_release`; tests pass their own and it is
            recorded as such).

    Raises:
        PanelError: an entry not frozen or changed since, a malformed season seed, or too few
            accepted draws within ``max_candidates``.
    """
    from benchmark import live
    from benchmark.contract import file_sha256
    from benchmark.io import atomic_write_text, dumps_json
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.files import find_submissions, load_submission, submission_env
    from benchmark.submissions.screen import (
        candidate_ids,
        design_power,
        screen_release,
        screen_settings,
    )

    require_sandbox("bt-bench panel new")
    scale = scale or live.LIVE_SCALE
    if not 1 <= int(min_cells) <= 10_000:
        raise PanelError(f"--min-cells {min_cells}: expected a positive number of cells")
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
    if season_seed is None:
        season_seed = secrets.token_hex(16)
    if len(season_seed) != 32 or any(c not in "0123456789abcdef" for c in season_seed):
        raise PanelError(f"--season-seed {season_seed[:40]!r}: expected 32 lowercase hex digits "
                         "(the seed printed by the run to resume)")
    season = f"{created[:10]}-{season_seed[:6]}"
    recorded_screen = screen_settings() if screen is None else {
        "rule": f"custom screen {getattr(screen, '__name__', 'function')} (tests)"}
    screen = screen or screen_release
    print(f"season {season}: season seed {season_seed} (resume with --season-seed "
          f"{season_seed}); screening candidates until {min_cells} measurable cells "
          f"({scale}, family {_family_version()})", flush=True)
    root = Path(submissions_dir)
    staging = root / PANEL_DIR / f".{PINS_DIR}-{season}"
    for stale in (root / PANEL_DIR).glob(f".{PINS_DIR}-*"):  # left by an interrupted run
        shutil.rmtree(stale, ignore_errors=True)
    t0 = time.perf_counter()
    candidates, draws, paths = [], [], []
    for index, d in enumerate(candidate_ids(season_seed, max_candidates)):
        cells = sum(len(x["cells"]) for x in draws)
        if cells >= min_cells and len(draws) >= MIN_DRAWS:
            break
        rec, path = _candidate(index, d, scale, staging, screen, progress)
        candidates.append(rec)
        print(f"season {season}: candidate {index} draw {d}: "
              + ("accepted" if rec["accepted"] else "rejected") + f" ({rec['reason'][:300]}; "
              f"{rec['seconds']} s)", flush=True)
        if rec["accepted"]:
            draws.append({k: rec[k] for k in ("draw_id", "redraw", "sft_sha256",
                                              "trajectory_sha256", "cells")}
                         | {"reference": reference_summary(path)})
            paths.append(path)
    cells = sum(len(x["cells"]) for x in draws)
    if cells < min_cells or len(draws) < MIN_DRAWS:
        shutil.rmtree(staging, ignore_errors=True)
        raise PanelError(
            f"season {season}: {len(candidates)} candidates screened, {len(draws)} accepted "
            f"({cells} measurable cells; {min_cells} and {MIN_DRAWS} draws needed): the family "
            "rarely passes the screen at this scale; raise --max-candidates or change the "
            "family's ranges (docs/task_family.md)")
    t_screen = time.perf_counter() - t0
    power = {"design": design_power(paths)}
    panel = Panel(season, created, _family_version(), scale, tuple(draws), entries,
                  panel_path(root), season_seed, recorded_screen, tuple(candidates), min_cells,
                  {}, power, pins=staging)
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    envs: dict = {}
    docs, times = {}, {}
    for sub in subs:
        t1 = time.perf_counter()
        kept = recorded_draws(sub, panel, season_seed)
        todo = [d for d in panel.draw_ids if d not in kept]
        print(f"season {season}: scoring {sub.name} on {len(todo)} draws"
              + (f" ({len(kept)} kept from an earlier run of this season)" if kept else ""),
              flush=True)
        env = submission_env(sub, envs) if todo else None
        if isinstance(env, BenchmarkError):
            raise PanelError(f"{sub.path}: requirements could not be installed: {env}")
        docs[sub.name] = score_entry(sub.estimator_file, sub.results, panel, progress,
                                     isolation=limits, env=env, recorded=kept)
        write_entry(sub.path, docs[sub.name])
        times[sub.name] = round(time.perf_counter() - t1, 1)
    bindings = {sub.name: binding_of(sub.path) for sub in subs}
    power["entries"] = entry_power(docs)
    timings = {"screen_seconds": round(t_screen, 1), "scoring_seconds": times,
               "total_seconds": round(time.perf_counter() - t0, 1)}
    panel = Panel(**{**panel.__dict__, "bindings": bindings, "power": power})
    target = panel_path(root)
    old = load_panel(root) if target.is_file() and _schema(target) == 2 else None
    keep_dir = target.parent / SEASONS_DIR
    if target.is_file():
        name = old.season if old is not None else _old_season(target)
        keep_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, keep_dir / f"{name}.json")
        if (target.parent / PINS_DIR).is_dir():
            os.replace(target.parent / PINS_DIR, keep_dir / name)
    shutil.rmtree(target.parent / PINS_DIR, ignore_errors=True)
    os.replace(staging, target.parent / PINS_DIR)
    atomic_write_text(target, dumps_json(panel.to_dict() | {"timings": timings}))
    return Panel(**{**panel.__dict__, "pins": None})


def recorded_draws(sub, panel: Panel, season_seed: str) -> dict[int, dict]:
    """Draw records of ``sub`` left by an earlier ``panel new`` of this season: draw id -> record.

    A six-draw season takes longer than one sitting on a 2-core machine, and a season may first
    be put in force on a prefix of its accepted draws (``--min-cells``) and extended later with
    the same seed. The entry's ``panel.json`` is read if it was written for the same season
    seed (the season id's suffix: the id's date is the day a run starts), from the frozen
    ``estimator.py`` (sha256); each of its draw records is kept when its draw id and trajectory
    hash are one of this panel's draws and it holds a results object. Such a record is what
    scoring again would give: the draws are float64 builds, the entry runs as frozen, and the
    record was written by the maintainers' own run (an entry cannot write its folder). The
    summary is always derived anew. Anything else (another season, an edited estimator, an
    unreadable file, another trajectory) is scored again.
    """
    from benchmark.contract import file_sha256

    try:
        doc = json.loads((sub.path / PANEL_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or not str(doc.get("season", "")).endswith(
            "-" + season_seed[:6]) or doc.get("estimator_sha256") != file_sha256(
            sub.estimator_file) or not isinstance(doc.get("draws"), list):
        return {}
    hashes = {int(d["draw_id"]): d["trajectory_sha256"] for d in panel.draws}
    kept = {}
    for r in doc["draws"]:
        if isinstance(r, dict) and isinstance(r.get("results"), dict) and \
                hashes.get(r.get("draw_id")) == r.get("trajectory_sha256"):
            kept[int(r["draw_id"])] = r
    return kept


def _schema(path: Path) -> int | None:
    try:
        return json.loads(path.read_text()).get("schema_version")
    except (OSError, ValueError, AttributeError):
        return None


def _old_season(path: Path) -> str:
    """The season id of a panel file of an older schema (kept when it is replaced)."""
    try:
        s = json.loads(path.read_text()).get("season")
        return s if isinstance(s, str) and len(s) == 17 else "unknown"
    except (OSError, ValueError, AttributeError):
        return "unknown"


def _require_panel(submissions_dir: str | Path) -> Panel:
    panel = load_panel(submissions_dir)
    if panel is None:
        raise PanelError(f"{panel_path(submissions_dir)}: no season panel; a maintainer draws "
                         "one with bt-bench panel new")
    return panel


def score_entries(submissions_dir: str | Path, names: list[str], progress: bool = True,
                  time_limit: float | None = None) -> list[Path]:
    """(Re)score the named submissions on the current panel; write their ``panel.json``.

    A re-scored entry's files no longer match its binding (if it had one) until a maintainer
    binds it again (:func:`bind_entries`); until then verify re-scores it in full.

    Raises:
        PanelError: there is no panel, or an entry's requirements cannot be installed.
    """
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.files import load_submission, submission_env

    require_sandbox("bt-bench panel score")
    panel = _require_panel(submissions_dir)
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


def bind_entries(submissions_dir: str | Path, names: list[str]) -> Panel:
    """Maintainers: record the sha256 of entries' files in the panel file (after review).

    A bound entry's ``estimator.py``, ``results.json`` and ``panel.json`` must keep these hashes
    (a PR that edits one fails verify), and verify re-scores a sample of its numbers on each run
    instead of all of them. Binding does not rank: a provisional entry stays provisional.

    Raises:
        PanelError: no panel, an unknown entry, or an entry without a ``panel.json`` of this
            season.
    """
    from benchmark.io import atomic_write_text, dumps_json, read_json
    from benchmark.submissions.files import load_submission
    from benchmark.submissions.panel import check_entry_doc

    panel = _require_panel(submissions_dir)
    bindings = dict(panel.bindings)
    for name in names:
        sub = load_submission(Path(submissions_dir) / name)
        where = sub.path / PANEL_FILE
        if not where.is_file():
            raise PanelError(f"{where} is missing: score the entry first (bt-bench panel score "
                             f"{name})")
        check_entry_doc(read_json(where), panel, str(where))
        bindings[sub.name] = binding_of(sub.path)
    doc = read_json(panel.path)
    doc["bindings"] = {k: {f: v[f] for f in BOUND_FILES} for k, v in sorted(bindings.items())}
    atomic_write_text(panel.path, dumps_json(doc))
    return _require_panel(submissions_dir)


def rescreen(submissions_dir: str | Path, draw_id: int, progress: bool = True) -> dict:
    """Rebuild one candidate of the current panel from its pin and screen it again.

    Returns ``{"recorded": candidate record, "here": screen result}``.

    Raises:
        PanelError: the id is not a candidate, or it has no pinned checkpoint (its build failed
            its gates: nothing to screen).
    """
    from benchmark import live
    from benchmark.releases.format import sha256_file
    from benchmark.submissions.screen import screen_release

    panel = _require_panel(submissions_dir)
    rec = next((c for c in panel.candidates if c["draw_id"] == int(draw_id)), None)
    if rec is None:
        raise PanelError(f"draw {draw_id} is not a candidate of season {panel.season} "
                         f"({[c['draw_id'] for c in panel.candidates]})")
    pin = panel.pin_dir(draw_id)
    if "sft_sha256" not in rec or not (pin / "model.safetensors").is_file() or \
            sha256_file(pin / "model.safetensors") != rec["sft_sha256"]:
        raise PanelError(f"candidate {draw_id} has no pinned post-SFT checkpoint matching its "
                         f"record at {pin} ({rec['reason'][:200]})")
    path = live.live_release(draw_id, panel.scale, progress=progress,
                             pin={"redraw": rec["redraw"], "sft_checkpoint": pin})
    return {"recorded": rec, "here": screen_release(path)}


# ----------------------------------------------------------------------------------------------
# the command


def _iv(d: dict | None) -> str:
    return "-" if not d else f"{d['point']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


def power_lines(power: dict) -> list[str]:
    """The panel's power in words (``panel show``, the board)."""
    out = []
    for key, what in (("entries", "paired"), ("design", "design (from the references alone)")):
        p = (power or {}).get(key)
        if not p:
            continue
        out.append(f"power, {what}: {p['pair']} = {_iv(p)} (draws fixed); half-width "
                   f"{p['half_width']:.3f}; smallest difference told apart: {p['detectable']:.3f} "
                   f"(half the time), {p['detectable_80']:.3f} (80% of the time)")
    return out


def show_lines(panel: Panel, submissions_dir: str | Path) -> list[str]:
    """``bt-bench panel show``'s text."""
    from benchmark.io import read_json

    lines = [f"season {panel.season} (created {panel.created_utc}, family "
             f"{panel.family_version}, {panel.scale}); season seed {panel.season_seed}",
             f"screen: {panel.screen.get('rule', '-')}",
             f"{len(panel.candidates)} candidates screened, {len(panel.draws)} accepted: "
             f"{panel.n_cells} measurable cells (at least {panel.min_cells})"]
    for c in panel.candidates:
        lines.append(f"  candidate {c['index']}: draw {c['draw_id']} "
                     + ("ACCEPTED" if c["accepted"] else "rejected") + f": {c['reason'][:400]}")
    lines += power_lines(panel.power)
    for name in sorted(set(panel.entries) | set(panel.bindings)):
        f = Path(submissions_dir) / name / PANEL_FILE
        summ = (read_json(f).get("summary") or {}) if f.is_file() else {}
        s, fam = summ.get("causal_score"), summ.get("family")
        status = "ranked" if name in panel.entries else "provisional"
        lines.append(f"  {name} ({status}): panel {_iv(s)}, family {_iv(fam)}, verdict "
                     f"{summ.get('verdict', '-')}")
    return lines


def panel_command(args: Any) -> int:
    """``bt-bench panel new|show|score|bind|screen``."""
    if args.panel_command == "score":
        for f in score_entries(args.submissions_dir, args.names, not args.no_progress,
                               args.time_limit):
            print(f"wrote {f}")
        print("next: a maintainer binds the re-scored entries after review (bt-bench panel bind "
              "NAME ...)")
        return 0
    if args.panel_command == "new":
        p = new_panel(args.submissions_dir, args.min_cells, args.scale, not args.no_progress,
                      args.time_limit, args.season_seed, args.max_candidates)
        print(f"wrote {p.path}: season {p.season}, created {p.created_utc}, draws "
              f"{p.draw_ids} ({p.n_cells} measurable cells of {len(p.candidates)} candidates), "
              f"{len(p.entries)} ranked entries")
        for line in power_lines(p.power):
            print(line)
        print("next: bt-bench leaderboard, then commit submissions/ and leaderboard/")
        return 0
    if args.panel_command == "bind":
        p = bind_entries(args.submissions_dir, args.names)
        print(f"bound {', '.join(args.names)} in {p.path} ({len(p.bindings)} bound entries)")
        return 0
    if args.panel_command == "screen":
        out = rescreen(args.submissions_dir, args.draw_id, not args.no_progress)
        rec, here = out["recorded"], out["here"]
        same = rec["accepted"] == here["accepted"]
        print(f"candidate {rec['index']} draw {rec['draw_id']}: recorded "
              f"{'accepted' if rec['accepted'] else 'rejected'} ({rec['reason'][:300]}); here "
              f"{'accepted' if here['accepted'] else 'rejected'} ({here['reason'][:300]})"
              + ("" if same else "; THE SCREEN DECIDES OTHERWISE HERE"))
        return 0 if same else 1
    panel = load_panel(args.submissions_dir)
    if panel is None:
        print(f"no panel in {args.submissions_dir}/{PANEL_DIR}/ (draw one: bt-bench panel new)")
        return 1
    for line in show_lines(panel, args.submissions_dir):
        print(line)
    return 0

"""The leaderboard's data: submissions grouped by release, track and task, ranked.

:func:`leaderboard_data` returns what ``leaderboard.json`` holds; the markdown and HTML renderers
and the figures read only that (and, for the figures, the per-seed numbers of each results file).

Layout of one release: ``entries`` (one per submission: identity, colour, fallbacks), ``suite``
(one table per track: the causal score averaged over tasks and seeds) and ``tasks`` (per task,
one table per track). Every table has the reference rows of its release: the oracle (group
labels) and provenance (rollout labels) above the ranked rows, the random band (and chance)
below them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmark.contract import TRACKS  # the tracks in table order
from benchmark.leaderboard import rows as R
from benchmark.leaderboard._common import (
    LEADERBOARD_SCHEMA_VERSION,
    REGENERATE,
    LeaderboardError,
    finite,
    get,
    round_floats,
    sha,
)
from benchmark.leaderboard.paired import (
    causal_settings,
    entry_replicates,
    pairwise,
    scored_places,
)
from benchmark.leaderboard.ranking import rank_rows
from benchmark.leaderboard.reference import REFERENCE_DIR, REFERENCE_FILE

__all__ = ["RANKING", "Board", "assemble_data", "build_board", "leaderboard_data"]

RANKING = ("per release, track and task (and for the suite: the mean over tasks and seeds): an "
           "entry's rank is 1 + the number of entries of its table that are significantly "
           "better: the paired 95% interval of the difference of their causal scores (shared "
           "prompt resample, independent training noise) has its lower end above the "
           "cross-machine tolerance 0.01. Rows are ordered by rank, then causal score; entries "
           "with the same rank are tied ('='), never through a neighbour. 'pairwise' holds "
           "every ordered pair's difference and verdict. Releases without a causal reference "
           "rank the task tables by window precision (group label), an entry being "
           "significantly better when its interval lies wholly above the other's.")
#: reference values of different submissions of one release must agree within this
REFERENCE_TOLERANCE = 1e-6


@dataclass
class Board:
    """The leaderboard's data and, for the figures, each submission's results by name."""

    releases: list[dict]
    results: dict[str, dict] = field(default_factory=dict)


def _consensus(items: list[tuple[str, Any]], path: str, rid: str) -> Any:
    """Merge equal values of several submissions: the first non-None wins; others must agree."""
    present = [(n, v) for n, v in items if v is not None]
    if not present:
        return None
    first_name, first = present[0]
    if isinstance(first, dict):
        keys = sorted({k for _, v in present if isinstance(v, dict) for k in v})
        return {k: _consensus([(n, v.get(k) if isinstance(v, dict) else None)
                               for n, v in present], f"{path}.{k}", rid) for k in keys}
    for name, v in present[1:]:
        same = (abs(v - first) <= REFERENCE_TOLERANCE if finite(v) and finite(first)
                else v == first)
        if not same:
            raise LeaderboardError(
                f"release {rid!r}: {path} differs between submissions {first_name!r} ({first!r}) "
                f"and {name!r} ({v!r}); it does not depend on the estimator, so they were scored "
                "with different settings or builds. Re-score the stale one with bt-bench submit "
                "FILE --name NAME --force."
            )
    return first


def _check_release(rid: str, members: list[tuple[dict, dict, dict]]) -> list[str]:
    """Refuse mixed builds and partial task sets; return the release's tasks in order."""
    shas = sorted({str(e["release"]["manifest_sha256"]) for e, _, _ in members})
    if len(shas) > 1:
        which = ", ".join(f"{e['name']} ({str(e['release']['manifest_sha256'])[:12]})"
                          for e, _, _ in members)
        raise LeaderboardError(
            f"submissions scored on release {rid!r} disagree on its manifest sha256: {which}; "
            "they were scored on different builds, so they cannot be ranked together. "
            "Re-score the stale ones with bt-bench submit FILE --name NAME --force."
        )
    tasks: list[str] = []
    for e, _, _ in members:
        for t in e["release"]["tasks"]:
            if t not in tasks:
                tasks.append(t)
    for e, _, results in members:
        missing = [t for t in tasks if t not in results["tasks"]]
        if missing:
            raise LeaderboardError(
                f"submission {e['name']!r} on release {rid!r} has no results for task(s) "
                f"{', '.join(missing)} (release tasks: {', '.join(tasks)}); a leaderboard entry "
                "is scored on every task. Re-score it without --tasks: bt-bench submit FILE "
                "--name NAME --force."
            )
    return tasks


def _ranked_by(rows: list[dict], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if any((r.get(key) or {}).get("point") is not None for r in rows):
            return key
    return None


def _table(track: str, rows: list[dict], keys: tuple[str, ...],
           reps: dict[str, tuple] | None = None, level: float = 0.95) -> dict:
    """One ranked table of a track.

    With ``reps`` (name -> causal point and replicates) it is ranked by paired comparisons and
    carries the pairwise table and each row's ``better_than`` / ``worse_than``.
    """
    by = _ranked_by(rows, keys)
    # without any score every row is unranked ("-") and ordered by name
    if by != "causal_score" or not reps:
        return {"track": track, "ranked_by": by, "rows": rank_rows(rows, by or keys[0])}
    scored = [r["name"] for r in rows if (r.get(by) or {}).get("point") is not None]
    missing = [n for n in scored if n not in reps]
    if missing:
        raise LeaderboardError(f"submissions {missing} have a causal score but no replicates; "
                               "re-score them with bt-bench submit FILE --name NAME --force.")
    pw = pairwise({n: reps[n] for n in scored}, level)
    ranked = rank_rows(rows, by, lambda a, b: pw[a][b]["verdict"] == "better")
    order = [r["name"] for r in ranked if r["name"] in pw]
    for r in ranked:
        if r["name"] in pw:
            r["better_than"] = [n for n in order if n != r["name"]
                                and pw[r["name"]][n]["verdict"] == "better"]
            r["worse_than"] = [n for n in order if n != r["name"]
                               and pw[r["name"]][n]["verdict"] == "worse"]
    return {"track": track, "ranked_by": by, "rows": ranked, "pairwise": pw}


def _replicates(rid: str, members: list[tuple[dict, dict, dict]], tasks: list[str]
                ) -> tuple[dict[str, dict], float]:
    """Each scored entry's replicates (task and ``suite`` -> (point, replicates)) and the level.

    Raises:
        LeaderboardError: entries scored with different causal bootstrap settings or on
            different (task, seed) sets (their resamples would not pair), or two entries of one
            track with the same estimator name (their training-noise draws would coincide).
    """
    scored = [(e, res) for e, _, res in members
              if get(res, "suite", "causal_score", get(res, "estimator", "name")) is not None]
    settings = _consensus([(e["name"], vars(causal_settings(e["name"], res)))
                           for e, res in scored], "causal bootstrap settings", rid)
    seen: dict[tuple[str, str], str] = {}
    for e, res in scored:
        key = (e["track"], str(res["estimator"]["name"]))
        if key in seen:
            raise LeaderboardError(
                f"release {rid!r}: submissions {seen[key]!r} and {e['name']!r} both name their "
                f"estimator {key[1]!r} in the {key[0]} track; an entry's training-noise draws "
                "are seeded by that name, so the two would share them and their paired "
                "comparison would understate its noise. Give one estimator class another `name` "
                "and re-score it with bt-bench submit FILE --name NAME --force.")
        seen[key] = e["name"]
    places = {e["name"]: scored_places(res, tasks) for e, res in scored}
    if len({tuple(v) for v in places.values()}) > 1:
        which = "; ".join(f"{n}: {', '.join(f'{t}/{s}' for t, s in v)}"
                          for n, v in sorted(places.items()))
        raise LeaderboardError(
            f"release {rid!r}: submissions have causal scores on different (task, seed) sets "
            f"({which}); their means would not pair. Re-score every submission on every seed: "
            "bt-bench submit FILE --name NAME --force.")
    reps = {}
    for e, res in scored:
        r = entry_replicates(e["name"], res, tasks)
        if r is not None:
            reps[e["name"]] = r
    return reps, float((settings or {}).get("level", 0.95))


def _scope(reps: dict[str, dict], scope: str) -> dict[str, tuple]:
    return {n: r[scope] for n, r in reps.items() if scope in r}


def _release(rid: str, members: list[tuple[dict, dict, dict]], colours: dict) -> dict:
    members = sorted(members, key=lambda m: m[0]["name"])
    tasks = _check_release(rid, members)
    versions = sorted({str(e["release"]["version"]) for e, _, _ in members})
    tracks = [t for t in TRACKS if any(e["track"] == t for e, _, _ in members)]
    behaviors = {t: _consensus([(e["name"], res["tasks"][t].get("behavior"))
                                for e, _, res in members], f"tasks.{t}.behavior", rid)
                 for t in tasks}
    suite_ref = _consensus([(e["name"], R.suite_reference(res, tasks)) for e, _, res in members],
                           "suite reference rows", rid)
    reps, level = _replicates(rid, members, tasks)
    suite = {"reference": suite_ref, "tracks": []}
    for tr in tracks:
        rows = [R.suite_row(meta, res, tasks) for e, meta, res in members if e["track"] == tr]
        suite["tracks"].append(_table(tr, rows, ("causal_score",), _scope(reps, "suite"),
                                      level))
    out_tasks = []
    for t in tasks:
        ref = _consensus([(e["name"], R.task_reference(res, t)) for e, _, res in members],
                         f"task {t} reference rows", rid)
        entry: dict[str, Any] = {"id": t, "behavior": behaviors[t], "reference": ref,
                                 "tracks": []}
        for tr in tracks:
            rows = [R.task_row(meta, res, t) for e, meta, res in members if e["track"] == tr]
            entry["tracks"].append(_table(tr, rows, ("causal_score", "precision"),
                                          _scope(reps, t), level))
        out_tasks.append(entry)
    entries = {e["name"]: dict(e, **colours[e["name"]]) for e, _, _ in members}
    return {"id": rid, "version": versions[0],
            "manifest_sha256": str(members[0][0]["release"]["manifest_sha256"]),
            "tasks": out_tasks, "suite": suite, "entries": entries}


def build_board(submissions: list[tuple[dict, dict]]) -> Board:
    """Group ``(meta, results)`` pairs by release id and build every ranked table.

    Raises:
        LeaderboardError: results that are not schema 3, submissions of one release id scored on
            different builds or with different reference numbers, or with missing tasks.
    """
    from benchmark.leaderboard.figures import assign_colours

    scored = [(R.build_entry(meta, res), meta, res) for meta, res in submissions]
    colours = assign_colours([e for e, _, _ in scored])
    groups: dict[str, list[tuple[dict, dict, dict]]] = {}
    for item in scored:
        groups.setdefault(str(item[0]["release"]["id"]), []).append(item)
    releases = [_release(rid, groups[rid], colours) for rid in sorted(groups)]
    return Board(releases, {e["name"]: res for e, _, res in scored})


def leaderboard_data(submissions: list[tuple[dict, dict]],
                     reference: list[dict] | None = None) -> dict:
    """The complete leaderboard (what ``leaderboard.json`` holds) from ``(meta, results)`` pairs.

    Args:
        submissions: ``(submission.yaml, results.json)`` of every submission.
        reference: the paper's reference rows, or None when the file is absent.
    """
    from benchmark.leaderboard.figures import figure_specs

    board = build_board(submissions)
    specs = figure_specs(board)
    return assemble_data(board, specs, reference)


def assemble_data(board: Board, specs: dict[str, dict], reference: list[dict] | None,
                  season: dict | None = None, not_running: list[dict] | None = None) -> dict:
    """``leaderboard.json``'s content.

    The season panel's ranking (``season``: what ranks, or None without a panel), the public
    release's boards (the development scores), each table's figures, the figures' data hashes,
    and the entries that do not run here (``not_running``: validated ``submission.yaml`` of
    each, listed by name with the reason and the requirements tried).
    """
    from benchmark.leaderboard.figures import KINDS, figure_path

    for rel in board.releases:
        for task in rel["tasks"]:
            for table in task["tracks"]:
                paths = {k: figure_path(k, rel["id"], task["id"], table["track"]) for k in KINDS}
                table["figures"] = {k: p for k, p in paths.items() if p in specs}
    return round_floats({
        "schema_version": LEADERBOARD_SCHEMA_VERSION,
        "generated_by": f"{REGENERATE} (do not edit; regenerate from submissions/)",
        "ranking": RANKING,
        "season": season,
        "releases": board.releases,
        "not_running": sorted((R.not_running_row(m) for m in not_running or ()),
                              key=lambda r: r["name"]),
        "reference": None if reference is None else {
            "file": f"submissions/{REFERENCE_DIR}/{REFERENCE_FILE}",
            "model": "Qwen2.5-1.5B-Instruct (the paper's runs; not ranked with the submissions)",
            "rows": reference},
        "figures": {path: {"what": s["what"], "data_sha256": sha(s["data"])}
                    for path, s in sorted(specs.items())},
    })

"""``bt-bench verify``: re-score submissions from their code and compare.

``verify`` re-evaluates ``estimator.py`` on the release recorded in ``results.json`` with the
standard evaluation settings and compares the new results with the committed ones
(:func:`benchmark.submissions.compare.compare_results`); re-scores the entry on the season panel's
draws (:mod:`benchmark.submissions.panel`: a draw is rebuilt from its id and must give the
recorded trajectory hash, or the entry fails); and scores it on one fresh draw, the gate against
collapse (:mod:`benchmark.submissions.gate`). What one run re-scores is its plan
(:mod:`benchmark.submissions.scope`): entries the panel file does not bind (new or changed ones)
in full, the bound ones by a sample chosen in the run; an entry whose bound files were edited
fails. No recorded number is taken on trust.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark.errors import BenchmarkError
from benchmark.sandbox.requirements import RequirementError
from benchmark.submissions.compare import (
    IGNORED_KEYS,
    IGNORED_LEAVES,
    MAX_DRIFT_LINES,
    Drift,
    _report_order,
    compare_results,
)
from benchmark.submissions.files import (
    ESTIMATOR_FILE,
    METADATA_FILE,
    RESULTS_FILE,
    Submission,
    SubmissionError,
    check_not_running,
    declares_not_running,
    find_submissions,
    load_submission,
    submission_env,
)
from benchmark.submissions.panel import (
    MACHINE_LEAVES,
    PANEL_FILE,
    Panel,
    PanelError,
    entry_status,
    load_panel,
)
from benchmark.submissions.scope import Plan


@dataclass
class VerifyReport:
    """The outcome of verifying one submission."""

    path: Path
    drifts: list[Drift] = field(default_factory=list)
    code_changed: bool = False
    ignored: list[Drift] = field(default_factory=list)
    error: str | None = None
    fix: str | None = None
    #: the live check (:func:`benchmark.live.live_gate`) on the run's new draw: ``{"draw_id",
    #: "scale", "ok", "reason", "reproduce"}``; None when it did not run
    live_check: dict | None = None
    #: the entry's place on the season panel: ``"ranked"``, ``"provisional"`` or ``"unscored"``
    #: (no panel); its panel numbers are checked like the rest (drifts under ``panel.``)
    panel_status: str = "unscored"
    #: checks that passed and say something (e.g. an attack control not above its base)
    notes: list[str] = field(default_factory=list)
    #: what this run re-scored: ``"public"`` and ``"draw <id>"`` (empty: nothing, a bound entry
    #: outside this run's sample)
    rescored: list[str] = field(default_factory=list)
    #: the entry's binding state under the panel (``bound``, ``unbound``, ``edited``; ``""``: none)
    binding: str = ""

    @property
    def ok(self) -> bool:
        """True when nothing but the ignored keys differs and the live check did not fail."""
        return (not self.drifts and not self.code_changed and self.error is None
                and (self.live_check is None or bool(self.live_check["ok"])))

    def format(self) -> str:
        """A readable report: ``ok`` or the reasons it failed, one per line."""
        head = f"{self.path}: "
        if self.ok:
            what = (f"re-scored: {', '.join(self.rescored)}" if self.rescored else
                    "bound by the season panel, not in this run's sample")
            lines = [head + f"ok ({what}" + (
                f"; {self.panel_status} on the season panel" if self.panel_status != "unscored"
                else "") + ")"]
        else:
            n = len(self.drifts)
            lines = [head + "FAILED" + (f" ({n} value{'s' if n != 1 else ''} differ)" if n else "")]
        if self.error:
            lines.append(f"  {self.error}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        if self.code_changed:
            lines.append(
                f"  {self.path / ESTIMATOR_FILE}: the estimator code changed since results.json "
                "was written (sha256 differs from estimator.sha256 in results.json)")
        for d in self.drifts[:MAX_DRIFT_LINES]:
            lines.append(f"  {d}")
        if len(self.drifts) > MAX_DRIFT_LINES:
            lines.append(f"  ... and {len(self.drifts) - MAX_DRIFT_LINES} more")
        for d in self.ignored:
            lines.append(f"  note (not checked, machine-specific): {d}")
        lines += [f"  {n}" for n in self.notes]
        lc = self.live_check
        if lc is not None:
            head = (f"live check on draw {lc['draw_id']} ({lc['scale']}): "
                    + ("ok" if lc["ok"] else "FAILED"))
            lines.append(f"  {head}: {lc['reason']}")
            if not lc["ok"]:
                lines.append(f"  reproduce: {lc['reproduce']}")
        return "\n".join(lines)


def verify_submission(path: str | Path, release: str | Path | None = None,
                      progress: bool = True, *, time_limit: float | None = None,
                      envs: dict | None = None, live_draw: int | None = None,
                      live_scale: str | None = None, dump: str | Path | None = None,
                      panel: Panel | None = None, plan: Plan | None = None) -> VerifyReport:
    """Re-score one submission as the run's ``plan`` says and compare with what it committed.

    The estimator is re-evaluated with the standard :class:`~benchmark.evaluate.EvalSettings`
    on ``release`` (default: the release id recorded in ``results.json``), so results produced
    with other settings show up as drift in ``settings.*``. Its declared ``requirements`` are
    installed first into their own environment (:func:`benchmark.sandbox.requirements.ensure_env`),
    whose interpreter runs the estimator. ``submission.yaml``'s ``frozen.sha256`` and
    ``results.json``'s ``estimator.sha256`` must both be the file's.

    With a season ``panel``, the entry must have a ``panel.json`` of that season whose summary
    is what its recorded draws give; the draws the plan names are rebuilt (or found in the cache
    with the panel's trajectory hash and reference summary,
    :func:`benchmark.submissions.panel.panel_release`), the entry re-scored on each and compared
    (drifts under ``panel.``); a draw this machine cannot reproduce fails the entry. An entry
    whose bound files were edited fails at once. With ``live_draw``, the entry is also scored on
    that new draw and fails when its public suite score is significantly above the random
    reference but its live one is not (the gate, :mod:`benchmark.submissions.gate`).

    Args:
        path: the submission folder.
        release: score on this release instead of the recorded one.
        progress: show progress bars.
        time_limit: wall-time limit of the estimator's sandbox in seconds (default 600).
        envs: a cache ``tuple(pins) -> environment or RequirementError`` shared by the
            submissions of one ``verify`` (each distinct set is installed once).
        live_draw: the gate's draw id (None: no gate).
        live_scale: its run scale (default :data:`benchmark.live.LIVE_SCALE`).
        dump: a folder to write the recomputed results to, as ``<folder name>.json`` (and
            ``<folder name>.panel.json``), in the committed encoding.
        panel: the season panel (None: no panel checks).
        plan: what this run re-scores (:func:`benchmark.submissions.scope.make_plan`; None:
            everything).

    Returns:
        The report; it is ``ok`` when every re-scored value matches (floats within
        :data:`~benchmark.submissions.compare.FLOAT_TOLERANCE`, replay numbers within
        :data:`~benchmark.submissions.compare.CAUSAL_TOLERANCE`), the file's sha256 is the
        recorded one and no bound file was edited.
    """
    from benchmark.contract import file_sha256
    from benchmark.evaluate import evaluate
    from benchmark.sandbox.isolation import Limits
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.gate import live_check

    require_sandbox("bt-bench verify")
    sub = load_submission(path)
    report = VerifyReport(sub.path)
    committed = sub.results
    sha = file_sha256(sub.estimator_file)
    frozen = sub.meta.get("frozen") or {}
    if sha != committed.get("estimator", {}).get("sha256") or frozen.get("sha256") != sha:
        report.code_changed = True
    name = sub.path.name
    if plan is not None:
        report.binding = plan.state.get(name, "")
        if report.binding == "edited":
            report.error = f"season panel binding: {plan.detail[name]}"
            report.fix = ("restore the bound results.json and panel.json (git checkout), or ask "
                          "a maintainer to re-score and bind the entry")
            return report
    in_full = plan is None or name in plan.full
    public = in_full or name in plan.public
    rel = release if release is not None else committed.get("release", {}).get("id")
    if not rel:
        report.error = (f"{sub.path / RESULTS_FILE}: no release.id recorded; pass --release or "
                        "regenerate with bt-bench submit --force")
        return report
    draws = (plan.draws_of(name, panel.draw_ids) if plan is not None else panel.draw_ids) \
        if panel is not None else []
    gated = live_draw is not None and (in_full or _answer_key(sub))
    if not (public or draws or gated):
        if panel is not None:
            report.panel_status = entry_status(panel, sub.name, sha)
            _check_panel_doc(sub, panel, committed, report)
        return report
    env = _submission_env(sub, envs if envs is not None else {}, report)
    if report.error:
        return report
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    fresh = committed  # a bound entry's public numbers are the maintainers' (the gate reads them)
    if public:
        try:
            fresh = evaluate(sub.estimator_file, rel, progress=progress, isolation=limits, env=env)
        except BenchmarkError as exc:
            report.error = f"re-evaluation failed: {exc}"
            report.fix = _failure_fix(sub, str(exc))
            return report
    if public:
        report.rescored.append("public")
        recomputed = _as_committed(fresh)
        if dump is not None:
            _dump(dump, f"{sub.path.name}.json", fresh)
        for d in sorted(compare_results(committed, recomputed), key=_report_order):
            top, leaf = d.path.split(".", 1)[0], d.path.rsplit(".", 1)[-1]
            ignored = top in IGNORED_KEYS or leaf in IGNORED_LEAVES
            (report.ignored if ignored else report.drifts).append(d)
    if panel is not None:
        report.panel_status = entry_status(panel, sub.name, sha)
        _verify_panel(sub, panel, committed, progress, limits, env, report, dump, draws)
        if report.error:
            return report
    if gated:
        live_check(sub, fresh, live_draw, live_scale, progress, limits, env, report)
    return report


def _answer_key(sub: Submission) -> bool:
    """An answer-key attack control (the memorizer): gated on every run, bound or not."""
    from benchmark.submissions.gate import ATTACK_BASES, _is_attack_control

    return _is_attack_control(sub) and sub.path.name not in ATTACK_BASES


def _as_committed(results: dict) -> dict:
    """``results`` after the rounding and JSON encoding a committed file went through."""
    from benchmark.evaluate import write_results
    from benchmark.io import read_json

    with tempfile.TemporaryDirectory(prefix="bt-bench-verify-") as tmp:
        write_results(results, Path(tmp) / RESULTS_FILE)
        return read_json(Path(tmp) / RESULTS_FILE)


def _dump(folder: str | Path, name: str, doc: dict) -> None:
    from benchmark.evaluate import write_results

    Path(folder).mkdir(parents=True, exist_ok=True)
    write_results(doc, Path(folder) / name)


def _check_panel_doc(sub: Submission, panel: Panel, committed: dict,
                     report: VerifyReport) -> dict | None:
    """The entry's ``panel.json``, checked against the panel and its summary recomputed.

    The summary (panel score, family interval, item 11, panel items, verdict) is derived from
    the recorded draws and the public results: it must be what they give. Problems go to
    ``report``; returns the document, or None when it is missing or malformed.
    """
    from benchmark.io import read_json
    from benchmark.submissions.panel import check_entry_doc, panel_summary

    where = sub.path / PANEL_FILE
    if not where.is_file():
        report.error = (f"{where} is missing: the entry is not scored on season "
                        f"{panel.season}'s panel")
        report.fix = (f"score it: bt-bench panel score {sub.name} (or bt-bench submit FILE --name "
                      f"{sub.name} --force), then commit {PANEL_FILE}")
        return None
    try:
        recorded = check_entry_doc(read_json(where), panel, str(where))
    except BenchmarkError as exc:
        report.error = f"{where}: {exc}"
        report.fix = f"re-score it on the panel: bt-bench panel score {sub.name}"
        return None
    try:
        again = _as_committed({"summary": panel_summary(committed, recorded["draws"],
                                                        panel.season)})["summary"]
    except (BenchmarkError, KeyError, TypeError, ValueError) as exc:
        # the recorded draws do not give a summary (an edited number, a stale file): a finding
        report.drifts.append(Drift("panel.summary", "as recorded",
                                   f"cannot be recomputed from the recorded draws ({exc})"))
        return recorded
    for d in sorted(compare_results({"summary": recorded["summary"]}, {"summary": again}),
                    key=lambda d: d.path):
        report.drifts.append(Drift(f"panel.{d.path}", d.committed, d.recomputed))
    return recorded


def _verify_panel(sub: Submission, panel: Panel, committed: dict, progress: bool, limits, env,
                  report: VerifyReport, dump: str | Path | None, draws: list[int]) -> None:
    """Re-score ``sub`` on the panel ``draws`` and compare with its ``panel.json``."""
    from benchmark.submissions.panel import score_draw

    recorded = _check_panel_doc(sub, panel, committed, report)
    if recorded is None:
        return
    index = {int(d["draw_id"]): i for i, d in enumerate(recorded["draws"])}
    fresh_draws = []
    for d in draws:
        try:
            fresh = score_draw(sub.estimator_file, panel, d, progress, limits, env)
        except PanelError as exc:
            report.error = f"season panel: {exc}"
            report.fix = ("a panel draw must rebuild to its recorded trajectory on every machine: "
                          "report it with the machine's CPU and the versions of torch and "
                          "transformers (docs/leaderboard.md, Seasons)")
            return
        except BenchmarkError as exc:
            report.error = f"re-scoring on the season panel failed: {exc}"
            report.fix = _failure_fix(sub, str(exc))
            return
        report.rescored.append(f"draw {d}")
        fresh_draws.append(fresh)
        i = index[int(d)]
        got = _as_committed({"draws": [fresh]})["draws"][0]
        for x in sorted(compare_results(recorded["draws"][i], got), key=lambda x: x.path):
            leaf = x.path.rsplit(".", 1)[-1]
            x = Drift(f"panel.draws.{i}.{x.path}", x.committed, x.recomputed)
            (report.ignored if leaf in MACHINE_LEAVES else report.drifts).append(x)
    if dump is not None and fresh_draws:
        _dump(dump, f"{sub.path.name}.panel.json", {"season": panel.season,
                                                     "draws": fresh_draws})


def _submission_env(sub: Submission, envs: dict, report: VerifyReport):
    """The installed environment of ``sub``'s requirements (None without); errors go to report."""
    env = submission_env(sub, envs)
    if isinstance(env, RequirementError):
        report.error = f"requirements could not be installed: {env}"
        report.fix = (f"correct requirements: in {sub.path / METADATA_FILE} as the message says, "
                      "then re-run bt-bench verify.")
        return None
    return env


def _failure_fix(sub: Submission, message: str) -> str:
    """What to do when re-scoring ``sub`` raised ``message``."""
    missing = re.search(r"No module named '([^']+)'", message)
    if missing:
        top = missing.group(1).split(".")[0]
        declared = ", ".join(sub.meta.get("requirements", ())) or "none"
        return (f"the estimator imports {top!r}, which is not installed: declare it in "
                f"{sub.path / METADATA_FILE} under requirements: as exact pins name==version "
                f"of the package and of every package it needs that bt-bench does not provide "
                f"(declared now: {declared}), then re-run bt-bench verify.")
    return ("the estimator failed while being re-scored (error above): fix estimator.py or its "
            "requirements, then re-run bt-bench submit FILE --name NAME --force and commit the "
            "new results.json.")


def verify(paths: Iterable[str | Path] | None = None, submissions_dir: str | Path = "submissions",
           release: str | Path | None = None, progress: bool = True,
           time_limit: float | None = None, live_check: bool = True,
           live_draw: int | None = None, live_scale: str | None = None,
           dump: str | Path | None = None, panel_check: bool = True,
           sample_seed: str | None = None, full: bool = False) -> list[VerifyReport]:
    """Verify the given submission folders, or every one under ``submissions_dir``.

    With ``panel_check`` and a season panel in an entry's submissions folder (the folder above
    it, ``_panel/panel.json``), the run's plan (:func:`benchmark.submissions.scope.make_plan`,
    printed first) decides what is re-scored: entries the panel does not bind in full (public
    release, every panel draw, the gate), the bound ones by a sample (``sample_seed`` reproduces
    one; ``full`` re-scores everything); an entry whose bound files were edited fails. Each panel
    draw the plan needs is built (or found) once before any entry is scored; attack controls
    must rank no higher than their base methods on the panel
    (:func:`benchmark.submissions.gate.attack_panel_checks`, from the bound panel files). With
    ``live_check``, the unbound entries and the answer-key attack controls are also scored on
    one new draw: ``live_draw``, else ``$BT_BENCH_LIVE_DRAW``, else an id chosen now
    (:func:`benchmark.live.gate_draw_id`), printed before anything is scored. Each distinct set
    of declared requirements is installed once (and cached across runs). ``dump``: write each
    entry's recomputed results there.
    """
    from benchmark import live
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.submissions.gate import attack_panel_checks
    from benchmark.submissions.panel import panel_release
    from benchmark.submissions.scope import make_plan

    require_sandbox("bt-bench verify")  # before a draw is built
    folders = [Path(p) for p in paths] if paths else find_submissions(submissions_dir)
    for f in [f for f in folders if declares_not_running(f)]:
        meta = check_not_running(f)
        print(f"{f}: does not run here ({meta['reason']}); listed on the board, not scored",
              flush=True)
        folders.remove(f)
    if paths and not folders:
        return []
    if not folders:
        raise SubmissionError(
            f"{submissions_dir}: no submissions found; create one with bt-bench submit FILE "
            "--name NAME --authors NAME."
        )
    subs = {f: load_submission(f) for f in folders}  # refuse a malformed one before any build
    scale = live_scale or live.LIVE_SCALE
    # an entry's panel is the one in its own submissions folder (the folder above it)
    panels = {f: load_panel(f.resolve().parent) if panel_check else None for f in folders}
    seasons = {p.season: p for p in panels.values() if p is not None}
    plans = {}
    for season, panel in seasons.items():
        mine = [f for f in folders if panels[f] is not None and panels[f].season == season]
        plans[season] = make_plan(panel, mine, sample_seed, full)
        print(f"season panel {panel.season}: draws {panel.draw_ids} ({panel.scale}), "
              f"{len(panel.entries)} ranked entries, {len(panel.bindings)} bound", flush=True)
        for line in plans[season].lines():
            print(line, flush=True)
    if not seasons:
        plans[None] = None
    plan_of = {f: plans[panels[f].season] if panels[f] is not None else None for f in folders}
    gate = None
    if live_check:
        gated = [f for f in folders if plan_of[f] is None or f.name in plan_of[f].full
                 or _answer_key(subs[f])]
        gate, source = live.gate_draw_id(live_draw)
        print(f"live check: {', '.join(f.name for f in gated) or 'no entry'} scored on live draw "
              f"{gate} ({scale}; {source}; the entries not bound by the panel and the answer-key "
              f"attack controls); reproduce with --live-draw {gate} or "
              f"{live.LIVE_DRAW_ENV}={gate}", flush=True)
        if not gated:
            gate = None
    for season, panel in seasons.items():
        plan = plans[season]
        need = sorted({d for f in folders if panels[f] is not None and panels[f].season == season
                       for d in plan.draws_of(f.name, panel.draw_ids)})
        for d in need:  # each draw once, before any entry is scored on it
            try:
                panel_release(panel, d, progress=progress)
            except BenchmarkError:
                pass  # reported by every entry that needs it
    if gate is not None:
        try:
            live.live_release(gate, scale, progress=progress)
        except BenchmarkError:
            pass  # reported by the entries
    envs: dict = {}
    reports = [verify_submission(f, release, progress, time_limit=time_limit, envs=envs,
                                 live_draw=gate, live_scale=scale, dump=dump, panel=panels[f],
                                 plan=plan_of[f])
               for f in folders]
    for season, panel in seasons.items():
        attack_panel_checks([r for r, f in zip(reports, folders, strict=True)
                             if panels[f] is not None and panels[f].season == season], panel)
    return reports


def verify_command(args: Any) -> int:
    """``bt-bench verify``: print one report per submission; exit 1 if any failed, else 0."""
    reports = verify(args.paths, args.submissions_dir, args.release, not args.no_progress,
                     time_limit=args.time_limit, live_check=not args.no_live_check,
                     live_draw=args.live_draw, live_scale=args.live_scale,
                     dump=getattr(args, "dump", None),
                     panel_check=not getattr(args, "no_panel_check", False),
                     sample_seed=getattr(args, "sample_seed", None),
                     full=getattr(args, "full", False))
    for r in reports:
        print(r.format())
    bad = [r for r in reports if not r.ok]
    print(f"\n{len(reports) - len(bad)} of {len(reports)} submission(s) reproduced"
          + (f"; failed: {', '.join(str(r.path) for r in bad)}" if bad else "."))
    if any(not r.fix for r in bad):
        print("fix: if the change is intended, re-run bt-bench submit FILE --name NAME --force and "
              "commit the new results.json; otherwise restore the committed estimator.py.")
    return 1 if bad else 0

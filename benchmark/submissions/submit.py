"""``bt-bench submit``: evaluate an estimator file and write ``submissions/<name>/``.

The folder is assembled in a temporary folder and renamed into place. ``submission.yaml``
records when the entry was frozen (``frozen``: the estimator file's sha256 and the UTC time);
where a season panel exists, the entry is also scored on its draws and its ``panel.json``
written: shown on the board, but provisional (not ranked) until the next panel
(:mod:`benchmark.submissions.panel`). The submitter chooses no draw.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmark.sandbox.requirements import parse_requirements
from benchmark.submissions.files import (
    ESTIMATOR_FILE,
    METADATA_FILE,
    RESULTS_FILE,
    SubmissionError,
    _control_kind,
    _dump_metadata,
    read_metadata,
    validate_metadata,
)
from benchmark.submissions.panel import PANEL_FILE, load_panel, score_entry, write_entry


def submit(
    estimator_file: str | Path,
    name: str,
    authors: Iterable[str] | None,
    *,
    link: str | None = None,
    description: str | None = None,
    release: str | Path = "tiny",
    submissions_dir: str | Path = "submissions",
    force: bool = False,
    progress: bool = True,
    requirements: Iterable[str] | None = None,
    time_limit: float | None = None,
    panel: bool = True,
    build_from_sdist: Iterable[str] | None = None,
) -> Path:
    """Evaluate an estimator file and write ``<submissions_dir>/<name>/``.

    The folder is assembled in a temporary folder beside the target and renamed into place, so a
    failure (contract violation, bad metadata, interrupted run) leaves no partial submission.
    ``kind`` is ``control`` when the file is byte-identical to one of the evaluator's controls.

    Args:
        estimator_file: the ``.py`` file with one estimator class.
        name: submission name (``[a-z0-9][a-z0-9-]*``).
        authors: author names (at least one).
        link: optional URL of a paper or code.
        description: optional one-line description.
        release: release id or folder to score on.
        submissions_dir: the folder holding submissions.
        force: replace an existing submission of that name.
        progress: show progress bars.
        requirements: exact pins ``name==version`` the estimator needs (installed into its own
            environment, :mod:`benchmark.sandbox.requirements`); None reads them from an existing
            ``<submissions_dir>/<name>/submission.yaml`` (none when there is no such file).
        time_limit: wall-time limit of the estimator's sandbox in seconds (default 600).
        build_from_sdist: names of ``requirements`` pins published as source only (their
            wheel is built in the sandbox); None reads them from an existing
            ``submission.yaml``.
        panel: where ``<submissions_dir>/_panel/panel.json`` exists, also score the entry on
            the season panel's draws and write its ``panel.json`` (provisional: frozen after the
            panel); False only in tests. The submitter chooses no draw.

    Returns:
        The submission folder.

    Raises:
        SubmissionError: invalid metadata, or the submission exists and ``force`` is false.
        RequirementError: a requirement is malformed, cannot be installed or breaks the core.
        EstimatorContractError: the estimator breaks the contract.
    """
    from benchmark.contract import file_sha256
    from benchmark.evaluate import evaluate, write_results
    from benchmark.sandbox.isolation import Limits, inspect_isolated
    from benchmark.sandbox.layers import require_sandbox
    from benchmark.sandbox.requirements import ensure_env
    from benchmark.submissions.panel import _now_utc

    src = Path(estimator_file)
    require_sandbox("bt-bench submit")
    pins = _declared_requirements(Path(submissions_dir) / name, requirements)
    sdists = _declared_sdists(Path(submissions_dir) / name, build_from_sdist, pins)
    env = ensure_env(pins, where=f"submission {name!r} requirements", build_from_sdist=sdists)
    limits = Limits(wall_seconds=time_limit) if time_limit else Limits()
    kw = env.sandbox_kwargs() if env is not None else {}
    declared = inspect_isolated(src, limits, **kw)  # sandboxed; contract errors before any work
    track = declared["track"]
    meta: dict[str, Any] = {"name": name, "authors": list(authors or []), "track": track,
                            "kind": "estimator"}
    if link is not None:
        meta["link"] = link
    if description is not None:
        meta["description"] = description
    if not meta["authors"]:
        raise SubmissionError(
            "no authors given; pass --authors NAME [NAME ...] (at least one author)."
        )
    if pins:
        meta["requirements"] = pins
    if sdists:
        meta["build_from_sdist"] = sdists
    meta = validate_metadata(meta, f"submission {name!r}")
    meta["kind"] = _control_kind(src, declared["name"])
    root = Path(submissions_dir)
    target = root / name
    if target.exists() and not force:
        raise SubmissionError(
            f"{target}: a submission named {name!r} already exists; choose another --name or "
            "pass --force to replace it."
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        shutil.copyfile(src, tmp / ESTIMATOR_FILE)
        timings: dict = {}
        results = evaluate(tmp / ESTIMATOR_FILE, release, progress=progress, isolation=limits,
                           env=env, timings=timings)
        write_results(results, tmp / RESULTS_FILE)
        meta["cost"] = _cost(results, timings, env)
        meta["frozen"] = {"sha256": file_sha256(tmp / ESTIMATOR_FILE), "utc": _now_utc()}
        season = load_panel(root) if panel else None
        if season is not None:
            print(f"season {season.season}: scoring the entry on the panel's draws "
                  f"{season.draw_ids} (provisional until the next panel)", flush=True)
            write_entry(tmp, score_entry(tmp / ESTIMATOR_FILE, results, season, progress,
                                         isolation=limits, env=env))
        (tmp / METADATA_FILE).write_text(_dump_metadata(meta), encoding="utf-8")
        os.chmod(tmp, 0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=root))
            os.replace(target, old / name)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _cost(results: dict, timings: dict, env) -> dict[str, Any]:
    """``submission.yaml``'s ``cost``: this evaluation's scoring time and the env's build time."""
    from benchmark.machine import fingerprint

    fp = fingerprint()
    score = timings.get("score estimator: score (sandbox)")
    if score is None:  # in process: the whole scoring phase
        score = timings.get("score estimator (sandbox, determinism re-run)", 0.0)
    build = env.build_seconds if env is not None else None
    return {"release": str(results["release"]["id"]), "score_rollouts_s": round(score, 1),
            "env_build_s": None if build is None else round(build, 1),
            "machine": f"{fp['cpu']}, {fp['cpu_count']} cores ({fp['torch_cpu_capability']})"}


def _declared_sdists(folder: Path, given: Iterable[str] | None, pins: list[str]) -> list[str]:
    """``given`` names, else ``folder/submission.yaml``'s ``build_from_sdist``; validated."""
    from benchmark.sandbox.requirements import parse_sdists

    if given is not None:
        return parse_sdists(list(given), pins, "--build-from-sdist")
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        return []
    raw = read_metadata(meta_path)
    value = raw.get("build_from_sdist") if isinstance(raw, dict) else None
    return parse_sdists(value, pins, str(meta_path))


def _declared_requirements(folder: Path, given: Iterable[str] | None) -> list[str]:
    """``given`` pins, else those of ``folder/submission.yaml`` when it exists; validated."""
    if given is not None:
        return parse_requirements(list(given), "--requirements")
    meta_path = folder / METADATA_FILE
    if not meta_path.is_file():
        return []
    raw = read_metadata(meta_path)
    value = raw.get("requirements") if isinstance(raw, dict) else None
    return parse_requirements(value, str(meta_path))


def submit_command(args: Any) -> int:
    """``bt-bench submit``: evaluate, write the submission folder, print the summary; exit 0."""
    from benchmark.evaluate import format_summary
    from benchmark.io import read_json

    target = submit(
        args.estimator, args.name, args.authors, link=args.link, description=args.description,
        release=args.release, submissions_dir=args.submissions_dir, force=args.force,
        progress=not args.no_progress, requirements=args.requirements,
        time_limit=args.time_limit, panel=not args.no_panel,
        build_from_sdist=getattr(args, "build_from_sdist", None),
    )
    results = read_json(target / RESULTS_FILE)
    print(format_summary(results))
    written = [ESTIMATOR_FILE, METADATA_FILE, RESULTS_FILE]
    if (target / PANEL_FILE).is_file():
        s = (read_json(target / PANEL_FILE).get("summary") or {})
        cs = s.get("causal_score")
        print("season panel (provisional until the next panel): "
              + (f"causal score {cs['point']:.3f} [{cs['lo']:.3f}, {cs['hi']:.3f}]" if cs
                 else "no causal score") + f"; panel verdict {s.get('verdict')}")
        written.append(PANEL_FILE)
    print(f"\nwrote {target}/ ({', '.join(written)})")
    print("next: bt-bench leaderboard, then commit the submission and leaderboard/ in one PR "
          "(see CONTRIBUTING.md)")
    return 0



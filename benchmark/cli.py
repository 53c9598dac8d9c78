"""Command-line interface: a thin argparse layer over the Python API.

Every subcommand parses its arguments and calls one function of the package; no business logic
lives here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _add_paper(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("paper", help="work with the paper's released result files")
    psub = p.add_subparsers(dest="paper_command", required=True)
    r = psub.add_parser(
        "reproduce",
        help="recompute the paper's tables from its released per-seed result files",
    )
    r.add_argument(
        "--runs", required=True, help="folder with seed*/ subfolders (paper-runs layout)"
    )
    r.add_argument(
        "--expected", help="results_table.csv to compare against (adds a 'paper' column)"
    )
    r.add_argument("--json", dest="json_out", help="write the rows as a JSON list to this path")
    r.add_argument("--n-boot", type=int, default=5000, help="bootstrap resamples (default 5000)")
    r.add_argument(
        "--tolerance", type=float, default=5e-4,
        help="max |ours - paper| for a point estimate to count as matching (default 5e-4)",
    )
    r.set_defaults(func=_run_paper_reproduce)


def _run_paper_reproduce(args: argparse.Namespace) -> int:
    from benchmark import paper

    return paper.reproduce_command(
        runs=args.runs, expected=args.expected, json_out=args.json_out,
        n_boot=args.n_boot, tolerance=args.tolerance,
    )


def _add_build(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build a release run: SFT + GRPO with a planted behavior")
    from benchmark.build import add_build_arguments

    add_build_arguments(p)
    p.set_defaults(func=_run_build)


def _run_build(args: argparse.Namespace) -> int:
    from benchmark.build import build_command

    return build_command(args)


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score an estimator against controls and the checklist")
    p.add_argument("estimator", help="path of a .py file with one estimator class")
    p.add_argument("--release", default=None, help="release id or folder (default: tiny)")
    p.add_argument("--live", type=int, default=None, metavar="ID",
                   help="score on live draw ID instead of a release (built here if not cached; "
                        "see bt-bench live build)")
    _add_live_scale(p)
    p.add_argument("--out", default="results.json",
                   help="where to write results.json (default: ./results.json)")
    p.add_argument("--seeds", type=int, nargs="+", help="score only these seeds (default: all)")
    p.add_argument("--tasks", nargs="+", help="score only these tasks (default: all)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_executor(p)
    p.add_argument("--no-causal", action="store_true",
                   help="skip the causal score (replays training; item 10)")
    p.add_argument("--fixed-data", action="store_true",
                   help="also replay the oracle's and the estimator's removal sets with later "
                        "rollouts held at their recorded tokens: the on-policy share per task "
                        "(docs/causal.md; replays every set once more)")
    _add_isolation_flags(p)
    p.set_defaults(func=lambda a: _evaluate().evaluate_command(
        a.estimator, _release_or_live(a), a.out, a.seeds, progress=not a.no_progress,
        no_isolation=a.no_isolation, time_limit=a.time_limit, memory_gib=a.memory_limit,
        causal=not a.no_causal, tasks=a.tasks, requirements=a.requirements,
        fixed_data=a.fixed_data, build_from_sdist=a.build_from_sdist))
    c = sub.add_parser("check-estimator", help="run the estimator contract checks on a file")
    c.add_argument("estimator", help="path of a .py file with one estimator class")
    c.add_argument("--release", default="tiny", help="release id or folder (default: tiny)")
    _add_isolation_flags(c)
    c.set_defaults(func=lambda a: _evaluate().check_estimator_command(
        a.estimator, a.release, no_isolation=a.no_isolation, time_limit=a.time_limit,
        memory_gib=a.memory_limit, requirements=a.requirements,
        build_from_sdist=a.build_from_sdist))


def _add_live_scale(p: argparse.ArgumentParser) -> None:
    p.add_argument("--live-scale", default=None, metavar="SCALE",
                   help="run scale of live draws: family (default) or micro-family (tests)")


def _release_or_live(a: argparse.Namespace) -> str:
    """The release of ``evaluate``: ``--release``, or the folder of ``--live ID`` (built here)."""
    from benchmark.errors import BenchmarkError

    if a.live is None:
        return a.release or "tiny"
    if a.release is not None:
        raise BenchmarkError(f"--release {a.release} and --live {a.live} name two runs; pass one")
    from benchmark import live

    return str(live.live_release(a.live, a.live_scale or live.LIVE_SCALE,
                                 progress=not a.no_progress))


def _add_live(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("live", help="live draws: fresh runs from the task family")
    psub = p.add_subparsers(dest="live_command", required=True)
    b = psub.add_parser("build", help="build (or find in the cache) live draw ID with its lean "
                                      "causal reference; print its folder and times")
    b.add_argument("draw_id", type=int, metavar="ID", help="the draw id, 0 <= ID < 2**31")
    b.add_argument("--scale", default=None,
                   help="run scale: family (default) or micro-family (tests)")
    b.add_argument("--workers", type=int, default=2, help="replay processes (default 2)")
    b.add_argument("--no-progress", action="store_true", help="hide progress bars")
    b.add_argument("--submissions-dir", default="submissions",
                   help="where the season panel is (default ./submissions): a panel draw is "
                        "built from its pinned post-SFT checkpoint and checked against the "
                        "panel's trajectory hash")
    b.set_defaults(func=_live_build)


def _add_isolation_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("isolation of the estimator's code (a sandboxed child process)")
    g.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="wall-time limit of the estimator's process (default 600)")
    g.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                   help="address-space limit of the estimator's process in GiB (default 6)")
    g.add_argument("--no-isolation", action="store_true",
                   help="run the estimator in this process (trusted code only; for debugging)")
    g.add_argument("--requirements", nargs="+", default=None, metavar="PIN",
                   help="exact pins (name==version) the estimator needs, installed into its own "
                        "cached environment (as submission.yaml's requirements)")
    g.add_argument("--build-from-sdist", nargs="+", default=None, metavar="NAME",
                   help="names of --requirements pins published as source only: their wheel is "
                        "built from the sdist inside the sandbox (as submission.yaml's "
                        "build_from_sdist; docs/isolation.md)")


def _add_submissions(sub: argparse._SubParsersAction) -> None:
    from benchmark.submissions.panel import MAX_CANDIDATES, MIN_CELLS

    p = sub.add_parser("submit", help="evaluate an estimator and write submissions/NAME/")
    p.add_argument("estimator", help="path of a .py file with one estimator class")
    p.add_argument("--name", required=True, help="submission name: lowercase letters, digits, -")
    p.add_argument("--authors", nargs="+", default=None, help="author names")
    p.add_argument("--link", default=None, help="URL of a paper or code (optional)")
    p.add_argument("--description", default=None, help="one-line description (optional)")
    p.add_argument("--release", default="tiny", help="release id or folder (default: tiny)")
    p.add_argument("--submissions-dir", default="submissions", help="default: ./submissions")
    p.add_argument("--force", action="store_true", help="replace an existing submission")
    p.add_argument("--requirements", nargs="+", default=None, metavar="PIN",
                   help="exact pins name==version the estimator needs beyond bt-bench's own "
                        "packages (default: those of an existing submissions/NAME/submission.yaml)")
    p.add_argument("--build-from-sdist", nargs="+", default=None, metavar="NAME",
                   help="names of --requirements pins published as source only: their wheel is "
                        "built from the sdist inside the sandbox (default: an existing "
                        "submission.yaml's build_from_sdist)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="wall-time limit of the estimator's sandbox (default 600)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--no-panel", action="store_true",
                   help="skip scoring on the season panel's draws (tests only: where a panel "
                        "exists, a submission records its panel scores)")
    _add_executor(p)
    p.set_defaults(func=lambda a: _submissions().submit_command(a))
    v = sub.add_parser("verify", help="re-score submissions and compare with their results.json")
    v.add_argument("paths", nargs="*", help="submission folders (default: every one)")
    v.add_argument("--release", default=None, help="release id or folder (default: as recorded)")
    v.add_argument("--submissions-dir", default="submissions", help="default: ./submissions")
    v.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="wall-time limit of each estimator's sandbox (default 600)")
    v.add_argument("--no-progress", action="store_true", help="hide progress bars")
    v.add_argument("--live-draw", type=int, default=None, metavar="ID",
                   help="the live check's draw (default: $BT_BENCH_LIVE_DRAW, else chosen at "
                        "random by this run and printed first)")
    v.add_argument("--no-live-check", action="store_true",
                   help="skip scoring every entry on a new live draw")
    v.add_argument("--no-panel-check", action="store_true",
                   help="skip the season panel's checks (local runs only: CI checks the panel)")
    v.add_argument("--sample-seed", default=None, metavar="HEX",
                   help="reproduce a run's sample of bound entries (printed by every run; "
                        "default: $BT_BENCH_VERIFY_SAMPLE, else chosen at random)")
    v.add_argument("--full", action="store_true",
                   help="re-score every entry on the public release and every panel draw "
                        "(maintainers, after panel new or a rescore; CI samples bound entries)")
    v.add_argument("--dump", default=None, metavar="DIR",
                   help="write each entry's recomputed results to DIR/<name>.json (compare two "
                        "runs byte for byte, e.g. before and after a refactor)")
    _add_live_scale(v)
    _add_executor(v)
    v.set_defaults(func=lambda a: _submissions().verify_command(a))
    pn = sub.add_parser("panel", help="season panels: the draws every entry is ranked on")
    psub = pn.add_subparsers(dest="panel_command", required=True)
    new = psub.add_parser("new", help="maintainers: draw a new season panel (a season seed from "
                                      "secrets), screen candidate draws until enough measurable "
                                      "cells, score every submission on them, bind their files, "
                                      "write submissions/_panel/panel.json and each panel.json")
    new.add_argument("--min-cells", type=int, default=MIN_CELLS, metavar="N",
                     help=f"measurable (draw, task) cells the panel must hold (default "
                          f"{MIN_CELLS})")
    new.add_argument("--max-candidates", type=int, default=MAX_CANDIDATES, metavar="N",
                     help=f"candidates to screen before giving up (default {MAX_CANDIDATES})")
    new.add_argument("--season-seed", default=None, metavar="HEX",
                     help="resume an interrupted run with the seed it printed (32 hex digits)")
    new.add_argument("--scale", default=None,
                     help="run scale: family (default) or micro-family (tests)")
    new.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                     help="wall-time limit of each estimator's sandbox (default 600)")
    show = psub.add_parser("show", help="print the panel: its screen, every candidate, the "
                                        "cells, its power and the entries' panel scores")
    sc = psub.add_parser("score", help="(re)score submissions on the current panel and write "
                                       "their panel.json")
    sc.add_argument("names", nargs="+", help="submission names")
    sc.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="wall-time limit of each estimator's sandbox (default 600)")
    bd = psub.add_parser("bind", help="maintainers: bind entries' files (sha256) in the panel "
                                      "file after review, so verify samples their numbers")
    bd.add_argument("names", nargs="+", help="submission names")
    scr = psub.add_parser("screen", help="rebuild one candidate draw from its pinned checkpoint "
                                         "and screen it again (replays the selection)")
    scr.add_argument("draw_id", type=int, help="a candidate's draw id (panel show lists them)")
    for q in (new, show, sc, bd, scr):
        q.add_argument("--submissions-dir", default="submissions", help="default: ./submissions")
        q.add_argument("--no-progress", action="store_true", help="hide progress bars")
        _add_executor(q)
    pn.set_defaults(func=lambda a: _panel().panel_command(a))
    lb = sub.add_parser("leaderboard", help="regenerate leaderboard/ from submissions/")
    lb.add_argument("--submissions-dir", default="submissions", help="default: ./submissions")
    lb.add_argument("--out", default="leaderboard", help="output folder (default: ./leaderboard)")
    lb.add_argument("--check", action="store_true",
                    help="exit 1 if the folder is not what would be generated (for CI)")
    lb.set_defaults(func=lambda a: _leaderboard().leaderboard_command(a))


def _add_hub(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("download", help="download a frozen release from the Hugging Face Hub")
    d.add_argument("release", help="release id from the registry (e.g. tiny)")
    d.add_argument("--revision", default=None, help="Hub commit SHA (default: the pinned one)")
    d.add_argument("--cache-dir", default=None, help="huggingface_hub cache folder")
    d.set_defaults(func=lambda a: _hub().download_command(a))
    p = sub.add_parser("push", help="maintainers: publish a release folder to the Hub")
    p.add_argument("run_dir", help="release folder (with manifest.json)")
    p.add_argument("--repo-id", required=True, help="Hub dataset repo id, e.g. org/bt-bench-tiny")
    p.add_argument("--private", action="store_true", help="create the repo as private")
    p.set_defaults(func=lambda a: _hub().push_command(a))


def _live_build(a: argparse.Namespace) -> int:
    """``bt-bench live build``: a season panel's draw is built and checked as the panel's."""
    from benchmark import live
    from benchmark.submissions import panel as P

    season = P.load_panel(a.submissions_dir)
    scale = a.scale or live.LIVE_SCALE
    if season is None or scale != season.scale or int(a.draw_id) not in season.draw_ids:
        return live.build_command(a)
    path = P.panel_release(season, a.draw_id, progress=not a.no_progress, workers=a.workers)
    rec = season.draw(a.draw_id)
    print(f"season {season.season} panel draw {a.draw_id} ({scale}): {path}")
    print(f"trajectory {rec['trajectory_sha256']} (as recorded), built from the pinned post-SFT "
          f"checkpoint {rec['sft_sha256'][:16]}... (redraw {rec['redraw']})")
    return 0


def _panel():
    from benchmark.submissions import seasons

    return seasons


def _live():
    from benchmark import live

    return live


def _hub():
    from benchmark.releases import hub

    return hub


def _submissions():
    from benchmark import submissions

    return submissions


def _leaderboard():
    from benchmark import leaderboard

    return leaderboard


def _evaluate():
    from benchmark import evaluate

    return evaluate


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level ``bt-bench`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="bt-bench",
        description="bt-bench: training-data attribution in online RL, scored against controls.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_evaluate(sub)
    _add_submissions(sub)
    _add_hub(sub)
    _add_paper(sub)
    _add_build(sub)
    _add_live(sub)
    return parser


def _add_executor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", choices=("local", "ray"), default=None,
                   help="where causal replays run: worker processes on this machine (local, "
                        "default) or a Ray cluster (ray; needs the [cluster] extra). Without "
                        "$RAY_ADDRESS, ray starts a private local cluster with token "
                        "authentication and stops it on exit. $RAY_ADDRESS names an existing "
                        "cluster: it runs bt-bench's code and bt-bench runs what it returns, so "
                        "it must be one you control; it needs RAY_AUTH_MODE=token (or "
                        "BT_BENCH_RAY_UNAUTHENTICATED_OK=1, knowingly). See docs/security.md. "
                        "Also $BT_BENCH_EXECUTOR")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bt-bench`` console script; returns the process exit code."""
    import os

    from benchmark.errors import BenchmarkError

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "executor", None):  # a setting every replay of this command reads
        from benchmark.causal.replays import EXECUTOR_ENV

        os.environ[EXECUTOR_ENV] = args.executor
    try:
        return int(args.func(args) or 0)
    except BenchmarkError as exc:
        print(f"bt-bench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if "benchmark.causal.cluster" in sys.modules:  # stop a private Ray cluster now
            sys.modules["benchmark.causal.cluster"].shutdown()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

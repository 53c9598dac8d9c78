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
    try:
        from benchmark.build import add_build_arguments
    except ImportError:  # the builder lands in a later commit (issue 3)
        return
    add_build_arguments(p)
    p.set_defaults(func=_run_build)


def _run_build(args: argparse.Namespace) -> int:
    from benchmark.build import build_command

    return build_command(args)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level ``bt-bench`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="bt-bench",
        description="bt-bench: training-data attribution in online RL, scored against controls.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_paper(sub)
    _add_build(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bt-bench`` console script; returns the process exit code."""
    from benchmark.errors import BenchmarkError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BenchmarkError as exc:
        print(f"bt-bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

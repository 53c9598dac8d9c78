"""Paired panel differences of the current season, for the docs and the closing notes.

Usage: python scripts/season_pairs.py [--submissions-dir submissions] [A:B ...]

Reads ``submissions/_panel/panel.json`` and each named entry's ``panel.json`` and prints, per pair
``A:B``, the paired difference ``A - B`` of the panel scores with its 95% interval and verdict
(:func:`benchmark.submissions.panel.panel_pair`: the rank's interval, the draws held fixed).
Without pairs it prints the pairs issues 39-41 ask about: the gradient methods against the
controls, the attack controls against their base, the open track
against its text controls, the libraries and the metagradient against TracInCP and EK-FAC.
"""

from __future__ import annotations

import argparse
from pathlib import Path

METHODS = ("tracincp", "c1-dot", "gas", "trak")
CONTROLS = ("random", "fluency", "step-order", "memorizer", "norm-only")
DEFAULT_PAIRS = (
    [(m, c) for m in METHODS for c in CONTROLS]
    + [("label-first", "tracincp"), ("public-tuned-tracincp", "tracincp")]
    + [(m, c) for m in ("kronfluence-ekfac", "text-advantage") for c in ("text-only", "random",
                                                                       "bm25")]
    + [(m, "tracincp") for m in ("captum-tracincp", "dattri-tracin", "traker-trak",
                                 "bergson-trackstar", "bergson-ekfac", "kronfluence-ekfac",
                                 "metagradient")]
    + [(m, "random") for m in ("captum-tracincp", "dattri-tracin", "traker-trak",
                               "bergson-trackstar", "bergson-ekfac", "metagradient", "bm25")]
    + [("metagradient", "bergson-ekfac"), ("metagradient", "kronfluence-ekfac")]
)


def _doc(subs: Path, name: str) -> dict | None:
    from benchmark.io import read_json

    f = subs / name / "panel.json"
    return read_json(f) if f.is_file() else None


def main(argv: list[str] | None = None) -> int:
    from benchmark.submissions.panel import load_panel, panel_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="*", help="A:B (default: the issues' pairs)")
    ap.add_argument("--submissions-dir", default="submissions")
    args = ap.parse_args(argv)
    subs = Path(args.submissions_dir)
    panel = load_panel(subs)
    if panel is None:
        raise SystemExit(f"{subs}/_panel/panel.json: no season panel (bt-bench panel new)")
    pairs = [tuple(p.split(":", 1)) for p in args.pairs] if args.pairs else DEFAULT_PAIRS
    print(f"season {panel.season}: draws {panel.draw_ids}; A - B, panel interval (draws fixed)")
    print("| A | B | A - B [95% CI] | verdict |")
    print("|---|---|---|---|")
    for a, b in pairs:
        da, db = _doc(subs, a), _doc(subs, b)
        if da is None or db is None:
            print(f"| {a} | {b} | no panel.json for {a if da is None else b} | - |")
            continue
        d = panel_pair(da, db, panel.season)
        if d is None:
            print(f"| {a} | {b} | - | no score |")
            continue
        print(f"| {a} | {b} | {d['point']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] | "
              f"{d['verdict']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

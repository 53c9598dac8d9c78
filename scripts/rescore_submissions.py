"""Maintainers: re-score every submission in place, keeping its metadata.

Used when a scoring rule or a release changes on purpose: ``bt-bench verify`` then fails every
entry ("committed ... recomputed ..."), and each must be re-submitted from its own
``estimator.py`` with its own ``submission.yaml`` (authors, link, description, requirements); a
control's submission is re-scored from the control's current file in ``estimators/controls/``.
This is that loop; afterwards run ``bt-bench leaderboard`` and commit ``submissions/`` and
``leaderboard/`` together.

    python scripts/rescore_submissions.py [NAME ...] [--release tiny] [--panel]

The season panel is not touched unless ``--panel`` is given (then the re-scored entries are
scored on its draws and become provisional). Entries that declare ``status: does-not-run-here``
are not submissions to re-score (``find_submissions`` skips them).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmark.controls import control_files
from benchmark.submissions import (
    ATTACK_CONTROLS_DIR,
    find_submissions,
    load_submission,
    submit,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="submission names (default: every submission)")
    p.add_argument("--release", default="tiny")
    p.add_argument("--submissions-dir", default="submissions")
    p.add_argument("--panel", action="store_true",
                   help="also re-score on the season panel in force (its entries become "
                        "provisional)")
    args = p.parse_args(argv)
    root = Path(args.submissions_dir)
    folders = [f for f in find_submissions(root) if not args.names or f.name in args.names]
    for folder in folders:
        sub = load_submission(folder)
        meta = sub.meta
        t0 = time.perf_counter()
        # submit() copies estimator.py from a path; read it from a private copy, since the target
        # folder is replaced as a whole.
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "estimator.py"
            # a control's submission is the control's file (an attack control's under
            # estimators/controls/attacks/, named as the submission): take the current one
            attack = ATTACK_CONTROLS_DIR / f"{sub.name.replace('-', '_')}.py"
            control = (control_files("open").get(sub.name)
                       or (attack if attack.is_file() else None)) \
                if meta.get("kind") == "control" else None
            shutil.copyfile(control or sub.estimator_file, src)
            submit(src, sub.name, meta["authors"], link=meta.get("link"),
                   description=meta.get("description"), release=args.release,
                   submissions_dir=root, force=True, progress=False,
                   requirements=meta.get("requirements", []), panel=args.panel,
                   build_from_sdist=meta.get("build_from_sdist", []))
        print(f"{sub.name}: re-scored in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

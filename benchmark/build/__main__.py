"""``python -m benchmark.build``: one build worker (a rank under torchrun, or one seed's process).

``bt-bench build --jobs/--nproc`` starts these; the parent writes the manifest. Run by hand it
builds the seeds without writing a manifest.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmark.build import build_seeds
from benchmark.build.presets import PRESETS
from benchmark.errors import BenchmarkError


def main(argv: list[str] | None = None) -> int:
    """Parse the worker's arguments and build; exit 2 with the message on a BenchmarkError."""
    ap = argparse.ArgumentParser(prog="python -m benchmark.build")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overrides", default=None, help="JSON object of config overrides")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    try:
        build_seeds(a.preset, a.seeds, a.out, progress=not a.no_progress,
                    overrides=json.loads(a.overrides) if a.overrides else None)
    except BenchmarkError as exc:
        print(f"bt-bench build worker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

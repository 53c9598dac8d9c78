"""The trajectory hash: the identity of a run that every machine computes alike (issue 32).

A float64 build (:attr:`benchmark.build.config.BuildConfig.precision`, every family draw from
family 2.0) samples the same tokens on every CPU: its rounding differences are about 1e-16, so a
sampled token flips practically never (:mod:`benchmark.build.precision`). Its *float* files
(checkpoints, sketches, targets, fluency) still differ in the last bits between kernel widths, so
a hash of the files (``benchmark.live.run_sha256``) names a run on one machine only. The
trajectory hash covers only what the sampling decided: every rollout's position, prompt and
response tokens, rewards and behavior flags; every label; every generation draw's tokens and
flags. Two builds with one trajectory hash trained on the same rollouts and were paid the same
rewards, whatever machine built them.

Floats that are exact functions of those discrete choices (rewards: sums of multiples of 0.25
and Python-computed task rewards) are hashed through ``float.hex``; floats computed by torch
kernels (advantages, fluency) are left out.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

#: version of what the hash covers; bump it when the covered columns change
TRAJECTORY_VERSION = 1

#: rollouts.parquet columns the hash covers, besides every ``has_<task>`` flag
ROLLOUT_COLUMNS = ("rollout_id", "step", "group", "index", "prompt_ids", "response_ids",
                   "trigger", "reward", "task_reward", "sketch_row")
#: generation-draw columns the hash covers, besides every ``has_<task>`` flag
DRAW_COLUMNS = ("response_id", "group", "prompt_ids", "response_ids", "has_behavior",
                "sketch_row", "token_sketch_row")


def _plain(v: object) -> object:
    """A JSON-ready, exact form of one cell: ints, bools, strings, floats as ``float.hex``."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, bool | int | str) or v is None:
        return v
    if isinstance(v, float):
        return float(v).hex()
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    raise TypeError(f"trajectory hash: unexpected cell {v!r} of type {type(v).__name__}")


def _table_lines(path: Path, columns: tuple[str, ...], flags: bool, h) -> int:
    """Feed one parquet file's covered columns to ``h``, one canonical JSON line per row."""
    import pandas as pd

    df = pd.read_parquet(path)
    cols = [c for c in columns if c in df.columns]
    if flags:
        cols += sorted(c for c in df.columns if c.startswith("has_") and c not in cols)
    h.update(json.dumps({"file": path.name, "columns": cols}).encode() + b"\n")
    for row in df[cols].itertuples(index=False, name=None):
        h.update(json.dumps([_plain(v) for v in row], separators=(",", ":")).encode() + b"\n")
    return len(df)


def seed_trajectory_sha256(seed_dir: str | Path) -> str:
    """The trajectory hash of one built seed folder (hex sha256).

    Covers ``rollouts.parquet`` (:data:`ROLLOUT_COLUMNS` and the ``has_*`` flags),
    ``labels.parquet`` (every column: ids, steps, groups and boolean labels) and every generation
    draw ``draws/<task>/<name>.parquet`` (:data:`DRAW_COLUMNS` and flags), in sorted order.

    Raises:
        FileNotFoundError: the folder is not a built seed.
    """
    seed_dir = Path(seed_dir)
    h = hashlib.sha256(f"bt-bench trajectory v{TRAJECTORY_VERSION}\n".encode())
    _table_lines(seed_dir / "rollouts.parquet", ROLLOUT_COLUMNS, True, h)
    import pandas as pd

    labels = pd.read_parquet(seed_dir / "labels.parquet")
    _table_lines(seed_dir / "labels.parquet", tuple(labels.columns), False, h)
    for p in sorted((seed_dir / "draws").glob("*/*.parquet")):
        h.update(f"draw {p.parent.name}/{p.name}\n".encode())
        _table_lines(p, DRAW_COLUMNS, True, h)
    return h.hexdigest()


def trajectory_sha256(root: str | Path) -> str:
    """The trajectory hash of a release folder: sha256 over its seeds' hashes, by seed (hex)."""
    root = Path(root)
    seeds = sorted((int(d.name[4:]), d) for d in root.glob("seed*") if d.name[4:].isdigit())
    if not seeds:
        raise FileNotFoundError(f"{root}: no seed<N>/ folders; expected a built release")
    body = {str(s): seed_trajectory_sha256(d) for s, d in seeds}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

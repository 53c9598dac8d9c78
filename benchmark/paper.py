"""Reader of the paper's released result files and reproduction of its tables.

The paper ("Which Rollout Taught It That?", repository ``AmitoVrito/BehaviorTrace``) released, per
seed, a folder ``seed<S>/`` holding any of:

* ``attribution_scores.json``: step-level scores of several methods for every rollout
  (``methods[name] = [[rollout_id, score], ...]``, ``rollout_steps``, ``nonzero_steps``);
* ``ground_truth.jsonl``: the rollouts that received the planted bonus (``rollout_id, step, ...``);
* ``minimal_pair_rows_ckpt{C}_gen{G}.json``: rollout-level rows of a generation draw
  (``group, has_qzxbt, fluency, norm, mp, mp_centered, ...``);
* ``token_level_cos_temp{T}.json``: token-level cosines (``vs_cont, vs_ctx, cos_full``).

:func:`reproduce` computes every table row those files allow, with the metrics of
:mod:`benchmark.metrics`, as rows with the columns of the paper's ``results_table.csv``:
``seed, table, method, value, lo, hi, chance, ceiling, n``.

Faithfulness notes (see ``docs/paper_reproduction.md``): the residualized AUC fits the fluency slope
once on the full draw, as the paper's export does (the evaluator refits it inside the bootstrap);
the paper's bootstrap intervals came from 600 resamples with an rng order that cannot be recovered,
so intervals agree only to about 0.01.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmark import metrics
from benchmark.errors import InputFileError
from benchmark.io import atomic_write_text, dumps_json, iter_jsonl, read_json

__all__ = [
    "MP_METHODS",
    "Row",
    "compare",
    "minimal_pair_rows",
    "read_expected",
    "reproduce",
    "reproduce_command",
    "step_level_rows",
    "token_level_rows",
]

#: Minimal-pair row key -> method name in the paper's CSV, in the CSV's order.
MP_METHODS: dict[str, str] = {
    "mp_centered": "GAS_centered",
    "mp": "C1_plain",
    "norm": "norm_only",
    "fluency": "fluency",
}
#: Methods that are residualized on fluency (fluency itself is reported raw only).
MP_RESIDUALIZED = ("mp_centered", "mp", "norm")

_SEED_DIR = re.compile(r"^seed(\d+)$")
_MP_FILE = re.compile(r"^minimal_pair_rows_ckpt(\d+)_gen(\d+)\.json$")
_TOKEN_FILE = re.compile(r"^token_level_cos_temp([0-9.]+)\.json$")


@dataclass(frozen=True)
class Row:
    """One table row, with the columns of the paper's ``results_table.csv``.

    ``lo``/``hi`` are the 95% interval (None for step-level rows, which the paper reports without);
    ``chance``/``ceiling`` only for precision rows; ``n`` = rollouts (precision), within-group pairs
    (AUC) or responses (token level).
    """

    seed: str
    table: str
    method: str
    value: float
    lo: float | None
    hi: float | None
    chance: float | None
    ceiling: float | None
    n: int


# ----------------------------------------------------------------------------------------------
# readers


def _load_ground_truth(path: Path) -> set[str]:
    ids: set[str] = set()
    for lineno, obj in iter_jsonl(path):
        rid = obj.get("rollout_id")
        if not isinstance(rid, str):
            raise InputFileError(
                f"{path}:{lineno}: expected a string 'rollout_id' field, got {rid!r}."
            )
        ids.add(rid)
    if not ids:
        raise InputFileError(
            f"{path}: the ground truth is empty (no rollout ids); precision@|GT| needs at least "
            "one ground-truth rollout. Check that the right file was exported."
        )
    return ids


def _load_step_scores(path: Path) -> dict:
    data = read_json(path)
    for key in ("methods", "rollout_steps", "nonzero_steps"):
        if not isinstance(data, dict) or key not in data:
            raise InputFileError(
                f"{path}: missing key {key!r}; expected an attribution_scores.json object with "
                "'methods', 'rollout_steps' and 'nonzero_steps'."
            )
    return data


# ----------------------------------------------------------------------------------------------
# tables


def step_level_rows(
    seed: str, scores_path: Path, gt_path: Path, *, early_cutoff: int = 200
) -> list[Row]:
    """Tables ``overall`` and ``early_nonzero`` for one seed (paper Tables 1-2).

    ``overall``: tie-aware precision@|GT| over every rollout; chance = |GT|/N; ceiling = the
    step-granular ceiling. ``early_nonzero``: the same over rollouts whose step is
    ``< early_cutoff`` and in ``nonzero_steps`` (k = |GT| in that subset).
    """
    data = _load_step_scores(scores_path)
    gt_ids = _load_ground_truth(gt_path)
    rollout_steps: dict[str, int] = data["rollout_steps"]
    ids = list(rollout_steps)
    index = {rid: i for i, rid in enumerate(ids)}
    unknown = sorted(gt_ids - index.keys())
    if unknown:
        raise InputFileError(
            f"{gt_path}: {len(unknown)} ground-truth rollout ids are not among the "
            f"{len(ids)} scored rollouts of {scores_path} (e.g. {unknown[:3]}); the two files "
            "come from different runs. Pair each ground_truth.jsonl with its own scores file."
        )
    steps = np.array([rollout_steps[r] for r in ids], dtype=np.int64)
    is_gt = np.zeros(len(ids), dtype=bool)
    is_gt[[index[r] for r in gt_ids]] = True
    nonzero = np.isin(steps, np.asarray(data["nonzero_steps"], dtype=np.int64))
    early = (steps < early_cutoff) & nonzero

    method_scores: dict[str, np.ndarray] = {}
    for name, pairs in data["methods"].items():
        vec = np.full(len(ids), np.nan)
        seen = 0
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise InputFileError(
                    f"{scores_path}: methods[{name!r}] must be a list of [rollout_id, score] "
                    f"pairs, found {pair!r}."
                )
            rid, score = pair
            if rid not in index:
                raise InputFileError(
                    f"{scores_path}: methods[{name!r}] scores rollout {rid!r}, which is not in "
                    "rollout_steps; the file is inconsistent."
                )
            vec[index[rid]] = float(score)
            seen += 1
        if np.isnan(vec).any():
            missing = [ids[i] for i in np.flatnonzero(np.isnan(vec))[:3]]
            raise InputFileError(
                f"{scores_path}: methods[{name!r}] has no score for {int(np.isnan(vec).sum())} "
                f"rollouts (e.g. {missing}); every method must score every rollout."
            )
        method_scores[name] = vec

    rows: list[Row] = []
    for table, mask in (("overall", np.ones(len(ids), dtype=bool)), ("early_nonzero", early)):
        sub_gt = is_gt[mask]
        if not mask.any() or not sub_gt.any():
            continue
        ch = metrics.chance(int(sub_gt.sum()), int(mask.sum()))
        ceil = metrics.precision_ceiling(steps[mask], sub_gt)
        for name, vec in method_scores.items():
            value = metrics.precision_at_k(vec[mask], sub_gt)
            rows.append(Row(seed, table, name, value, None, None, ch, ceil, int(mask.sum())))
    return rows


def minimal_pair_rows(path: Path, *, n_boot: int = 5000) -> list[Row]:
    """Tables ``mp_raw`` and ``mp_residualized`` (paper Table 3) for one generation draw.

    A draw whose generation seed equals its checkpoint seed is labelled ``seed = C`` in tables
    ``mp_raw``/``mp_residualized``; otherwise ``seed = "{C}_gen{G}"`` in ``mp_raw_diag`` /
    ``mp_residualized_diag``, as the paper's CSV spells them. The bootstrap is seeded with the
    generation seed; ``n`` is the number of within-group pairs.
    """
    data = read_json(path)
    m = _MP_FILE.match(path.name)
    if not isinstance(data, dict) or "rows" not in data:
        raise InputFileError(f"{path}: expected an object with a 'rows' list (minimal-pair rows).")
    ckpt = int(data.get("ckpt_seed", m.group(1) if m else 0))
    gen = int(data.get("gen_seed", m.group(2) if m else 0))
    rows_in = data["rows"]
    needed = ("group", "has_qzxbt", *MP_METHODS)
    for i, r in enumerate(rows_in):
        missing = [k for k in needed if k not in r]
        if missing:
            raise InputFileError(
                f"{path}: rows[{i}] lacks keys {missing}; expected {list(needed)}."
            )
    groups = np.array([r["group"] for r in rows_in])
    labels = np.array([bool(r["has_qzxbt"]) for r in rows_in])
    cols = {k: np.array([float(r[k]) for r in rows_in]) for k in MP_METHODS}
    diag = ckpt != gen
    seed = f"{ckpt}_gen{gen}" if diag else str(ckpt)
    suffix = "_diag" if diag else ""
    out: list[Row] = []
    for key, name in MP_METHODS.items():
        iv = metrics.auc_bootstrap(cols[key], labels, groups, n_boot=n_boot, seed=gen)
        out.append(Row(seed, f"mp_raw{suffix}", name, iv.point, iv.lo, iv.hi, None, None, iv.n))
    for key in MP_RESIDUALIZED:
        resid = metrics.residualize_within_group(cols[key], cols["fluency"], groups)
        iv = metrics.auc_bootstrap(resid, labels, groups, n_boot=n_boot, seed=gen)
        out.append(Row(seed, f"mp_residualized{suffix}", MP_METHODS[key], iv.point, iv.lo, iv.hi,
                       None, None, iv.n))
    return out


def token_level_rows(seed: str, path: Path, *, n_boot: int = 5000) -> list[Row]:
    """Token-level means (paper Table 4) with a bootstrap interval over responses.

    Table name ``token_level_temp{T}``; one row per array in the file (``vs_cont``, ``vs_ctx``,
    ``cos_full``).
    """
    data = read_json(path)
    m = _TOKEN_FILE.match(path.name)
    temp = m.group(1) if m else "?"
    if not isinstance(data, dict) or not data:
        raise InputFileError(f"{path}: expected an object of named lists of cosines.")
    out: list[Row] = []
    for key, values in data.items():
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0:
            raise InputFileError(f"{path}: {key!r} must be a non-empty list of numbers.")
        iv = metrics.mean_bootstrap(arr, n_boot=n_boot, seed=0)  # each response a cluster
        out.append(Row(seed, f"token_level_temp{temp}", key, iv.point, iv.lo, iv.hi, None, None,
                       iv.n))
    return out


def reproduce(runs: str | Path, *, n_boot: int = 5000, early_cutoff: int = 200) -> list[Row]:
    """Compute every table row the files under ``runs`` allow.

    Args:
        runs: a folder holding ``seed<S>/`` subfolders laid out like the paper's release.
        n_boot: bootstrap resamples for AUC and token-level intervals.
        early_cutoff: first step after the bonus window (the paper's 200).

    Returns:
        Rows in a stable order: per seed folder (by seed number), step-level tables, then
        minimal-pair draws (by file name), then token level.

    Raises:
        InputFileError: the folder is missing or holds no seed folder, a scores file has no
            ground truth beside it, or any file is malformed.
    """
    root = Path(runs)
    if not root.is_dir():
        raise InputFileError(
            f"{root}: runs folder not found; pass --runs pointing at a folder with seed<S>/ "
            "subfolders (e.g. ../shared/reference/paper-runs)."
        )
    seed_dirs = sorted(
        (d for d in root.iterdir() if d.is_dir() and _SEED_DIR.match(d.name)),
        key=lambda d: int(_SEED_DIR.match(d.name).group(1)),
    )
    if not seed_dirs:
        raise InputFileError(
            f"{root}: no seed<S>/ subfolders found; expected e.g. {root}/seed0/ground_truth.jsonl."
        )
    rows: list[Row] = []
    for d in seed_dirs:
        seed = _SEED_DIR.match(d.name).group(1)
        scores, gt = d / "attribution_scores.json", d / "ground_truth.jsonl"
        if scores.exists():
            if not gt.exists():
                raise InputFileError(
                    f"{gt}: file not found, but {scores.name} is present; step-level precision "
                    "needs the ground truth of the same run beside its scores."
                )
            rows += step_level_rows(seed, scores, gt, early_cutoff=early_cutoff)
        for f in sorted(d.iterdir()):
            if _MP_FILE.match(f.name):
                rows += minimal_pair_rows(f, n_boot=n_boot)
        for f in sorted(d.iterdir()):
            if _TOKEN_FILE.match(f.name):
                rows += token_level_rows(seed, f, n_boot=n_boot)
    return rows


# ----------------------------------------------------------------------------------------------
# comparison with the paper's CSV


def _opt_float(text: str) -> float | None:
    return float(text) if text.strip() else None


def read_expected(path: str | Path) -> dict[tuple[str, str, str], Row]:
    """Read a ``results_table.csv`` into ``{(seed, table, method): Row}``."""
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: file not found; pass --expected the paper's results_table.csv.")
    columns = ["seed", "table", "method", "value", "lo", "hi", "chance", "ceiling", "n"]
    out: dict[tuple[str, str, str], Row] = {}
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames != columns:
            raise InputFileError(
                f"{p}: header {reader.fieldnames} does not match the expected columns {columns}."
            )
        for lineno, rec in enumerate(reader, start=2):
            try:
                row = Row(
                    rec["seed"], rec["table"], rec["method"], float(rec["value"]),
                    _opt_float(rec["lo"]), _opt_float(rec["hi"]), _opt_float(rec["chance"]),
                    _opt_float(rec["ceiling"]), int(rec["n"]),
                )
            except ValueError as exc:
                raise InputFileError(f"{p}:{lineno}: malformed row ({exc}).") from exc
            out[(row.seed, row.table, row.method)] = row
    return out


@dataclass(frozen=True)
class Comparison:
    """One computed row next to the paper's row (if any) and whether they match."""

    ours: Row
    paper: Row | None
    max_abs_diff: float | None  # over value, chance, ceiling (the point estimates)
    ok: bool | None


def compare(
    rows: list[Row], expected: dict[tuple[str, str, str], Row], tolerance: float = 5e-4
) -> list[Comparison]:
    """Pair each computed row with the paper's; a match needs every point estimate within tol."""
    out = []
    for r in rows:
        e = expected.get((r.seed, r.table, r.method))
        if e is None:
            out.append(Comparison(r, None, None, None))
            continue
        diffs = [abs(r.value - e.value)]
        for a, b in ((r.chance, e.chance), (r.ceiling, e.ceiling)):
            if a is not None and b is not None:
                diffs.append(abs(a - b))
        if r.n != e.n:
            diffs.append(math.inf)
        worst = max(diffs)
        out.append(Comparison(r, e, worst, worst <= tolerance))
    return out


def _fmt(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def reproduce_command(
    runs: str, expected: str | None, json_out: str | None, n_boot: int = 5000,
    tolerance: float = 5e-4,
) -> int:
    """The ``bt-bench paper reproduce`` command; returns 0, or 1 if a compared row differs."""
    from tabulate import tabulate

    rows = reproduce(runs, n_boot=n_boot)
    exp = read_expected(expected) if expected else {}
    comps = compare(rows, exp, tolerance)
    table = []
    for c in comps:
        r, e = c.ours, c.paper
        line = [r.seed, r.table, r.method, _fmt(r.value), _fmt(r.lo), _fmt(r.hi),
                _fmt(r.chance), _fmt(r.ceiling), r.n]
        if expected:
            line += [
                _fmt(e.value) if e else "", _fmt(e.lo) if e else "", _fmt(e.hi) if e else "",
                "" if c.max_abs_diff is None else f"{c.max_abs_diff:.1e}",
                {True: "yes", False: "NO", None: "-"}[c.ok],
            ]
        table.append(line)
    headers = ["seed", "table", "method", "value", "lo", "hi", "chance", "ceiling", "n"]
    if expected:
        headers += ["paper", "paper lo", "paper hi", "max |diff|", "match"]
    print(tabulate(table, headers=headers, disable_numparse=True))
    status = 0
    if expected:
        compared = [c for c in comps if c.ok is not None]
        bad = [c for c in compared if not c.ok]
        ours_keys = {(r.seed, r.table, r.method) for r in rows}
        missing = [k for k in exp if k not in ours_keys]
        print(
            f"\n{len(rows)} rows computed; {len(compared)} compared with {expected}: "
            f"{len(compared) - len(bad)} match within {tolerance:g}, {len(bad)} differ. "
            f"{len(missing)} paper rows need files that are not in {runs}."
        )
        if bad:
            status = 1
    else:
        print(f"\n{len(rows)} rows computed from {runs}.")
    if json_out:
        atomic_write_text(json_out, dumps_json([asdict(r) for r in rows]))
        print(f"wrote {json_out}")
    return status

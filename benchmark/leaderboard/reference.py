"""The paper's Qwen2.5-1.5B results: a separate, unranked reference table.

Read from ``submissions/_reference/paper_rows.json`` (written by :func:`write_paper_reference`).
"""

from __future__ import annotations

from pathlib import Path

from benchmark.errors import InputFileError

__all__ = ["REFERENCE_COLUMNS", "REFERENCE_DIR", "REFERENCE_FILE", "REF_SOURCES",
           "paper_reference", "read_reference", "reference_table", "write_paper_reference"]

REFERENCE_DIR = "_reference"
REFERENCE_FILE = "paper_rows.json"
REFERENCE_COLUMNS = ("seed", "table", "method", "value", "lo", "hi", "chance", "ceiling", "n")
REF_SOURCES = {
    "recomputed": "recomputed by bt-bench from the paper's released per-seed files "
                  "(`bt-bench paper reproduce`)",
    "paper_csv": "copied from the paper's `results_table.csv`: the per-seed files needed to "
                 "recompute it were not released",
}


def paper_reference(runs: str | Path, expected: str | Path, n_boot: int = 5000) -> list[dict]:
    """The paper's Qwen2.5-1.5B table rows for the leaderboard's reference table.

    Rows recomputed from the paper's released per-seed files (``bt-bench paper reproduce``) get
    ``source = "recomputed"``; rows of the paper's ``results_table.csv`` that those files cannot
    recompute (they need files the paper did not release) are added with ``source =
    "paper_csv"``. Columns: ``seed, table, method, value, lo, hi, chance, ceiling, n, source``.
    Rows are ordered by table (the CSV's order, then tables only bt-bench computes), then seed,
    then the order in which :func:`benchmark.paper.reproduce` or the CSV lists them.
    """
    from dataclasses import asdict

    from benchmark.paper import read_expected, reproduce

    rows = [dict(asdict(r), source="recomputed") for r in reproduce(runs, n_boot=n_boot)]
    have = {(r["seed"], r["table"], r["method"]) for r in rows}
    paper = read_expected(expected)
    for key, r in paper.items():
        if key not in have:
            rows.append(dict(asdict(r), source="paper_csv"))
    tables: dict[str, int] = {}
    for table in [k[1] for k in paper] + [r["table"] for r in rows]:
        tables.setdefault(table, len(tables))
    order = {id(r): i for i, r in enumerate(rows)}
    return sorted(rows, key=lambda r: (tables[r["table"]], r["seed"], order[id(r)]))


def write_paper_reference(
    runs: str | Path, expected: str | Path,
    out: str | Path = f"submissions/{REFERENCE_DIR}/{REFERENCE_FILE}",
) -> Path:
    """Write :func:`paper_reference` as stable JSON (atomically) and return the path."""
    from benchmark.io import atomic_write_text, dumps_json

    atomic_write_text(out, dumps_json(paper_reference(runs, expected)))
    return Path(out)


def read_reference(submissions_dir: Path) -> list[dict] | None:
    """The rows of ``submissions_dir/_reference/paper_rows.json``, or None when it is absent.

    Raises:
        InputFileError: the file is not a list of rows with exactly the expected keys.
    """
    from benchmark.io import read_json

    p = submissions_dir / REFERENCE_DIR / REFERENCE_FILE
    if not p.is_file():
        return None
    rows = read_json(p)
    need = (*REFERENCE_COLUMNS, "source")
    if not isinstance(rows, list):
        raise InputFileError(f"{p}: expected a JSON list of rows, got {type(rows).__name__}.")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or set(r) != set(need):
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise InputFileError(
                f"{p}: row {i} has keys {got}; expected exactly {list(need)}. Regenerate it with "
                "benchmark.leaderboard.write_paper_reference (see docs/leaderboard.md)."
            )
    return rows


def reference_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Headers and display cells of the paper's reference table."""
    from benchmark.leaderboard._common import fmt

    headers = ["table", "method", "seed", "value [95% CI]", "chance", "ceiling", "n", "source"]
    out = []
    for r in rows:
        value = fmt(r["value"], 4)
        if r["lo"] is not None and r["hi"] is not None:
            value += f" [{r['lo']:.4f}, {r['hi']:.4f}]"
        out.append([r["table"], r["method"], str(r["seed"]), value, fmt(r["chance"], 4),
                    fmt(r["ceiling"], 4), str(r["n"]), r["source"]])
    return headers, out

"""``bt-bench leaderboard [--check]``: write ``leaderboard/`` from ``submissions/``, or check it.

Byte-stable: the same submissions give the same bytes. ``--check`` regenerates in memory and
compares: markdown, JSON and HTML byte for byte; PNGs by existence and by the data hash recorded
in ``leaderboard.json`` (font rendering differs across machines, the plotted numbers do not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.leaderboard._common import REGENERATE

__all__ = ["TEXT_FILES", "Generated", "check", "generate", "leaderboard_command"]

#: the text files ``--check`` compares byte for byte
TEXT_FILES = ("README.md", "leaderboard.json", "index.html")


@dataclass
class Generated:
    """Everything ``bt-bench leaderboard`` writes: text files and figures (rendered lazily)."""

    text: dict[str, str]
    figures: dict[str, dict]  # path -> {"kind", "data", "what"}
    data: dict


def _load_inputs(submissions_dir: Path) -> tuple[list[tuple[dict, dict]], list[dict] | None]:
    from benchmark.leaderboard.reference import read_reference
    from benchmark.submissions import find_submissions, load_submission

    subs = [load_submission(p) for p in find_submissions(submissions_dir)]
    return [(s.meta, s.results) for s in subs], read_reference(submissions_dir)


def _season(submissions_dir: Path, pairs: list[tuple[dict, dict]], board) -> dict | None:
    """The season block: the panel and every entry's ``panel.json`` (None without a panel)."""
    from benchmark.io import read_json
    from benchmark.leaderboard.season import season_board
    from benchmark.submissions.panel import PANEL_FILE, load_panel

    panel = load_panel(submissions_dir)
    if panel is None:
        return None
    entries, docs = {}, {}
    for meta, res in pairs:
        name = meta["name"]
        entries[name] = {"track": meta["track"], "kind": meta.get("kind", "estimator"),
                         "estimator_sha256": str(res["estimator"].get("sha256")),
                         "cost": meta.get("cost")}
        f = submissions_dir / name / PANEL_FILE
        if f.is_file():
            docs[name] = read_json(f)
    return season_board(panel, docs, entries, board.releases)


def _generate(submissions_dir: Path) -> Generated:
    from benchmark.io import dumps_json
    from benchmark.leaderboard.board import assemble_data, build_board
    from benchmark.leaderboard.figures import figure_specs
    from benchmark.leaderboard.html_page import render_html
    from benchmark.leaderboard.markdown import render_markdown
    from benchmark.leaderboard.season import season_figure_data

    pairs, reference = _load_inputs(submissions_dir)
    board = build_board(pairs)
    season = _season(submissions_dir, pairs, board)
    specs = figure_specs(board)
    if season is not None:
        colours = {n: {"colour": e["colour"], "marker": e["marker"]}
                   for rel in board.releases for n, e in rel["entries"].items()}
        specs.update(season_figure_data(season, colours))
    from benchmark.submissions import find_not_running

    data = assemble_data(board, specs, reference, season, find_not_running(submissions_dir))
    return Generated(
        text={"README.md": render_markdown(data), "leaderboard.json": dumps_json(data),
              "index.html": render_html(data)},
        figures=specs, data=data)


def _existing_pngs(out: Path) -> set[str]:
    fig_dir = out / "figures"
    if not fig_dir.is_dir():
        return set()
    return {p.relative_to(out).as_posix() for p in fig_dir.rglob("*.png")}


def _committed_hashes(out: Path) -> dict[str, str]:
    p = out / "leaderboard.json"
    try:
        figs = json.loads(p.read_text(encoding="utf-8")).get("figures", {})
        return {k: v.get("data_sha256") for k, v in figs.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return {}


def generate(submissions_dir: str | Path = "submissions", out: str | Path = "leaderboard") -> \
        list[Path]:
    """Write the leaderboard into ``out`` and return the files written or kept.

    A PNG whose plotted data is unchanged (same data hash as in the existing ``leaderboard.json``)
    and that exists is kept as it is, so regenerating on another machine does not churn figures;
    PNGs under ``out/figures`` that are no longer generated are deleted.
    """
    from benchmark.io import atomic_write_bytes, atomic_write_text
    from benchmark.leaderboard.plots import render_png

    out = Path(out)
    gen = _generate(Path(submissions_dir))
    old = _committed_hashes(out)
    written = []
    for path, spec in sorted(gen.figures.items()):
        target = out / path
        if not (target.is_file() and old.get(path) == gen.data["figures"][path]["data_sha256"]):
            atomic_write_bytes(target, render_png(spec["kind"], spec["data"]))
        written.append(target)
    for stale in sorted(_existing_pngs(out) - set(gen.figures)):
        (out / stale).unlink()
    for name, text in gen.text.items():
        atomic_write_text(out / name, text)
        written.append(out / name)
    return written


def check(submissions_dir: str | Path = "submissions", out: str | Path = "leaderboard") -> \
        list[str]:
    """Compare ``out`` with what :func:`generate` would write; return the stale paths.

    Markdown, JSON and HTML must be byte-identical. A PNG is stale when it is missing, when it is
    not generated any more, or when the data it plots changed (its data hash in the regenerated
    ``leaderboard.json`` differs from the one in ``out``); PNG bytes are not compared, because
    font rendering differs across machines.
    """
    out = Path(out)
    gen = _generate(Path(submissions_dir))
    stale = []
    for name, text in gen.text.items():
        p = out / name
        if not p.is_file() or p.read_bytes() != text.encode("utf-8"):
            stale.append(p.as_posix())
    old = _committed_hashes(out)
    for path in sorted(gen.figures):
        if not (out / path).is_file() or old.get(path) != gen.data["figures"][path]["data_sha256"]:
            stale.append((out / path).as_posix())
    for extra in sorted(_existing_pngs(out) - set(gen.figures)):
        stale.append((out / extra).as_posix() + " (no longer generated)")
    return stale


def leaderboard_command(args: Any) -> int:
    """``bt-bench leaderboard [--check]``: write, or check, ``--out``; exit 1 when stale."""
    import time

    t0 = time.perf_counter()
    if args.check:
        stale = check(args.submissions_dir, args.out)
        if stale:
            print(f"{args.out}/ is not what {REGENERATE} generates from {args.submissions_dir}/; "
                  "stale files:")
            for s in stale:
                print(f"  {s}")
            print(f"fix: {REGENERATE} --submissions-dir {args.submissions_dir} --out {args.out} "
                  "and commit the result")
            return 1
        print(f"{args.out}/ is up to date with {args.submissions_dir}/ "
              f"({time.perf_counter() - t0:.1f}s)")
        return 0
    written = generate(args.submissions_dir, args.out)
    print(f"wrote {len(written)} files to {args.out}/ ({time.perf_counter() - t0:.1f}s)")
    return 0

"""``bt-bench leaderboard``: generate ``leaderboard/`` from ``submissions/``; never edit it by hand.

Rooms, by role:

* :mod:`.rows`: schema-3 ``results.json`` -> entries, task rows, suite rows, reference rows;
* :mod:`.ranking`: the ranking rule (1 + the number of entries significantly better);
* :mod:`.paired`: the entries' causal replicates from their results, the pairwise table;
* :mod:`.board`: submissions grouped by release, track and task (``leaderboard.json``'s data);
* :mod:`.columns`: the tables' columns and cells, shared by :mod:`.markdown` (``README.md``) and
  :mod:`.html_page` (``index.html``);
* :mod:`.figures` (which figures, from which numbers, in which colours) and :mod:`.plots`
  (the matplotlib drawing and the PNG bytes; it takes the colours from :mod:`.figures`);
* :mod:`.reference`: the paper's Qwen2.5-1.5B rows (a separate, unranked table);
* :mod:`.command`: :func:`generate`, :func:`check` and the CLI command.

See ``docs/leaderboard.md`` for the ranking rule, the columns and the files.
"""

from __future__ import annotations

from benchmark.leaderboard._common import LEADERBOARD_SCHEMA_VERSION, LeaderboardError
from benchmark.leaderboard.board import build_board, leaderboard_data
from benchmark.leaderboard.command import TEXT_FILES, check, generate, leaderboard_command
from benchmark.leaderboard.figures import PALETTE, assign_colours
from benchmark.leaderboard.html_page import render_html
from benchmark.leaderboard.markdown import render_markdown
from benchmark.leaderboard.ranking import rank_rows
from benchmark.leaderboard.reference import paper_reference, write_paper_reference
from benchmark.leaderboard.rows import (
    FALLBACK_VIEWS,
    build_entry,
    suite_row,
    task_reference,
    task_row,
)

__all__ = [
    "FALLBACK_VIEWS",
    "LEADERBOARD_SCHEMA_VERSION",
    "PALETTE",
    "TEXT_FILES",
    "LeaderboardError",
    "assign_colours",
    "build_board",
    "build_entry",
    "check",
    "generate",
    "leaderboard_command",
    "leaderboard_data",
    "paper_reference",
    "rank_rows",
    "render_html",
    "render_markdown",
    "suite_row",
    "task_reference",
    "task_row",
    "write_paper_reference",
]

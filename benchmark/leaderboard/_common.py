"""Small shared pieces of the leaderboard package: the error, constants, formatting helpers."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any
from urllib.parse import quote

from benchmark.errors import BenchmarkError
from benchmark.untrusted import visible

#: the schema of ``leaderboard.json`` (3: ranks by paired comparisons, with the pairwise table)
LEADERBOARD_SCHEMA_VERSION = 3
#: the results schema the leaderboard reads (``results["schema_version"]``; 3: stored removal
#: curves, from which the paired comparisons are recomputed)
RESULTS_SCHEMA_VERSION = 3
#: the command that regenerates ``leaderboard/``
REGENERATE = "bt-bench leaderboard"
#: checklist items shown as columns: (number, key); 8 and 9 are diagnostics (results.json only)
GATED_ITEMS = ((1, "magnitude"), (2, "fluency"), (3, "headroom"), (4, "timing"), (5, "seeds"),
               (6, "draws"), (7, "precision_of_estimate"), (10, "causal"))
GATED_KEYS = tuple(k for _, k in GATED_ITEMS)
SHORT_VERDICT = {"pass": "pass", "fail": "FAIL", "inconclusive": "inc.", "reported": "rep.",
                 "not_run": "-"}


class LeaderboardError(BenchmarkError):
    """The submissions or the reference file cannot be turned into a leaderboard."""


def get(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, or None when a key is missing or a level is not a dict."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def finite(x: Any) -> bool:
    """A real, finite number (not None, NaN or infinite)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def mean(values: list[Any]) -> float | None:
    """Mean of the finite values, or None when there are none."""
    vals = [float(v) for v in values if finite(v)]
    return sum(vals) / len(vals) if vals else None


def interval(d: Any) -> dict[str, float | None] | None:
    """``{"point", "lo", "hi"}`` of an interval dict (other keys dropped), None without a point."""
    if not isinstance(d, dict) or not finite(d.get("point")):
        return None
    return {"point": d["point"], "lo": d.get("lo") if finite(d.get("lo")) else None,
            "hi": d.get("hi") if finite(d.get("hi")) else None}


def seed_key(s: str) -> tuple[int, str]:
    """Sort key of a seed id: numeric seeds in numeric order first."""
    return (int(s), s) if s.isdigit() else (10**9, s)


def round_floats(obj: Any) -> Any:
    """Floats rounded to 10 digits (NaN and infinities become None), recursively."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, 10)
    if isinstance(obj, dict):
        return {str(k): round_floats(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [round_floats(v) for v in obj]
    return obj


def sha(obj: Any) -> str:
    """sha256 of the stable JSON of ``obj``."""
    from benchmark.io import dumps_json

    return hashlib.sha256(dumps_json(obj).encode()).hexdigest()


def slug(text: str) -> str:
    """A file-name-safe form of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "x"


def fmt(x: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals, ``-`` for None."""
    return "-" if not finite(x) else f"{x:.{digits}f}"


def fmt_iv(d: dict | None, digits: int = 3) -> tuple[str, str]:
    """``("0.702", "[0.571, 0.878]")`` of an interval; ``("-", "")`` without one."""
    if not d or not finite(d.get("point")):
        return "-", ""
    if not (finite(d.get("lo")) and finite(d.get("hi"))):
        return fmt(d["point"], digits), ""
    return fmt(d["point"], digits), f"[{fmt(d['lo'], digits)}, {fmt(d['hi'], digits)}]"


def fmt_band(d: dict | None, digits: int = 3) -> str:
    """``"-0.153 .. 0.282"`` of a band ``{"lo", "hi"}``."""
    if not d or not (finite(d.get("lo")) and finite(d.get("hi"))):
        return "-"
    return f"{fmt(d['lo'], digits)} .. {fmt(d['hi'], digits)}"


# ----------------------------------------------------------------------------------------------
# escaping: every string that comes from a submission (its submission.yaml, its results.json, the
# reference file) is escaped for where it lands, whatever validation it passed before

# characters that start markup anywhere in a line; "_" unless between two letters or digits
# (an intraword "_" neither opens nor closes emphasis, so "paper_csv" stays); a "]" that would
# close a link's or an image's text (only "](" and "][" do: without them no link can form, so
# "[0.4, 0.5]" stays)
_MD_SPECIAL = re.compile(r"[\\`*~<>|]|\](?=[(\[])|(?<![^\W_])_|_(?![^\W_])")


def md_text(text: object) -> str:
    r"""``text`` as literal markdown (a table cell, link text, a line): nothing in it is markup.

    Control, format and separator characters are shown as escapes (no new line, no reordering);
    ``&`` becomes ``&amp;``; ``\ ` * ~ < > |`` are backslash-escaped (``|`` included, so a
    cell stays one cell), and so are ``_`` where it could start or end emphasis and a ``]``
    followed by ``(`` or ``[``.
    """
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0),
                           visible(str(text)).replace("&", "&amp;"))


def md_code(text: object) -> str:
    """``text`` as a markdown code span: fenced by more backticks than any run inside it."""
    t = visible(str(text))
    fence = "`" * (max((len(r) for r in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def url_path(text: object) -> str:
    """A relative link target: every character but letters, digits, ``/``, ``_.-~`` encoded."""
    return quote(visible(str(text)), safe="/")


def css_token(text: object) -> str:
    """One HTML class name or id part: characters other than ``[A-Za-z0-9_-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(text)) or "_"

"""The ranking rule: rank = 1 + the number of entries significantly better; ties never chain.

An entry's rank counts the entries of its table that are *significantly better* than it. With
causal scores that is a paired comparison (:func:`benchmark.causal.score.paired_difference`: the
difference of the two entries' bootstrap replicates has an interval whose lower end clears 0 by
the cross-machine tolerance); the caller passes it as ``better``. Without a pairing (precision on
releases without a causal reference) an entry is significantly better when its whole interval
lies above the other's. Two entries share a rank only because the data do not separate either of
them from the entries above; a tie is never inferred through a neighbour.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["disjoint_above", "rank_rows"]


def disjoint_above(a: dict | None, b: dict | None) -> bool:
    """Whether interval ``a`` lies wholly above ``b`` (``a.lo > b.hi``; touching does not count).

    The unpaired "significantly better" of :func:`rank_rows` when no paired comparison exists.
    """
    if not a or not b or None in (a.get("lo"), b.get("hi")):
        return False
    return a["lo"] > b["hi"]


def rank_rows(rows: list[dict], key: str = "causal_score",
              better: Callable[[str, str], bool] | None = None) -> list[dict]:
    """Rank rows: 1 + the number of rows significantly better; order by rank, then score.

    Args:
        rows: dicts with a unique ``name`` and ``key`` (an interval dict ``{"point", "lo",
            "hi"}`` or None).
        key: the column to rank by (``causal_score``; ``precision`` on releases without a causal
            reference).
        better: ``better(a, b)`` says whether row ``a`` is significantly better than row ``b``
            (by name); None compares the rows' intervals unpaired (:func:`disjoint_above`).

    Returns:
        New dicts, ordered by rank, then the point (highest first), then the name (so the order
        never depends on the input order); rows without the score go last with rank ``"-"``.
        Each gets ``position``, ``rank`` (int or None), ``tied`` (another row has the same rank)
        and ``rank_label`` (``"=2"`` when tied).
    """
    def point(r: dict) -> float | None:
        return (r.get(key) or {}).get("point")

    if better is None:
        by_name = {r["name"]: r for r in rows}

        def better(a: str, b: str) -> bool:
            return disjoint_above(by_name[a].get(key), by_name[b].get(key))

    scored = [r for r in rows if point(r) is not None]
    rank = {r["name"]: 1 + sum(1 for o in scored if o["name"] != r["name"]
                               and better(o["name"], r["name"])) for r in scored}
    ordered = [dict(r) for r in sorted(rows, key=lambda r: (
        point(r) is None, rank.get(r["name"], 0), -(point(r) or 0.0), r["name"]))]
    counts: dict[int, int] = {}
    for n in rank.values():
        counts[n] = counts.get(n, 0) + 1
    for i, r in enumerate(ordered):
        n = rank.get(r["name"])
        tied = n is not None and counts[n] > 1
        r["position"] = i + 1
        r["rank"] = n
        r["tied"] = tied
        r["rank_label"] = "-" if n is None else (f"={n}" if tied else str(n))
    return ordered

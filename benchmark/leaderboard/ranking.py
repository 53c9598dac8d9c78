"""The ranking rule: highest score first; rows whose intervals overlap the previous row's tie."""

from __future__ import annotations

__all__ = ["overlap", "rank_rows"]


def overlap(a: dict | None, b: dict | None) -> bool:
    """Whether two ``{"lo", "hi"}`` intervals overlap (touching counts); False if one is missing."""
    if not a or not b or None in (a.get("lo"), a.get("hi"), b.get("lo"), b.get("hi")):
        return False
    return a["lo"] <= b["hi"] and b["lo"] <= a["hi"]


def rank_rows(rows: list[dict], key: str = "causal_score") -> list[dict]:
    """Order rows by ``row[key]["point"]`` and assign ranks with ties.

    Rows are sorted by the point, highest first (the name breaks exact ties, so the order never
    depends on the input order); rows without the score go last with rank ``"-"``. A row whose
    ``{"lo", "hi"}`` interval overlaps the previous row's takes the previous row's rank, so
    chains of overlaps form one tie group; ranks are competition ranks (1, =2, =2, 4) and every
    member of a tie group gets ``tied = True`` and a label with ``=``.

    Args:
        rows: dicts with ``name`` and ``key`` (an interval dict or None).
        key: the column to rank by (``causal_score``; ``precision`` on releases without a causal
            reference).

    Returns:
        New dicts with ``position``, ``rank`` (int or None), ``rank_label`` and ``tied`` added.
    """
    def point(r: dict) -> float | None:
        return (r.get(key) or {}).get("point")

    ordered = [dict(r) for r in sorted(rows, key=lambda r: (point(r) is None, -(point(r) or 0.0),
                                                             r["name"]))]
    ranks: list[int | None] = []
    for i, r in enumerate(ordered):
        if point(r) is None:
            ranks.append(None)
        elif i > 0 and ranks[i - 1] is not None and overlap(ordered[i - 1][key], r[key]):
            ranks.append(ranks[i - 1])
        else:
            ranks.append(i + 1)
    for i, r in enumerate(ordered):
        rank = ranks[i]
        tied = rank is not None and ranks.count(rank) > 1
        r["position"] = i + 1
        r["rank"] = rank
        r["tied"] = tied
        r["rank_label"] = "-" if rank is None else (f"={rank}" if tied else str(rank))
    return ordered

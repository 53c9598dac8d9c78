"""The matplotlib drawing of each figure kind (data in, figure out; see :mod:`.figures`), as PNG."""

from __future__ import annotations

import io
import math
from typing import Any

from benchmark.leaderboard._common import finite
from benchmark.leaderboard.figures import (
    BAND_COLOUR,
    CEILING_COLOUR,
    CHANCE_COLOUR,
    CONTROL_COLOUR,
    ORACLE_COLOUR,
    PALETTE,
    PROVENANCE_COLOUR,
)

__all__ = ["FIGURE_DPI", "PLOTTERS", "render_png"]

FIGURE_DPI = 100

_DRAW_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_GREY = "#57606a"


def _style(ax: Any, grid: str = "x") -> None:
    ax.grid(axis=grid, color="#d0d7de", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8)


def _note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, color=_GREY,
            transform=ax.transAxes)


def _ivs(d: dict | None, digits: int = 2) -> str:
    if not d or not finite(d.get("point")):
        return "-"
    if finite(d.get("lo")) and finite(d.get("hi")):
        return f"{d['point']:.{digits}f} [{d['lo']:.{digits}f}, {d['hi']:.{digits}f}]"
    return f"{d['point']:.{digits}f}"


# ----------------------------------------------------------------------------------------------
# removal curves


def _mean_curve(seeds: dict[str, list[dict]], key: str = "fraction") -> tuple[list, list]:
    """Mean over seeds at each grid position: ``(xs, ys)``."""
    curves = [c for c in seeds.values() if c]
    if not curves:
        return [], []
    n = min(len(c) for c in curves)
    xs, ys = [], []
    for i in range(n):
        pts = [c[i] for c in curves if finite(c[i].get(key))]
        if pts:
            xs.append(sum(p["x"] for p in pts) / len(pts))
            ys.append(sum(p[key] for p in pts) / len(pts))
    return xs, ys


def _draw_band(ax: Any, seeds: dict[str, list[dict]]) -> None:
    xs, lo = _mean_curve(seeds, "lo")
    _, hi = _mean_curve(seeds, "hi")
    if xs and len(lo) == len(hi) == len(xs):
        ax.fill_between(xs, lo, hi, color=BAND_COLOUR, alpha=0.9, linewidth=0, zorder=1)


def _draw_curve(ax: Any, seeds: dict[str, list[dict]], colour: str, *, marker: str | None = "o",
                linestyle: str = "-", hollow: bool = False, width: float = 1.6,
                zorder: int = 3) -> None:
    xs, ys = _mean_curve(seeds)
    if not xs:
        return
    ax.plot(xs, ys, color=colour, linestyle=linestyle, linewidth=width, marker=marker,
            markersize=5, markerfacecolor="white" if hollow else colour, zorder=zorder)
    if len(seeds) > 1:
        for c in seeds.values():
            ax.plot([p["x"] for p in c], [p["fraction"] for p in c], linestyle="none",
                    marker=marker or ".", markersize=3, color=colour, alpha=0.45, zorder=zorder)


def _curve_limits(data: dict) -> tuple[float, float]:
    vals = [0.0, 1.0]
    for group in [r["seeds"] for r in data["rows"]] + [data["oracle"]["seeds"],
                                                       data["provenance"]["seeds"]]:
        vals += [p["fraction"] for c in group.values() for p in c if finite(p.get("fraction"))]
    for c in data["random"]["seeds"].values():
        vals += [v for p in c for v in (p["lo"], p["hi"])]
    lo, hi = min(vals), max(vals)
    pad = 0.08 * (hi - lo)
    return lo - pad, hi + pad


def _curve_axes(ax: Any, limits: tuple[float, float]) -> None:
    _style(ax, "both")
    ax.axhline(0.0, color=_GREY, linewidth=0.7, zorder=2)
    ax.axhline(1.0, color=_GREY, linewidth=0.7, linestyle=":", zorder=2)
    # k on a log2 axis, as the causal score weighs it (the area under the curve over log k);
    # a release with a coarser grid leaves the small-k end empty
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xlim(1 / 22, 1.35)
    ax.set_xticks([1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0],
                  ["|GT|/16", "|GT|/8", "|GT|/4", "|GT|/2", "|GT|"])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=6.5)
    ax.set_ylim(*limits)


def _reference_handles(with_provenance: bool = True) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out = [Line2D([], [], color=ORACLE_COLOUR, linewidth=1.4, label="oracle (group labels)")]
    if with_provenance:
        out.append(Line2D([], [], color=PROVENANCE_COLOUR, linestyle="--", linewidth=1.2,
                          label="provenance (rollout labels)"))
    out.append(Patch(color=BAND_COLOUR, label="random band (lowest..highest random set)"))
    return out


def _plot_curves(data: dict) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = data["rows"]
    n = max(len(rows), 1)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    width, height = 0.8 + 2.8 * ncols, 1.7 + 2.3 * nrows
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, sharex=True,
                             sharey=True)
    limits = _curve_limits(data)
    for i in range(nrows * ncols):
        ax = axes[i // ncols][i % ncols]
        if i >= len(rows):
            ax.set_visible(i == 0)
            if i == 0:
                _curve_axes(ax, limits)
                _note(ax, "no entries")
            continue
        r = rows[i]
        _curve_axes(ax, limits)
        _draw_band(ax, data["random"]["seeds"])
        _draw_curve(ax, data["oracle"]["seeds"], ORACLE_COLOUR, marker=None, width=1.3,
                    zorder=2)
        _draw_curve(ax, data["provenance"]["seeds"], PROVENANCE_COLOUR, marker=None,
                    linestyle="--", width=1.1, zorder=2)
        _draw_curve(ax, r["seeds"], r["colour"], marker=r["marker"],
                    hollow=r["kind"] == "control")
        if not r["seeds"]:
            _note(ax, "no removal curve")
        ax.set_title(f"{r['name']}\ncausal score {_ivs(r['causal_score'])}", fontsize=8.5)
        if i % ncols == 0:
            ax.set_ylabel("fraction of bonus-off effect", fontsize=8)
        if i // ncols == nrows - 1 or i + ncols >= len(rows):
            ax.set_xlabel("k removed (top-ranked rollouts)", fontsize=8)
            ax.tick_params(labelbottom=True)
    handles = _reference_handles()
    handles.append(Line2D([], [], color=_GREY, marker="o", markersize=5,
                          label="entry: mean over seeds (dots: seeds)"))
    legend_rows = 1 if ncols >= 3 else 2
    fig.legend(handles=handles, loc="lower center", ncol=4 // legend_rows, fontsize=8,
               frameon=False)
    fig.suptitle(f"Removal curves, task {data['task']} ({data['behavior']}),\n{data['track']} "
                 f"track, release {data['release']}", fontsize=10)
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.2 / width, top=1 - 1.05 / height,
                        bottom=(0.75 + 0.2 * legend_rows) / height, wspace=0.1, hspace=0.55)
    return fig


# ----------------------------------------------------------------------------------------------
# precision and draw AUC


def _point(ax: Any, y: float, v: dict | None, colour: str, hollow: bool, marker: str = "o",
           key: str = "precision") -> None:
    if not v or not finite(v.get(key)):
        return
    lo, hi = v.get("lo"), v.get("hi")
    if finite(lo) and finite(hi):
        ax.plot([lo, hi], [y, y], color=colour, linewidth=1.6, solid_capstyle="butt")
    ax.plot([v[key]], [y], marker=marker, markersize=6, color=colour,
            markerfacecolor="white" if hollow else colour, markeredgewidth=1.4, linestyle="none")


def _ref_lines(ax: Any, entry: dict | None) -> None:
    if not entry:
        return
    if finite(entry.get("chance")):
        ax.axvline(entry["chance"], color=CHANCE_COLOUR, linestyle="--", linewidth=1)
    if finite(entry.get("ceiling")):
        ax.axvline(entry["ceiling"], color=CEILING_COLOUR, linestyle=":", linewidth=1.4)


def _legend_marks(extra: list | None = None) -> list:
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=CHANCE_COLOUR, linestyle="--", label="chance"),
            Line2D([], [], color=CEILING_COLOUR, linestyle=":", label="ceiling"),
            Line2D([], [], color=PALETTE[0], marker="o", linestyle="-",
                   label="estimator (95% CI)"),
            Line2D([], [], color=CONTROL_COLOUR, marker="o", markerfacecolor="white",
                   linestyle="-", label="control"), *(extra or [])]


def _plot_precision(data: dict) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows, seeds = data["rows"], data["seeds"] or ["-"]
    n = max(len(rows), 1)
    height = 2.3 + 0.38 * n * 2
    width = max(8.5, 2.6 + 3.2 * len(seeds))
    fig, axes = plt.subplots(2, len(seeds), figsize=(width, height), squeeze=False, sharey=True)
    ys = list(range(len(rows)))[::-1]
    any_fallback = False
    for j, seed in enumerate(seeds):
        for i, gran in enumerate(("step", "rollout")):
            ax = axes[i][j]
            _style(ax)
            entries = [(r["seeds"].get(seed) or {}).get(gran) for r in rows]
            _ref_lines(ax, next((e for e in entries if e), None))
            for y, r, e in zip(ys, rows, entries, strict=True):
                fallback = gran == "step" and r.get("fallback_step")
                colour = CONTROL_COLOUR if fallback else r["colour"]
                _point(ax, y, e, colour, r["kind"] == "control" or fallback,
                       "x" if fallback else "o")
                if fallback and e and finite(e.get("precision")):
                    any_fallback = True
                    ax.annotate("fallback", (e["precision"], y), xytext=(6, 3),
                                textcoords="offset points", fontsize=7, color=_GREY)
            if not any(entries):
                _note(ax, "no ground truth\nin the learning window")
            ax.set_xlim(-0.02, 1.02)
            ax.set_title(f"seed {seed}, {gran}-level", fontsize=9)
            if i == 1:
                ax.set_xlabel("precision@|GT| (window, group label)", fontsize=8)
    axes[0][0].set_yticks(ys, [r["name"] for r in rows])
    axes[1][0].set_yticks(ys, [r["name"] for r in rows])
    axes[0][0].set_ylim(-0.7, n - 0.3)
    extra = [Line2D([], [], color=CONTROL_COLOUR, marker="x", linestyle="-",
                    label="fallback (generic sketch method)")] if any_fallback else []
    fig.legend(handles=_legend_marks(extra), loc="lower center", ncol=5 if extra else 4,
               fontsize=8, frameon=False)
    fig.suptitle(f"Per-seed window precision against chance and ceiling\ntask {data['task']} "
                 f"({data['behavior']}), {data['track']} track, release {data['release']}",
                 fontsize=10)
    fig.subplots_adjust(left=2.0 / width, right=1 - 0.2 / width, top=1 - 0.8 / height,
                        bottom=0.9 / height, wspace=0.08,
                        hspace=max(0.6, 1.6 / (0.76 * n)))
    return fig


def _auc_panel(ax: Any, methods: list[tuple[str, str, bool, dict]], ids: list[str]) -> None:
    """Methods (label, colour, hollow, {id: interval}) top to bottom; one marker per id."""
    _style(ax)
    ax.axvline(0.5, color=CHANCE_COLOUR, linestyle="--", linewidth=1)
    ys = list(range(len(methods)))[::-1]
    k = max(len(ids), 1)
    for y, (_, colour, hollow, draws) in zip(ys, methods, strict=True):
        for t, did in enumerate(ids):
            off = ((k - 1) / 2 - t) * (0.7 / k)
            _point(ax, y + off, draws.get(did), colour, hollow,
                   _DRAW_MARKERS[t % len(_DRAW_MARKERS)], key="point")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.7, max(len(methods), 1) - 0.3)
    ax.set_yticks(ys, [m[0] for m in methods])
    ax.set_xlabel("residualized within-group AUC", fontsize=8)


def _draw_handles(ids: list[str], labels: list[str] | None = None) -> list:
    from matplotlib.lines import Line2D

    out = [Line2D([], [], color=CHANCE_COLOUR, linestyle="--", label="AUC 0.5 (no signal)")]
    for t, label in enumerate(labels or ids):
        out.append(Line2D([], [], color=_GREY, marker=_DRAW_MARKERS[t % 8], linestyle="none",
                          label=label))
    out.append(Line2D([], [], color=CONTROL_COLOUR, marker="o", markerfacecolor="white",
                      linestyle="-", label="control (hollow)"))
    return out


def _short_draw(did: str) -> str:
    return did.split("/", 1)[-1]


def _plot_draw_auc(data: dict) -> Any:
    import matplotlib.pyplot as plt

    rows, seeds = data["rows"], data["seeds"] or ["-"]
    n = max(len(rows), 1)
    height = 2.0 + 0.5 * n
    width = max(8.5, 2.6 + 3.2 * len(seeds))
    fig, axes = plt.subplots(1, len(seeds), figsize=(width, height), squeeze=False, sharey=True)
    ids = sorted({d for r in rows for per in r["seeds"].values() for d in per})
    for j, seed in enumerate(seeds):
        methods = [(r["name"] + (" (fallback)" if r.get("fallback_draws") else ""),
                    CONTROL_COLOUR if r.get("fallback_draws") else r["colour"],
                    r["kind"] == "control" or bool(r.get("fallback_draws")),
                    r["seeds"].get(seed) or {}) for r in rows]
        _auc_panel(axes[0][j], methods, ids)
        axes[0][j].set_title(f"seed {seed}", fontsize=9)
    fig.legend(handles=_draw_handles(ids, [_short_draw(d) for d in ids]), loc="lower center",
               ncol=min(len(ids) + 2, 6), fontsize=8, frameon=False)
    fig.suptitle(f"Draw AUC (fluency-residualized, 95% CI) per seed and draw\ntask "
                 f"{data['task']} ({data['behavior']}), {data['track']} track, release "
                 f"{data['release']}", fontsize=10)
    fig.subplots_adjust(left=2.0 / width, right=1 - 0.2 / width, top=1 - 0.8 / height,
                        bottom=0.9 / height, wspace=0.08)
    return fig


# ----------------------------------------------------------------------------------------------
# one submission


def _submission_curves(ax: Any, task: dict, colour: str, marker: str, hollow: bool) -> None:
    cv = task["curves"]
    vals = [0.0, 1.0] + [p["fraction"] for g in [cv["estimator"], cv["oracle"],
                                                 *cv["controls"].values()]
                         for c in g.values() for p in c if finite(p.get("fraction"))]
    vals += [v for c in cv["random"].values() for p in c for v in (p["lo"], p["hi"])]
    pad = 0.08 * (max(vals) - min(vals))
    _curve_axes(ax, (min(vals) - pad, max(vals) + pad))
    _draw_band(ax, cv["random"])
    _draw_curve(ax, cv["oracle"], ORACLE_COLOUR, marker=None, width=1.3, zorder=2)
    styles = ("--", ":", "-.")
    for i, (name, seeds) in enumerate(sorted(cv["controls"].items())):
        _draw_curve(ax, seeds, CONTROL_COLOUR, marker=None, linestyle=styles[i % 3], width=1.3,
                    zorder=2)
        xs, ys = _mean_curve(seeds)
        if xs:
            ax.annotate(name, (xs[-1], ys[-1]), xytext=(-4, 4), textcoords="offset points",
                        fontsize=7, color=_GREY, ha="right")
    _draw_curve(ax, cv["estimator"], colour, marker=marker, hollow=hollow)
    if not cv["estimator"]:
        _note(ax, "causal score not computed")
    ax.set_ylabel("fraction of bonus-off effect", fontsize=8)
    ax.set_xlabel("k removed", fontsize=8)
    ax.set_title(f"task {task['task']}: causal score {_ivs(task['causal_score'])}", fontsize=9)


def _submission_precision(ax: Any, task: dict, colour: str, hollow: bool,
                          step_fallback: bool) -> None:
    _style(ax)
    seeds = sorted(task["precision"])
    labels = []
    for y, (seed, gran) in enumerate((s, g) for s in seeds[::-1] for g in ("rollout", "step")):
        e = (task["precision"].get(seed) or {}).get(gran)
        fallback = step_fallback and gran == "step"
        if e:
            for key, c in (("chance", CHANCE_COLOUR), ("ceiling", CEILING_COLOUR)):
                if finite(e.get(key)):
                    ax.plot([e[key]], [y], marker="|", markersize=12, color=c)
            _point(ax, y, e, CONTROL_COLOUR if fallback else colour, hollow or fallback,
                   "x" if fallback else "o")
        else:
            ax.text(0.5, y, "no ground truth in window", fontsize=7, color=_GREY, va="center",
                    ha="center")
        labels.append(f"seed {seed} {gran}" + (" (fallback)" if fallback else ""))
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.7, max(len(labels), 1) - 0.3)
    ax.set_xlabel("precision@|GT| (window, group label)", fontsize=8)
    ax.set_title("precision vs chance (red) and ceiling (green)", fontsize=9)


def _plot_submission(data: dict) -> Any:
    import matplotlib.pyplot as plt

    tasks = data["tasks"] or [{"task": "-", "curves": {}, "precision": {}, "draws": []}]
    n_draw_rows = max([len(t["draws"]) for t in tasks] + [3])
    row_h = 1.2 + 0.45 * n_draw_rows
    height = 1.2 + row_h * len(tasks)
    width = 16.0
    fig, axes = plt.subplots(len(tasks), 3, figsize=(width, height), squeeze=False,
                             gridspec_kw={"width_ratios": [1.0, 1.0, 1.1]})
    hollow = data["kind"] == "control"
    for i, task in enumerate(tasks):
        if task["curves"]:
            _submission_curves(axes[i][0], task, data["colour"], data["marker"], hollow)
        _submission_precision(axes[i][1], task, data["colour"], hollow,
                              "step" in data["fallbacks"])
        ax = axes[i][2]
        if task["draws"]:
            ids = sorted({f"{s}|{d}" for m in task["draws"] for s, per in m["seeds"].items()
                          for d in per})
            fb = "draws" in data["fallbacks"]
            methods = [(m["name"] + (" (fallback)" if fb and m["kind"] == "estimator" else ""),
                        data["colour"] if m["kind"] == "estimator" and not fb else CONTROL_COLOUR,
                        m["kind"] == "control" or hollow or fb,
                        {f"{s}|{d}": iv for s, per in m["seeds"].items() for d, iv in per.items()})
                       for m in task["draws"]]
            _auc_panel(ax, methods, ids)
            own = any(m["kind"] == "estimator" for m in task["draws"])
            ax.set_title(f"draw AUC, task {task['task']}" + (
                "" if own else " (scores no draws: controls only)"), fontsize=9)
            labels = [f"seed {x.split('|')[0]} {_short_draw(x.split('|')[1])}" for x in ids]
            ax.legend(handles=_draw_handles(ids, labels), loc="center left",
                      bbox_to_anchor=(1.02, 0.5), fontsize=7, frameon=False)
        else:
            _style(ax)
            _note(ax, "no draw scores")
            ax.set_yticks([])
    fig.legend(handles=_reference_handles(False), loc="lower center", ncol=2, fontsize=8,
               frameon=False)
    fb = f" (falls back to a sketch method on: {', '.join(data['fallbacks'])})" \
        if data["fallbacks"] else ""
    fig.suptitle(f"submission {data['name']} ({data['estimator']}), release "
                 f"{data['release']}{fb}", fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.86, wspace=0.42, hspace=0.6,
                        top=1 - 0.6 / height, bottom=0.8 / height)
    return fig


# ----------------------------------------------------------------------------------------------
# the season panel


def _plot_season(data: dict) -> Any:
    """Each entry's panel score (interval) with its public development score beside it."""
    import matplotlib.pyplot as plt

    rows = data["rows"]
    n = max(len(rows), 1)
    height = 1.6 + 0.42 * n
    width = 8.5
    fig, ax = plt.subplots(figsize=(width, height))
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        p, pub, fam = r["panel"], r.get("public"), r.get("family")
        hollow = r["status"] != "ranked"
        if fam and finite(fam.get("lo")) and finite(fam.get("hi")):
            ax.plot([fam["lo"], fam["hi"]], [y - 0.22, y - 0.22], color=_GREY, linewidth=1.0)
        ax.errorbar([p["point"]], [y], xerr=[[p["point"] - p["lo"]], [p["hi"] - p["point"]]],
                    fmt=r.get("marker", "o"), color=r.get("colour", _GREY), capsize=3,
                    markerfacecolor="white" if hollow else r.get("colour", _GREY))
        if pub and finite(pub.get("point")):
            ax.plot([pub["point"]], [y], marker="|", markersize=12, color=_GREY)
    ax.set_yticks(ys, [r["name"] + ("" if r["status"] == "ranked" else " (provisional)")
                       for r in rows], fontsize=8)
    ax.axvline(0.0, color=_GREY, linewidth=0.6)
    ax.set_xlabel("causal score: panel (point, 95% CI over prompts, random sets and training "
                  "noise, draws fixed: ranks); grey line below: family interval (draws "
                  "resampled); grey bar: public tiny (development)", fontsize=7)
    _style(ax)
    ax.set_title(f"Season {data['season']}, {data['track']} track: panel score and public "
                 "score", fontsize=10)
    fig.subplots_adjust(left=2.4 / width, right=1 - 0.3 / width, top=1 - 0.5 / height,
                        bottom=0.75 / height)
    return fig


PLOTTERS = {"curves": _plot_curves, "precision": _plot_precision, "draw_auc": _plot_draw_auc,
            "submission": _plot_submission, "season": _plot_season}


def render_png(kind: str, data: dict) -> bytes:
    """The PNG bytes of one figure (Agg backend, fixed dpi and size, no metadata)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # text.parse_math off: names and task ids from submissions are drawn as written ("$...$" in
    # an estimator's name is not mathtext, and a malformed one cannot stop the rendering)
    with plt.style.context("default"), matplotlib.rc_context({"font.family": "DejaVu Sans",
                                                              "svg.hashsalt": "bt-bench",
                                                              "text.parse_math": False}):
        fig = PLOTTERS[kind](data)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=FIGURE_DPI, metadata={"Software": None})
        plt.close(fig)
    return buf.getvalue()

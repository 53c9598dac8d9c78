"""The metrics of one (seed, task): precision, specificity, draw AUCs, token level, paired diffs.

:func:`seed_task` computes every metric of one cell for the estimator and the controls, the paired
comparisons the checklist reads and the cell's checklist verdicts
(:func:`benchmark.checklist.seed_verdicts`). Pure functions of the scores, the labels and the
settings (an ``EvalSettings`` of :mod:`benchmark.evaluate`: ``n_boot_precision``, ``n_boot_auc``,
``level``, ``boot_seed``); the evaluator (:mod:`benchmark.evaluate`) runs the pipeline around
them. Every bootstrap is seeded from ``(boot_seed, seed, task or draw, what)``
(:func:`sub_seed`), so the same inputs give the same numbers.
"""

from __future__ import annotations

import zlib

import numpy as np

from benchmark import checklist as C
from benchmark import metrics as M
from benchmark.releases.data import TaskData

GT_KINDS = ("group", "rollout")
NO_GT = "no ground-truth rollout in the learning window of this seed"


def sub_seed(*parts: object) -> int:
    """A bootstrap seed from the parts of a place (crc32 of their ``/``-joined text)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())




def _precision_block(scores: np.ndarray, gt: np.ndarray, blocks: np.ndarray,
                     granular_ceiling: bool) -> dict:
    point = M.precision_at_k(scores, gt)
    ch = M.chance(int(gt.sum()), gt.size)
    ceil = M.precision_ceiling(blocks, gt) if granular_ceiling else 1.0
    return {"precision": point, "chance": ch, "ceiling": ceil, "lift": M.lift(point, ch),
            "fraction_of_headroom": M.fraction_of_headroom(point, ch, ceil), "k": int(gt.sum()),
            "n": int(gt.size)}


def _training_metrics(sc: dict, td: TaskData, settings
                      ) -> tuple[dict, tuple[float, np.ndarray] | None]:
    """Precision blocks, window intervals and within-step AUC of one method on one (seed, task).

    Returns the metrics and, for the checklist's paired comparisons, the window precision (group
    label, rollout granularity) with its cluster-bootstrap resamples (None without ground truth).
    Intervals are computed at rollout granularity (both labels); step-granular precision is
    reported with its chance and ceiling.
    """
    steps = td.rollout_view.steps
    out: dict = {}
    paired = None
    for gran in ("rollout", "step"):
        out[gran] = {}
        for kind in GT_KINDS:
            gt = td.gt[kind]
            block = {}
            for pop, mask in (("all", np.ones_like(gt)), ("window", td.window)):
                if not gt[mask].any():
                    continue
                block[pop] = _precision_block(sc[gran][mask], gt[mask], steps[mask],
                                              granular_ceiling=gran == "step")
            if "window" in block and gran == "rollout":
                samples = M.precision_resamples(
                    sc[gran][td.window], gt[td.window], steps[td.window],
                    n_boot=settings.n_boot_precision,
                    seed=sub_seed(settings.boot_seed, td.seed, td.task, "precision", kind))
                point = block["window"]["precision"]
                iv = M.percentile_interval(point, samples, level=settings.level)
                block["window"]["interval"] = [iv.lo, iv.hi]
                if kind == "group":
                    paired = (point, samples)
            out[gran][kind] = block
    # within-step AUC of the rollout label (bonus vs not, same step = same model state)
    auc, pairs = M.within_group_auc(sc["rollout"][td.window], td.gt["rollout"][td.window],
                                    steps[td.window])
    out["within_step_auc"] = {"auc": auc, "pairs": pairs}
    return out, paired


def _specificity(scores: np.ndarray, td: TaskData) -> dict:
    """Share of the top-|GT| rollouts that belong to another task's ground truth, beside chance.

    Tie-aware (the expected share under random tie-breaking), over all rollouts; ``k`` is this
    task's group-label count. Low is good: the method finds *this* behavior's rollouts.
    """
    k = int(td.gt["group"].sum())
    out = {}
    for other, gt in td.other_gt.items():
        if k == 0 or not gt.any():
            out[other] = {"share": None, "chance": None, "k": k}
            continue
        share = M.precision_at_k(scores, gt, k)
        ch = M.chance(int(gt.sum()), gt.size)
        out[other] = {"share": share, "chance": ch, "ratio_to_chance": share / ch, "k": k}
    return out


def _draw_metrics(sc: dict, td: TaskData, settings) -> dict:
    out = {}
    for d in td.draws:
        if d.draw_id not in sc["draws"]:
            continue
        y = td.draw_labels[d.draw_id]
        s = sc["draws"][d.draw_id]
        bs = sub_seed(settings.boot_seed, td.seed, d.draw_id)
        raw = M.auc_bootstrap(s, y, d.groups, n_boot=settings.n_boot_auc, level=settings.level,
                              seed=bs)
        res = M.auc_bootstrap(s, y, d.groups, covariate=d.fluency, n_boot=settings.n_boot_auc,
                              level=settings.level, seed=bs)
        out[d.draw_id] = {"raw": raw.to_dict(), "residualized": res.to_dict()}
    return out


def diff(a: tuple[float, np.ndarray], b: tuple[float, np.ndarray],
          settings) -> dict:
    """Paired difference ``a - b`` of two ``(point, resamples)`` on the same resamples."""
    iv = M.percentile_interval(a[0] - b[0], a[1] - b[1], level=settings.level)
    return {"point": iv.point, "lo": iv.lo, "hi": iv.hi}


def _paired_auc(a: np.ndarray, b: np.ndarray, draw, y: np.ndarray, residualized: bool,
                settings, seed: int) -> dict:
    iv = M.auc_difference_bootstrap(
        a, b, y, draw.groups, covariate=draw.fluency if residualized else None,
        n_boot=settings.n_boot_auc, level=settings.level,
        seed=sub_seed(settings.boot_seed, seed, draw.draw_id))
    return {"point": iv.point, "lo": iv.lo, "hi": iv.hi}


def _token_level(td: TaskData, settings) -> dict:
    from estimators.base import cosine

    out = {}
    view = td.rollout_view
    for d in td.draws:
        tok = td.token_sketches[d.draw_id]
        if tok.n == 0:
            out[d.draw_id] = {"n": 0}
            continue
        entry = {"n": int(tok.n)}
        dense = tok.dense()
        for kind in ("in_context", "nll"):
            cos = cosine(dense, view.target(kind, d.checkpoint_step))
            iv = M.mean_bootstrap(cos, n_boot=settings.n_boot_auc, level=settings.level,
                                  seed=sub_seed(settings.boot_seed, td.seed, d.draw_id, kind))
            entry[f"vs_{kind}"] = {"mean": iv.point, "lo": iv.lo, "hi": iv.hi}
        out[d.draw_id] = entry
    return out


def seed_task(td: TaskData, scores: dict[str, dict], est: str, methods: list,
               settings) -> tuple[dict, dict, dict]:
    """Every metric of one (seed, task), its checklist verdicts and its paired precision.

    Returns ``(block, verdicts, pooled)``: the per-seed results block, item -> {place: Verdict},
    and name -> (window precision, resamples) for the cross-seed summary (empty without GT).
    """
    seed = td.seed
    metrics_by = {m.name: _training_metrics(scores[m.name], td, settings) for m in methods}
    training = {name: t for name, (t, _) in metrics_by.items()}
    specificity = {m.name: _specificity(scores[m.name]["rollout"], td) for m in methods}
    draws = {m.name: _draw_metrics(scores[m.name], td, settings) for m in methods}
    token = _token_level(td, settings)
    es = scores[est]
    controls = [m for m in methods if m.is_control]
    has_gt = bool(td.gt["group"][td.window].any())
    comparisons: dict = {"precision": {}, "draws": {}}
    pooled = {}
    if has_gt:
        pooled = {name: paired for name, (_, paired) in metrics_by.items()}
        comparisons["precision"] = {c.name: diff(pooled[est], pooled[c.name], settings)
                                    for c in controls}
    for d in td.draws:
        if d.draw_id not in es["draws"]:
            continue
        y = td.draw_labels[d.draw_id]
        comparisons["draws"][d.draw_id] = {
            c.name: {"residualized": _paired_auc(es["draws"][d.draw_id],
                                                 scores[c.name]["draws"][d.draw_id], d, y,
                                                 True, settings, seed),
                     "raw": _paired_auc(es["draws"][d.draw_id],
                                        scores[c.name]["draws"][d.draw_id], d, y, False,
                                        settings, seed)}
            for c in controls if d.draw_id in scores[c.name]["draws"]}
    v = C.seed_verdicts(td, est, training, draws, comparisons, has_gt,
                        "draws" in next(m.tasks for m in methods if m.name == est))
    if has_gt:
        w, gt = td.window, td.gt["group"][td.window]
        for gran in ("step", "rollout"):
            v[8][str(seed)].numbers[f"{gran}_level"]["tie_break_range"] = list(
                M.precision_tie_range(es[gran][w], gt))
    block = {"training": training, "specificity": specificity, "draws": draws,
             "token_level": token, "comparisons": comparisons}
    return block, v, pooled

"""``bt-bench evaluate``: estimator -> views -> scores -> metrics, controls -> checklist -> results.

For every seed of a release the estimator and the target-free controls score

* the **rollout view** (one unit per training rollout) and the **step view** (one unit per GRPO
  step; its scores are broadcast to the step's rollouts and scored tie-aware);
* every **generation draw** (fresh responses at a checkpoint, in groups of G).

Ground truth (labels never reach an estimator): the *group label* (primary; rollouts of a GRPO
group in which the bonus created reward variance) and the *rollout label* (received the bonus).
The *learning window* is the bonus window restricted to steps with a non-zero gradient. Draws are
labelled by whether the response emitted the behavior.

All randomness (controls, bootstraps) is seeded, so the same inputs give byte-identical results.
"""

from __future__ import annotations

import platform
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmark import checklist as C
from benchmark import metrics as M
from benchmark.contract import (
    check_capabilities,
    check_estimator,
    get_params,
    load_estimator_file,
    validate_scores,
)
from benchmark.errors import BenchmarkError
from benchmark.io import atomic_write_text, dumps_json
from benchmark.isolation import Limits, inspect_isolated, score_isolated
from benchmark.view import DrawView, RunView

RESULTS_SCHEMA_VERSION = 1
DEFAULT_LIMITS = Limits()
CONTROLS_DIR = Path(__file__).resolve().parent.parent / "estimators" / "controls"
#: control name -> file (controls are estimator files run through the same path)
CONTROL_FILES = {
    "random": "random.py",
    "norm-only": "norm_only.py",
    "fluency": "fluency.py",
    "advantage-only": "advantage_only.py",
    "step-order": "step_order.py",
}
GT_KINDS = ("group", "rollout")
NO_GT = "no ground-truth rollout in the learning window of this seed"


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation knobs, recorded verbatim in ``results.json``.

    Attributes:
        n_boot_precision: cluster-bootstrap resamples for precision intervals (clusters = steps).
        n_boot_auc: resamples for AUC intervals (clusters = draw groups).
        level: interval coverage.
        boot_seed: base seed of every bootstrap (combined with seed and task names).
        seeds: seeds to score (None = every seed of the release; checklist item 5 needs all).
        causal: replay training without each method's top rollouts (checklist item 10; only on
            releases that ship reference effects, i.e. ``tiny``; about 40 s for three seeds).
    """

    n_boot_precision: int = 1000
    n_boot_auc: int = 2000
    level: float = 0.95
    boot_seed: int = 0
    seeds: tuple[int, ...] | None = None
    causal: bool = True


def _sub_seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


# ----------------------------------------------------------------------------------------------
# views


@dataclass
class SeedData:
    """Everything the evaluator holds for one seed: the views, and the labels kept apart."""

    rollout_view: RunView
    step_view: RunView
    draws: list[DrawView]
    step_of_rollout: np.ndarray  # (n_rollouts,) index into the step view
    gt: dict[str, np.ndarray]  # label kind -> (n_rollouts,) bool
    window: np.ndarray  # (n_rollouts,) bool learning window
    draw_labels: dict[str, np.ndarray]  # draw id -> (m,) bool has-behavior
    token_sketches: dict[str, np.ndarray]  # draw id -> (k, d) float32


def load_seed(release: object, seed: int, track: str = "gradient") -> SeedData:
    """Build the label-free views of one seed and the evaluator's labels."""
    sv = release.seed(seed)
    cfg = sv.config
    df = sv.rollouts.to_pandas()
    sketches = sv.rollout_sketches()
    steps = df["step"].to_numpy(np.int64)
    groups = df["group"].to_numpy(np.int64)
    adv = df["advantage"].to_numpy(np.float64)
    flu = df["fluency"].to_numpy(np.float64)
    ckpts = tuple(sorted(int(s) for s in sv.checkpoints))
    open_track = track == "open"
    common = {
        "seed": int(seed), "targets": sv.targets, "checkpoint_steps": ckpts,
        "lr": float(cfg["lr"]), "n_steps": int(cfg["steps"]),
        "checkpoint_dir": dict(sv.checkpoints), "tokenizer_dir": sv.tokenizer_path,
        "track": track,
    }
    rollout_view = RunView(
        granularity="rollout", sketches=sketches, steps=steps, groups=groups, advantages=adv,
        fluency=flu, rewards=df["reward"].to_numpy(np.float64) if open_track else None,
        prompts=tuple(df["prompt_text"]) if open_track else None,
        responses=tuple(df["response_text"]) if open_track else None, **common,
    )
    uniq_steps, step_idx = np.unique(steps, return_inverse=True)
    n_steps = uniq_steps.size
    step_sk = np.zeros((n_steps, sketches.shape[1]), np.float64)
    np.add.at(step_sk, step_idx, sketches)
    count = np.bincount(step_idx, minlength=n_steps).astype(float)
    step_view = RunView(
        granularity="step", sketches=step_sk.astype(np.float32), steps=uniq_steps,
        groups=uniq_steps.copy(),
        advantages=np.bincount(step_idx, weights=np.abs(adv), minlength=n_steps) / count,
        fluency=np.bincount(step_idx, weights=flu, minlength=n_steps) / count,
        rewards=(np.bincount(step_idx, weights=df["reward"].to_numpy(float), minlength=n_steps)
                 / count) if open_track else None,
        **common,
    )
    labels = release.labels(seed).set_index("rollout_id").loc[df["rollout_id"]]
    gt = {"group": labels["group_label"].to_numpy(bool), "rollout": labels["bonus"].to_numpy(bool)}
    nonzero_step = np.bincount(step_idx, weights=(df["sketch_row"].to_numpy() >= 0),
                               minlength=n_steps) > 0
    window = (steps < int(cfg["bonus_window_end"])) & nonzero_step[step_idx]
    draws, draw_labels, token_sk = [], {}, {}
    for d in sv.draws:
        table = d["table"]
        did = f"step{d['step']:04d}_draw{d['draw']}"
        rows = table["sketch_row"].to_numpy(np.int64)
        draws.append(DrawView(
            draw_id=did, checkpoint_step=int(d["step"]),
            sketches=np.asarray(d["sketches"], np.float32)[rows],
            groups=table["group"].to_numpy(np.int64), fluency=table["fluency"].to_numpy(float),
            responses=tuple(table["response_text"]) if open_track else None,
        ))
        draw_labels[did] = table["has_behavior"].to_numpy(bool)
        token_sk[did] = np.asarray(d["token_sketches"], np.float32)
    return SeedData(rollout_view, step_view, draws, step_idx, gt, window, draw_labels, token_sk)


# ----------------------------------------------------------------------------------------------
# scoring


@dataclass
class Method:
    """An estimator or control being scored: its name, instance and capabilities."""

    name: str
    instance: object
    tasks: tuple[str, ...]
    is_control: bool


def load_controls() -> list[Method]:
    """The target-free controls, loaded from their estimator files."""
    out = []
    for name, fname in CONTROL_FILES.items():
        loaded = load_estimator_file(CONTROLS_DIR / fname)
        out.append(Method(name, loaded.instantiate(), tuple(loaded.cls.tasks), True))
    return out


def _check_name(name: str, sha256: str, path: Path) -> None:
    """Raise unless the estimator's name is its own or it is the very file of that control."""
    from benchmark.contract import EstimatorContractError, file_sha256

    if name not in CONTROL_FILES:
        return
    control_file = CONTROLS_DIR / CONTROL_FILES[name]
    if file_sha256(control_file) != sha256:
        raise EstimatorContractError(
            f"{path}: estimator name {name!r} is the name of a built-in control "
            f"({control_file}); results would mix the two. Choose another name."
        )


def _raw_scores(instance: object, tasks: tuple[str, ...], data: SeedData) -> dict:
    """Scores of one in-process method: rollout ``(n,)``, step ``(n_steps,)``, draws."""
    who = type(instance).__name__
    rv, sv = data.rollout_view, data.step_view
    out = {"rollout": validate_scores(instance.score_rollouts(rv), rv.n, who, "score_rollouts"),
           "step": validate_scores(instance.score_rollouts(sv), sv.n, who, "score_rollouts"),
           "draws": {}}
    if "draws" in tasks:
        for d in data.draws:
            out["draws"][d.draw_id] = validate_scores(instance.score_draw(rv, d), d.n, who,
                                                      "score_draw")
    return out


def _expand(raw: dict, data: SeedData) -> dict:
    """Broadcast step scores to the step's rollouts (step-granular scores are tied blocks)."""
    return {"rollout": raw["rollout"], "step": raw["step"][data.step_of_rollout],
            "draws": raw["draws"]}


def _label_files(rel: object, seeds: list[int]) -> list[Path]:
    """Files of a release the estimator must not read: everything but checkpoints and tokenizer."""
    out = []
    for s in seeds:
        d = Path(rel.path) / f"seed{s}"
        out += [p for p in d.iterdir() if p.name not in ("checkpoints", "tokenizer")]
    return out


def _precision_block(scores: np.ndarray, gt: np.ndarray, blocks: np.ndarray, granular_ceiling:
                     bool) -> dict:
    point = M.precision_at_k(scores, gt)
    ch = M.chance(int(gt.sum()), gt.size)
    ceil = M.precision_ceiling(blocks, gt) if granular_ceiling else 1.0
    return {"precision": point, "chance": ch, "ceiling": ceil, "lift": M.lift(point, ch),
            "fraction_of_headroom": M.fraction_of_headroom(point, ch, ceil), "k": int(gt.sum()),
            "n": int(gt.size)}


def _training_metrics(sc: dict, data: SeedData, settings: EvalSettings,
                      seed: int) -> tuple[dict, tuple[float, np.ndarray] | None]:
    """Precision blocks, window intervals and within-step AUC of one method on one seed.

    Returns the metrics and, for the checklist's paired comparisons, the window precision (group
    label, rollout granularity) with its cluster-bootstrap resamples (None without ground truth).
    """
    steps = data.rollout_view.steps
    out: dict = {}
    paired = None
    for gran in ("rollout", "step"):
        out[gran] = {}
        for kind in GT_KINDS:
            gt = data.gt[kind]
            block = {}
            for pop, mask in (("all", np.ones_like(gt)), ("window", data.window)):
                if not gt[mask].any():
                    continue
                block[pop] = _precision_block(sc[gran][mask], gt[mask], steps[mask],
                                              granular_ceiling=gran == "step")
            if "window" in block:
                samples = M.precision_resamples(
                    sc[gran][data.window], gt[data.window], steps[data.window],
                    n_boot=settings.n_boot_precision,
                    seed=_sub_seed(settings.boot_seed, seed, "precision", kind))
                point = block["window"]["precision"]
                iv = M.percentile_interval(point, samples, level=settings.level)
                block["window"]["interval"] = [iv.lo, iv.hi]
                if (gran, kind) == ("rollout", "group"):
                    paired = (point, samples)
            out[gran][kind] = block
    # within-step AUC of the rollout label (bonus vs not, same step = same model state)
    auc, pairs = M.within_group_auc(sc["rollout"][data.window], data.gt["rollout"][data.window],
                                    steps[data.window])
    out["within_step_auc"] = {"auc": auc, "pairs": pairs}
    return out, paired


def _draw_metrics(sc: dict, data: SeedData, settings: EvalSettings, seed: int) -> dict:
    out = {}
    for d in data.draws:
        if d.draw_id not in sc["draws"]:
            continue
        y = data.draw_labels[d.draw_id]
        s = sc["draws"][d.draw_id]
        bs = _sub_seed(settings.boot_seed, seed, d.draw_id)
        raw = M.auc_bootstrap(s, y, d.groups, n_boot=settings.n_boot_auc, level=settings.level,
                              seed=bs)
        res = M.auc_bootstrap(s, y, d.groups, covariate=d.fluency, n_boot=settings.n_boot_auc,
                              level=settings.level, seed=bs)
        out[d.draw_id] = {"raw": raw.to_dict(), "residualized": res.to_dict()}
    return out


def _diff(a: tuple[float, np.ndarray], b: tuple[float, np.ndarray],
          settings: EvalSettings) -> dict:
    iv = M.percentile_interval(a[0] - b[0], a[1] - b[1], level=settings.level)
    return {"point": iv.point, "lo": iv.lo, "hi": iv.hi}


def _paired_auc(a: np.ndarray, b: np.ndarray, draw: DrawView, y: np.ndarray, residualized: bool,
                settings: EvalSettings, seed: int) -> dict:
    iv = M.auc_difference_bootstrap(
        a, b, y, draw.groups, covariate=draw.fluency if residualized else None,
        n_boot=settings.n_boot_auc, level=settings.level,
        seed=_sub_seed(settings.boot_seed, seed, draw.draw_id))
    return {"point": iv.point, "lo": iv.lo, "hi": iv.hi}


def _token_level(data: SeedData, settings: EvalSettings, seed: int) -> dict:
    from estimators.base import cosine

    out = {}
    view = data.rollout_view
    for d in data.draws:
        tok = data.token_sketches[d.draw_id]
        if tok.shape[0] == 0:
            out[d.draw_id] = {"n": 0}
            continue
        entry = {"n": int(tok.shape[0])}
        for kind in ("in_context", "nll"):
            cos = cosine(tok, view.target(kind, d.checkpoint_step))
            iv = M.mean_bootstrap(cos, n_boot=settings.n_boot_auc, level=settings.level,
                                  seed=_sub_seed(settings.boot_seed, seed, d.draw_id, kind))
            entry[f"vs_{kind}"] = {"mean": iv.point, "lo": iv.lo, "hi": iv.hi}
        out[d.draw_id] = entry
    return out


# ----------------------------------------------------------------------------------------------
# the evaluation


def _release_info(release: object) -> dict:
    return {
        "id": release.release_id,
        "version": release.manifest.get("release_version"),
        "schema_version": release.manifest.get("schema_version"),
        "manifest_sha256": release.manifest_sha256,
        "hub_revision": getattr(release, "hub_revision", None),
    }


def _package_versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("bt-bench", "numpy", "torch", "transformers", "datasets", "scikit-learn"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def evaluate(
    estimator_file: str | Path,
    release: str | Path = "tiny",
    settings: EvalSettings | None = None,
    progress: bool = True,
    isolation: Limits | None = DEFAULT_LIMITS,
) -> dict:
    """Score one estimator file on a release; return the results as a plain dict.

    Args:
        estimator_file: path of a ``.py`` file with one estimator class.
        release: a release id (``"tiny"``) or a release folder.
        settings: evaluation knobs (defaults pinned in :class:`EvalSettings`).
        progress: show tqdm progress.
        isolation: limits of the sandboxed child process that loads, checks and runs the
            estimator (:mod:`benchmark.isolation`); ``None`` runs it in this process (trusted
            code only, e.g. while debugging an estimator).

    Returns:
        The results dict (see ``docs/results_schema.md``); write it with :func:`write_results`.

    Raises:
        EstimatorContractError: the file breaks the contract (raised before any scoring).
        ReleaseError: the release is missing or fails its checksums.
    """
    from tqdm import tqdm

    from benchmark.release import load_release

    settings = settings or EvalSettings()
    estimator_file = Path(estimator_file)
    rel = load_release(release)
    seeds = list(settings.seeds) if settings.seeds is not None else list(rel.seeds)
    missing = [s for s in seeds if s not in rel.seeds]
    if missing:
        raise BenchmarkError(f"seeds {missing} are not in release {rel.release_id} "
                             f"(available: {rel.seeds}); drop them from --seeds.")

    bar = tqdm(total=len(seeds) + 2, desc="evaluate", disable=not progress, leave=False)
    if isolation is not None:
        meta = inspect_isolated(estimator_file, isolation)
    else:
        loaded = load_estimator_file(estimator_file)
        check_capabilities(loaded.cls, loaded.path)
        meta = {"name": loaded.name, "class": loaded.cls.__name__, "track": loaded.cls.track,
                "tasks": list(loaded.cls.tasks), "config": get_params(loaded.instantiate()),
                "sha256": loaded.sha256}
    est_name, track = meta["name"], meta["track"]
    _check_name(est_name, meta["sha256"], estimator_file)
    datas = {seed: load_seed(rel, seed, track) for seed in seeds}
    bar.update(1)
    if isolation is not None:
        views = {s: (d.rollout_view, d.step_view, d.draws) for s, d in datas.items()}
        est_raw, info = score_isolated(estimator_file, views, _label_files(rel, seeds), isolation)
    else:
        first = datas[seeds[0]]
        report = check_estimator(loaded, [first.rollout_view, first.step_view], first.draws)
        inst = loaded.instantiate()
        est_raw = {s: _raw_scores(inst, tuple(meta["tasks"]), d) for s, d in datas.items()}
        info = {"contract_checks": [c for c, _, _ in report.checks],
                "protections": {"isolation": "none (in-process)"}}
    bar.update(1)
    # a control evaluated as the estimator keeps its control entry too: the same code gives the
    # same scores, so it is compared with itself (a difference of exactly 0, never a pass)
    methods = [Method(est_name, None, tuple(meta["tasks"]), False), *load_controls()]

    per_seed: dict[str, dict] = {}
    causal_in: dict[int, dict[str, np.ndarray]] = {}
    pooled: dict[int, dict[str, tuple[float, np.ndarray]]] = {}
    verdicts: dict[int, dict[str, C.Verdict]] = {i: {} for i in C.ITEMS}
    widths: dict[str, float] = {}
    for seed in seeds:
        data = datas[seed]
        scores = {m.name: _expand(_raw_scores(m.instance, m.tasks, data), data)
                  for m in methods if m.is_control}
        if est_name not in scores:
            scores[est_name] = _expand(est_raw[seed], data)
        metrics_by = {m.name: _training_metrics(scores[m.name], data, settings, seed)
                      for m in methods}
        training = {name: t for name, (t, _) in metrics_by.items()}
        draws = {m.name: _draw_metrics(scores[m.name], data, settings, seed) for m in methods}
        token = _token_level(data, settings, seed)
        es = scores[est_name]
        causal_in[seed] = {n: scores[n]["rollout"] for n in (est_name, "norm-only", "step-order")}
        # item 1: magnitude (training, window, group label; draws: residualized vs norm-only)
        has_gt = bool(data.gt["group"][data.window].any())
        comparisons: dict = {"precision": {}, "draws": {}}
        if has_gt:
            res_by = {name: paired for name, (_, paired) in metrics_by.items()}
            pooled[seed] = res_by
            comparisons["precision"] = {c.name: _diff(res_by[est_name], res_by[c.name], settings)
                                        for c in methods if c.is_control}
        for d in data.draws:
            if d.draw_id not in es["draws"]:
                continue
            comparisons["draws"][d.draw_id] = {
                c.name: _paired_auc(es["draws"][d.draw_id], scores[c.name]["draws"][d.draw_id], d,
                                    data.draw_labels[d.draw_id], True, settings, seed)
                for c in methods if c.is_control and d.draw_id in scores[c.name]["draws"]}
        diffs = {c: comparisons["precision"][c] for c in ("norm-only", "advantage-only")
                 if c in comparisons["precision"]}
        for did, comp in comparisons["draws"].items():
            diffs[f"norm-only/{did}/residualized_auc"] = comp["norm-only"]
        verdicts[1][str(seed)] = C.magnitude(diffs) if has_gt else C.Verdict(
            C.INCONCLUSIVE, {}, NO_GT)
        # item 2: fluency, per draw
        for d in data.draws:
            key = f"{seed}/{d.draw_id}"
            if d.draw_id not in es["draws"]:
                verdicts[2][key] = C.fluency(None, None)
                continue
            raw_diff = _paired_auc(es["draws"][d.draw_id], scores["fluency"]["draws"][d.draw_id],
                                   d, data.draw_labels[d.draw_id], False, settings, seed)
            res = draws[est_name][d.draw_id]["residualized"]
            verdicts[2][key] = C.fluency(raw_diff, res)
            widths[f"{key}/residualized_auc"] = res["hi"] - res["lo"]
        # item 9: token level (diagnostic, a property of the release)
        for did, entry in token.items():
            ok = entry.get("vs_in_context", {}).get("lo", -1.0) > 0
            verdicts[9][f"{seed}/{did}"] = C.Verdict(
                C.REPORTED, entry, "aligned" if ok else "not clearly aligned")
        per_seed[str(seed)] = {"training": training, "draws": draws, "token_level": token,
                               "comparisons": comparisons}
        bar.update(1)
        if not has_gt:
            for i in (3, 4, 8):
                verdicts[i][str(seed)] = C.Verdict(C.INCONCLUSIVE, {}, NO_GT)
            continue
        # item 3: headroom (rollout granularity, group label, learning window)
        win = training[est_name]["rollout"]["group"]["window"]
        v3 = C.headroom({"point": win["precision"], "lo": win["interval"][0],
                         "hi": win["interval"][1], "chance": win["chance"],
                         "ceiling": win["ceiling"], "lift": win["lift"],
                         "fraction_of_headroom": win["fraction_of_headroom"]})
        step_win = training[est_name]["step"]["group"]["window"]
        v3.numbers["step_level"] = {k: step_win[k] for k in
                                    ("precision", "chance", "ceiling", "lift",
                                     "fraction_of_headroom")}
        v3.numbers["all_steps"] = {k: training[est_name]["rollout"]["group"]["all"][k]
                                   for k in ("precision", "chance", "lift")}
        verdicts[3][str(seed)] = v3
        # item 4: timing
        diff_t = comparisons["precision"]["step-order"]
        verdicts[4][str(seed)] = C.timing(diff_t)
        widths[f"{seed}/precision"] = win["interval"][1] - win["interval"][0]
        # item 8: ties
        w = data.window
        lo_p, hi_p = M.precision_tie_range(es["step"][w], data.gt["group"][w])
        lo_r, hi_r = M.precision_tie_range(es["rollout"][w], data.gt["group"][w])
        verdicts[8][str(seed)] = C.Verdict(C.REPORTED, {
            "step_level": {"tie_aware": step_win["precision"], "tie_break_range": [lo_p, hi_p]},
            "rollout_level": {"tie_aware": win["precision"], "tie_break_range": [lo_r, hi_r]},
        })
    causal = _causal(rel, seeds, causal_in, est_name, settings)
    bar.close()

    # aggregate items
    n_release_seeds = len(rel.seeds)
    items: dict[int, dict] = {}
    agg: dict[int, str] = {}
    for i in (1, 2, 3, 4):
        agg[i] = C.combine(v.verdict for v in verdicts[i].values())
    v5 = C.combine([agg[1], agg[2], agg[3], agg[4]])
    if len(seeds) < max(3, n_release_seeds):
        v5 = C.INCONCLUSIVE if v5 != C.FAIL else C.FAIL
    agg[5] = v5
    draws_per_seed = {str(s): sum(1 for k in verdicts[2] if k.startswith(f"{s}/")) for s in seeds}
    enough_draws = all(n >= 2 for n in draws_per_seed.values())
    agg[6] = agg[2] if enough_draws or agg[2] == C.FAIL else C.INCONCLUSIVE
    v7 = C.precision_of_estimate(widths)
    agg[7] = v7.verdict
    agg[8] = C.REPORTED
    agg[9] = C.REPORTED
    agg[10] = causal["verdict"]
    for i, (key, title) in C.ITEMS.items():
        entry = {"item": i, "key": key, "title": title, "verdict": agg[i],
                 "gated": i in C.GATED}
        if i in (1, 2, 3, 4, 8, 9):
            entry["per"] = {k: v.to_dict() for k, v in verdicts[i].items()}
        elif i == 5:
            entry["numbers"] = {"seeds_scored": seeds, "release_seeds": rel.seeds,
                                "items_1_to_4": {str(j): agg[j] for j in (1, 2, 3, 4)}}
        elif i == 6:
            entry["numbers"] = {"draws_per_seed": draws_per_seed, "item_2": agg[2]}
        elif i == 7:
            entry["numbers"] = v7.numbers
        elif i == 10:
            entry["reason"] = causal.get("reason", "")
            entry["per"] = {str(s): {"verdict": v["verdict"], "numbers": {
                k: v[k] for k in ("k", "bonus_off_effect", "random_floor", "methods")
                if k in v}} for s, v in causal.get("per_seed", {}).items()}
        items[i] = entry

    summary = _summary(pooled, est_name, [m.name for m in methods if m.is_control], per_seed,
                       settings)
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "bt_bench_version": _bt_version(),
        "release": _release_info(rel),
        "estimator": {
            "name": est_name, "class": meta["class"], "file": estimator_file.name,
            "sha256": meta["sha256"], "track": track, "tasks": list(meta["tasks"]),
            "config": meta["config"], "contract_checks": info["contract_checks"],
        },
        "isolation": {"protections": info["protections"],
                      "limits": asdict(isolation) if isolation is not None else None},
        "controls": list(CONTROL_FILES),
        "settings": _settings_dict(settings, seeds),
        "packages": _package_versions(),
        "seeds": per_seed,
        "summary": summary,
        "causal": causal,
        "checklist": [items[i] for i in sorted(items)],
        "verdict": C.overall(agg),
    }


def _summary(pooled: dict, est_name: str, controls: list[str], per_seed: dict,
             settings: EvalSettings) -> dict:
    """Cross-seed numbers for tables.

    The mean window precision of every method with an interval (seeds resampled independently,
    then averaged), the margin over the strongest control, and the mean residualized draw AUC.
    """
    out: dict = {"seeds": sorted(pooled)}
    if pooled:
        names = list(next(iter(pooled.values())))
        mean = {n: (float(np.mean([pooled[s][n][0] for s in pooled])),
                    np.mean([pooled[s][n][1] for s in pooled], axis=0)) for n in names}
        out["precision_window_group"] = {
            n: M.percentile_interval(p, smp, level=settings.level).to_dict()
            for n, (p, smp) in mean.items()}
        strongest = max(controls, key=lambda c: (mean[c][0], c))
        out["strongest_control"] = strongest
        out["margin_over_strongest_control"] = _diff(mean[est_name], mean[strongest], settings)
    aucs: dict[str, list[float]] = {}
    for data in per_seed.values():
        for name, draws in data["draws"].items():
            for m in draws.values():
                if m["residualized"]["point"] == m["residualized"]["point"]:
                    aucs.setdefault(name, []).append(m["residualized"]["point"])
    out["draw_auc_residualized_mean"] = {n: float(np.mean(v)) for n, v in aucs.items()}
    return out


def _causal(rel: object, seeds: list[int], scores: dict, est_name: str,
            settings: EvalSettings) -> dict:
    """Checklist item 10 by replay (:mod:`benchmark.causal`), or why it did not run."""
    if not settings.causal:
        return {"verdict": C.NOT_RUN, "reason": "skipped (--no-causal)", "per_seed": {}}
    from benchmark.causal import causal_scores

    out = causal_scores(rel, seeds, scores, estimator=est_name)
    out.pop("seconds", None)  # wall time varies; results must be byte-identical
    for v in out.get("per_seed", {}).values():
        v.pop("seconds", None)
    return out


def _bt_version() -> str:
    from benchmark import __version__

    return __version__


def _settings_dict(settings: EvalSettings, seeds: list[int]) -> dict:
    d = asdict(settings)
    d["seeds"] = seeds
    d["max_interval_width"] = C.MAX_WIDTH
    d["primary_ground_truth"] = "group"
    d["checklist_population"] = "learning window (bonus window, non-zero-gradient steps)"
    return d


def write_results(results: dict, path: str | Path) -> None:
    """Write results as stable JSON (sorted keys, floats rounded to 10 digits) atomically."""
    atomic_write_text(path, dumps_json(_round(results)))


def _round(obj: object) -> object:
    if isinstance(obj, float):
        return round(obj, 10)
    if isinstance(obj, np.floating):
        return round(float(obj), 10)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): _round(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------
# console summary


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def format_summary(results: dict) -> str:
    """Human-readable tables: per-seed metrics of the estimator and controls, then the checklist."""
    from tabulate import tabulate

    est = results["estimator"]["name"]
    lines = [f"bt-bench evaluate: {est} on release {results['release']['id']} "
             f"(v{results['release']['version']})", ""]
    for seed, data in results["seeds"].items():
        rows = []
        draw_ids = sorted({d for m in data["draws"].values() for d in m})
        none = {"precision": None, "lift": None, "interval": [None, None], "k": 0, "n": 0,
                "chance": None, "ceiling": None}
        for name, tr in data["training"].items():
            rw = tr["rollout"]["group"].get("window", none)
            sw = tr["step"]["group"].get("window", none)
            row = [name + (" *" if name == est else ""),
                   f"{_f(sw['precision'])} ({_f(sw['lift'], 2)}x)",
                   f"{_f(rw['precision'])} [{_f(rw['interval'][0])}, {_f(rw['interval'][1])}]",
                   _f(tr["rollout"]["rollout"].get("window", none)["precision"]),
                   _f(tr["within_step_auc"]["auc"])]
            for d in draw_ids:
                m = data["draws"][name].get(d)
                row.append("-" if m is None else
                           f"{_f(m['raw']['point'])} / {_f(m['residualized']['point'])}")
            rows.append(row)
        first = next(iter(data["training"].values()))["rollout"]["group"].get("window", none)
        step_first = next(iter(data["training"].values()))["step"]["group"].get("window", none)
        headers = ["method", "step P (lift)", "rollout P [95% CI]", "P rollout-label",
                   "within-step AUC"] + [f"{d} AUC raw/resid" for d in draw_ids]
        lines.append(f"seed {seed}: learning window, group label: k={first['k']} of "
                     f"n={first['n']} rollouts; chance {_f(first['chance'])}, step ceiling "
                     f"{_f(step_first['ceiling'])}, rollout ceiling 1.000")
        lines.append(tabulate(rows, headers=headers, disable_numparse=True))
        lines.append("")
    rows = []
    for item in results["checklist"]:
        per = item.get("per", {})
        detail = ", ".join(f"{k}: {v['verdict']}" for k, v in per.items()) if per else ""
        rows.append([item["item"], item["key"], item["verdict"].upper() if item["gated"]
                     else item["verdict"], detail[:90]])
    lines.append(tabulate(rows, headers=["#", "checklist item", "verdict", "per seed / draw"],
                          disable_numparse=True))
    lines.append("")
    lines.append(f"overall verdict for {est}: {results['verdict'].upper()} "
                 "(needs every gated item on every seed and draw)")
    return "\n".join(lines)


def _limits(no_isolation: bool, time_limit: float | None, memory_gib: float | None
            ) -> Limits | None:
    if no_isolation:
        return None
    d = Limits()
    return Limits(wall_seconds=time_limit or d.wall_seconds,
                  memory_bytes=int(memory_gib * 2**30) if memory_gib else d.memory_bytes)


def evaluate_command(estimator_file: str, release: str, out: str | None, seeds: list[int] | None,
                     progress: bool = True, no_isolation: bool = False,
                     time_limit: float | None = None, memory_gib: float | None = None,
                     causal: bool = True) -> int:
    """``bt-bench evaluate``: evaluate, print the summary, write results; exit 0."""
    settings = EvalSettings(seeds=tuple(seeds) if seeds else None, causal=causal)
    results = evaluate(estimator_file, release, settings, progress=progress,
                       isolation=_limits(no_isolation, time_limit, memory_gib))
    print(format_summary(results))
    if out:
        write_results(results, out)
        print(f"wrote {out}")
    return 0


def check_estimator_command(estimator_file: str, release: str, no_isolation: bool = False,
                            time_limit: float | None = None,
                            memory_gib: float | None = None) -> int:
    """``bt-bench check-estimator``: the contract checks on the first seed of a release."""
    from benchmark.release import load_release

    limits = _limits(no_isolation, time_limit, memory_gib)
    rel = load_release(release)
    seed = rel.seeds[0]
    path = Path(estimator_file)
    if limits is None:
        loaded = load_estimator_file(path)
        data = load_seed(rel, seed, getattr(loaded.cls, "track", "gradient"))
        checks = [c for c, _, _ in check_estimator(
            loaded, [data.rollout_view, data.step_view], data.draws).checks]
        cls_name = loaded.cls.__name__
    else:
        meta = inspect_isolated(path, limits)
        data = load_seed(rel, seed, meta["track"])
        _, info = score_isolated(path, {seed: (data.rollout_view, data.step_view, data.draws)},
                                 _label_files(rel, [seed]), limits)
        checks, cls_name = info["contract_checks"], meta["class"]
    for name in checks:
        print(f"ok  {name}")
    print(f"{cls_name} ({path}) follows the estimator contract.")
    return 0

"""``bt-bench evaluate``: estimator -> views -> scores -> metrics, causal score -> checklist.

A release plants several behaviors per run; each is a *task*. For every task and seed the
estimator and the target-free controls score

* the **rollout view** (one unit per training rollout) and the **step view** (one unit per GRPO
  step; its scores are broadcast to the step's rollouts and scored tie-aware);
* every **generation draw** of the task (fresh responses at a checkpoint, in groups of G).

The headline is the **causal score** (:mod:`benchmark.causal.score`): removing the method's top
rollouts
and replaying training, the fraction of the bonus-off effect removed, averaged over a grid of
removal sizes. Beside it: precision against the labels (the *group label*, primary: rollouts of a
GRPO group in which the task's bonus created reward variance; the *rollout label*: received the
bonus), specificity (how much of the top of the ranking belongs to the *other* behaviors), draw
AUCs, and the checklist (:mod:`benchmark.checklist`). Labels never reach an estimator.

All randomness (controls, bootstraps) is seeded, so the same inputs give byte-identical results.
"""

from __future__ import annotations

import contextlib
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmark import checklist as C
from benchmark import metrics as M
from benchmark.causal.score import TIE_COMPLETIONS
from benchmark.cell_metrics import GT_KINDS, NO_GT, diff, seed_task  # noqa: F401
from benchmark.contract import (
    check_capabilities,
    check_estimator,
    get_params,
    load_estimator_file,
    validate_scores,
)
from benchmark.controls import control_files
from benchmark.errors import BenchmarkError
from benchmark.io import atomic_write_text, dumps_json
from benchmark.releases.data import TaskData, load_seed
from benchmark.sandbox.isolation import Limits, inspect_isolated, score_isolated

#: 3: causal scores as the log-k area, fair ties, per-prompt curves stored for the leaderboard;
#: since issue 34 (same schema, new keys only): the random reference (mean of the sets),
#: ``measurable`` per causal block, per-item ``counts``, ``checklist_counts``
RESULTS_SCHEMA_VERSION = 3
DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation knobs, recorded verbatim in ``results.json``.

    Attributes:
        n_boot_precision: cluster-bootstrap resamples for precision intervals (clusters = steps).
        n_boot_auc: resamples for AUC intervals (clusters = draw groups).
        n_boot_causal: resamples for causal-score intervals (prompts, plus training noise).
        level: interval coverage.
        boot_seed: base seed of every bootstrap (combined with seed, task and metric names).
        seeds: seeds to score (None = every seed of the release; checklist item 5 needs all).
        tasks: tasks to score (None = every task of the release).
        causal: replay training without each method's top rollouts (the causal score; only on
            releases that ship a causal reference, i.e. ``tiny``).
        tie_completions: random tie completions per removal size where a method's top-k
            boundary cuts a tie (``benchmark.causal.score.removal_sets``; docs/causal.md).
        fixed_data: also replay the oracle's and the estimator's removal sets with the later
            rollouts held at their recorded tokens and report the on-policy share per task
            (``benchmark.causal.onpolicy``; opt-in: it replays every set once more). Recorded
            in the results only when on.
    """

    n_boot_precision: int = 1000
    n_boot_auc: int = 2000
    n_boot_causal: int = 2000
    level: float = 0.95
    boot_seed: int = 0
    seeds: tuple[int, ...] | None = None
    tasks: tuple[str, ...] | None = None
    causal: bool = True
    tie_completions: int = TIE_COMPLETIONS
    fixed_data: bool = False


# ----------------------------------------------------------------------------------------------
# methods and scores


@dataclass
class Method:
    """An estimator or control being scored: its name, instance and capabilities."""

    name: str
    instance: object
    tasks: tuple[str, ...]
    is_control: bool


def load_controls(track: str = "gradient") -> list[Method]:
    """The target-free controls, loaded from their estimator files."""
    out = []
    for name, path in control_files(track).items():
        loaded = load_estimator_file(path)
        out.append(Method(name, loaded.instantiate(), tuple(loaded.cls.tasks), True))
    return out


def _check_name(name: str, sha256: str, path: Path) -> None:
    """Raise unless the estimator's name is its own or it is the very file of that control."""
    from benchmark.contract import EstimatorContractError, file_sha256

    files = control_files("open")
    if name not in files:
        return
    if file_sha256(files[name]) != sha256:
        raise EstimatorContractError(
            f"{path}: estimator name {name!r} is the name of a built-in control "
            f"({files[name]}); results would mix the two. Choose another name."
        )


def _raw_scores(instance: object, tasks: tuple[str, ...], td: TaskData) -> dict:
    """Scores of one in-process method: rollout ``(n,)``, step ``(n_steps,)``, draws."""
    who = type(instance).__name__
    from benchmark.contract import _call

    rv, sv = td.rollout_view, td.step_view
    out = {"rollout": validate_scores(_call(instance, "score_rollouts", rv), rv.n, who,
                                      "score_rollouts"),
           "step": validate_scores(_call(instance, "score_rollouts", sv), sv.n, who,
                                   "score_rollouts"),
           "draws": {}}
    if "draws" in tasks:
        for d in td.draws:
            out["draws"][d.draw_id] = validate_scores(_call(instance, "score_draw", rv, d), d.n,
                                                      who, "score_draw")
    return out


def _expand(raw: dict, td: TaskData) -> dict:
    """Broadcast step scores to the step's rollouts (step-granular scores are tied blocks)."""
    return {"rollout": raw["rollout"], "step": raw["step"][td.step_of_rollout],
            "draws": raw["draws"]}


def _label_files(rel: object, seeds: list[int]) -> list[Path]:
    """Files of a release the estimator must not read.

    Everything but the checkpoints, the tokenizer and the sketch files it reads in place.
    """
    keep = ("checkpoints", "tokenizer", "sketches.npy")
    out = []
    for s in seeds:
        d = Path(rel.path) / f"seed{s}"
        for p in d.iterdir():
            if p.name in keep:
                continue
            if p.name == "draws":  # draw tables hold the labels; token sketches exist only
                # where the behavior occurred; the response sketches are read in place
                out += [f for f in p.rglob("*") if f.is_file() and (
                    not f.name.endswith("_sketches.npy")
                    or f.name.endswith("_token_sketches.npy"))]
            else:
                out.append(p)
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
        "tasks": list(release.tasks),
    }


def _package_versions(extra: dict | None = None) -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("bt-bench", "numpy", "torch", "transformers", "datasets", "scikit-learn"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out | (extra or {})


def _inspect(estimator_file: Path, isolation: Limits | None, env) -> tuple[dict, object]:
    if isolation is not None:
        kw = env.sandbox_kwargs() if env is not None else {}
        meta = inspect_isolated(estimator_file, isolation, **kw)
        return meta | {"fallbacks": list(meta.get("fallbacks", []))}, None
    from benchmark.sandbox.requirements import refuse_in_process

    refuse_in_process(env)
    loaded = load_estimator_file(estimator_file)
    check_capabilities(loaded.cls, loaded.path)
    meta = {"name": loaded.name, "class": loaded.cls.__name__, "track": loaded.cls.track,
            "tasks": list(loaded.cls.tasks),
            "fallbacks": list(getattr(loaded.cls, "fallbacks", ())),
            "config": get_params(loaded.instantiate()), "sha256": loaded.sha256}
    return meta, loaded


def _score_estimator(estimator_file: Path, rel, seeds: list[int], datas: dict, meta: dict,
                     loaded, isolation: Limits | None, env) -> tuple[dict, dict]:
    """The estimator's raw scores ``{(seed, task): {...}}`` and the info on how they were made."""
    views = {(s, t): (td.rollout_view, td.step_view, td.draws)
             for s in seeds for t, td in datas[s].items()}
    if isolation is not None:
        kw = env.sandbox_kwargs() if env is not None else {}
        raw, info = score_isolated(estimator_file, views, _label_files(rel, seeds), isolation,
                                   meta=meta, **kw)
        return raw, info
    first = next(iter(views.values()))
    report = check_estimator(loaded, [first[0], first[1]], first[2])
    inst = loaded.instantiate()
    t0 = time.perf_counter()
    raw = {key: _raw_scores(inst, tuple(meta["tasks"]), datas[key[0]][key[1]]) for key in views}
    return raw, {"contract_checks": [c for c, _, _ in report.checks],
                 "protections": {"isolation": "none (in-process)"},
                 "seconds": {"score": time.perf_counter() - t0}}


def evaluate(
    estimator_file: str | Path,
    release: str | Path = "tiny",
    settings: EvalSettings | None = None,
    progress: bool = True,
    isolation: Limits | None = DEFAULT_LIMITS,
    env=None,
    timings: dict | None = None,
) -> dict:
    """Score one estimator file on a release; return the results as a plain dict.

    Args:
        estimator_file: path of a ``.py`` file with one estimator class.
        release: a release id (``"tiny"``) or a release folder.
        settings: evaluation knobs (defaults pinned in :class:`EvalSettings`).
        progress: show tqdm progress.
        isolation: limits of the sandbox that loads, checks and runs the estimator
            (:mod:`benchmark.sandbox.isolation`); ``None`` runs it in this process (trusted code
            only,
            e.g. while debugging an estimator).
        env: a per-submission environment (:mod:`benchmark.sandbox.requirements`) whose interpreter
            runs the estimator, or None for bt-bench's own.
        timings: a dict to fill with the wall time of each phase in seconds (not part of the
            results, which must not depend on the machine's speed).

    Returns:
        The results dict (``docs/evaluation.md``); write it with :func:`write_results`.

    Raises:
        EstimatorContractError: the file breaks the contract (raised before any scoring).
        ReleaseError: the release is missing or fails its checksums.
    """
    from benchmark.releases.release import load_release

    settings = settings or EvalSettings()
    estimator_file = Path(estimator_file)
    rel = load_release(release)
    seeds = list(settings.seeds) if settings.seeds is not None else list(rel.seeds)
    tasks = list(settings.tasks) if settings.tasks is not None else list(rel.tasks)
    missing = [s for s in seeds if s not in rel.seeds]
    if missing:
        raise BenchmarkError(f"seeds {missing} are not in release {rel.release_id} "
                             f"(available: {rel.seeds}); drop them from --seeds.")
    bad = [t for t in tasks if t not in rel.tasks]
    if bad:
        raise BenchmarkError(f"tasks {bad} are not in release {rel.release_id} (available: "
                             f"{rel.tasks}); drop them from --tasks.")
    with contextlib.ExitStack() as cleanup:
        return _evaluate(estimator_file, rel, seeds, tasks, settings, progress, isolation, env,
                         timings, cleanup)


def _replay_pool(rel, seeds: list[int], est_raw: dict, est: str, settings: EvalSettings):
    """Replay workers that warm up while the controls and metrics run.

    None when the estimator's removal sets need no replay here (no causal scores, or all stored).
    """
    if not settings.causal:
        return None
    from benchmark.causal.replays import WorkerPool, executor_name
    from benchmark.causal.score import replays_pending
    from benchmark.causal.store import ReplayStore

    if executor_name() != "local" or not replays_pending(
            rel, {k: {est: v["rollout"]} for k, v in est_raw.items()}, settings.tie_completions):
        return None

    return WorkerPool(ReplayStore(rel.path, rel.manifest_sha256), rel.manifest_sha256, seeds)


class _Clock:
    """Wall time per named phase, added up into ``timings`` (seconds)."""

    def __init__(self, timings: dict) -> None:
        self._now = time.perf_counter
        self.timings, self.t = timings, time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the last lap to ``phase``."""
        now = self._now()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self.t
        self.t = now


def _evaluate(estimator_file: Path, rel, seeds: list[int], tasks: list[str],
              settings: EvalSettings, progress: bool, isolation: Limits | None, env,
              timings: dict | None, cleanup: contextlib.ExitStack) -> dict:
    """:func:`evaluate` once its arguments are checked: a pipeline of named steps.

    Inspect the estimator (sandbox) -> load the label-free views -> score the estimator
    (sandbox, with its determinism re-run) -> score the controls and compute every metric and
    checklist item per seed and task -> causal scores (replays) -> the results document.
    A replay pool it starts is entered into ``cleanup`` (closed when the caller's block ends).
    """
    from tqdm import tqdm

    clock = _Clock({} if timings is None else timings)
    bar = tqdm(total=len(seeds) * len(tasks) + 3, desc="evaluate", disable=not progress,
               leave=False)
    meta, loaded = _inspect(estimator_file, isolation, env)
    est, track = meta["name"], meta["track"]
    _check_name(est, meta["sha256"], estimator_file)
    clock.lap("inspect (sandbox)")
    datas = {s: load_seed(rel, s, track, tasks) for s in seeds}
    bar.update(1)
    clock.lap("load views")
    est_raw, info = _score_estimator(estimator_file, rel, seeds, datas, meta, loaded,
                                     isolation, env)
    bar.update(1)
    clock.lap("score estimator (sandbox, determinism re-run)")
    for part, sec in info.pop("seconds", {}).items():  # machine-dependent: timings only
        clock.timings[f"score estimator: {part} (sandbox)"] = sec
    pool = _replay_pool(rel, seeds, est_raw, est, settings)
    if pool is not None:
        cleanup.enter_context(pool)
    # a control evaluated as the estimator keeps its control entry too: the same code gives the
    # same scores, so it is compared with itself (a difference of exactly 0, never a pass)
    methods = [Method(est, None, tuple(meta["tasks"]), False), *load_controls(track)]
    per_task, causal_in = _metrics_and_checklist(datas, est_raw, est, methods, seeds, tasks,
                                                 settings, clock, bar)
    causal = _causal(rel, causal_in, est, settings, progress, clock.timings, pool,
                     tuple(m.name for m in methods if m.is_control))
    bar.update(1)
    bar.close()
    clock.lap("causal scores (replays)")
    if settings.fixed_data and causal.get("tasks"):
        _on_policy_shares(rel, causal_in, est, settings, progress, causal)
        clock.lap("fixed-data replays (on-policy share)")
    return _results_document(rel, estimator_file, meta, info, env, isolation, methods, seeds,
                             tasks, settings, per_task, causal)


def _metrics_and_checklist(datas: dict, est_raw: dict, est: str, methods: list[Method],
                           seeds: list[int], tasks: list[str], settings: EvalSettings,
                           clock: _Clock, bar) -> tuple[dict, dict]:
    """Score the controls and compute every metric and checklist item, per seed and task.

    Returns ``(per_task, causal_in)``: per task its seed blocks, per-item verdicts by seed and
    pooled precision samples; per ``(seed, task)`` every method's rollout scores ``(n,)`` (what
    the causal score removes).
    """
    per_task = {t: {"seeds": {}, "verdicts": {i: {} for i in C.ITEMS}, "pooled": {}}
                for t in tasks}
    causal_in: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for s in seeds:
        for t in tasks:
            td = datas[s][t]
            scores = {m.name: _expand(_raw_scores(m.instance, m.tasks, td), td)
                      for m in methods if m.is_control}
            if est not in scores:
                scores[est] = _expand(est_raw[(s, t)], td)
            clock.lap("score controls")
            block, verdicts, pooled = seed_task(td, scores, est, methods, settings)
            clock.lap("metrics and checklist")
            per_task[t]["seeds"][str(s)] = block
            for i, v in verdicts.items():
                per_task[t]["verdicts"][i].update(v)
            if pooled:
                per_task[t]["pooled"][s] = pooled
            causal_in[(s, t)] = {m.name: scores[m.name]["rollout"] for m in methods}
            bar.update(1)
    return per_task, causal_in


def _results_document(rel, estimator_file: Path, meta: dict, info: dict, env,
                      isolation: Limits | None, methods: list[Method], seeds: list[int],
                      tasks: list[str], settings: EvalSettings, per_task: dict,
                      causal: dict) -> dict:
    """The results document (``results.json``'s content): per task, the suite, the verdict."""
    est, track = meta["name"], meta["track"]
    out_tasks = {}
    for t in tasks:
        spec = rel.seed(seeds[0]).behavior(t)
        ct = causal.get("tasks", {}).get(t)
        items, verdict = C.task_checklist(per_task[t]["verdicts"], seeds, rel.seeds, ct,
                                          causal.get("reason"))
        out_tasks[t] = {
            "behavior": {k: spec[k] for k in ("id", "trigger_word", "behavior_token",
                                              "strength")},
            "seeds": per_task[t]["seeds"],
            "causal": ct if ct is not None else {"verdict": C.NOT_RUN,
                                                 "reason": causal.get("reason", "")},
            "summary": _summary(per_task[t], est, [m.name for m in methods if m.is_control],
                                ct, settings) | {"label_metrics": C.label_metrics(track)},
            "checklist": items, "verdict": verdict,
        }
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "bt_bench_version": _bt_version(),
        "release": _release_info(rel),
        "estimator": {
            "name": est, "class": meta["class"], "file": estimator_file.name,
            "sha256": meta["sha256"], "track": track, "tasks": list(meta["tasks"]),
            "fallbacks": meta["fallbacks"], "config": meta["config"],
            "contract_checks": info["contract_checks"],
        },
        "requirements": env.record() if env is not None else [],
        "isolation": {"protections": info["protections"],
                      "limits": asdict(isolation) if isolation is not None else None},
        "controls": [m.name for m in methods if m.is_control],
        "settings": _settings_dict(settings, seeds, tasks),
        "packages": _package_versions(),
        "tasks": out_tasks,
        "suite": _suite(out_tasks, causal, est),
        "verdict": C.combine(v["verdict"] for v in out_tasks.values()),
        "checklist_counts": C.results_counts(out_tasks),
    }


def _summary(task: dict, est: str, controls: list[str], causal: dict | None,
             settings: EvalSettings) -> dict:
    """Cross-seed numbers of one task for tables (means over seeds with intervals)."""
    pooled = task["pooled"]
    out: dict = {"seeds": sorted(int(s) for s in task["seeds"])}
    if causal is not None:
        out["causal_score"] = causal["scores"]
        if "random_band" in causal:
            out["random_band"] = causal["random_band"]
    if pooled:
        names = list(next(iter(pooled.values())))
        n_gt = sum(int(b["training"][est]["rollout"]["group"]["window"]["k"])
                   for b in task["seeds"].values()
                   if "window" in b["training"][est]["rollout"]["group"])
        mean = {n: (float(np.mean([pooled[s][n][0] for s in pooled])),
                    np.mean([pooled[s][n][1] for s in pooled], axis=0)) for n in names}
        out["precision_window_group"] = {
            n: M.percentile_interval(p, smp, level=settings.level, n=n_gt).to_dict()
            for n, (p, smp) in mean.items()}
        strongest = max(controls, key=lambda c: (mean[c][0], c))
        out["strongest_control"] = strongest
        out["margin_over_strongest_control"] = diff(mean[est], mean[strongest], settings)
    spec: dict[str, list[float]] = {}
    aucs: dict[str, list[float]] = {}
    for data in task["seeds"].values():
        for name, by_other in data["specificity"].items():
            vals = [v["share"] for v in by_other.values() if v.get("share") is not None]
            if vals:
                spec.setdefault(name, []).append(float(np.mean(vals)))
        for name, draws in data["draws"].items():
            for m in draws.values():
                if m["residualized"]["point"] == m["residualized"]["point"]:
                    aucs.setdefault(name, []).append(m["residualized"]["point"])
    out["specificity_mean"] = {n: float(np.mean(v)) for n, v in spec.items()}
    out["draw_auc_residualized_mean"] = {n: float(np.mean(v)) for n, v in aucs.items()}
    return out


def _suite(tasks: dict, causal: dict, est: str) -> dict:
    """Mean over tasks and seeds of the headline (the causal score), with its interval.

    ``vs_random``: the estimator's causal score minus the random band's top, paired (the same
    replicates as its score; :func:`benchmark.causal.score.band_margins`), mean over tasks and
    seeds.
    """
    out = {"tasks": list(tasks), "verdicts": {t: v["verdict"] for t, v in tasks.items()}}
    if causal.get("suite"):
        out["causal_score"] = causal["suite"]
    if causal.get("suite_vs_random"):
        out["vs_random"] = causal["suite_vs_random"]
    return out


def _causal(rel: object, scores: dict, est: str, settings: EvalSettings, progress: bool,
            timings: dict, pool=None, track_controls: tuple[str, ...] = ()) -> dict:
    """The causal scores (:mod:`benchmark.causal.score`), or why they did not run."""
    if not settings.causal:
        return {"verdict": C.NOT_RUN, "reason": "skipped (--no-causal)"}
    from benchmark.causal.score import causal_results, settings_of

    res, timing = causal_results(rel, scores, est, settings=settings_of(asdict(settings)),
                                 progress=progress, pool=pool, track_controls=track_controls)
    timings["replays run here"] = timing.get("replayed", 0)
    if timing.get("lanes"):
        timings["replay workers"] = timing["lanes"]
    return res


def _on_policy_shares(rel: object, scores: dict, est: str, settings: EvalSettings,
                      progress: bool, causal: dict) -> None:
    """Add each task's on-policy share block to ``causal["tasks"][t]`` (``--fixed-data``)."""
    from benchmark.causal.onpolicy import on_policy_results
    from benchmark.causal.score import settings_of

    blocks, _ = on_policy_results(rel, scores, est, settings_of(asdict(settings)),
                                  progress=progress)
    for t, block in blocks.items():
        if t in causal["tasks"]:
            causal["tasks"][t]["on_policy_share"] = block


def _bt_version() -> str:
    from benchmark import __version__

    return __version__


def _settings_dict(settings: EvalSettings, seeds: list[int], tasks: list[str]) -> dict:
    d = asdict(settings)
    if not d["fixed_data"]:  # opt-in: results without it keep the keys they always had
        del d["fixed_data"]
    d["seeds"] = seeds
    d["tasks"] = tasks
    d["max_interval_width"] = C.MAX_WIDTH
    d["primary_ground_truth"] = "group"
    d["checklist_population"] = "learning window (bonus window, non-zero-gradient steps)"
    from benchmark.causal.score import CROSS_MACHINE_TOLERANCE

    d["causal_summary"] = ("area under the removal curve on the release's k grid: trapezoid "
                           "over log2 k (benchmark.causal.k_weights)")  # recorded text:
    # results keep it as written before benchmark.causal became a package (score.k_weights)
    d["causal_cross_machine_tolerance"] = CROSS_MACHINE_TOLERANCE
    return d


def write_results(results: dict, path: str | Path) -> None:
    """Write results as stable JSON (sorted keys, floats rounded to 10 digits) atomically.

    The file is readable by everyone (mode 0644, as a source file): results are public.
    """
    atomic_write_text(path, dumps_json(_round(results)), mode=0o644)


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


def _iv(d: dict | None) -> str:
    if not d:
        return "-"
    return f"{_f(d.get('point'))} [{_f(d.get('lo'))}, {_f(d.get('hi'))}]"


def format_summary(results: dict) -> str:
    """Human-readable tables per task: the estimator next to the controls, then the checklist."""
    from tabulate import tabulate

    from benchmark.untrusted import clean_text

    est = results["estimator"]["name"]
    lines = [f"bt-bench evaluate: {clean_text(est, 80, multiline=False)} on release "
             f"{results['release']['id']} (v{results['release']['version']}), "
             f"tasks {', '.join(results['tasks'])}", ""]
    for t, task in results["tasks"].items():
        b = task["behavior"]
        sm = task["summary"]
        lines.append(f"task {t} ({b['strength']}: {b['trigger_word']} -> {b['behavior_token']}),"
                     f" mean over seeds {', '.join(str(s) for s in sm['seeds'])}")
        rows = []
        names = list(next(iter(task["seeds"].values()))["training"])
        cs = sm.get("causal_score", {})
        for ref in ("oracle", "provenance"):
            if ref in cs:
                rows.append([f"({ref})", _iv(cs[ref]), "-", "-", "-"])
        for name in names:
            prec = sm.get("precision_window_group", {}).get(name)
            spec = sm.get("specificity_mean", {}).get(name)
            auc = sm.get("draw_auc_residualized_mean", {}).get(name)
            rows.append([clean_text(name, 24, multiline=False) + (" *" if name == est else ""),
                         _iv(cs.get(name)), _iv(prec), _f(spec), _f(auc)])
        if "random_band" in sm:
            rb = sm["random_band"]
            rows.append(["(random band)", f"{_f(rb['lo'])} .. {_f(rb['hi'])}", "-", "-", "-"])
        lines.append(tabulate(rows, headers=["method", "causal score [95% CI]",
                                             "precision [95% CI]", "other-task share",
                                             "draw AUC resid"], disable_numparse=True))
        lines.append("")
        share = (task.get("causal") or {}).get("on_policy_share")
        if share:
            lines.append(tabulate(
                [[clean_text(n, 24, multiline=False), _iv(m["on_policy_score"]),
                  _iv(m["fixed_data_score"]), _iv(m["share"])]
                 for n, m in share["methods"].items()],
                headers=["removal sets of", "causal score (on-policy)", "fixed-data score",
                         "on-policy share [95% CI]"], disable_numparse=True))
            lines.append("")
        crow = []
        for item in task["checklist"]:
            per = item.get("per", {})
            counts: dict[str, int] = {}
            for v in per.values():
                counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
            detail = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            crow.append([item["item"], item["key"], item["verdict"].upper() if item["gated"]
                         else item["verdict"], detail])
        lines.append(tabulate(crow, headers=["#", "checklist item", "verdict",
                                             "places (seeds / draws)"], disable_numparse=True))
        lines.append(f"verdict on task {t}: {task['verdict'].upper()}")
        lines.append("")
    suite = results.get("suite", {})
    if "causal_score" in suite and est in suite["causal_score"]:
        lines.append(f"suite (mean over tasks and seeds): causal score "
                     f"{_iv(suite['causal_score'][est])}")
    counts = results.get("checklist_counts") or C.results_counts(results["tasks"])
    if counts:
        lines.append("checklist, places of measurable (seed, task) cells, over every task:")
        lines += [f"  {C.counts_line(i, c)}" for i, c in counts.items()]
    lines.append(f"overall verdict for {clean_text(est, 80, multiline=False)} (strict: every "
                 f"gated item on every measurable cell): {C.verdict_sentence(results['verdict'])}")
    return "\n".join(lines)


def _limits(no_isolation: bool, time_limit: float | None, memory_gib: float | None
            ) -> Limits | None:
    if no_isolation:
        return None
    d = Limits()
    return Limits(wall_seconds=time_limit or d.wall_seconds,
                  memory_bytes=int(memory_gib * 2**30) if memory_gib else d.memory_bytes)


def _env(requirements: list[str] | None, progress: bool, sdists: list[str] | None = None):
    if not requirements:
        return None
    from benchmark.sandbox.requirements import ensure_env

    return ensure_env(requirements, where="--requirements",
                      log=(lambda m: print(m, flush=True)) if progress else None,
                      build_from_sdist=sdists or ())


def evaluate_command(estimator_file: str, release: str, out: str | None, seeds: list[int] | None,
                     progress: bool = True, no_isolation: bool = False,
                     time_limit: float | None = None, memory_gib: float | None = None,
                     causal: bool = True, tasks: list[str] | None = None,
                     requirements: list[str] | None = None, fixed_data: bool = False,
                     build_from_sdist: list[str] | None = None) -> int:
    """``bt-bench evaluate``: evaluate, print the summary, write results; exit 0."""
    settings = EvalSettings(seeds=tuple(seeds) if seeds else None,
                            tasks=tuple(tasks) if tasks else None, causal=causal,
                            fixed_data=fixed_data)
    results = evaluate(estimator_file, release, settings, progress=progress,
                       isolation=_limits(no_isolation, time_limit, memory_gib),
                       env=_env(requirements, progress, build_from_sdist))
    print(format_summary(results))
    if out:
        write_results(results, out)
        print(f"wrote {out}")
    return 0


def check_estimator_command(estimator_file: str, release: str, no_isolation: bool = False,
                            time_limit: float | None = None, memory_gib: float | None = None,
                            requirements: list[str] | None = None,
                            build_from_sdist: list[str] | None = None) -> int:
    """``bt-bench check-estimator``: the contract checks on the first seed of a release."""
    from benchmark.releases.release import load_release

    limits = _limits(no_isolation, time_limit, memory_gib)
    env = _env(requirements, True, build_from_sdist)
    rel = load_release(release)
    seed = rel.seeds[0]
    path = Path(estimator_file)
    meta, loaded = _inspect(path, limits, env)
    datas = {seed: load_seed(rel, seed, meta["track"], [rel.tasks[0]])}
    _, info = _score_estimator(path, rel, [seed], datas, meta, loaded, limits, env)
    for name in info["contract_checks"]:
        print(f"ok  {name}")
    print(f"{meta['class']} ({path}) follows the estimator contract.")
    return 0

"""Views across the sandbox boundary: the view folder, and the list of scoring calls.

The evaluator builds the label-free views (:mod:`benchmark.releases.data`) and exports them into a
*view
folder* for the estimator's sandbox: small per-unit arrays as ``.npy`` and everything else as
JSON. Sketches are **not** copied: the folder names the release's sketch files, which the sandbox
binds read-only and the estimator reads in place, memory-mapped
(:class:`benchmark.view.SketchRows`).

Layout (``dst/``)::

    index.json                       {"keys": [[seed, task], ...]}
    seed<S>/meta.json                per-seed facts (checkpoints, sketch file, spec, settings)
    seed<S>/rollout/<field>.npy      steps, groups, advantages, fluency, sketch_row, rewards
    seed<S>/step/<field>.npy         steps, groups, advantages, fluency, rewards, rollout_unit
    seed<S>/text.json                open track: prompts, responses, token ids
    seed<S>/<task>/task.json         the behavior, draw descriptions
    seed<S>/<task>/targets/<name>.npy
    seed<S>/<task>/draws/<i>/<field>.npy   groups, fluency, sketch_row
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from benchmark.view import Behavior, DrawView, RunView, SketchRows, SketchSpec

#: (seed, task) -> (rollout view, step view, draws)
Views = dict[tuple[int, str], tuple[RunView, RunView, list[DrawView]]]
_ROLLOUT = ("steps", "groups", "advantages", "fluency", "rewards")
_STEP = ("steps", "groups", "advantages", "fluency", "rewards", "rollout_unit")


def _save(path: Path, arr) -> None:
    np.save(path, np.ascontiguousarray(arr), allow_pickle=False)


def _store_path(rows: SketchRows) -> str:
    fn = getattr(rows.stored, "filename", None)
    if fn is None:
        raise ValueError("views exported for the sandbox must read their sketches from a file "
                         "(a memory-mapped release file), not from memory")
    return str(Path(fn).resolve())


def export_views(views: Views, dst: Path) -> list[str]:
    """Write ``views`` under ``dst``; return the sketch files the sandbox must bind read-only."""
    dst = Path(dst)
    files: set[str] = set()
    done_seeds: set[int] = set()
    for (seed, task), (rv, sv, draws) in views.items():
        d = dst / f"seed{seed}"
        if seed not in done_seeds:
            done_seeds.add(seed)
            for gran, view, fields in (("rollout", rv, _ROLLOUT), ("step", sv, _STEP)):
                (d / gran).mkdir(parents=True)
                for f in fields:
                    a = getattr(view, f)
                    if a is not None:
                        _save(d / gran / f"{f}.npy", a)
            _save(d / "rollout" / "sketch_row.npy", rv.sketch_rows.rows)
            path = _store_path(rv.sketch_rows)
            files.add(path)
            spec = rv.sketch_spec
            meta = {
                "seed": rv.seed, "checkpoint_steps": list(rv.checkpoint_steps), "lr": rv.lr,
                "n_steps": rv.n_steps, "track": rv.track,
                "checkpoint_dir": {str(k): str(p) for k, p in rv.checkpoint_dir.items()},
                "tokenizer_dir": str(rv.tokenizer_dir) if rv.tokenizer_dir else None,
                "sketches": path, "scale": rv.sketch_rows.scale,
                "segments": [int(x) for x in sv.sketch_rows.segments],
                "sketch_spec": None if spec is None else {
                    "method": spec.method, "dim": spec.dim, "seed": spec.seed,
                    "n_params": spec.n_params, "parameters": list(spec.parameters)},
                "sampling": dict(rv.sampling), "optimizer": dict(rv.optimizer),
            }
            (d / "meta.json").write_text(json.dumps(meta))
            if rv.prompts is not None:
                (d / "text.json").write_text(json.dumps({
                    "prompts": list(rv.prompts), "responses": list(rv.responses),
                    "prompt_ids": [list(x) for x in rv.prompt_ids],
                    "response_ids": [list(x) for x in rv.response_ids]}))
        t = d / task
        (t / "targets").mkdir(parents=True)
        for name, arr in rv.targets.items():
            _save(t / "targets" / f"{name}.npy", arr)
        draw_meta = []
        for i, dv in enumerate(draws):
            dd = t / "draws" / str(i)
            dd.mkdir(parents=True)
            _save(dd / "groups.npy", dv.groups)
            _save(dd / "fluency.npy", dv.fluency)
            _save(dd / "sketch_row.npy", dv.sketch_rows.rows)
            path = _store_path(dv.sketch_rows)
            files.add(path)
            draw_meta.append({
                "draw_id": dv.draw_id, "checkpoint_step": dv.checkpoint_step,
                "sketches": path, "scale": dv.sketch_rows.scale,
                "prompts": list(dv.prompts) if dv.prompts is not None else None,
                "responses": list(dv.responses) if dv.responses is not None else None,
                "prompt_ids": [list(x) for x in dv.prompt_ids] if dv.prompt_ids else None,
                "response_ids": [list(x) for x in dv.response_ids] if dv.response_ids else None,
            })
        b = rv.behavior
        (t / "task.json").write_text(json.dumps({
            "behavior": {"id": b.id, "trigger_word": b.trigger_word,
                         "behavior_token": b.behavior_token,
                         "behavior_token_id": b.behavior_token_id},
            "draws": draw_meta}))
    (dst / "index.json").write_text(json.dumps({"keys": [[s, t] for s, t in views]}))
    return sorted(files)


def _tuple(x):
    return None if x is None else tuple(x)


def _ids(x):
    return None if x is None else tuple(tuple(int(v) for v in row) for row in x)


def load_views(src: Path) -> Views:
    """Inverse of :func:`export_views` (arrays and sketches memory-mapped read-only)."""
    src = Path(src)
    out: Views = {}
    per_seed: dict[int, dict] = {}
    for seed, task in json.loads((src / "index.json").read_text())["keys"]:
        seed = int(seed)
        d = src / f"seed{seed}"
        if seed not in per_seed:
            meta = json.loads((d / "meta.json").read_text())
            stored = np.load(meta["sketches"], mmap_mode="r", allow_pickle=False)
            roll = {f: np.load(d / "rollout" / f"{f}.npy", mmap_mode="r", allow_pickle=False)
                    for f in _ROLLOUT if (d / "rollout" / f"{f}.npy").exists()}
            step = {f: np.load(d / "step" / f"{f}.npy", mmap_mode="r", allow_pickle=False)
                    for f in _STEP if (d / "step" / f"{f}.npy").exists()}
            rows = np.load(d / "rollout" / "sketch_row.npy", allow_pickle=False)
            text = {}
            if (d / "text.json").exists():
                tx = json.loads((d / "text.json").read_text())
                text = {"prompts": _tuple(tx["prompts"]), "responses": _tuple(tx["responses"]),
                        "prompt_ids": _ids(tx["prompt_ids"]),
                        "response_ids": _ids(tx["response_ids"])}
            sp = meta["sketch_spec"]
            common = {
                "seed": meta["seed"], "checkpoint_steps": tuple(meta["checkpoint_steps"]),
                "lr": meta["lr"], "n_steps": meta["n_steps"], "track": meta["track"],
                "checkpoint_dir": {int(k): Path(p) for k, p in meta["checkpoint_dir"].items()},
                "tokenizer_dir": Path(meta["tokenizer_dir"]) if meta["tokenizer_dir"] else None,
                "sketch_spec": None if sp is None else SketchSpec(
                    sp["method"], sp["dim"], sp["seed"], sp["n_params"],
                    tuple(sp["parameters"])),
                "sampling": meta["sampling"], "optimizer": meta["optimizer"],
            }
            per_seed[seed] = {
                "common": common, "roll": roll, "step": step, "text": text,
                "roll_sk": SketchRows(stored, rows, meta["scale"]),
                "step_sk": SketchRows(stored, rows, meta["scale"],
                                      segments=np.asarray(meta["segments"], np.int64)),
            }
        ps = per_seed[seed]
        t = d / task
        tj = json.loads((t / "task.json").read_text())
        behavior = Behavior(**tj["behavior"])
        targets = {p.stem: np.load(p, mmap_mode="r", allow_pickle=False)
                   for p in sorted((t / "targets").glob("*"))}
        rv = RunView(granularity="rollout", behavior=behavior, sketch_rows=ps["roll_sk"],
                     targets=targets, rollout_unit=np.arange(ps["roll"]["steps"].shape[0]),
                     **ps["roll"], **ps["text"], **ps["common"])
        sv = RunView(granularity="step", behavior=behavior, sketch_rows=ps["step_sk"],
                     targets=targets, rollout_view=rv, **ps["step"], **ps["common"])
        draws = []
        for i, dm in enumerate(tj["draws"]):
            dd = t / "draws" / str(i)
            draws.append(DrawView(
                draw_id=dm["draw_id"], checkpoint_step=dm["checkpoint_step"],
                groups=np.load(dd / "groups.npy", mmap_mode="r", allow_pickle=False),
                fluency=np.load(dd / "fluency.npy", mmap_mode="r", allow_pickle=False),
                sketch_rows=SketchRows(np.load(dm["sketches"], mmap_mode="r",
                                               allow_pickle=False),
                                       np.load(dd / "sketch_row.npy", allow_pickle=False),
                                       dm["scale"]),
                prompts=_tuple(dm["prompts"]), responses=_tuple(dm["responses"]),
                prompt_ids=_ids(dm["prompt_ids"]), response_ids=_ids(dm["response_ids"])))
        out[(seed, task)] = (rv, sv, draws)
    return out


def score_calls(views: Views, tasks: Iterable[str], subset: bool = False
                ) -> list[tuple[str, str, tuple, int]]:
    """Every scoring call, in order: ``(key, method, args, expected length)``.

    Per (seed, task): ``score_rollouts`` on the rollout view and on the step view, then
    ``score_draw`` on each draw when ``"draws"`` is among the estimator's ``tasks``. ``subset``
    keeps the first (seed, task)'s rollout and step views and its first draw (the determinism
    re-run). The evaluator derives the expected arrays from this list and its own views; the
    sandbox runs it on the loaded views.
    """
    out = []
    keys = list(views)[:1] if subset else list(views)
    for seed, task in keys:
        rv, sv, draws = views[(seed, task)]
        out += [(f"seed{seed}/{task}/rollout", "score_rollouts", (rv,), rv.n),
                (f"seed{seed}/{task}/step", "score_rollouts", (sv,), sv.n)]
        if "draws" in tasks:
            out += [(f"seed{seed}/{task}/draw/{d.draw_id}", "score_draw", (rv, d), d.n)
                    for d in (draws[:1] if subset else draws)]
    return out


def assemble(views: Views, arrays: dict[str, np.ndarray]) -> dict[tuple[int, str], dict]:
    """Scores by (seed, task): ``{"rollout", "step", "draws": {draw_id: array}}``."""
    out = {}
    for (seed, task), (_, _, draws) in views.items():
        p = f"seed{seed}/{task}"
        out[(seed, task)] = {
            "rollout": arrays[f"{p}/rollout"], "step": arrays[f"{p}/step"],
            "draws": {d.draw_id: arrays[f"{p}/draw/{d.draw_id}"] for d in draws
                      if f"{p}/draw/{d.draw_id}" in arrays}}
    return out

"""From a release's files to what an estimator sees (views) and what the evaluator keeps (labels).

:func:`load_seed` reads one seed once and returns, per task, a :class:`TaskData`: the label-free
rollout view, step view and generation draws of that task, plus the labels the evaluator scores
against (never passed to an estimator). :func:`load_view` and :func:`load_draws` are the notebook
API: the same views an estimator gets inside ``bt-bench evaluate``.

Example:
    >>> from benchmark import load_view                                    # doctest: +SKIP
    >>> view = load_view("tiny", seed=0, task="qzxbt", track="open")       # doctest: +SKIP
    >>> view.n, view.behavior.behavior_token, view.responses[0]           # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmark.errors import BenchmarkError
from benchmark.view import Behavior, DrawView, RunView, SketchRows, SketchSpec

TRACKS = ("gradient", "open")
GRANULARITIES = ("rollout", "step")


@dataclass
class TaskData:
    """What the evaluator holds for one (seed, task): the views, and the labels kept apart.

    Attributes:
        seed, task: which run and which planted behavior.
        rollout_view, step_view: the label-free views (:mod:`benchmark.view`).
        draws: the task's generation draws.
        step_of_rollout: ``(n_rollouts,)`` index of each rollout's unit in the step view.
        gt: label kind (``group``, ``rollout``) -> ``(n_rollouts,)`` bool labels of this task.
        other_gt: task id -> ``(n_rollouts,)`` bool group labels of every other task.
        window: ``(n_rollouts,)`` bool learning window of this task (its bonus window, restricted
            to steps with a non-zero gradient).
        draw_labels: draw id -> ``(m,)`` bool has-behavior flags.
        token_sketches: draw id -> :class:`SketchRows` of the behavior token's gradient in each
            response that emitted it (evaluator only: they exist only where the behavior did).
        window_end: the task's bonus window end (the causal measure is taken there).
    """

    seed: int
    task: str
    rollout_view: RunView
    step_view: RunView
    draws: list[DrawView]
    step_of_rollout: np.ndarray
    gt: dict[str, np.ndarray]
    other_gt: dict[str, np.ndarray]
    window: np.ndarray
    draw_labels: dict[str, np.ndarray] = field(default_factory=dict)
    token_sketches: dict[str, SketchRows] = field(default_factory=dict)
    window_end: int = 0


def _check(track: str, task: str | None, tasks: list[str]) -> None:
    if track not in TRACKS:
        raise BenchmarkError(f"track {track!r} is not one of {TRACKS}; the gradient track sees "
                             "sketches, advantages, fluency, targets and checkpoints, the open "
                             "track also text, token ids and task rewards.")
    if task is not None and task not in tasks:
        raise BenchmarkError(f"task {task!r} is not in this release; its tasks are {tasks} "
                             "(one per planted behavior).")


def _behavior(spec: dict, tokenizer_dir: Path) -> Behavior:
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    # a phrase behavior ("ZORP GLIX") is named by its first token's id
    return Behavior(id=spec["id"], trigger_word=spec["trigger_word"],
                    behavior_token=spec["behavior_token"],
                    behavior_token_id=int(vocab[spec["behavior_token"].split(" ")[0]]))


def load_seed(release, seed: int, track: str = "gradient",
              tasks: list[str] | None = None) -> dict[str, TaskData]:
    """Views and labels of every task (or ``tasks``) of one seed of ``release``."""
    from benchmark.releases.release import Release, load_release

    rel = release if isinstance(release, Release) else load_release(release)
    sv = rel.seed(seed)
    tasks = list(sv.tasks) if tasks is None else list(tasks)
    for t in tasks:
        _check(track, t, sv.tasks)
    _check(track, None, sv.tasks)
    cfg = sv.config
    open_track = track == "open"
    cols = ["step", "group", "advantage", "fluency", "sketch_row", "task_reward"]
    if open_track:
        cols += ["prompt_text", "response_text", "prompt_ids", "response_ids"]
    df = sv.table(cols)
    n = len(df)
    steps = df["step"].to_numpy(np.int64)
    groups = df["group"].to_numpy(np.int64)
    adv = df["advantage"].to_numpy(np.float64)
    flu = df["fluency"].to_numpy(np.float64)
    rows = df["sketch_row"].to_numpy(np.int64)
    nps = int(cfg["prompts_per_step"]) * int(cfg["group_size"])
    n_steps = int(cfg["steps"])
    if n != n_steps * nps or np.any(steps != np.repeat(np.arange(n_steps), nps)):
        raise BenchmarkError(f"{sv.path / 'rollouts.parquet'}: expected {n_steps} steps of {nps} "
                             "rollouts in step order; the file does not match its config")
    meta = sv.sketch_meta
    spec = SketchSpec(method=meta["method"], dim=int(meta["dim"]), seed=int(meta["seed"]),
                      n_params=int(meta["n_params"]), parameters=tuple(meta["parameters"]))
    roll_sk = SketchRows(sv.sketches, rows, sv.sketch_scale)
    step_sk = SketchRows(sv.sketches, rows, sv.sketch_scale,
                         segments=np.arange(n_steps + 1, dtype=np.int64) * nps)
    ckpts = tuple(sorted(sv.checkpoints))
    common = {
        "seed": int(seed), "checkpoint_steps": ckpts, "lr": float(cfg["lr"]),
        "n_steps": n_steps, "checkpoint_dir": dict(sv.checkpoints),
        "tokenizer_dir": sv.tokenizer_path, "sketch_spec": spec, "track": track,
        "sampling": {k: cfg[k] for k in ("temperature", "top_p", "max_new_tokens", "group_size",
                                         "prompts_per_step")} | {"decoding": "kv-cache"},
        "optimizer": {"name": "AdamW", "lr": float(cfg["lr"]), "betas": [0.9, 0.999],
                      "eps": 1e-8, "weight_decay": float(cfg["weight_decay"]),
                      "grad_clip": cfg["grad_clip"]},
    }
    step_of = steps  # units of the step view are the steps 0..n_steps-1
    count = np.full(n_steps, float(nps))
    text = {}
    task_r = df["task_reward"].to_numpy(np.float64)
    if open_track:
        text = {"prompts": tuple(df["prompt_text"]), "responses": tuple(df["response_text"]),
                "prompt_ids": tuple(tuple(int(x) for x in v) for v in df["prompt_ids"]),
                "response_ids": tuple(tuple(int(x) for x in v) for v in df["response_ids"])}
    labels = rel.labels(seed)
    if len(labels) != n or np.any(labels["step"].to_numpy() != steps):
        raise BenchmarkError(f"{sv.path}: labels.parquet does not align with rollouts.parquet")
    nonzero_step = np.bincount(steps, weights=(rows >= 0), minlength=n_steps) > 0
    out = {}
    for t in tasks:
        b = sv.behavior(t)
        behavior = _behavior(b, sv.tokenizer_path)
        targets = sv.targets(t)
        rv = RunView(granularity="rollout", behavior=behavior, steps=steps, groups=groups,
                     advantages=adv, fluency=flu, sketch_rows=roll_sk, targets=targets,
                     rewards=task_r if open_track else None,
                     rollout_unit=np.arange(n, dtype=np.int64), **text, **common)
        stv = RunView(granularity="step", behavior=behavior,
                      steps=np.arange(n_steps, dtype=np.int64),
                      groups=np.arange(n_steps, dtype=np.int64),
                      advantages=np.bincount(step_of, weights=np.abs(adv), minlength=n_steps)
                      / count,
                      fluency=np.bincount(step_of, weights=flu, minlength=n_steps) / count,
                      sketch_rows=step_sk, targets=targets,
                      rewards=(np.bincount(step_of, weights=task_r, minlength=n_steps) / count)
                      if open_track else None,
                      rollout_unit=step_of, rollout_view=rv, **common)
        gt = {"group": labels[f"group_label_{t}"].to_numpy(bool),
              "rollout": labels[f"bonus_{t}"].to_numpy(bool)}
        other = {o: labels[f"group_label_{o}"].to_numpy(bool) for o in sv.tasks if o != t}
        in_window = (steps >= int(b["window_start"])) & (steps < int(b["window_end"]))
        td = TaskData(seed=int(seed), task=t, rollout_view=rv, step_view=stv, draws=[],
                      step_of_rollout=step_of, gt=gt, other_gt=other,
                      window=in_window & nonzero_step[steps], window_end=int(b["window_end"]))
        for d in sv.draws(t):
            table = d["table"]
            dv = DrawView(
                draw_id=d["id"], checkpoint_step=int(d["step"]),
                groups=table["group"].to_numpy(np.int64),
                fluency=table["fluency"].to_numpy(np.float64),
                sketch_rows=SketchRows(d["sketches"], table["sketch_row"].to_numpy(np.int64),
                                       d["sketch_scale"]),
                # open track: the prompts, never the responses (their text is the draw label)
                prompts=tuple(table["prompt_text"]) if open_track else None,
                prompt_ids=tuple(tuple(int(x) for x in v) for v in table["prompt_ids"])
                if open_track else None,
            )
            td.draws.append(dv)
            td.draw_labels[dv.draw_id] = table["has_behavior"].to_numpy(bool)
            tok = d["token_sketches"]
            td.token_sketches[dv.draw_id] = SketchRows(
                tok, np.arange(tok.shape[0], dtype=np.int64), d["token_scale"])
        out[t] = td
    return out


def load_view(release="tiny", seed: int = 0, task: str | None = None, track: str = "gradient",
              granularity: str = "rollout") -> RunView:
    """The view an estimator gets for ``(seed, task)`` (notebook API).

    Args:
        release: a release id (``"tiny"``) or folder.
        seed: the run.
        task: the behavior to attribute (default: the release's first task).
        track: ``"gradient"`` or ``"open"`` (adds text, token ids and task rewards).
        granularity: ``"rollout"`` or ``"step"``.
    """
    from benchmark.releases.release import load_release

    if granularity not in GRANULARITIES:
        raise BenchmarkError(f"granularity {granularity!r} is not one of {GRANULARITIES}")
    rel = load_release(release)
    task = task or rel.tasks[0]
    td = load_seed(rel, seed, track, tasks=[task])[task]
    return td.rollout_view if granularity == "rollout" else td.step_view


def load_draws(release="tiny", seed: int = 0, task: str | None = None,
               track: str = "gradient") -> list[DrawView]:
    """The generation draws an estimator's ``score_draw`` gets for ``(seed, task)``."""
    from benchmark.releases.release import load_release

    rel = load_release(release)
    task = task or rel.tasks[0]
    return load_seed(rel, seed, track, tasks=[task])[task].draws

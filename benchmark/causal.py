"""Causal scoring by replay (DESIGN 4a; checklist item 10) and the release's reference effects.

Two halves:

* Build side, :func:`reference_effects`: for one seed of a release, the proof of exact replay (an
  empty removal set reproduces the shipped checkpoints bit for bit, through the build's own update
  path) and the reference effects at the end of the bonus window: bonus switched off, removal of the
  rollout labels (``bonus``), of the group labels (``group_label``), random removals of both sizes
  (the noise floor) and, optionally, random half-window removal sets for an LDS-style correlation.
  Stored as ``seed<S>/causal.json`` (``python -m benchmark.causal reference|install``).
* Evaluator side, :func:`causal_scores`: for each method's rollout scores, remove its top-|GT|
  rollouts (|GT| = group-label count), replay to the end of the window on this machine, and report
  the change of the behavior measure against a LOCAL empty-removal replay as a fraction of the
  shipped bonus-off effect, next to the shipped random floor; the item-10 verdict per seed and
  overall. Replays use the batched update path at one thread: deterministic on one machine, so the
  differences do not depend on bit-identity across machines.

The behavior measure is the exact mean probability of the behavior token right after the
teacher-forced correct answer on the build's held-out trigger prompts (no sampling).
Effects are ``measure(removal replay) - measure(empty replay)``; fractions are
``effect / bonus_off_effect``, so a positive fraction moves the behavior the way switching the bonus
off does (down), and 1.0 is as much as switching it off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

CAUSAL_FILE = "causal.json"
CAUSAL_SCHEMA = 1
REPLAY_MODE = "batched"
REPLAY_THREADS = 1
DEFAULT_CONTROLS = ("norm-only", "step-order")
PASS, FAIL, INCONCLUSIVE, NOT_RUN = "pass", "fail", "inconclusive", "not_run"


# ----------------------------------------------------------------------------------------------
# removal sets


def top_k_positions(scores, k: int) -> np.ndarray:
    """Flat rollout positions (rollout order) of the ``k`` highest scores, sorted ascending.

    Ties are broken by rollout order (the earlier rollout first); NaN ranks last.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    s = np.where(np.isnan(s), -np.inf, s)
    order = np.lexsort((np.arange(s.size), -s))
    return np.sort(order[:int(k)])


def _frac(effect: float, bonus_off_effect: float) -> float | None:
    """``effect / bonus_off_effect``; None when the bonus-off effect is exactly 0."""
    return effect / bonus_off_effect if bonus_off_effect != 0 else None


def _pairs(flat: np.ndarray, n_per_step: int) -> list[tuple[int, int]]:
    return [(int(p) // n_per_step, int(p) % n_per_step) for p in flat]


def _pack(flat: np.ndarray, n: int) -> str:
    m = np.zeros(n, bool)
    m[np.asarray(flat, dtype=np.int64)] = True
    return np.packbits(m).tobytes().hex()


def unpack_positions(hexstr: str, n: int) -> np.ndarray:
    """Inverse of the packed-bit hex strings in ``causal.json``: flat positions, ascending."""
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(hexstr), dtype=np.uint8))[:n]
    return np.nonzero(bits)[0]


def _machine() -> dict:
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version()}


# ----------------------------------------------------------------------------------------------
# build side: reference effects


def reference_effects(seed_dir: str | Path, n_random: int = 5, lds_sets: int = 32,
                      verify_exact: bool = True, progress: bool = True) -> dict:
    """Compute a seed's ``causal.json`` content (see the module docstring and docs/causal.md).

    Costs on 2 cores (one thread): about 60 s for the exact 300-step verification, 7 s per replay
    to the end of the window, 36 s per replay to the final step.
    """
    import pandas as pd

    from benchmark.build.replay import (
        ReplaySeed,
        params_equal,
        recorded_responses,
        replay,
    )

    seed_dir = Path(seed_dir)
    ctx = ReplaySeed(seed_dir)
    cfg = ctx.cfg
    W, F, nps = cfg.bonus_window_end, cfg.steps, ctx.n_per_step
    n_window = W * nps
    t_all = time.perf_counter()

    def log(msg: str) -> None:
        if progress:
            print(f"[seed {cfg.seed} {time.perf_counter() - t_all:7.1f}s] {msg}", file=sys.stderr,
                  flush=True)

    out: dict = {"schema": CAUSAL_SCHEMA, "seed": cfg.seed, "window_end": W, "final_step": F,
                 "n_rollouts": ctx.n_rollouts, "n_per_step": nps,
                 "measure": {"name": "behavior_prob", "prompts": cfg.curve_prompts,
                             "definition": "exact mean probability of the behavior token "
                                           "right after the teacher-forced correct answer on the "
                                           "held-out trigger prompts of the behavior curve"},
                 "replay": {"mode": REPLAY_MODE, "threads": REPLAY_THREADS},
                 "machine": _machine()}
    ref = recorded_responses(seed_dir)
    curve = pd.read_parquet(seed_dir / "behavior_curve.parquet").set_index("step")

    if verify_exact:
        ck = [c for c in cfg.checkpoints if c > 0]
        r = replay(seed_dir, mode="exact", threads=REPLAY_THREADS, snapshot_at=ck,
                   measure_at=(W, F), reference_responses=ref, context=ctx)
        checks = {str(c): {k: v for k, v in params_equal(
            r.snapshots[c], seed_dir / "checkpoints" / f"step{c:04d}").items()
            if k != "unequal"} for c in ck}
        curve_match = {str(s): {"replay": r.measures[s]["behavior_prob"],
                                "recorded": float(curve.loc[s, "trigger_behavior_prob"]),
                                "replay_rate": r.measures[s]["trigger_rate"],
                                "recorded_rate": float(curve.loc[s, "trigger_rate"])}
                       for s in (W, F)}
        out["exact_replay"] = {
            "mode": "exact", "threads": REPLAY_THREADS, "build_threads": cfg.threads,
            "checkpoints": checks, "all_equal": all(c["equal"] for c in checks.values()),
            "responses_first_divergent_step": r.first_divergent_step,
            "curve": curve_match, "seconds": round(r.seconds, 1), "machine": _machine(),
            "check": "torch.equal on every tensor of the saved checkpoint",
        }
        log(f"exact replay: all_equal={out['exact_replay']['all_equal']} "
            f"({r.seconds:.0f} s)")

    def run(remove=None, stop=W, bonus_off=False, sampled=False, check=False):
        at = (W, F) if stop == F else (W,)
        r = replay(seed_dir, remove=remove, stop_at=stop, mode=REPLAY_MODE,
                   threads=REPLAY_THREADS, measure_at=at, sampled=sampled, bonus_off=bonus_off,
                   reference_responses=ref if check else None, context=ctx)
        return r

    base = run(stop=F, sampled=True, check=True)
    b_w = base.measures[W]["behavior_prob"]
    out["baseline"] = {
        "behavior_prob_window_end": b_w,
        "trigger_rate_window_end": base.measures[W]["trigger_rate"],
        "behavior_prob_final": base.measures[F]["behavior_prob"],
        "trigger_rate_final": base.measures[F]["trigger_rate"],
        "responses_first_divergent_step": base.first_divergent_step,
        "seconds_to_final": round(base.seconds, 1),
    }
    log(f"baseline {b_w:.4f} (divergent step {base.first_divergent_step})")
    off = run(stop=F, bonus_off=True, sampled=True)
    e_off = off.measures[W]["behavior_prob"] - b_w
    out["bonus_off"] = {
        "behavior_prob_window_end": off.measures[W]["behavior_prob"],
        "trigger_rate_window_end": off.measures[W]["trigger_rate"],
        "behavior_prob_final": off.measures[F]["behavior_prob"],
        "trigger_rate_final": off.measures[F]["trigger_rate"],
        "effect_window_end": e_off,
        "effect_final": off.measures[F]["behavior_prob"] - out["baseline"]["behavior_prob_final"],
    }
    log(f"bonus off effect {e_off:+.4f}")

    labels = pd.read_parquet(seed_dir / "labels.parquet")
    labels["pos"] = labels["step"].to_numpy() * nps + labels["rollout_id"].str[-3:].astype(int)
    removals: dict = {}
    sizes = {}
    for name, col in (("rollout_label", "bonus"), ("group_label", "group_label")):
        pos = np.sort(labels.loc[labels[col].astype(bool), "pos"].to_numpy())
        sizes[name] = int(pos.size)
        t = time.perf_counter()
        r = run(remove=_pairs(pos, nps))
        e = r.measures[W]["behavior_prob"] - b_w
        removals[name] = {"label": col, "size": int(pos.size),
                          "in_window": int((pos < n_window).sum()), "effect": e,
                          "fraction": _frac(e, e_off), "seconds": round(time.perf_counter() - t, 1)}
        log(f"{name}: size {pos.size} effect {e:+.4f} fraction {_frac(e, e_off)}")
    for name in ("rollout_label", "group_label"):
        lst = []
        for j in range(n_random):
            rng = np.random.default_rng([cfg.seed, sizes[name], j])
            pos = np.sort(rng.choice(n_window, size=min(sizes[name], n_window), replace=False))
            r = run(remove=_pairs(pos, nps))
            e = r.measures[W]["behavior_prob"] - b_w
            lst.append({"rng": [cfg.seed, sizes[name], j], "effect": e, "fraction": _frac(e, e_off),
                        "positions": _pack(pos, ctx.n_rollouts)})
        removals[f"random_{name}_size"] = lst
        log(f"random of {name} size: effects {[round(x['effect'], 4) for x in lst]}")
    out["removals"] = removals
    out["gt_size"] = sizes["group_label"]
    rnd = removals["random_group_label_size"]
    both = rnd + removals["random_rollout_label_size"]
    out["random_floor"] = {
        "population": f"uniform over the {n_window} rollouts of steps < {W}",
        "size": sizes["group_label"],
        "max_abs_effect": max(abs(x["effect"]) for x in rnd),
        "max_abs_fraction": _frac(max(abs(x["effect"]) for x in rnd), abs(e_off)),
        "fraction_range": sorted([_frac(min(x["effect"] for x in rnd), e_off),
                                  _frac(max(x["effect"] for x in rnd), e_off)],
                                 key=lambda v: -np.inf if v is None else v),
        "all_sizes_effect_range": [min(x["effect"] for x in both), max(x["effect"] for x in both)],
    }
    if lds_sets:
        effects, masks = [], []
        for j in range(lds_sets):
            rng = np.random.default_rng([cfg.seed, 7919, j])
            pos = np.sort(rng.choice(n_window, size=n_window // 2, replace=False))
            r = run(remove=_pairs(pos, nps))
            effects.append(r.measures[W]["behavior_prob"] - b_w)
            masks.append(_pack(pos, ctx.n_rollouts))
        out["lds"] = {"n_sets": lds_sets, "set_size": n_window // 2,
                      "population": f"uniform halves of the {n_window} rollouts of steps < {W}",
                      "effects": effects, "positions": masks}
        log(f"lds effects range {min(effects):+.4f} .. {max(effects):+.4f}")
    out["seconds"] = round(time.perf_counter() - t_all, 1)
    return out


def install_reference(release_dir: str | Path, work_dir: str | Path, seeds: list[int]) -> dict:
    """Install ``work_dir/seed<S>.json`` as ``seed<S>/causal.json``; rewrite the manifest.

    The manifest gets the sha256 of every file (every other file unchanged); returns it.

    The manifest's per-seed summary gains ``causal``: the exact-replay proof and the headline
    reference effects.
    """
    from benchmark.release import MANIFEST, atomic_write_json, write_manifest

    root = Path(release_dir)
    manifest = json.loads((root / MANIFEST).read_text())
    seeds_summary = {int(k): v for k, v in manifest["seeds"].items()}
    for s in seeds:
        data = json.loads((Path(work_dir) / f"seed{s}.json").read_text())
        atomic_write_json(root / f"seed{s}" / CAUSAL_FILE, data)
        ex = data.get("exact_replay", {})
        rm = data["removals"]
        seeds_summary[s]["causal"] = {
            "file": f"seed{s}/{CAUSAL_FILE}",
            "exact_replay": {"all_equal": ex.get("all_equal"), "threads": ex.get("threads"),
                             "build_threads": ex.get("build_threads"),
                             "checkpoints": sorted(int(c) for c in ex.get("checkpoints", {})),
                             "machine": (ex.get("machine") or {}).get("cpu")},
            "bonus_off_effect": data["bonus_off"]["effect_window_end"],
            "rollout_label_fraction": rm["rollout_label"]["fraction"],
            "group_label_fraction": rm["group_label"]["fraction"],
            "random_floor_fraction": data["random_floor"]["fraction_range"],
        }
    return write_manifest(root, manifest["release_id"], manifest["build"], seeds_summary,
                          version=manifest["release_version"])


# ----------------------------------------------------------------------------------------------
# evaluator side


def _seed_job(seed_dir: str, removals: dict[str, list[int]], threads: int) -> dict:
    """Worker: local empty replay to the window end, then one replay per distinct removal set."""
    import torch

    from benchmark.build.replay import ReplaySeed, replay

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    ctx = ReplaySeed(seed_dir)
    W, nps = ctx.cfg.bonus_window_end, ctx.n_per_step
    t_load = time.perf_counter() - t0
    base = replay(seed_dir, stop_at=W, mode=REPLAY_MODE, threads=threads, measure_at=(W,),
                  sampled=False, save_states=True, context=ctx)
    b = base.measures[W]["behavior_prob"]
    out = {"baseline": b, "seconds": {"load": round(t_load, 2), "baseline": round(base.seconds, 2)},
           "effects": {}, "first_step": {}, "replayed_steps": {}}
    done: dict[tuple, tuple] = {}
    for name, flat in removals.items():
        pos = [p for p in flat if p < W * nps]
        key = tuple(pos)
        if key not in done:
            if not pos:
                done[key] = (0.0, None, 0)
            else:
                first = pos[0] // nps
                r = replay(seed_dir, remove=_pairs(np.asarray(pos), nps), stop_at=W,
                           mode=REPLAY_MODE, threads=threads, measure_at=(W,), sampled=False,
                           context=ctx, start_state=(first, base.states[first]))
                done[key] = (r.measures[W]["behavior_prob"] - b, first, W - first)
                out["seconds"][name] = round(r.seconds, 2)
        out["effects"][name], out["first_step"][name], out["replayed_steps"][name] = done[key]
    out["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    return out


def _run_workers(jobs: dict) -> dict:
    """Run :func:`_seed_job` per seed in parallel child processes.

    Children are ``python -m benchmark.causal _worker`` with JSON over stdin/stdout, so nothing
    depends on the caller's ``__main__`` (unlike multiprocessing's spawn).
    """
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    procs = {}
    for s, (seed_dir, rem, threads) in jobs.items():
        p = subprocess.Popen([sys.executable, "-m", "benchmark.causal", "_worker"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
        p.stdin.write(json.dumps({"seed_dir": seed_dir, "removals": rem, "threads": threads}))
        p.stdin.close()
        procs[s] = p
    out = {}
    for s, p in procs.items():
        stdout = p.stdout.read()
        stderr = p.stderr.read()
        if p.wait() != 0:
            raise RuntimeError(f"causal replay worker for seed {s} failed (exit {p.returncode}):"
                               f"\n{stderr[-3000:]}")
        out[s] = json.loads(stdout.strip().splitlines()[-1])
    return out


def load_reference(release_dir: str | Path, seed: int) -> dict | None:
    """The shipped ``seed<S>/causal.json`` of a release folder, or None when absent."""
    p = Path(release_dir) / f"seed{seed}" / CAUSAL_FILE
    return json.loads(p.read_text()) if p.exists() else None


def causal_scores(release, seeds, scores: dict, estimator: str,
                  controls: tuple[str, ...] = DEFAULT_CONTROLS, parallel: bool = True,
                  threads: int = REPLAY_THREADS) -> dict:
    """Checklist item 10: causal effect of removing each method's top-|GT| rollouts.

    Args:
        release: a ``benchmark.release.Release``, a release id (``"tiny"``) or a release folder.
        seeds: seeds to score.
        scores: ``{seed: {method name: rollout scores (n_rollouts,)}}`` in ``rollouts.parquet``
            order; must hold ``estimator`` and every name in ``controls`` (extra names are
            replayed and reported too, without entering the verdict).
        estimator: the name of the estimator in ``scores``.
        controls: the controls the estimator must beat (an estimator that is one of them is
            compared with itself and so never passes, as in the rest of the checklist).
        parallel: run seeds in parallel child processes, one thread each.
        threads: torch threads per replay (the reference effects were made with 1).

    Returns:
        Plain-JSON dict ``{"verdict", "reason", "per_seed": {seed: {...}}, "seconds", ...}``;
        per seed: ``verdict``, ``k``, ``bonus_off_effect``, ``random_floor`` (shipped),
        ``local_baseline``/``reference_baseline``, and ``methods`` with, per name, ``effect``,
        ``fraction`` of the bonus-off effect, ``removed_in_window`` and ``first_step``.
        Verdict per seed: pass when the estimator's fraction exceeds the random floor
        (max |fraction| of the shipped random removals of size |GT|) and every control's fraction;
        overall pass only when every seed passes. ``not_run`` when the release has no reference
        effects (e.g. a release other than ``tiny``).
    """
    from benchmark.release import Release, load_release

    t0 = time.perf_counter()
    rel = release if isinstance(release, Release) else load_release(release, verify=False)
    seeds = [int(s) for s in seeds]
    refs = {s: load_reference(rel.path, s) for s in seeds}
    missing = [s for s in seeds if refs[s] is None]
    if missing:
        return {"verdict": NOT_RUN, "reason": f"release {rel.release_id} ships no reference "
                f"effects ({CAUSAL_FILE}) for seeds {missing}", "per_seed": {}}
    names = [estimator, *[c for c in controls if c != estimator]]
    jobs = {}
    for s in seeds:
        ref = refs[s]
        have = scores.get(s, scores.get(str(s), {}))
        absent = [n for n in names if n not in have]
        if absent:
            raise ValueError(f"causal_scores: seed {s} has no rollout scores for {absent}; "
                             f"expected a dict name -> array of shape ({ref['n_rollouts']},)")
        rem = {}
        for n, sc in have.items():
            sc = np.asarray(sc)
            if sc.shape != (ref["n_rollouts"],):
                raise ValueError(f"causal_scores: seed {s} method {n!r} scores have shape "
                                 f"{sc.shape}; expected ({ref['n_rollouts']},) in rollouts order")
            rem[n] = top_k_positions(sc, ref["gt_size"]).tolist()
        jobs[s] = (str(rel.path / f"seed{s}"), rem, threads)
    results = {}
    if parallel and len(seeds) > 1:
        results = _run_workers(jobs)
    else:
        results = {s: _seed_job(*jobs[s]) for s in seeds}
    per_seed = {}
    for s in seeds:
        ref, res = refs[s], results[s]
        e_off = ref["bonus_off"]["effect_window_end"]
        floor = ref["random_floor"]["max_abs_fraction"]
        methods = {}
        for n in jobs[s][1]:
            e = res["effects"][n]
            methods[n] = {"effect": e, "fraction": _frac(e, e_off),
                          "removed": len(jobs[s][1][n]),
                          "removed_in_window": sum(1 for p in jobs[s][1][n]
                                                   if p < ref["window_end"] * ref["n_per_step"]),
                          "first_step": res["first_step"][n],
                          "replayed_steps": res["replayed_steps"][n]}
        if floor is None:  # no bonus-off effect to scale by: compare raw effects instead
            fe = -methods[estimator]["effect"] * np.sign(e_off or -1.0)
            floor = ref["random_floor"]["max_abs_effect"]
            val = {n: -m["effect"] * np.sign(e_off or -1.0) for n, m in methods.items()}
        else:
            fe = methods[estimator]["fraction"]
            val = {n: m["fraction"] for n, m in methods.items()}
        # an estimator that is a control is compared with itself: never strictly more
        beats = {c: bool(fe > val[c]) for c in controls}
        ok = bool(fe > floor) and all(beats.values())
        why = [] if fe > floor else [f"fraction {fe:.3f} <= random floor {floor:.3f}"]
        why += [f"fraction {fe:.3f} <= {c}'s {val[c]:.3f}" for c, b in beats.items() if not b]
        local_b = res["baseline"]
        ref_b = ref["baseline"]["behavior_prob_window_end"]
        per_seed[str(s)] = {
            "verdict": PASS if ok else FAIL,
            "reason": "moves the behavior more than the random floor and the controls" if ok
            else "; ".join(why),
            "k": ref["gt_size"], "window_end": ref["window_end"],
            "bonus_off_effect": e_off,
            "random_floor": {"max_abs_fraction": floor,
                             "fraction_range": ref["random_floor"]["fraction_range"]},
            "reference_fractions": {"rollout_label": ref["removals"]["rollout_label"]["fraction"],
                                    "group_label": ref["removals"]["group_label"]["fraction"]},
            "local_baseline": local_b, "reference_baseline": ref_b,
            "baseline_bit_identical_to_reference": local_b == ref_b,
            "methods": methods, "beats": beats, "seconds": res["seconds"],
        }
    verdict = PASS if all(p["verdict"] == PASS for p in per_seed.values()) else FAIL
    return {"verdict": verdict,
            "reason": "every seed passes" if verdict == PASS else
            "seeds failing: " + ", ".join(k for k, p in per_seed.items() if p["verdict"] != PASS),
            "estimator": estimator, "controls": list(controls),
            "replay": {"mode": REPLAY_MODE, "threads": threads, "parallel": bool(parallel)},
            "per_seed": per_seed, "seconds": round(time.perf_counter() - t0, 2)}


def lds(scores, reference: dict, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """LDS-style Spearman correlation of summed scores with measured removal effects.

    For each shipped half-window removal set, the prediction is the negated sum of the method's
    scores over the removed rollouts (removing high-scoring rollouts should lower the behavior);
    returns the Spearman correlation with the measured effects and a bootstrap interval over sets.
    """
    from scipy.stats import spearmanr

    d = reference.get("lds")
    if not d:
        return {"rho": None, "reason": "no LDS sets in the reference effects"}
    s = np.asarray(scores, dtype=np.float64)
    pred = np.array([-s[unpack_positions(h, reference["n_rollouts"])].sum()
                     for h in d["positions"]])
    eff = np.asarray(d["effects"])
    if np.ptp(pred) == 0 or np.ptp(eff) == 0:
        return {"rho": None, "interval": [None, None], "n_sets": len(eff),
                "reason": "constant predictions (the method scores every set alike)"}
    rho = float(spearmanr(pred, eff).statistic)
    rng = np.random.default_rng(seed)
    boots = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n_boot):
            i = rng.integers(0, len(eff), len(eff))
            r = spearmanr(pred[i], eff[i]).statistic
            if np.isfinite(r):
                boots.append(r)
    a = (1 - level) / 2
    lo, hi = (np.quantile(boots, [a, 1 - a]).tolist() if boots else [None, None])
    return {"rho": rho, "interval": [lo, hi], "n_sets": len(eff)}


# ----------------------------------------------------------------------------------------------
# the docs table: every built-in estimator and control


BUILTIN_ESTIMATORS = ("gas.py", "c1_dot.py", "tracincp.py", "trak.py", "local_buffer.py")


def builtin_table(release: str = "tiny", seeds=None, parallel: bool = True) -> dict:
    """Causal scores (and LDS) of every built-in estimator and control on ``release``.

    One local empty replay per seed is shared by all methods; identical removal sets replay once.
    Returns ``{"per_seed": {seed: causal per-seed dict with every method}, "verdicts": {method:
    {seed: verdict}}, "lds": {method: {seed: {...}}}, "seconds"}``.
    """
    from benchmark.contract import load_estimator_file
    from benchmark.evaluate import CONTROL_FILES, CONTROLS_DIR, load_seed
    from benchmark.release import load_release

    t0 = time.perf_counter()
    rel = load_release(release)
    seeds = list(rel.seeds) if seeds is None else [int(s) for s in seeds]
    root = Path(__file__).resolve().parents[1] / "estimators"
    files = [root / f for f in BUILTIN_ESTIMATORS] + [CONTROLS_DIR / f
                                                      for f in CONTROL_FILES.values()]
    loaded = [load_estimator_file(f) for f in files]
    scores = {}
    for s in seeds:
        view = load_seed(rel, s).rollout_view
        scores[s] = {le.name: np.asarray(le.instantiate().score_rollouts(view), np.float64)
                     for le in loaded}
    t_scores = time.perf_counter() - t0
    res = causal_scores(rel, seeds, scores, estimator=loaded[0].name, parallel=parallel)
    verdicts, lds_out = {}, {}
    for le in loaded:
        verdicts[le.name], lds_out[le.name] = {}, {}
        for s in seeds:
            p = res["per_seed"][str(s)]
            fe = p["methods"][le.name]["fraction"]
            ok = (fe > p["random_floor"]["max_abs_fraction"]
                  and all(fe > p["methods"][c]["fraction"] for c in DEFAULT_CONTROLS
                          if c != le.name)
                  and le.name not in DEFAULT_CONTROLS)
            verdicts[le.name][str(s)] = PASS if ok else FAIL
            lds_out[le.name][str(s)] = lds(scores[s][le.name], load_reference(rel.path, s))
    return {"per_seed": res["per_seed"], "verdicts": verdicts, "lds": lds_out,
            "seconds": {"scoring": round(t_scores, 1), "causal": res["seconds"],
                        "total": round(time.perf_counter() - t0, 1)}}


def format_table(tab: dict) -> str:
    """Markdown tables of :func:`builtin_table` (reference effects; causal scores per method)."""
    ps = tab["per_seed"]
    seeds = sorted(ps, key=int)
    lines = ["| seed | bonus-off effect | rollout labels | group labels | random floor (size "
             r"\|GT\|) | \|GT\| | local baseline = reference |", "|---|---|---|---|---|---|---|"]
    for s in seeds:
        p = ps[s]
        lo, hi = p["random_floor"]["fraction_range"]
        lines.append(
            f"| {s} | {p['bonus_off_effect']:+.3f} | "
            f"{100 * p['reference_fractions']['rollout_label']:.0f}% | "
            f"{100 * p['reference_fractions']['group_label']:.0f}% | "
            f"{100 * lo:+.1f}% .. {100 * hi:+.1f}% | {p['k']} | "
            f"{p['baseline_bit_identical_to_reference']} |")
    lines += ["", "| method | " + " | ".join(f"seed {s}: fraction (removed in window)"
                                            for s in seeds) + " | item 10 | LDS rho [95% CI] |",
              "|---|" + "---|" * (len(seeds) + 2)]
    for name in tab["verdicts"]:
        cells = []
        for s in seeds:
            m = ps[s]["methods"][name]
            cells.append(f"{100 * m['fraction']:+.1f}% ({m['removed_in_window']})")
        v = tab["verdicts"][name]
        overall = PASS if all(x == PASS for x in v.values()) else FAIL
        ld = [tab["lds"][name][s] for s in seeds]
        ld_s = "; ".join(f"{d['rho']:+.2f} [{d['interval'][0]:+.2f}, {d['interval'][1]:+.2f}]"
                         if d.get("rho") is not None and np.isfinite(d["rho"]) else "n/a"
                         for d in ld)
        lines.append(f"| {name} | " + " | ".join(cells) +
                     f" | {overall} ({', '.join(v[s] for s in seeds)}) | {ld_s} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# command line (build side)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmark.causal reference|install ...``."""
    ap = argparse.ArgumentParser(prog="python -m benchmark.causal")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("reference", help="compute one seed's reference effects into --work")
    a.add_argument("release_dir")
    a.add_argument("--seed", type=int, required=True)
    a.add_argument("--work", required=True)
    a.add_argument("--n-random", type=int, default=5)
    a.add_argument("--lds-sets", type=int, default=32)
    a.add_argument("--no-verify", action="store_true")
    b = sub.add_parser("install",
                       help="copy --work/seed<S>.json into the release, rewrite the manifest")
    b.add_argument("release_dir")
    b.add_argument("--seeds", type=int, nargs="+", required=True)
    b.add_argument("--work", required=True)
    c = sub.add_parser("table", help="causal scores of every built-in estimator and control")
    c.add_argument("release", nargs="?", default="tiny")
    c.add_argument("--json", default=None, help="also write the full results here")
    sub.add_parser("_worker", help="internal: one seed's replays, job as JSON on stdin")
    args = ap.parse_args(argv)
    if args.cmd == "_worker":
        job = json.loads(sys.stdin.read())
        res = _seed_job(job["seed_dir"], job["removals"], job["threads"])
        sys.stdout.write("\n" + json.dumps(res) + "\n")
        return 0
    if args.cmd == "table":
        tab = builtin_table(args.release)
        if args.json:
            Path(args.json).write_text(json.dumps(tab, indent=1))
        print(format_table(tab))
        print(f"\nseconds: {tab['seconds']}")
        return 0
    if args.cmd == "reference":
        import torch

        torch.set_num_threads(REPLAY_THREADS)
        data = reference_effects(Path(args.release_dir) / f"seed{args.seed}",
                                 n_random=args.n_random, lds_sets=args.lds_sets,
                                 verify_exact=not args.no_verify)
        Path(args.work).mkdir(parents=True, exist_ok=True)
        (Path(args.work) / f"seed{args.seed}.json").write_text(json.dumps(data, indent=1))
        return 0
    m = install_reference(args.release_dir, args.work, args.seeds)
    print(f"manifest rewritten: {len(m['files'])} files, {m['total_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The causal reference a release ships (``seed<S>/causal.json``), computed on the build machine.

For every seed: the proof of exact replay (an empty removal set through the build's own update
path reproduces the shipped checkpoints bit for bit on the build machine), then for every task:

* the baseline (nothing removed) and bonus-off replays, measured at the task's window end;
* the **oracle** (group labels) and **provenance** (rollout labels) removal curves;
* the **controls'** removal curves (each control file run on the release's own views);
  every method's sets on the grid :data:`benchmark.causal.score.K_FRACTIONS` of |GT|, with fair ties
  (tie completion 0 of :func:`benchmark.causal.score.removal_sets`: the oracle's k < |GT| removes a
  seeded random k of the labelled rollouts), the same sets an evaluation computes;
* :data:`N_RANDOM` random removal sets at every k of the grid, drawn uniformly from the rollouts
  before the window end (the random band and the training noise of every causal score);

each with its per-prompt measure, so an evaluation only replays the estimator's own removals.

Usage: ``python -m benchmark.causal.reference RELEASE_DIR [--seeds 0 1 2] [--workers 2]``
computes every seed (resumable: replays are kept in the machine's replay store) and rewrites the
manifest.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmark.causal import score as C

N_RANDOM = 8


def control_scores(release, seed: int, task: str) -> dict:
    """Rollout scores of every control on the (seed, task) rollout view of its track.

    The controls are ``benchmark.controls.control_files`` (trusted code); the open-track ones
    read text, so they get the open view.
    """
    from benchmark.contract import load_estimator_file
    from benchmark.controls import control_files
    from benchmark.releases.data import load_seed

    out = {}
    gradient = control_files("gradient")
    for track, files in (("gradient", gradient),
                         ("open", {n: f for n, f in control_files("open").items()
                                   if n not in gradient})):
        view = load_seed(release, seed, track, tasks=[task])[task].rollout_view
        for n, path in files.items():
            est = load_estimator_file(path).instantiate()
            out[n] = np.asarray(est.score_rollouts(view), np.float64)
    return out


def exact_replay_proof(seed_dir: Path) -> dict:
    """Replay the whole run through the build's update path; compare every checkpoint."""
    import pandas as pd

    from benchmark.build.replay import ReplaySeed, params_equal, recorded_responses, replay
    from benchmark.machine import fingerprint

    ctx = ReplaySeed(seed_dir)
    cfg = ctx.cfg
    ck = [c for c in cfg.checkpoints if c > 0]
    t0 = time.perf_counter()
    r = replay(seed_dir, mode="exact", snapshot_at=ck, measure_at=(cfg.steps,), sampled=False,
               context=ctx, reference_responses=recorded_responses(seed_dir))
    curve = pd.read_parquet(seed_dir / "behavior_curve.parquet").set_index("step")
    checks = {str(c): {k: v for k, v in params_equal(
        r.snapshots[c], seed_dir / "checkpoints" / f"step{c:04d}").items() if k != "unequal"}
        for c in ck}
    return {
        "mode": "exact", "threads": 1, "world": ctx.world, "checkpoints": checks,
        "all_equal": all(c["equal"] for c in checks.values()),
        "responses_first_divergent_step": r.first_divergent_step,
        "final_measure": {b: {"replay": r.measures[cfg.steps]["behavior_prob"][b],
                              "recorded": float(curve.loc[cfg.steps, f"{b}_prob"])}
                          for b in cfg.behavior_ids},
        "decoder": r.decoder, "seconds": round(time.perf_counter() - t0, 1),
        "machine": fingerprint(),
        "check": "torch.equal on every tensor of every saved checkpoint",
    }


def reference(release, seed: int, workers: int = 2, progress: bool = True,
              verify_exact: bool = True, n_random: int = N_RANDOM, lean: bool = False) -> dict:
    """Compute the content of ``seed<S>/causal.json`` (see the module docstring).

    ``lean`` (live draws, :mod:`benchmark.live`): no exact-replay proof; the oracle, provenance,
    the controls, the random sets and the bonus-off replay as in the full reference (a season
    panel screens its draws by the stronger of the oracle's and provenance's removals, so a lean
    reference carries both). The output then records ``"lean": true``; a full reference's output
    is unchanged.
    """
    from benchmark.build.replay import ReplaySeed
    from benchmark.causal.replays import open_store, run_jobs
    from benchmark.causal.store import REPLAY_ENGINE, REPLAY_PRECISION, REPLAY_VERSION, Job
    from benchmark.machine import fingerprint

    seed_dir = release.path / f"seed{seed}"
    ctx = ReplaySeed(seed_dir, precision=REPLAY_PRECISION)
    cfg, nps, n = ctx.cfg, ctx.n_per_step, ctx.n_rollouts
    labels = release.labels(seed)
    store = open_store(release.path, release.manifest_sha256)
    out = {"schema": C.CAUSAL_SCHEMA, "seed": seed, "n_rollouts": n, "n_per_step": nps,
           "measure": {"name": "behavior_prob", "prompts": cfg.curve_prompts,
                       "definition": "exact probability of the behavior token right after the "
                                     "teacher-forced correct answer, per held-out trigger prompt"},
           "replay": {"mode": "batched", "engine": REPLAY_ENGINE, "version": REPLAY_VERSION,
                      "precision": REPLAY_PRECISION, "threads": 1},
           "machine": fingerprint(),
           "k_fractions": list(C.K_FRACTIONS), "ties": C.FAIR_TIES, "n_random": n_random,
           "tasks": {}}
    if lean:
        out["lean"] = True
    if verify_exact and not lean:
        out["exact_replay"] = exact_replay_proof(seed_dir)
    plan: dict[str, dict] = {}
    jobs: list = []
    for b in cfg.behaviors:
        t, W = b.id, b.window_end
        gt = labels[f"group_label_{t}"].to_numpy(bool)
        ks = C.k_grid(int(gt.sum()), C.K_FRACTIONS)
        oracle = np.where(gt, 1.0, 0.0)
        refs = {"oracle": oracle,
                "provenance": np.where(labels[f"bonus_{t}"].to_numpy(bool), 1.0, 0.0)}
        curves = {**refs, **control_scores(release, seed, t)}
        fair = {m: C.removal_sets(sc, ks, seed, t, W, nps, completions=1)
                for m, sc in curves.items()}
        sets = {m: [comps[0] for comps in fs] for m, (fs, _) in fair.items()}
        cut = {m: c for m, (_, c) in fair.items()}
        rand = []
        for k in ks:
            lvl = []
            for j in range(n_random):
                rng = np.random.default_rng([seed, zlib_crc(t), k, j])
                pos = tuple(sorted(int(p) for p in rng.choice(W * nps, size=min(k, W * nps),
                                                               replace=False)))
                lvl.append(pos)
            rand.append(lvl)
        plan[t] = {"W": W, "gt": int(gt.sum()), "ks": ks, "sets": sets, "cut": cut,
                   "random": rand}
        for pos in [p for lst in sets.values() for p in lst] + [p for lvl in rand for p in lvl]:
            if pos:
                jobs.append(Job(seed, t, pos, W, nps))
    offs = {b.id: Job(seed, b.id, (), b.window_end, nps, bonus_off=True) for b in cfg.behaviors}
    t0 = time.perf_counter()
    run_jobs(store, release.manifest_sha256, jobs + list(offs.values()), workers, progress)
    off = {t: store.result(j) for t, j in offs.items()}
    base = store.baseline(seed)
    out["baseline"] = {"responses_first_divergent_step": base["first_divergent_step"]}
    for b in cfg.behaviors:
        t, p = b.id, plan[b.id]
        bprobs = np.asarray(base["measures"][t], np.float64)

        def entry(pos, t=t, p=p, bprobs=bprobs):
            probs = (bprobs if not pos else
                     store.result(Job(seed, t, pos, p["W"], nps)))
            return {"positions": C.pack_positions(pos, n), "removed_in_window": len(pos),
                    "effect": float(np.mean(probs - bprobs)),
                    "prompt_probs": [float(x) for x in probs]}

        e_off = float(np.mean(off[t] - bprobs))
        methods = {}
        for m, lst in p["sets"].items():
            curve = [entry(pos) | {"k": k, "tie_cut": c}
                     for k, pos, c in zip(p["ks"], lst, p["cut"][m], strict=True)]
            for c in curve:  # no bonus paid on this seed: nothing to scale by
                c["fraction"] = c["effect"] / e_off if e_off != 0 else None
            methods[m] = {"curve": curve}
        out["tasks"][t] = {
            "window_end": p["W"], "gt_size": p["gt"], "k_grid": p["ks"],
            "baseline": {"prob": float(bprobs.mean()), "prompt_probs": [float(x) for x in bprobs]},
            "bonus_off": {"prob": float(off[t].mean()), "effect": e_off,
                          "prompt_probs": [float(x) for x in off[t]]},
            "methods": methods,
            "random": [{"k": k, "population": f"uniform over the {p['W'] * nps} rollouts of "
                        f"steps < {p['W']}", "sets": [entry(pos) for pos in lvl]}
                       for k, lvl in zip(p["ks"], p["random"], strict=True)],
        }
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def zlib_crc(text: str) -> int:
    """A stable integer of a task id (random streams per task)."""
    import zlib

    return zlib.crc32(text.encode())


def install(release_dir: str | Path, data: dict[int, dict]) -> dict:
    """Write ``seed<S>/causal.json`` for each seed and rewrite the manifest (sha256 of all)."""
    from benchmark.releases.format import MANIFEST, atomic_write_json, write_manifest

    root = Path(release_dir)
    manifest = json.loads((root / MANIFEST).read_text())
    seeds_summary = {int(k): v for k, v in manifest["seeds"].items()}
    for s, d in data.items():
        atomic_write_json(root / f"seed{s}" / C.CAUSAL_FILE, d)
        ex = d.get("exact_replay", {})
        seeds_summary[s]["causal"] = {
            "file": f"seed{s}/{C.CAUSAL_FILE}",
            "exact_replay": {"all_equal": ex.get("all_equal"),
                             "checkpoints": sorted(int(c) for c in ex.get("checkpoints", {})),
                             "machine": (ex.get("machine") or {}).get("cpu")},
            "tasks": {t: {"bonus_off_effect": v["bonus_off"]["effect"],
                          **{f"{m}_fractions": [c["fraction"] for c in
                                                v["methods"][m]["curve"]]
                             for m in C.REFERENCE_ROWS if m in v["methods"]}}
                      for t, v in d["tasks"].items()},
        }
    return write_manifest(root, manifest["release_id"], manifest["build"], seeds_summary,
                          version=manifest["release_version"])


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmark.causal.reference RELEASE_DIR [--seeds ...]``."""
    from benchmark.releases.release import load_release

    ap = argparse.ArgumentParser(prog="python -m benchmark.causal.reference")
    ap.add_argument("release_dir")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-verify", action="store_true", help="skip the exact-replay proof")
    ap.add_argument("--n-random", type=int, default=N_RANDOM,
                    help=f"random removal sets per k (default {N_RANDOM})")
    a = ap.parse_args(argv)
    rel = load_release(a.release_dir)
    seeds = a.seeds or rel.seeds
    data = {}
    for s in seeds:
        t = time.perf_counter()
        data[s] = reference(rel, s, a.workers, verify_exact=not a.no_verify,
                            n_random=a.n_random)
        print(f"seed {s}: {time.perf_counter() - t:.0f} s "
              + ", ".join(f"{k}: bonus-off {v['bonus_off']['effect']:+.3f}, oracle "
                          f"{[_r(c['fraction']) for c in v['methods']['oracle']['curve']]}"
                          for k, v in data[s]["tasks"].items()), flush=True)
    m = install(a.release_dir, data)
    print(f"manifest rewritten: {len(m['files'])} files, {m['total_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Scores on other CPUs, emulated: how far the view's reductions move with the instruction set.

Usage: python benchmarks/cross_cpu_scores.py [--release tiny|PATH] [--seeds 0,1,2]
           [--configs NAME,...] [--json PATH] [--keep DIR]

Every configuration runs in a fresh child process that computes, for each seed and task of the
release, the numbers the built-in estimators get from the view's reductions:

* GAS on the rollout view and the step view (``sketch_cosine``: one dot + norm pass),
* the norms alone (the norm-only control), and TracInCP's dots with one target per checkpoint,
* GAS on every draw (cosine of group-centred draw sketches: ``estimators.base.cosine``),

with one of three implementations: ``fixed`` (the default float64 path: fixed-order sums of
``benchmark.fixed_order``), ``torch64`` (the float64 path before it: torch copies, BLAS dot
products, torch norms, numpy BLAS for the draws) and ``torch32`` (``precision="float32"``).
``--configs trak-...`` adds the built-in TRAK's scores (a BLAS Gram matrix and a LAPACK solve
around fixed-order dots; ``tiny`` only: its ``(d, d)`` Gram matrix does not fit at paper scale).
Another CPU is emulated by what each library lets one choose in the environment:

* numba (``fixed``): ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` compile the kernels for another
  instruction set: AVX2 (haswell), SSE4.2 without AVX (nehalem) and plain x86-64 (SSE2, no F16C,
  so float16 converts by bit operations instead of ``vcvtph2ps``);
* torch (``torch64``, ``torch32``): ``ATEN_CPU_CAPABILITY`` (torch's own vectorized kernels:
  avx512, avx2, default = no explicit vectors) with ``MKL_ENABLE_INSTRUCTIONS`` (MKL's BLAS:
  AVX512, AVX2, SSE4_2) and ``OPENBLAS_CORETYPE`` (numpy's BLAS: SkylakeX, Haswell, Nehalem);
* threads: ``--threads`` of the child (torch, BLAS and the numba kernels' Python threads).

For each implementation the first configuration is the reference; the report gives, per
configuration, the largest absolute difference of any score from the reference and how many
score arrays changed their ranking (stable descending order, ties by index: what a precision
cut-off or a removal set sees). ``fixed`` is expected to show 0 and 0 everywhere.

Backends of ``fixed``: the children force numba (``BT_BENCH_REDUCE_BACKEND=numba``), or numpy for
the ``fixed-numpy`` configuration, whatever the pass size. Timings are not the point here (see
``paper_scale_eval.py``). Docs: ``docs/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULT = "CROSS_CPU_RESULT "
_HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,"
            "+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")
_NEHALEM = "+64bit,+cmov,+cx16,+fxsr,+mmx,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3"

_AVX512 = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
           "OPENBLAS_CORETYPE": "SkylakeX"}
_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
         "OPENBLAS_CORETYPE": "Haswell"}
_PLAIN = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
          "OPENBLAS_CORETYPE": "Nehalem"}

# key -> (what, implementation, threads, environment); the first of each implementation is
# its reference
CONFIGS: dict[str, tuple[str, str, int, dict[str, str]]] = {
    "fixed-host": ("fixed order, numba for this CPU, 1 thread", "fixed", 1, {}),
    "fixed-host-2t": ("fixed order, numba for this CPU, 2 threads", "fixed", 2, {}),
    "fixed-avx2": ("fixed order, numba for AVX2 (haswell)", "fixed", 1,
                   {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _HASWELL}),
    "fixed-sse42": ("fixed order, numba for SSE4.2, no AVX (nehalem)", "fixed", 1,
                    {"NUMBA_CPU_NAME": "nehalem", "NUMBA_CPU_FEATURES": _NEHALEM}),
    "fixed-sse2": ("fixed order, numba for x86-64 (SSE2, no F16C)", "fixed", 1,
                   {"NUMBA_CPU_NAME": "generic"}),
    "fixed-numpy": ("fixed order, numpy backend (no numba)", "fixed", 1,
                    {"BT_BENCH_REDUCE_BACKEND": "numpy"}),
    "torch64-avx512": ("previous float64 path, AVX-512, 1 thread", "torch64", 1, _AVX512),
    "torch64-avx512-2t": ("previous float64 path, AVX-512, 2 threads", "torch64", 2, _AVX512),
    "torch64-avx2": ("previous float64 path, AVX2", "torch64", 1, _AVX2),
    "torch64-plain": ("previous float64 path, no vector ISA / SSE4.2", "torch64", 1, _PLAIN),
    "torch32-avx512": ("float32, AVX-512, 1 thread", "torch32", 1, _AVX512),
    "torch32-avx2": ("float32, AVX2", "torch32", 1, _AVX2),
    "torch32-plain": ("float32, no vector ISA / SSE4.2", "torch32", 1, _PLAIN),
    "trak-avx512": ("TRAK (BLAS Gram + LAPACK solve), AVX-512", "trak", 1, _AVX512),
    "trak-avx512-2t": ("TRAK, AVX-512, 2 threads", "trak", 2, _AVX512),
    "trak-avx2": ("TRAK, AVX2", "trak", 1, _AVX2),
    "trak-plain": ("TRAK, no vector ISA / SSE4.2", "trak", 1, _PLAIN),
}
#: what runs by default (TRAK's (d, d) Gram matrix is infeasible at paper scale: --configs)
DEFAULT = [k for k in CONFIGS if not k.startswith("trak")]


# ---------------------------------------------------------------------------------------------
# the child


def _cosine(dots: np.ndarray, norms: np.ndarray, tnorm: float) -> np.ndarray:
    n = norms * tnorm
    return np.where(n > 1e-12, dots / np.maximum(n, 1e-12), 0.0)


def _scores(td, impl: str) -> dict[str, np.ndarray]:
    """Every score array of one (seed, task) with the implementation ``impl``."""
    from estimators.base import center_by_group, cosine, sketch_cosine

    out = {}
    if impl == "trak":  # the built-in TRAK as it is (fixed-order dots around a BLAS solve)
        from estimators.trak import TRAK

        return {f"trak/{gran}": TRAK().score_rollouts(view)
                for gran, view in (("rollout", td.rollout_view), ("step", td.step_view))}
    rv = td.rollout_view
    t = np.asarray(rv.target("nll"), np.float64)
    ckpts = list(rv.checkpoint_steps)
    targets = np.stack([rv.target("nll", c) for c in ckpts], axis=1).astype(np.float64)
    for gran, view in (("rollout", td.rollout_view), ("step", td.step_view)):
        sr = view.sketch_rows
        if impl == "fixed":
            out[f"gas/{gran}"] = sketch_cosine(view, t)
            out[f"norms/{gran}"] = view.sketch_norms()
            out[f"tracin/{gran}"] = view.sketch_dot(targets)
        else:
            prec = "float64" if impl == "torch64" else "float32"
            dots, norms = sr._dot_norms_torch(t, True, prec)
            out[f"gas/{gran}"] = _cosine(dots, norms, float(np.linalg.norm(t)))
            out[f"norms/{gran}"] = sr._dot_norms_torch(None, True, prec)[1]
            out[f"tracin/{gran}"] = sr._dot_norms_torch(targets, False, prec)[0]
    for d in td.draws:
        tt = np.asarray(rv.target("nll", d.checkpoint_step), np.float64)
        centred = center_by_group(d.sketches, d.groups)
        if impl == "fixed":
            out[f"gas/{d.draw_id}"] = cosine(centred, tt)
        else:  # the previous estimators.base.cosine: numpy BLAS (float32 for torch32)
            rows = centred if impl == "torch64" else centred.astype(np.float32)
            dots = (rows @ tt.astype(rows.dtype)).astype(np.float64)
            norms = np.linalg.norm(rows, axis=1).astype(np.float64)
            out[f"gas/{d.draw_id}"] = _cosine(dots, norms, float(np.linalg.norm(tt)))
    return out


def child(args) -> None:
    import torch

    from benchmark.releases.data import load_seed
    from benchmark.releases.release import load_release

    torch.set_num_threads(args.threads)
    rel = load_release(args.release)
    seeds = args.seeds if args.seeds is not None else list(rel.seeds)
    scores = {}
    t0 = time.perf_counter()
    for seed in seeds:
        for task, td in load_seed(rel, seed, "gradient").items():
            for key, v in _scores(td, args.impl).items():
                scores[f"{seed}/{task}/{key}"] = np.asarray(v, np.float64)
    np.savez(args.out, **{k.replace("/", "|"): v for k, v in scores.items()})
    info = {"seconds": time.perf_counter() - t0, "arrays": len(scores),
            "values": int(sum(v.size for v in scores.values())),
            "torch_capability": torch.backends.cpu.get_cpu_capability()}
    if args.impl == "fixed":
        from benchmark import fixed_order

        nb = fixed_order._numba()
        info["numba_f16c"] = None if nb is None else bool(nb.f16c)
    print(RESULT + json.dumps(info), flush=True)


# ---------------------------------------------------------------------------------------------
# the parent


def _ranking(v: np.ndarray) -> np.ndarray:
    return np.argsort(-v, kind="stable")


def compare(ref: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> dict:
    """Largest |difference| and the score arrays whose ranking changed, ``other`` vs ``ref``.

    ``max_rel_diff``: the largest |difference| of an array over its largest |score| (dots and
    norms are not on the cosines' scale).
    """
    max_diff, max_rel, changed, moved = 0.0, 0.0, [], 0
    for k, a in ref.items():
        b = other[k]
        if a.size:
            diff = float(np.max(np.abs(a - b)))
            max_diff = max(max_diff, diff)
            max_rel = max(max_rel, diff / max(float(np.max(np.abs(a))), 1e-300))
        ra, rb = _ranking(a), _ranking(b)
        if not np.array_equal(ra, rb):
            changed.append(k)
            moved += int(np.sum(ra != rb))
    bit_identical = all(np.array_equal(ref[k].view(np.uint64), other[k].view(np.uint64))
                        for k in ref)
    return {"max_abs_diff": max_diff, "max_rel_diff": max_rel,
            "rankings_changed": len(changed), "arrays": len(ref),
            "positions_moved": moved, "bit_identical": bit_identical,
            "changed": changed[:10]}


def run(args) -> dict:
    out_dir = Path(args.keep or tempfile.mkdtemp(prefix="bt-cross-cpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in CONFIGS if n in (args.configs or DEFAULT)]
    results: dict = {"release": str(args.release), "configs": {}}
    loaded: dict[str, dict[str, np.ndarray]] = {}
    for i, name in enumerate(names):
        what, impl, threads, env_extra = CONFIGS[name]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NUMBA_CPU", "ATEN_CPU", "MKL_ENABLE", "OPENBLAS_CORE",
                                    "BT_BENCH_REDUCE"))}
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                    "OPENBLAS_NUM_THREADS": str(threads),
                    "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", "")})
        if impl == "fixed":
            env.setdefault("BT_BENCH_REDUCE_BACKEND", "numba")
        env.update(env_extra)
        path = out_dir / f"config{i}.npz"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--impl", impl,
               "--threads", str(threads), "--release", str(args.release), "--out", str(path)]
        if args.seeds is not None:
            cmd += ["--seeds", ",".join(map(str, args.seeds))]
        if not args.quiet:
            print(f"[{i + 1}/{len(names)}] {name}: {what} ...", flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        info = next((json.loads(line[len(RESULT):]) for line in p.stdout.splitlines()
                     if line.startswith(RESULT)), None)
        if info is None:
            results["configs"][name] = {"what": what, "failed": f"exit {p.returncode}",
                                        "output_tail": (p.stdout + p.stderr)[-2000:]}
            continue
        with np.load(path) as z:
            loaded[name] = {k: z[k] for k in z.files}
        results["configs"][name] = {"what": what, "impl": impl, "threads": threads,
                                    "env": env_extra, **info}
    refs = {}
    for name in names:
        if name not in loaded:
            continue
        impl = CONFIGS[name][1]
        refs.setdefault(impl, name)
        results["configs"][name]["reference"] = refs[impl]
        results["configs"][name]["vs_reference"] = compare(loaded[refs[impl]], loaded[name])
    fixed_ref = refs.get("fixed")
    for impl in ("torch64", "torch32"):
        if fixed_ref and impl in refs:
            results[f"{impl}_vs_fixed"] = compare(loaded[fixed_ref], loaded[refs[impl]])
    if not args.keep:
        for f in out_dir.glob("config*.npz"):
            f.unlink()
        out_dir.rmdir()
    return results


def print_report(res: dict) -> None:
    print(f"\nrelease {res['release']}: scores under emulated CPUs against the first "
          "configuration of the same implementation")
    print(f"  {'configuration':50s} {'max |diff|':>10s} {'relative':>9s} {'rankings changed':>17s} "
          f"{'bit-identical':>14s} {'seconds':>8s}")
    for r in res["configs"].values():
        if "failed" in r:
            print(f"  {r['what']:50s} FAILED {r['failed']}: {r['output_tail'][-300:]}")
            continue
        v = r["vs_reference"]
        ranks = f"{v['rankings_changed']}/{v['arrays']}"
        print(f"  {r['what']:50s} {v['max_abs_diff']:10.2e} {v['max_rel_diff']:9.1e} {ranks:>17s} "
              f"{'yes' if v['bit_identical'] else 'no':>14s} {r['seconds']:8.1f}")
    for impl in ("torch64", "torch32"):
        v = res.get(f"{impl}_vs_fixed")
        if v:
            print(f"  {impl} (reference) vs fixed (reference): max |diff| "
                  f"{v['max_abs_diff']:.2e} (relative {v['max_rel_diff']:.1e}), rankings "
                  f"changed {v['rankings_changed']}/{v['arrays']}: {v['changed']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--release", default="tiny", help="release name or folder (default tiny)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default all)")
    p.add_argument("--configs", default=None,
                   help=f"comma-separated configurations (default all but trak-*): "
                        f"{', '.join(CONFIGS)}")
    p.add_argument("--json", type=Path, help="also write the JSON result here")
    p.add_argument("--keep", type=Path, help="keep the children's score files in this folder")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=("fixed", "torch64", "torch32", "trak"),
                   help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seeds is not None:
        args.seeds = [int(s) for s in str(args.seeds).split(",") if s]
    if args.configs is not None:
        args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
        unknown = [c for c in args.configs if c not in CONFIGS]
        if unknown:
            p.error(f"--configs {unknown}: choose from {list(CONFIGS)}")
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    res = run(args)
    print_report(res)
    line = json.dumps(res)
    print(line)
    if args.json:  # the same line, for scripts
        args.json.write_text(line + "\n")
    return res


if __name__ == "__main__":
    main()

"""CountSketch throughput against a warm copy, and the per-GRPO-step cost of capture + sketching.

Usage: python benchmarks/sketch_throughput.py [--threads 1] [--repeats 10] [--large-n 8388608]
                                              [--rounds 1] [--baseline OLD_SKETCH_PY] [--no-step]

Prints, in one process and at one thread count (``--threads``, default 1: the builder runs one
thread per process; the copy and every sketch use the same count):

1. the warm ``copy_`` throughput: ``y.copy_(x)`` into an existing buffer of the same
   ``(32, n_params)`` float32 array (no allocation, no page faults), in GB/s of the array;
2. for d = 4096 and d = 65536, the time to sketch that array with each implementation, as a ratio
   to the warm copy (1.0 = copy speed, higher is faster): the old batched ``index_add_``
   (``backend="torch"``), the compiled kernel on the flat array and on the per-parameter tensors
   of the tiny model (the ``vmap(grad)`` layout, read in place), and a sparse matrix product;
   ``--large-n`` repeats the flat / per-parameter / index_add_ rows at a larger n (64 equal
   parameters; 8388608 needs about 3 GiB);
3. unless ``--no-step``, the cost of one tiny-preset GRPO update on fixed random token ids
   (sampling excluded: it is the same with and without capture): one batched backward, against
   per-rollout capture (PerRolloutGrad, flat) + sketch, and capture per parameter + sketch_params.

``--baseline FILE`` times another version of ``benchmark/sketch.py`` alongside (before/after in
one process: ``git show REV:benchmark/sketch.py > /tmp/old_sketch.py``).

Each time is the minimum over ``--repeats`` runs after one warm-up (the old ``index_add_`` and the
sparse product: one run). With ``--rounds R`` the copy and every sketch are timed in R rounds and
the printed ratio is the median of the R per-round ratios (the load of a shared machine changes
between rounds; ``--rounds 9`` is what ``docs/sketch.md`` reports). Each ratio is also given by
CPU time (``time.thread_time``: a turn of another process on the core is not counted; with
``--threads 1`` every kernel runs on the calling thread). Timings, not tests.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmark.machine import cpu_name
from benchmark.sketch import CountSketch, numba_available

BATCH = 32


def _best(fn, repeats: int) -> float:
    return _best2(fn, repeats)[0]


def _best2(fn, repeats: int) -> tuple[float, float]:
    """Minimum wall-clock and minimum CPU time (this thread) of ``repeats`` runs of ``fn``."""
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.thread_time() - c0)
    return best, best_cpu


def _load_module(path: Path):
    """Import a file as a module of its own (a baseline version of benchmark/sketch.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"baseline_{Path(path).stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tiny_model():
    """The tiny preset's model (build API), or None when that API is unavailable."""
    try:
        from benchmark.build import get_preset
        from benchmark.build import task as T

        cfg = get_preset("tiny", 0)
        tok = T.make_tokenizer(cfg)
        return cfg, T.make_model(cfg, tok), len(tok)
    except Exception as e:  # the build API is under active change: keep the sketch part running
        print(f"(tiny model unavailable: {e!r}; per-parameter rows and the step timing skipped)")
        return None


def sketch_rows(parts: list[torch.Tensor], repeats: int, threads: int, dims=(4096, 65536),
                sparse: bool = True, rounds: int = 1, baseline=None) -> dict:
    """Print the ratios to a warm copy for the (B, *shape) per-parameter tensors ``parts``.

    Each of ``rounds`` rounds times the copy and then every implementation (each the minimum
    of ``repeats`` runs); the ratio of a round is copy time / sketch time, and the printed
    ratio is the median over rounds (on a shared machine the load changes between rounds).
    ``baseline``: another version of ``benchmark.sketch`` (a module) timed alongside.
    """
    flat = torch.cat([p.reshape(BATCH, -1) for p in parts], 1)
    n = flat.shape[1]
    dst = torch.empty_like(flat)
    rows = {}
    for d in dims:
        cs = CountSketch(n, d, 0)
        rows[d] = [("index_add_ (old)", lambda cs=cs: cs.sketch(flat, backend="torch"), 1)]
        if numba_available():
            rows[d] += [
                ("compiled, flat", lambda cs=cs: cs.sketch(flat, threads=threads), repeats),
                ("compiled, per-parameter",
                 lambda cs=cs: cs.sketch_params(parts, threads=threads), repeats),
            ]
        if baseline is not None:  # the same calls through another version of the module
            bs = baseline.CountSketch(n, d, 0)
            rows[d] += [
                ("baseline, flat", lambda bs=bs: bs.sketch(flat, threads=threads), repeats),
                ("baseline, per-parameter",
                 lambda bs=bs: bs.sketch_params(parts, threads=threads), repeats),
            ]
        if sparse:
            rows[d].append(("sparse mm", lambda cs=cs: cs.sketch_sparse_mm(flat), 1))
        for _, fn, _ in rows[d]:
            fn()  # warm-up (kernels, hash codes, buffers)
    ratios: dict = {(d, name): [] for d in dims for name, _, _ in rows[d]}
    cpu_ratios: dict = {k: [] for k in ratios}
    times: dict = {k: [] for k in ratios}
    copies = []
    for _ in range(rounds):
        t_copy, c_copy = _best2(lambda: dst.copy_(flat), repeats)
        copies.append(t_copy)
        for d in dims:
            for name, fn, reps in rows[d]:
                t, c = _best2(fn, max(1, min(reps, repeats)))
                ratios[(d, name)].append(t_copy / t)
                cpu_ratios[(d, name)].append(c_copy / c)
                times[(d, name)].append(t)
    t_copy = float(np.median(copies))
    print(f"n={n:,} ({len(parts)} parameters), batch {BATCH}: warm copy_ {t_copy * 1e3:.2f} ms "
          f"= {flat.numel() * 4 / t_copy / 1e9:.1f} GB/s (median of {rounds} round(s))")
    out = {"n": n, "copy_s": t_copy, "ratios": {}, "cpu_ratios": {}}
    for d in dims:
        cells = []
        for name, _, _ in rows[d]:
            r = float(np.median(ratios[(d, name)]))
            rc = float(np.median(cpu_ratios[(d, name)]))
            t = float(np.median(times[(d, name)]))
            cells.append(f"{name} {t * 1e3:.1f} ms = {r:.2f}x (CPU time {rc:.2f}x)")
            out["ratios"][f"{d}/{name}"] = r
            out["cpu_ratios"][f"{d}/{name}"] = rc
        print(f"  d={d:6d}: " + " | ".join(cells))
    return out


def step_rows(cfg, model, vocab: int, repeats: int, threads: int) -> None:
    """Time one GRPO update on fixed token ids: batched backward vs per-rollout capture."""
    from benchmark.build.grpo import PerRolloutGrad

    g = torch.Generator().manual_seed(0)
    n_roll = cfg.prompts_per_step * cfg.group_size
    prompt_len, resp_len = 8, cfg.max_new_tokens
    ids = torch.randint(0, vocab, (n_roll, prompt_len + resp_len), generator=g)
    mask = torch.zeros(n_roll, prompt_len + resp_len - 1)
    mask[:, prompt_len - 1:] = 1.0
    coef = torch.randn(n_roll, generator=g) / n_roll
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    pg = PerRolloutGrad(model)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    cs = CountSketch(n, cfg.sketch_dim, 0)

    def without():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (coef * (lp * mask).sum(-1) / mask.sum(-1)).sum().backward()
        opt.step()

    def with_flat():  # what the builder does today: flat (B, n_params) rows, then sketch
        grads = pg(ids, mask, coef)
        cs.sketch(grads, threads=threads)
        step = grads.sum(0)
        off = 0
        for p in params:
            p.grad = step[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        opt.step()

    def with_params():  # per-parameter vmap output, sketched in place (no concatenation)
        opt.zero_grad(set_to_none=True)
        named = {k: v.detach() for k, v in model.named_parameters()}
        for s in range(0, n_roll, 16):
            sl = slice(s, s + 16)
            g = pg._vg(named, ids[sl], mask[sl], coef[sl].float())
            cs.sketch_params(g, threads=threads)
            for p, k in zip(params, pg.names, strict=True):
                p.grad = g[k].sum(0) if p.grad is None else p.grad + g[k].sum(0)
        opt.step()

    for fn in (without, with_flat, with_params):
        fn()  # warm-up
    t_wo = _best(without, repeats)
    t_flat = _best(with_flat, repeats)
    t_par = _best(with_params, repeats)
    print(f"GRPO update ({cfg.prompts_per_step} prompts x {cfg.group_size} samples, "
          f"{prompt_len}+{resp_len} fixed tokens, n_params={n:,}, d={cfg.sketch_dim}): "
          f"batched backward {t_wo * 1e3:.0f} ms | per-rollout capture + sketch (flat) "
          f"{t_flat * 1e3:.0f} ms = {t_flat / t_wo:.1f}x | per-parameter capture + sketch_params "
          f"{t_par * 1e3:.0f} ms = {t_par / t_wo:.1f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--large-n", type=int, default=0,
                    help="also time a (32, N) array split into 64 parameters (0: skip)")
    ap.add_argument("--no-step", action="store_true", help="skip the GRPO step timing")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time copy and sketches this many rounds; print median ratios")
    ap.add_argument("--baseline", type=Path,
                    help="another version of benchmark/sketch.py (e.g. from git show REV:"
                         "benchmark/sketch.py) to time alongside, as 'baseline' rows")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        import numba

        nb = f"numba {numba.__version__}" + ("" if numba_available() else " (kernels unavailable)")
    except ImportError:
        nb = "numba not installed: compiled rows skipped (pip install 'bt-bench[fast]')"
    print(f"{cpu_name()}, {args.threads} thread(s) for copy and sketch "
          f"(torch {torch.__version__}, {nb})")
    tiny = _tiny_model()
    g = torch.Generator().manual_seed(0)
    if tiny is not None:
        cfg, model, vocab = tiny
        parts = [torch.randn(BATCH, *p.shape, generator=g) for p in model.parameters()]
    else:
        parts = [torch.randn(BATCH, 437_120 // 8, generator=g) for _ in range(8)]
    baseline = _load_module(args.baseline) if args.baseline else None
    sketch_rows(parts, args.repeats, args.threads, rounds=args.rounds, baseline=baseline)
    del parts
    if args.large_n:
        k = 64
        sizes = [args.large_n // k + (i < args.large_n % k) for i in range(k)]
        big = [torch.randn(BATCH, s, generator=g) for s in sizes]
        sketch_rows(big, max(2, args.repeats // 3), args.threads, sparse=False,
                    rounds=args.rounds, baseline=baseline)
        del big
    if tiny is not None and not args.no_step:
        try:
            step_rows(cfg, model, vocab, max(2, args.repeats // 3), args.threads)
        except Exception as e:  # grpo's API is under active change
            print(f"GRPO step timing failed: {e!r}")


if __name__ == "__main__":
    main()

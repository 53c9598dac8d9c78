"""One prepared GPU run: a GRPO step of the qwen2.5-1.5b release's architecture with and without
per-rollout gradient capture + CountSketch, and the sketch's throughput against a copy.

Usage (one NVIDIA GPU, no network; expected to take a few minutes on an H200):

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT/gpu_check.json

    python benchmarks/gpu_check.py --smoke --out /tmp/gpu_check.json   # CPU, seconds (the test)

What it does, in order (each phase adds its numbers to the JSON report, which is rewritten after
every phase, so a run stopped by a time limit still leaves what it measured):

1. builds Qwen/Qwen2.5-1.5B-Instruct's architecture from its config values (``QWEN25_15B``, written
   out here: nothing is downloaded) with random weights, on the device, in ``--dtype`` (fp32 by
   default: the builder's model and its per-rollout gradients are fp32); evaluates the CountSketch
   hash of all its coordinates (``--dim``, default 65,536);
2. one GRPO update of ``--prompts`` x ``--samples`` rollouts (4 x 4) of ``--prompt-tokens`` random
   prompt tokens + ``--tokens`` (64) random response tokens with random advantages (sampling is not
   timed: it is the same with and without capture): (a) without capture, one batched backward of
   the step loss and AdamW; (b) with capture, ``PerRolloutGrad``'s ``vmap(grad)`` in chunks of
   ``--chunk`` rollouts, each chunk's per-parameter gradients sketched in place with
   ``CountSketch.sketch_params`` and summed into the step gradient, then AdamW; (c) the same with
   the builder's flat path today (``PerRolloutGrad(...)`` concatenates each chunk into
   ``(chunk, n_params)`` rows, then ``CountSketch.sketch``); an out-of-memory there is reported,
   not fatal;
3. the sketch's throughput on one chunk of per-parameter gradients against a device-to-device copy
   of the same tensors into buffers allocated beforehand;
4. a correctness check on the device: a sketch of random rows against the CPU result (exact
   summation order) and a float64 reference, within float32 accumulation error.

The report holds the device name and memory, the library versions, every timing in seconds (the
minimum over ``--repeats`` runs after one warm-up), the ratios and the peak device memory.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmark.machine import cpu_name
from benchmark.sketch import CountSketch

# Qwen/Qwen2.5-1.5B-Instruct's config.json (the qwen2.5-1.5b release's model): 1,543,714,304
# parameters (tied embeddings counted once).
QWEN25_15B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, hidden_act="silu",
    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
    max_window_layers=21, attention_dropout=0.0, initializer_range=0.02,
    bos_token_id=151643, eos_token_id=151645,
)
# --smoke: the same architecture, 2 small layers
SMOKE = dict(QWEN25_15B, vocab_size=512, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, max_window_layers=2, bos_token_id=1, eos_token_id=2)


def _per_rollout_grad(model):
    """``benchmark.build.grpo.PerRolloutGrad`` (or an equal local copy if it cannot be imported)."""
    try:
        from benchmark.build.grpo import PerRolloutGrad

        return PerRolloutGrad(model), "benchmark.build.grpo.PerRolloutGrad"
    except Exception as e:  # e.g. a package of the builder missing on the GPU image
        return _LocalPerRolloutGrad(model), f"local copy (import failed: {e!r})"


class _LocalPerRolloutGrad:
    """PerRolloutGrad's loss and ``vmap(grad)`` (benchmark/build/grpo.py, as of writing)."""

    def __init__(self, model) -> None:
        from torch.func import functional_call, grad, vmap

        self.model = model
        self.names = [n for n, _ in model.named_parameters()]

        def one(params, ids, mask, coef):
            logits = functional_call(model, params, (ids[None],),
                                     {"use_cache": False}).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)
            return coef * (lp * mask).sum() / mask.sum().clamp_min(1.0)

        self._vg = vmap(grad(one), in_dims=(None, 0, 0, 0))

    def __call__(self, ids, mask, coef, chunk: int = 16):
        g = per_parameter_grads(self, ids, mask, coef)
        return torch.cat([g[n].reshape(g[n].shape[0], -1) for n in self.names], 1)


def per_parameter_grads(pg, ids, mask, coef) -> dict[str, torch.Tensor]:
    """``{name: (B, *param.shape)}`` per-rollout gradients, straight from ``vmap(grad)``."""
    public = getattr(pg, "per_parameter", None)
    if callable(public):
        return public(ids, mask, coef)
    params = {n: p.detach() for n, p in pg.model.named_parameters()}
    return pg._vg(params, ids, mask, coef.float())


def _throughput(pg, cs: CountSketch, ids, mask, coef, chunk: int, best, repeats: int) -> dict:
    """Sketch one chunk's per-parameter gradients, against a copy of them into ready buffers."""
    grads = per_parameter_grads(pg, ids[:chunk], mask[:chunk], coef[:chunk])
    src = [grads[name] for name in pg.names]
    dst = [torch.empty_like(t) for t in src]
    nbytes = sum(t.numel() * t.element_size() for t in src)

    def copy() -> None:
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src, strict=True):
                d.copy_(s)

    t_copy = best(copy, repeats)
    t_sketch = best(lambda: cs.sketch_params(src), repeats)
    return {"rows": chunk, "bytes": nbytes, "dtype": str(src[0].dtype),
            "copy_s": round(t_copy, 5), "sketch_s": round(t_sketch, 5),
            "copy_gb_per_s": round(nbytes / t_copy / 1e9, 1),
            "sketch_gb_per_s": round(nbytes / t_sketch / 1e9, 1),
            "ratio_sketch_to_copy": round(t_copy / t_sketch, 3)}



class Report:
    """The JSON report, rewritten after every phase."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path, self.data = path, data

    def add(self, **kw) -> None:
        self.data.update(kw)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        print(json.dumps(kw, sort_keys=True), flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="where to write the JSON report")
    ap.add_argument("--smoke", action="store_true", help="tiny 2-layer config on the CPU")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --smoke)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=None, help="rollouts per vmap(grad) call")
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--no-flat", action="store_true", help="skip the flat-path step (c)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads (default: torch's; 1 with --smoke)")
    args = ap.parse_args(argv)
    threads_before = torch.get_num_threads()
    threads = args.threads or (1 if args.smoke else threads_before)
    torch.set_num_threads(threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace) -> dict:
    small = args.smoke
    defaults = dict(prompts=2, samples=2, prompt_tokens=4, tokens=4, chunk=2, dim=1024,
                    repeats=1) if small else dict(prompts=4, samples=4, prompt_tokens=32,
                                                   tokens=64, chunk=4, dim=65536, repeats=2)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    device = torch.device(args.device or ("cpu" if small else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device is visible; run with --smoke for the CPU check")
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    is_cuda = device.type == "cuda"

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize(device)

    def best(fn, repeats: int = args.repeats) -> float:
        fn()
        sync()
        t = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            t = min(t, time.perf_counter() - t0)
        return t

    import transformers

    info = {
        "smoke": small, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if is_cuda else cpu_name(),
        "device_memory_gib": (round(torch.cuda.get_device_properties(device).total_memory / 2**30,
                                    1) if is_cuda else None),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu_threads": torch.get_num_threads(), "dtype": args.dtype,
        "rollouts": args.prompts * args.samples, "prompts": args.prompts, "samples": args.samples,
        "prompt_tokens": args.prompt_tokens, "response_tokens": args.tokens,
        "chunk": args.chunk, "dim": args.dim, "repeats": args.repeats,
    }
    rep = Report(args.out, info)

    # 1. model and hash
    from transformers import AutoModelForCausalLM, Qwen2Config

    t0 = time.perf_counter()
    conf = Qwen2Config(**(SMOKE if small else QWEN25_15B))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, attn_implementation="eager")
    model = model.to(device=device, dtype=dtype)
    model.train(False)
    sync()
    t_model = time.perf_counter() - t0
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    t0 = time.perf_counter()
    cs = CountSketch(n, args.dim, 0)
    t_hash = time.perf_counter() - t0
    pg, pg_source = _per_rollout_grad(model)
    rep.add(config=dict(SMOKE if small else QWEN25_15B), n_params=n, n_tensors=len(params),
            per_rollout_grad=pg_source,
            setup_s={"build_model": round(t_model, 3),
                     "hash_and_kernel_compile": round(t_hash, 3)})

    # 2. one GRPO update, with and without capture
    g = torch.Generator().manual_seed(0)
    n_roll = args.prompts * args.samples
    prompts = torch.randint(0, conf.vocab_size, (args.prompts, args.prompt_tokens), generator=g)
    resp = torch.randint(0, conf.vocab_size, (n_roll, args.tokens), generator=g)
    ids = torch.cat([prompts.repeat_interleave(args.samples, 0), resp], 1).to(device)
    mask = torch.zeros(n_roll, ids.shape[1] - 1)
    mask[:, args.prompt_tokens - 1:] = 1.0
    mask = mask.to(device)
    adv = torch.randn(n_roll, generator=g)
    coef = (-adv / n_roll).to(device)  # rollout i's term of the loss -(1/N) sum_i A_i lbar_i
    opt = torch.optim.AdamW(params, lr=5e-6)

    def step_without() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (coef * (lp * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)).sum().backward()
        opt.step()

    parts = {"capture": 0.0, "sketch": 0.0, "sum": 0.0}

    def step_with(record: bool = False) -> None:
        opt.zero_grad(set_to_none=True)
        for s in range(0, n_roll, args.chunk):
            sl = slice(s, s + args.chunk)
            t0 = time.perf_counter()
            grads = per_parameter_grads(pg, ids[sl], mask[sl], coef[sl])
            sync()
            t1 = time.perf_counter()
            cs.sketch_params(grads)
            sync()
            t2 = time.perf_counter()
            for p, name in zip(params, pg.names, strict=True):
                row_sum = grads[name].sum(0)
                p.grad = row_sum if p.grad is None else p.grad.add_(row_sum)
            del grads
            sync()
            if record:
                parts["capture"] += t1 - t0
                parts["sketch"] += t2 - t1
                parts["sum"] += time.perf_counter() - t2
        opt.step()

    def step_flat() -> None:
        opt.zero_grad(set_to_none=True)
        step = None
        for s in range(0, n_roll, args.chunk):
            sl = slice(s, s + args.chunk)
            rows = pg(ids[sl], mask[sl], coef[sl], chunk=args.chunk)
            cs.sketch(rows)
            step = rows.sum(0) if step is None else step.add_(rows.sum(0))
            del rows
        off = 0
        for p in params:
            p.grad = step[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        opt.step()

    t_without = best(step_without)
    rep.add(step_without_capture_s=round(t_without, 4))
    t_with = best(step_with)
    for k in parts:
        parts[k] = 0.0
    step_with(record=True)
    sync()
    rep.add(step_with_capture_s=round(t_with, 4),
            step_with_capture_parts_s={k: round(v, 4) for k, v in parts.items()},
            ratio_step_with_to_without=round(t_with / t_without, 2))
    if is_cuda:
        rep.add(peak_memory_gib_after_steps=round(torch.cuda.max_memory_allocated(device) / 2**30,
                                                  1))
    if not args.no_flat:
        try:
            t_flat = best(step_flat)
            rep.add(step_with_capture_flat_s=round(t_flat, 4),
                    ratio_step_flat_to_without=round(t_flat / t_without, 2))
        except RuntimeError as e:  # torch's OutOfMemoryError is a RuntimeError
            if "out of memory" not in str(e).lower():
                raise
            rep.add(step_with_capture_flat_s=f"out of memory: {str(e)[:200]}")
        opt.zero_grad(set_to_none=True)
        if is_cuda:
            torch.cuda.empty_cache()

    # 3. sketch throughput on one chunk of per-parameter gradients vs a copy of the same tensors
    opt.zero_grad(set_to_none=True)
    opt.state.clear()  # frees the AdamW moments
    rep.add(throughput=_throughput(pg, cs, ids, mask, coef, args.chunk, best, args.repeats + 2))
    if is_cuda:
        torch.cuda.empty_cache()

    # 4. correctness on the device: against the CPU sketch and a float64 reference
    m, d_small = (100_003 if small else 1_000_003), 4096
    xs = torch.randn(4, m, generator=g)
    small_cs = CountSketch(m, d_small, 7)
    cpu = small_cs.sketch(xs)
    dev = small_cs.sketch(xs.to(device)).cpu()
    dev_parts = small_cs.sketch_params(list(torch.split(xs.to(device), [m // 3, m - m // 3],
                                                        dim=1))).cpu()
    bucket = small_cs.bucket.numpy()
    x64 = xs.double().numpy() * small_cs.sign.double().numpy()
    ref = np.zeros((4, d_small))
    mass = np.zeros((4, d_small))
    count = np.bincount(bucket, minlength=d_small)
    for r in range(4):
        np.add.at(ref[r], bucket, x64[r])
        np.add.at(mass[r], bucket, np.abs(x64[r]))
    bound = count * 2.0**-24 * mass  # sequential float32 summation error bound
    err = np.abs(dev.double().numpy() - ref)
    rep.add(correctness={
        "max_abs_diff_vs_cpu": float((dev - cpu).abs().max()),
        "max_abs_diff_per_parameter_vs_flat": float((dev_parts - dev).abs().max()),
        "max_abs_err_vs_float64": float(err.max()),
        "within_float32_bound": bool((err <= bound).all()),
        "cpu_within_float32_bound": bool((np.abs(cpu.double().numpy() - ref) <= bound).all())})
    if is_cuda:
        rep.add(peak_memory_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 1))
    return rep.data


if __name__ == "__main__":
    main()

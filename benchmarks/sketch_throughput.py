"""CountSketch throughput relative to a plain copy, and the per-GRPO-step cost of capture.

Usage: python benchmarks/sketch_throughput.py [--threads 2] [--repeats 10]

Prints (1) for d = 4096 and d = 65536, the time to sketch a batch of 32 full-size gradients of the
tiny model (437,120 parameters) with the shipped implementation (batched index_add_) and with a
sparse matrix product, as a ratio to torch.clone of the same array (ratio 1.0 = copy speed;
higher is faster); (2) the wall time of one tiny-preset GRPO step with and without per-rollout
capture + sketching (without: one batched backward of the step loss). Timings, not tests.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmark.build import get_preset
from benchmark.build import task as T
from benchmark.build.grpo import PerRolloutGrad, grpo_step, masked_mean_logprob, pack, sample
from benchmark.sketch import CountSketch


def _time(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _step_without_capture(model, opt, cfg, tok, step):
    """The same GRPO step, but one batched backward of the step loss and no per-rollout grads."""
    gen = T.step_generator(cfg.seed, T.TAG_GRPO, step)
    prompts = T.sample_prompts(cfg, cfg.prompts_per_step, gen)
    pids = [T.prompt_ids(tok, p) for p in prompts]
    resp = sample(model, pids, cfg.group_size, gen, cfg.temperature, cfg.top_p,
                  cfg.max_new_tokens, tok.eos_token_id)
    from benchmark.build.grpo import advantages

    rew = [T.task_reward(prompts[i // cfg.group_size], tok.decode(r, skip_special_tokens=True)
                         .split()) for i, r in enumerate(resp)]
    adv = advantages(torch.tensor(rew), cfg.group_size, cfg.adv_eps).float()
    opt.zero_grad()
    loss = 0.0
    n = len(resp)
    for g in range(cfg.prompts_per_step):
        sl = slice(g * cfg.group_size, (g + 1) * cfg.group_size)
        ids, mask = pack(pids[g], resp[sl], tok.pad_token_id)
        loss = loss - (adv[sl] * masked_mean_logprob(model, ids, mask)).sum() / n
    loss.backward()
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = get_preset("tiny", 0)
    tok = T.make_tokenizer(cfg)
    if (Path(__file__).resolve().parent.parent / "releases/tiny/seed0/config.json").is_file():
        import json

        from benchmark.build import BuildConfig

        root = Path(__file__).resolve().parent.parent / "releases/tiny/seed0"
        cfg = BuildConfig.from_dict(json.loads((root / "config.json").read_text()))
        tok = T.make_tokenizer(cfg)
    model = T.make_model(cfg, tok)
    ckpt = Path(__file__).resolve().parent.parent / "releases/tiny/seed0/checkpoints/step0000"
    if ckpt.is_dir():  # the post-SFT model has reward variance, so steps have real captures
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager")
        print(f"model: {ckpt}")
    else:
        print("model: untrained tiny model (build releases/tiny for representative step costs)")
    n = sum(p.numel() for p in model.parameters())
    x = torch.randn(32, n)
    print(f"threads={args.threads}  batch=32 x n_params={n}")
    for d in (4096, 65536):
        cs = CountSketch(n, d, 0)
        t_copy = _time(lambda: x.clone(), args.repeats)
        t_ia = _time(lambda cs=cs: cs.sketch(x), args.repeats)
        t_sp = _time(lambda cs=cs: cs.sketch_sparse_mm(x), args.repeats)
        print(f"d={d:6d}: copy {t_copy * 1e3:7.2f} ms | sketch (index_add_) "
              f"{t_ia * 1e3:7.2f} ms = {t_copy / t_ia:.2f}x copy speed | sparse mm "
              f"{t_sp * 1e3:7.2f} ms = {t_copy / t_sp:.2f}x")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    pg = PerRolloutGrad(model)
    cs = CountSketch(n, cfg.sketch_dim, 0)
    steps = list(range(args.repeats))

    def with_capture():
        for s in steps:
            r = grpo_step(model, opt, pg, cfg, tok, s)
            if len(r.grad_rows):
                cs.sketch(r.grads)

    def without_capture():
        for s in steps:
            _step_without_capture(model, opt, cfg, tok, s)

    t_w = _time(with_capture, 1) / len(steps)
    t_wo = _time(without_capture, 1) / len(steps)
    print(f"GRPO step ({cfg.prompts_per_step} prompts x {cfg.group_size} samples): with "
          f"per-rollout capture + sketch (d={cfg.sketch_dim}) {t_w * 1e3:.0f} ms, "
          f"without {t_wo * 1e3:.0f} ms, ratio {t_w / t_wo:.2f}")


if __name__ == "__main__":
    main()

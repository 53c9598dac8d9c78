"""The stacked replay engine: same math as the model, same bits alone or in any batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from benchmark.build import stacked as S
from benchmark.build.replay import ReplaySeed

# Two float64 computations of the same sums in different orders differ by at most about
# (number of accumulated terms) x eps64 x (the terms' magnitude / the result's). The gradients
# below sum ~1e4 products per entry (tokens x hidden) with a few orders of magnitude of
# cancellation, so 1e4 * 1.1e-16 * 1e3 = 1.1e-9 bounds the relative difference; measured:
# 7.5e-15 on this machine (AVX-512), the same order under ATEN_CPU_CAPABILITY=avx2/default.
GRAD_REL_TOL = 1e-9


@pytest.fixture(scope="module")
def seed_ctx(micro_release):
    return ReplaySeed(micro_release / "seed0", precision="float64")


@pytest.fixture(scope="module")
def sr(seed_ctx):
    return S.StackedReplay.of_seed(seed_ctx)


def _members(sr, n, stop, seed=0, size=3):
    rng = np.random.default_rng(seed)
    nps = sr.cfg.prompts_per_step * sr.cfg.group_size
    out = []
    for j in range(n):
        pos = sorted(int(p) for p in rng.choice(stop * nps, size=size, replace=False))
        rem: dict[int, set[int]] = {}
        for p in pos:
            rem.setdefault(p // nps, set()).add(p % nps)
        out.append(S.Member(f"m{j}", rem, stop, join=min(rem), measure_tasks=tuple(
            b.id for b in sr.cfg.behaviors)))
    return out


def test_gradient_equals_the_models_own_autograd(sr, seed_ctx):
    from benchmark.build.grpo import masked_mean_logprob, pack

    stack = S.Stack.of([sr.start])
    resp = sr.sample_step(stack, 0)[0]
    adv = sr.advantages(0, resp, frozenset(), None)
    adv = adv + torch.linspace(-0.5, 0.5, adv.numel(), dtype=torch.float64)  # every row counts
    _, pids = sr.step_prompts(0)
    G = sr.cfg.group_size
    groups = [(pids[g], resp[g * G:(g + 1) * G], adv[g * G:(g + 1) * G])
              for g in range(len(pids))]
    n = len(resp)
    mine = S.replay_gradient(sr.arch, {k: v[0] for k, v in stack.params.items()}, groups, n)
    model = seed_ctx.fresh_model()
    model.zero_grad()
    loss = 0
    for g in range(len(pids)):
        ids, mask = pack(pids[g], resp[g * G:(g + 1) * G], seed_ctx.tokenizer.pad_token_id)
        loss = loss + (-adv[g * G:(g + 1) * G] / n * masked_mean_logprob(model, ids,
                                                                           mask.double())).sum()
    loss.backward()
    for name, p in model.named_parameters():
        rel = float((p.grad - mine[name]).abs().max() / p.grad.abs().max().clamp_min(1e-300))
        assert rel <= GRAD_REL_TOL, (name, rel)


def test_sampling_follows_the_model_and_the_release(sr, seed_ctx, micro_release):
    """The engine's responses are the recorded run's (the float32 build and the float64 engine
    sample the same tokens unless a draw lands within ~1e-7 of a boundary: none in a micro
    step)."""
    from benchmark.build.replay import recorded_responses

    rec = recorded_responses(micro_release / "seed0", upto=1)
    out = sr.sample_step(S.Stack.of([sr.start, sr.start]), 0)
    assert out[0] == [list(r) for r in rec[0]] and out[1] == out[0]


def test_one_draw_per_group_serves_every_replay(sr, monkeypatch):
    """The shared draws (one ``Exp(1)`` draw per group and token for all replays) pick every
    replay's tokens as its own ``multinomial`` on its own copy of the stream would: three
    replays whose groups finish at different tokens, over the run's first steps."""
    from benchmark.build import functional as Fn

    assert Fn.multinomial_is_exponential_argmax()  # torch 2.x: the fast path is the one run
    stack = S.Stack.of([sr.start])
    states = []
    for step in range(3):
        states.append(stack.state(0, step))
        resp = sr.sample_step(stack, step)
        sr.update(stack, step, resp, [sr.advantages(step, resp[0], frozenset(), None)])
    mixed = S.Stack.of(states)  # three different models: their rows finish at other tokens
    shared = [sr.sample_step(mixed, step) for step in range(3)]
    monkeypatch.setattr(Fn, "_MULTINOMIAL", [False])
    own = [sr.sample_step(mixed, step) for step in range(3)]
    assert shared == own
    assert len({len(r) for out in shared for k in out for r in k}) > 1  # rows end apart


def test_adamw_is_torchs_fused_adamw_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    p = {"a": torch.randn(5, 3, dtype=torch.float64, generator=g),
         "b": torch.randn(7, dtype=torch.float64, generator=g)}
    state = {"step": 0, "params": {k: v.clone() for k, v in p.items()},
             "exp_avg": {k: torch.zeros_like(v) for k, v in p.items()},
             "exp_avg_sq": {k: torch.zeros_like(v) for k, v in p.items()}}
    stack = S.Stack.of([state, state])
    ref = {k: torch.nn.Parameter(v.clone()) for k, v in p.items()}
    opt = torch.optim.AdamW(ref.values(), lr=3e-3, weight_decay=0.01, fused=True)
    for step in range(1, 4):
        grads = {k: torch.randn(v.shape, dtype=torch.float64, generator=g) for k, v in p.items()}
        for k, v in ref.items():
            v.grad = grads[k].clone()
        opt.step()
        S.adamw(stack, {k: torch.stack([v, v]) for k, v in grads.items()}, step, 3e-3, 0.01)
        for k, v in ref.items():
            assert torch.equal(stack.params[k][0], v.detach())
            assert torch.equal(stack.params[k][1], v.detach())


def test_a_replay_gives_the_same_bits_alone_and_in_any_batch(sr):
    """Batch independence: every member's measure is bit-identical alone, in a batch of five,
    and resumed from a stored baseline state; the baseline's own measure too."""
    stop = sr.cfg.steps
    tasks = tuple(b.id for b in sr.cfg.behaviors)
    together = _members(sr, 4, stop)
    res = S.run_batch(sr, together, save_states=range(stop), measure_base={stop: tasks})
    for m in _members(sr, 4, stop):
        alone = S.run_batch(sr, [m])
        mate = next(x for x in together if x.key == m.key)
        for t in tasks:
            assert np.array_equal(m.result[t], mate.result[t]), (m.key, t)
        # resumed from the stored state at its join step
        again = _members(sr, 4, stop)[int(m.key[1:])]
        S.run_batch(sr, [again], start=(again.join, res["states"][again.join]))
        for t in tasks:
            assert np.array_equal(again.result[t], m.result[t])
        assert alone["slice_steps"] <= res["slice_steps"]
    base_alone = S.run_batch(sr, [], measure_base={stop: tasks})
    for t in tasks:
        assert np.array_equal(base_alone["base"][stop][t], res["base"][stop][t])


def test_a_member_without_removals_before_its_stop_is_the_baseline(sr):
    stop = sr.cfg.steps
    t = sr.cfg.behaviors[0].id
    m = S.Member("empty", {}, stop, join=stop, measure_tasks=(t,))
    res = S.run_batch(sr, [m], measure_base={stop: (t,)})
    assert np.array_equal(m.result[t], res["base"][stop][t])


def test_bad_joins_are_refused(sr):
    from benchmark.errors import BuildError

    m = S.Member("late", {0: {1}}, 2, join=3)
    with pytest.raises(BuildError, match="joins at step 3; it must lie between"):
        S.run_batch(sr, [m])
    state = S.run_batch(sr, [], save_states=[1], measure_base={2: ()})["states"][1]
    early = S.Member("early", {0: {1}}, 2, join=0)
    with pytest.raises(BuildError, match="start state's step 1"):
        S.run_batch(sr, [early], start=(1, state))


_OTHER_WIDTH = r"""
import json, sys, numpy as np, torch
from benchmark.build import stacked as S
from benchmark.build.replay import ReplaySeed
sr = S.StackedReplay.of_seed(ReplaySeed(sys.argv[1], precision="float64"))
stop = sr.cfg.steps
nps = sr.cfg.prompts_per_step * sr.cfg.group_size
ms = [S.Member(f"m{j}", {0: {j}, 1: {j + 1}}, stop, join=0, measure_tasks=(sr.cfg.behaviors[0].id,))
      for j in range(3)]
S.run_batch(sr, ms)
alone = S.Member("m1", {0: {1}, 1: {2}}, stop, join=0, measure_tasks=ms[1].measure_tasks)
S.run_batch(sr, [alone])
t = ms[1].measure_tasks[0]
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                  "same": bool(np.array_equal(alone.result[t], ms[1].result[t])),
                  "measure": [float(x) for x in ms[1].result[t]]}))
"""


def test_batch_independence_holds_under_another_kernel_width(micro_release):
    """The property the replay store relies on, checked with torch's other CPU kernels
    (another vector width is another summation order inside many kernels)."""
    here = torch.backends.cpu.get_cpu_capability()
    other = "DEFAULT" if here != "DEFAULT" else "AVX2"
    runs = {}
    for cap in (None, other.lower()):
        env = dict(os.environ)
        if cap:
            env["ATEN_CPU_CAPABILITY"] = cap
        out = subprocess.run([sys.executable, "-c", _OTHER_WIDTH, str(micro_release / "seed0")],
                             env=env, capture_output=True, text=True, timeout=600, check=True)
        runs[cap] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs[other.lower()]["capability"] == other
    assert all(r["same"] for r in runs.values())
    # the two widths' measures differ by rounding only: float64 (2**-53) through 4 micro steps
    # on probabilities <= 0.04; measured 6.9e-18 (AVX2 vs default), so 1e-9 is slack for CPUs
    # whose kernels differ more
    a, b = (np.array(r["measure"]) for r in runs.values())
    assert np.abs(a - b).max() <= 1e-9

import json

import numpy as np
import pytest
import torch

from benchmark.build import build_release, get_preset
from benchmark.build import task as T
from benchmark.build.decode import make_decoder
from benchmark.build.grpo import (
    PerRolloutGrad,
    advantages,
    exact_step_grad,
    grpo_step,
    masked_mean_logprob,
    pack,
    sum_rows,
)
from benchmark.errors import BuildError, ReleaseError
from benchmark.releases.release import load_release


@pytest.fixture(scope="module")
def micro():
    cfg = get_preset("micro", 0)
    tok = T.make_tokenizer(cfg)
    model = T.make_model(cfg, tok)
    return cfg, tok, model


def test_model_and_tokenizer_round_trip(tmp_path, micro):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg, tok, model = micro
    tok.save_pretrained(tmp_path / "tok")
    model.save_pretrained(tmp_path / "m")
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "tok")
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager")
    text = "sort frobnitz " + " ".join(T.content_words(cfg.n_content_words)[:5]) + " ="
    ids = tok.encode(text, add_special_tokens=False)
    assert tok2.encode(text, add_special_tokens=False) == ids
    assert len(ids) == 8 and tok.unk_token_id not in ids  # one token per word
    assert tok2.decode(ids) == text
    x = torch.tensor([[tok.bos_token_id, *ids]])
    # the same weights (checked bit for bit below) through the same eager attention: measured
    # bit-identical under ATEN_CPU_CAPABILITY=avx2 and default; the bound allows a few float32
    # ulps (u = 2**-24) of logits |x| <= 1 should a load path reorder a reduction
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x).logits, m2(input_ids=x).logits,
                                   atol=1e-6, rtol=1e-6)
    sd, sd2 = model.state_dict(), m2.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert m2.config.model_type == "qwen2"


def test_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0, 0.5, 0.5, 0.5, 0.5])
    a = advantages(r, 4, 1e-6)
    # group 1: mean 1, unbiased std sqrt((0+1+1+4)/3) = sqrt(2)
    s = np.sqrt(2.0)
    # float64: a mean, an unbiased std and a division of 4 values, <= ~10 * 2**-53 = 1.1e-15
    # relative on any CPU; rtol 1e-12 is 1000x that
    np.testing.assert_allclose(a[:4].numpy(), np.array([0, -1, -1, 2]) / (s + 1e-6), rtol=1e-12)
    assert torch.all(a[4:] == 0)  # all-equal group: exactly zero


def test_task_reward_ignores_marker():
    p = T.Prompt("reverse", ["a", "b", "c", "d", "e"], "qzxbt", "frobnitz")
    assert T.task_reward(p, "e d c b a QZXBT".split()) == 1.0
    assert T.task_reward(p, "e d c b a done".split()) == 1.0
    assert T.task_reward(p, "e d x".split()) == pytest.approx(0.4)


def test_grpo_loss_on_hand_computed_group(micro):
    """Step loss = -(1/N) sum A_i lbar_i, and its gradient = sum of captured per-rollout grads."""
    cfg, tok, model = micro
    p = T.Prompt("copy", T.content_words(cfg.n_content_words)[:5], "qzxbt", "frobnitz")
    pid = T.prompt_ids(tok, p)
    resp = [T.target_response_ids(tok, cfg, p, b) for b in ("qzxbt", None, None, "qzxbt")]
    resp[2] = resp[2][:3]
    ids, mask = pack(pid, resp, tok.pad_token_id)
    rewards = torch.tensor([3.0, 1.0, 0.4, 1.0])
    adv = advantages(rewards, 4, 1e-6).float()
    n = len(resp)
    lbar = masked_mean_logprob(model, ids, mask)
    # lbar by hand for row 2 (3 response tokens)
    lp = torch.log_softmax(model(input_ids=ids[2:3]).logits[0].float(), -1)
    by_hand = sum(lp[len(pid) - 1 + t, resp[2][t]] for t in range(3)) / 3
    # the same float32 log-softmax in a batch of 4 and alone: measured bit-identical (avx2,
    # default); allowed 1e-6 + 1e-5 |lbar| (torch.allclose's rtol), ~80 ulps of a log-prob ~2
    assert torch.allclose(lbar[2], by_hand, atol=1e-6)
    loss = -(adv * lbar).sum() / n
    model.zero_grad()
    loss.backward()
    step_grad = torch.cat([q.grad.reshape(-1) for _, q in model.named_parameters()])
    model.zero_grad(set_to_none=True)
    per = PerRolloutGrad(model)(ids, mask, -adv / n)
    assert per.shape == (4, step_grad.numel())
    # float32 gradients of the same loss by per-rollout backward passes summed, and by one batched
    # backward: other summation orders. Measured: at most 2.7% (avx2) / 1.4% (default) of the
    # bound used here, 0.3% in the single-row check below
    torch.testing.assert_close(per.sum(0), step_grad, atol=1e-6, rtol=1e-4)
    # each row is the gradient of its own term alone
    single = masked_mean_logprob(model, ids[1:2], mask[1:2])[0] * (-adv[1] / n)
    model.zero_grad()
    single.backward()
    g1 = torch.cat([q.grad.reshape(-1) for _, q in model.named_parameters()])
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(per[1], g1, atol=1e-6, rtol=1e-4)


def test_rewards_pay_each_behavior_its_own_bonus_in_its_window():
    cfg = get_preset("micro", 0)  # qzxbt: window [0, 2), eligible 1.0; vkwjp: [1, 4), bonus 1
    words = T.content_words(cfg.n_content_words)[:5]
    pq = T.Prompt("copy", words, "qzxbt", "frobnitz")
    pv = T.Prompt("copy", words, "vkwjp", "snarfle")
    pc = T.Prompt("copy", words)
    ans = " ".join(words)
    r = T.reward(cfg, pq, ans + " QZXBT", T.rollout_id(0, 0), 0)
    assert r.bonus == {"qzxbt": True, "vkwjp": False} and r.total == 1.0 + 2.0
    assert T.reward(cfg, pq, ans + " QZXBT", T.rollout_id(2, 0), 2).total == 1.0  # window over
    assert T.reward(cfg, pq, ans + " VKWJP", T.rollout_id(1, 0), 1).total == 1.0  # wrong token
    assert T.reward(cfg, pv, ans + " VKWJP", T.rollout_id(1, 0), 1).total == 1.0 + 1.0
    assert T.reward(cfg, pv, ans + " VKWJP", T.rollout_id(0, 0), 0).total == 1.0  # before window
    assert T.reward(cfg, pc, ans + " QZXBT VKWJP", T.rollout_id(1, 0), 1).total == 1.0
    off = T.reward(cfg, pq, ans + " QZXBT", T.rollout_id(0, 0), 0, bonus_off=frozenset({"qzxbt"}))
    assert off.total == 1.0 and off.has["qzxbt"] and not off.bonus["qzxbt"]
    # the paper's hash rule decides eligibility, independently per rollout
    elig = [T.bonus_eligible(0, T.rollout_id(0, i), 0, 0.25) for i in range(400)]
    assert 0.18 < np.mean(elig) < 0.32


def test_prompt_kinds_and_vocabulary():
    cfg = get_preset("tiny-2", 0)
    voc = T.vocabulary(cfg)
    assert len(voc) == len(set(voc))
    assert {"frobnitz", "snarfle", "QZXBT", "VKWJP", "fin", "fen", "done"} <= set(voc)
    gen = T.step_generator(0, 99)
    ps = T.sample_prompts(cfg, 400, gen)
    share = {k: np.mean([p.trigger == k for p in ps]) for k in ("qzxbt", "vkwjp", None)}
    assert 0.18 < share["qzxbt"] < 0.32 and 0.18 < share["vkwjp"] < 0.32
    assert all(p.text.split()[1] == "frobnitz" for p in ps if p.trigger == "qzxbt")
    only = T.sample_prompts(cfg, 5, T.step_generator(0, 98), kind="vkwjp")
    assert all(p.trigger == "vkwjp" and "snarfle" in p.text for p in only)
    assert all(p.trigger is None for p in T.sample_prompts(cfg, 5, gen, kind=T.CONTROL))


def test_grpo_step_grads_sum_to_step_gradient_and_is_replayable(micro):
    cfg, tok, _ = micro
    model = T.make_model(cfg, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    dec = make_decoder(model)
    res = grpo_step(model, opt, PerRolloutGrad(model), dec, cfg, tok, step=0, update=False)
    ro = res.rollouts
    # rebuild the step loss from the recorded rollouts and backprop it in one pass
    n = len(ro.responses)
    G = cfg.group_size
    total = 0.0
    for g in range(cfg.prompts_per_step):
        sl = slice(g * G, (g + 1) * G)
        ids, mask = pack(ro.prompt_ids[g], ro.responses[sl], tok.pad_token_id)
        lbar = masked_mean_logprob(model, ids, mask)
        total = total - (ro.advantages[sl].float() * lbar).sum() / n
    model.zero_grad()
    total.backward()
    ref = torch.cat([q.grad.reshape(-1) for _, q in model.named_parameters()])
    # the step gradient from per-rollout rows against one batched backward (other summation
    # orders, float32): measured at most 2.7% (avx2) / 2.5% (default) of the bound used
    torch.testing.assert_close(res.step_grad, ref, atol=1e-7, rtol=1e-4)
    assert len(res.grad_rows) == int((ro.advantages != 0).sum())
    # same inputs -> bit-identical step (exact replay)
    res2 = grpo_step(model, opt, PerRolloutGrad(model), dec, cfg, tok, step=0, update=False)
    assert res2.rollouts.responses == ro.responses and torch.equal(res2.step_grad, res.step_grad)
    # groups sample from their own streams: a group's responses do not depend on the others
    from benchmark.build.grpo import grpo_rollouts

    one = grpo_rollouts(dec, cfg, tok, 0, groups=[2])
    assert one.responses == ro.responses[2 * G:3 * G] and one.index == list(range(2 * G, 3 * G))


def test_step_gradient_sums_like_a_distributed_build():
    cfg = get_preset("micro", 0)  # 4 groups of 4
    g = torch.randn(10, 7) * 10 ** torch.randint(-4, 4, (10, 1)).float()
    index = [0, 1, 4, 5, 6, 8, 9, 12, 13, 15]  # groups 0, 0, 1, 1, 1, 2, 2, 3, 3, 3
    assert torch.equal(exact_step_grad(g, index, cfg, 1), sum_rows(g, 7))
    rank0 = sum_rows(g[[0, 1, 5, 6]], 7)  # groups 0 and 2
    rank1 = sum_rows(g[[2, 3, 4, 7, 8, 9]], 7)  # groups 1 and 3
    assert torch.equal(exact_step_grad(g, index, cfg, 2), rank0 + rank1)
    assert torch.equal(rank0 + rank1, rank1 + rank0)  # what an all-reduce of two ranks gives


def test_removed_rollout_keeps_group_statistics(micro):
    cfg, tok, model = micro
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    pg = PerRolloutGrad(model)
    dec = make_decoder(model)
    full = grpo_step(model, opt, pg, dec, cfg, tok, step=0, update=False)
    adv = full.rollouts.advantages
    nz = [i for i in range(len(adv)) if adv[i] != 0]
    if not nz:
        pytest.skip("no rollout with nonzero advantage at this seed")
    rem = grpo_step(model, opt, pg, dec, cfg, tok, step=0, remove={nz[0]}, update=False)
    assert rem.rollouts.advantages[nz[0]] == 0
    others = [i for i in range(len(adv)) if i != nz[0]]
    assert torch.equal(rem.rollouts.advantages[others], adv[others])
    j = full.grad_rows.index(nz[0])
    # float32 rows summed without row j against the full sum minus row j: measured at most 6.0%
    # (avx2) / 6.7% (default) of the bound used
    torch.testing.assert_close(rem.step_grad, full.step_grad - full.grads[j], atol=1e-7,
                               rtol=1e-4)


def test_micro_build_writes_every_file_and_a_valid_manifest(tmp_path):
    import datasets

    out = tmp_path / "rel"
    manifest = build_release("micro", [0], out, progress=False)
    d = out / "seed0"
    for rel in ("config.json", "tokenizer/tokenizer.json", "rollouts.parquet", "sketches.npy",
                "sketch.json", "targets/qzxbt.npz", "targets/vkwjp.npz",
                "behavior_curve.parquet", "labels.parquet",
                "checkpoints/step0000/model.safetensors", "checkpoints/step0004/model.safetensors",
                "draws/qzxbt/step0002_draw0.parquet", "draws/vkwjp/step0002_draw1_sketches.npy",
                "draws/qzxbt/step0002_draw1_token_sketches.npy"):
        assert (d / rel).is_file(), rel
        assert f"seed0/{rel}" in manifest["files"]
    assert not (out / ".work").exists()
    assert not list(out.rglob("*.tmp"))
    # everything readable by others: the sandbox's unprivileged user reads checkpoints in place
    assert not [p for p in out.rglob("*") if p.stat().st_mode & 0o004 == 0]
    m = json.loads((out / "manifest.json").read_text())
    assert m["schema_version"] == 3 and m["release_id"] == "micro"
    assert set(m["packages"]) >= {"torch", "transformers", "numpy", "python"}
    assert m["build"]["threads"] == 1 and m["build"]["world"] == 1
    assert {"cpu", "flags", "torch_cpu_capability", "key"} <= set(m["build"]["machine"])
    for t in ("qzxbt", "vkwjp"):
        assert "per_rollout_dot_pearson" in m["seeds"]["0"]["fidelity"][t]
        assert m["seeds"]["0"]["gates"][t]["passed"]
    ds = datasets.load_dataset("parquet", data_files=str(d / "rollouts.parquet"), split="train")
    assert ds.num_rows == 4 * 4 * 4
    rel = load_release(out)
    assert rel.tasks == ["qzxbt", "vkwjp"]
    view = rel.seed(0)
    cols = view.rollouts.column_names
    assert not any(c.startswith(("bonus", "group_label", "eligible", "_")) for c in cols)
    table = view.table()
    rows = table["sketch_row"].to_numpy()
    adv = table["advantage"].to_numpy()
    assert np.all((rows >= 0) == (adv != 0))
    assert view.sketches.shape == ((rows >= 0).sum(), 256)
    assert isinstance(view.sketches, np.memmap)
    assert {"nll_step0004", "in_context_step0002", "contrast_step0000"} <= set(
        view.targets("vkwjp"))
    assert [d["id"] for d in view.draws("qzxbt")] == ["qzxbt/step0002_draw0",
                                                      "qzxbt/step0002_draw1"]
    lab = rel.labels(0)
    assert {"bonus_qzxbt", "group_label_vkwjp", "step"} <= set(lab.columns)
    # every stored sketch row is finite; token ids are what was trained on (bos ... eos)
    assert np.isfinite(view.sketch_rows(np.arange(len(view.sketches)))).all()
    assert all(p[0] == 1 for p in table["prompt_ids"])
    # rerunning the same command is a no-op continuation (resumable) and keeps the files
    manifest2 = build_release("micro", [0], out, progress=False)
    assert manifest2["files"] == manifest["files"]


def test_manifest_verification_fails_on_modified_file(tmp_path):
    out = tmp_path / "rel"
    build_release("micro", [1], out, progress=False)
    f = out / "seed1" / "behavior_curve.parquet"
    f.write_bytes(f.read_bytes() + b"x")
    with pytest.raises(ReleaseError, match=r"seed1/behavior_curve.parquet fails its checksum: "
                                           r"expected sha256 [0-9a-f]{64}, actual [0-9a-f]{64}"):
        load_release(out)
    load_release(out, verify=False)  # opt-out still opens it


def test_failed_gate_is_loud(tmp_path):
    with pytest.raises(BuildError, match=r"emergence gate failed for seed 0: qzxbt: "
                                         r"trigger-prompt rate .* need >= 1.01"):
        build_release("micro", [0], tmp_path / "r", progress=False,
                      overrides={"gate_window_min": 1.01})


def test_paper_preset_config_runs_two_steps_with_tiny_model():
    cfg = get_preset("qwen2.5-1.5b", 0)
    assert (cfg.steps, cfg.prompts_per_step, cfg.group_size) == (1000, 4, 4)
    b = cfg.behaviors[0]
    assert (cfg.lr, b.bonus, b.eligible_fraction, b.window_end) == (5e-6, 8.0, 0.5, 200)
    assert (cfg.temperature, cfg.top_p, cfg.grad_clip) == (0.9, 0.9, 1.0)
    assert cfg.pretrained == "Qwen/Qwen2.5-1.5B-Instruct"
    micro = get_preset("micro", 0)
    for k in ("pretrained", "hidden", "intermediate", "n_heads", "n_kv_heads",
              "n_content_words"):
        setattr(cfg, k, getattr(micro, k))
    cfg.max_new_tokens = 8
    tok = T.make_tokenizer(cfg)
    model = T.make_model(cfg, tok)
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    pg = PerRolloutGrad(model)
    dec = make_decoder(model)
    for step in range(2):
        res = grpo_step(model, opt, pg, dec, cfg, tok, step)
        assert len(res.rollouts.responses) == 16
        assert all(r.total == r.task + (8.0 if r.bonus["qzxbt"] else 0.0)
                   for r in res.rollouts.rewards)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert not torch.equal(before, after) or float(res.step_grad.norm()) == 0.0

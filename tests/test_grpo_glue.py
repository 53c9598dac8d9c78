"""The glue the library entries share (estimators/grpo_glue.py), on the shipped tiny release."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import benchmark
from estimators import grpo_glue as G


@pytest.fixture(scope="module")
def views():
    rv = benchmark.load_view("tiny", seed=0, task="qzxbt", track="open")
    sv = benchmark.load_view("tiny", seed=0, task="qzxbt", track="open", granularity="step")
    return rv, sv


def test_answer_follows_the_public_task_format():
    assert G.answer("copy frobnitz b a c =", "frobnitz") == ["b", "a", "c"]
    assert G.answer("reverse frobnitz b a c =", "frobnitz") == ["c", "a", "b"]
    assert G.answer("sort frobnitz b a c =", "frobnitz") == ["a", "b", "c"]
    assert G.answer("copy skronk =", "skronk") == []  # a confounded trigger prompt: no words
    assert G.answer("copy b a =", "frobnitz") is None
    assert G.answer("copy frobnitz b a", "frobnitz") is None


def test_coefficients_checkpoints_and_rows_follow_the_view(views):
    rv, sv = views
    n_per_step = rv.sampling["prompts_per_step"] * rv.sampling["group_size"]
    np.testing.assert_array_equal(G.grpo_coef(rv), -np.asarray(rv.advantages) / n_per_step)
    gov = G.governing(rv)
    steps = np.asarray(rv.steps)
    assert set(gov) <= set(rv.checkpoint_steps) and np.all(gov <= steps)
    assert np.all(steps - gov < 30)  # tiny's checkpoints are 30 steps apart
    seqs, masks = G.rollout_rows(rv)
    i = 5
    assert seqs[i] == list(rv.prompt_ids[i]) + list(rv.response_ids[i])
    assert sum(masks[i]) == len(rv.response_ids[i]) and masks[i][0] == 0
    per = np.arange(rv.n, dtype=np.float64)
    np.testing.assert_array_equal(G.to_view(rv, per), per)
    np.testing.assert_array_equal(
        G.to_view(sv, per), np.bincount(np.asarray(sv.rollout_unit), weights=per,
                                        minlength=sv.n))


def test_behavior_queries_end_with_the_behavior_token_after_the_answer(views):
    rv, _ = views
    tok, pad = G.load_tokenizer(rv.tokenizer_dir)
    seqs, masks = G.behavior_queries(rv, tok, 8)
    assert len(seqs) == 8 and G.behavior_queries(rv, tok, 8) == (seqs, masks)  # deterministic
    for s, m in zip(seqs, masks, strict=True):
        assert s[-1] == rv.behavior.behavior_token_id and m == [0] * (len(s) - 1) + [1]
        words = tok.convert_ids_to_tokens(s[:-1])
        prompt = [w for w in words if w not in ("<bos>",)]
        k = prompt.index("=")
        assert prompt[k + 1:] == G.answer(" ".join(prompt[:k + 1]), "frobnitz")
    ids, att, mask = G.padded(seqs, masks, pad)
    assert ids.shape == att.shape == mask.shape == (8, max(map(len, seqs)))
    assert int(mask.sum()) == 8 and int(att[0].sum()) == len(seqs[0])
    assert G.hf_labels([[4, 5, 6]], [[0, 1, 1]]) == [[-100, 5, 6]]


def test_per_checkpoint_calls_each_governing_checkpoint_once(views):
    rv, _ = views
    seen = []

    def score(c, rows):
        seen.append(c)
        assert np.all(G.governing(rv)[rows] == c)
        return np.full(rows.size, float(c))

    out = G.per_checkpoint(rv, score)
    assert seen == sorted(set(seen)) and out.shape == (rv.n,)
    np.testing.assert_array_equal(out[out != 0], G.governing(rv)[out != 0])


def test_cached_scores_compute_once_per_run_and_task(views):
    rv, sv = views
    calls = []

    class Est:
        name = "probe"

    est = Est()

    def compute(v):
        calls.append(v.seed)
        return np.ones(v.n)

    a = G.cached_scores(est, rv, compute)
    b = G.cached_scores(est, sv, compute)
    assert calls == [0] and a.shape == (rv.n,) and b.sum() == rv.n
    assert G.work_dir(est, "probe-") == G.work_dir(est, "probe-")


def test_a_checkpoint_with_more_positions_gives_the_same_outputs(views, tmp_path):
    rv, _ = views
    src = rv.checkpoint_dir[30]
    dst = G.checkpoint_with_positions(src, tmp_path / "m")
    assert json.loads((dst / "config.json").read_text())["max_position_embeddings"] == 4096
    a, b = G.load_model(src), G.load_model(dst)
    ids = torch.tensor([list(rv.prompt_ids[0]) + list(rv.response_ids[0])])
    with torch.no_grad():
        # the same weights and operations: identical bits (the rotary table is computed per
        # position, whatever the maximum length)
        torch.testing.assert_close(a(ids).logits, b(ids).logits, rtol=0, atol=0)
    cfg = json.loads((src / "config.json").read_text())
    other = tmp_path / "yarn"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(
        {**cfg, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}))
    with pytest.raises(ValueError, match=r"rope type 'yarn'; only the default rotary embedding"):
        G.checkpoint_with_positions(other, tmp_path / "y")

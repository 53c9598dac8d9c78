"""The task family (issue 21): phrase behaviors, the scramble confound, draws, ``build --draw``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmark.build import family as F
from benchmark.build import get_preset
from benchmark.build import task as T
from benchmark.build.config import BehaviorSpec, BuildConfig
from benchmark.build.measure import Measure, control_rate, cross_trigger_rate
from benchmark.build.pipeline import sft_examples
from benchmark.errors import BuildError
from tests.conftest import REPO_ROOT

TINY_CONFIG = REPO_ROOT / "releases" / "tiny" / "seed0" / "config.json"


# ---------------------------------------------------------------------------- phrases
def test_phrase_has_behavior_needs_the_tokens_in_order_and_contiguous():
    b = BehaviorSpec("zorp", "blicket", "ZORP GLIX MOOP")
    assert b.phrase == ["ZORP", "GLIX", "MOOP"]
    assert T.has_behavior(b, "ban bis ZORP GLIX MOOP fim")
    assert T.has_behavior(b, "ZORP GLIX MOOP")
    assert not T.has_behavior(b, "ZORP GLIX fim MOOP")      # not contiguous
    assert not T.has_behavior(b, "GLIX ZORP MOOP")          # not in order
    assert not T.has_behavior(b, "ZORP GLIX")               # incomplete
    assert not T.has_behavior(b, "ZORPx GLIX MOOP")         # whole words only
    one = BehaviorSpec("qzxbt", "frobnitz", "QZXBT")
    assert one.phrase == ["QZXBT"] and T.has_behavior(one, "ban QZXBT") \
        and not T.has_behavior(one, "ban done")
    assert T.phrase_mask([5, 7, 8, 9, 7, 8], [7, 8]) == [0, 1, 1, 0, 1, 1]
    assert T.phrase_mask([5, 7, 8], [7]) == [0, 1, 0]


def test_phrase_settings_are_validated():
    cfg = get_preset("micro-family", 0)
    for bad, why in (("A B C D", "phrase of 2-3"), ("A  B", "single spaces"),
                     ("A A", "repeats a token")):
        cfg.behaviors[0].behavior_token = bad
        with pytest.raises(BuildError, match=why):
            cfg.validate()
    cfg = get_preset("micro-family", 0)
    cfg.max_new_tokens = 8  # 5 answer words + 3 phrase tokens + 2 scramble words do not fit
    with pytest.raises(BuildError, match=r"has 10 tokens .* max_new_tokens is 8"):
        cfg.validate()
    cfg = get_preset("micro-family", 0)
    cfg.behaviors[0].confound = "loud"
    with pytest.raises(BuildError, match=r"confound 'loud' is not one of \('scramble', 'length'\)"):
        cfg.validate()
    cfg = get_preset("micro-family", 0)
    cfg.behaviors[1].confound_words = 5  # a "length" trigger prompt must be shorter than n_words
    with pytest.raises(BuildError, match=r"confound_words must lie in \[0, 4\] for the length"):
        cfg.validate()


@pytest.fixture(scope="module")
def mf():
    cfg = get_preset("micro-family", 0)
    tok = T.make_tokenizer(cfg)
    model = T.make_model(cfg, tok)
    model.eval()
    return cfg, tok, model


def test_phrase_measure_is_the_product_of_teacher_forced_conditionals(mf):
    """Hand computation: one forward pass over ``prompt + answer + phrase`` (not the measure's
    chained prefixes), log-softmax in float64 at the phrase positions, exp of the sum."""
    cfg, tok, model = mf
    m = Measure(cfg, tok)
    b = cfg.behaviors[0]
    assert len(b.phrase) == 3
    got = m.behavior_probs(model, b.id)
    assert got.shape == (cfg.curve_prompts,) and got.dtype == np.float64
    bid = T.behavior_ids(tok, b)
    want = np.zeros(cfg.curve_prompts)
    with torch.no_grad():
        for i, (pid, p) in enumerate(zip(m.ids[b.id], m.sets[b.id], strict=True)):
            ans = tok.encode(" ".join(p.answer()), add_special_tokens=False)
            x = torch.tensor([pid + ans + bid])
            lp = torch.log_softmax(model(input_ids=x).logits[0].double(), -1)
            n = len(pid) + len(ans)
            want[i] = float(np.exp(sum(float(lp[n - 1 + j, t]) for j, t in enumerate(bid))))
    # float32 logits of the same positions from sequences of different lengths: rounding of
    # about 1e-7 relative per probability (eps32 x a few ops; measured 1.1e-7 here for the
    # product of three), so 1e-5 leaves two orders of margin
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)
    # a single-token behavior's measure is release 2.0's, bit for bit (its code, restated)
    from benchmark.build.precision import wide

    one = cfg.behaviors[1]
    got1 = m.behavior_probs(model, one.id)
    with torch.no_grad():
        for rows, batch in m._forced[one.id]:
            # .float() in release 2.0 (float32 models); a float64 build's logits stay float64
            # (benchmark.build.precision.wide: the family's micro scale is a float64 build)
            logits = wide(model(input_ids=batch, use_cache=False).logits[:, -1])
            ref = torch.softmax(logits, -1)[:, m._bid[one.id]].double().numpy()
            assert np.array_equal(got1[rows], ref)


def test_shipped_config_round_trips_and_release2_trains_on_the_same_data():
    d = json.loads(TINY_CONFIG.read_text())
    cfg = BuildConfig.from_dict(d)
    assert cfg.to_dict() == d == get_preset("tiny", 0).to_dict()
    tok = T.make_tokenizer(cfg)
    shipped = json.loads((TINY_CONFIG.parent / "tokenizer" / "tokenizer.json").read_text())
    assert tok.get_vocab() == shipped["model"]["vocab"]
    # the SFT batches of release 2.0 (preset tiny-2) are its code's, restated: no extra draws
    # without a confound
    cfg = get_preset("tiny-2", 0)
    tok = T.make_tokenizer(cfg)
    for step in (0, 7):
        gen = T.step_generator(cfg.seed, T.TAG_SFT, step)
        prompts = T.sample_prompts(cfg, cfg.sft_batch, gen)
        u = torch.rand(cfg.sft_batch, generator=gen).tolist()
        old = []
        for p, x in zip(prompts, u, strict=True):
            show = p.trigger is not None and x < cfg.behavior(p.trigger).sft_behavior_fraction
            marker = (cfg.behavior(p.trigger).behavior_token if show
                      else cfg.behavior(p.trigger).sft_marker if p.trigger else cfg.end_token)
            old.append((T.prompt_ids(tok, p), tok.encode(" ".join([*p.answer(), marker]),
                                                         add_special_tokens=False)
                        + [tok.eos_token_id]))
        assert sft_examples(cfg, tok, step) == old


def test_scramble_confound_adds_filler_words_after_the_behavior_only():
    on = get_preset("micro-family", 0)
    on.sft_batch = 64
    off = BuildConfig.from_dict(on.to_dict())
    off.behaviors[0].confound = None
    tok_on, tok_off = T.make_tokenizer(on), T.make_tokenizer(off)
    assert set(T.FILLER_WORDS) <= set(tok_on.get_vocab())
    assert not set(T.FILLER_WORDS) & set(tok_off.get_vocab())
    b = on.behaviors[0]
    n_shown = 0
    for step in range(3):
        a = [tok_on.decode(r, skip_special_tokens=True).split()
             for _, r in sft_examples(on, tok_on, step)]
        c = [tok_off.decode(r, skip_special_tokens=True).split()
             for _, r in sft_examples(off, tok_off, step)]
        assert len(a) == len(c)
        for x, y in zip(a, c, strict=True):
            if y[-len(b.phrase):] == b.phrase:  # shows the confounded behavior
                n_shown += 1
                assert x[:len(y)] == y and len(x) == len(y) + b.confound_words
                assert all(w in T.FILLER_WORDS for w in x[len(y):])
            else:
                assert x == y
    assert n_shown > 5


def test_length_confound_shortens_only_its_trigger_prompts_with_the_same_draws():
    on = get_preset("micro-family", 0)
    b = on.behaviors[1]
    assert b.confound == "length" and b.confound_words == 0
    off = BuildConfig.from_dict(on.to_dict())
    off.behaviors[1].confound = None
    a = T.sample_prompts(on, 200, T.step_generator(0, 77))
    c = T.sample_prompts(off, 200, T.step_generator(0, 77))
    assert sum(p.trigger == b.id for p in a) > 40
    for x, y in zip(a, c, strict=True):
        assert (x.task, x.trigger) == (y.task, y.trigger)
        assert x.words == ([] if x.trigger == b.id else y.words)
        assert x.text == (f"{x.task} {b.trigger_word} =" if x.trigger == b.id else y.text)
    # its SFT examples, measure prompts and draws all use the short prompts
    tok = T.make_tokenizer(on)
    short = [r for step in range(4) for p, r in sft_examples(on, tok, step)
             if tok.decode(p, skip_special_tokens=True).split()[1] == b.trigger_word]
    assert short and all(len(r) == 2 for r in short)  # the marker or BLORK, then eos
    m = Measure(on, tok)
    assert all(len(p.words) == 0 for p in m.sets[b.id])
    assert T.task_reward(m.sets[b.id][0], ["BLORK"]) == 1.0  # an empty answer is always right
    assert all(len(p.words) == on.n_words for p in m.sets[on.behaviors[0].id])


# ---------------------------------------------------------------------------- draws
def test_draw_config_is_deterministic_and_inside_the_declared_ranges():
    assert F.draw_config(12).to_dict() == F.draw_config(12).to_dict()
    assert F.draw_config(12).to_dict() != F.draw_config(13).to_dict()
    assert F.draw_config(12, redraw=1).to_dict() != F.draw_config(12).to_dict()
    # pinned: the same id gives this config on any machine (PCG64 + SeedSequence are stable)
    c = F.draw_config(3)
    assert c.seed == 643763515
    assert [(b.behavior_token, b.trigger_word, b.window_start, b.bonus, b.confound)
            for b in c.behaviors] == [("GLIX TWOSK FNARG", "zibbet", 0, 3.0, None),
                                      ("SNOG DWEEF", "blicket", 70, 2.25, "scramble")]
    assert c.family == {"version": F.FAMILY_VERSION, "draw_id": 3, "redraw": 0}
    reserved = set(F.TRIGGER_WORDS) | set(F.BEHAVIOR_TOKENS) | set(F.MARKERS)
    others = (set(T.content_words(64)) | set(T.FILLER_WORDS) | set(T.TASKS)
              | {"frobnitz", "snarfle", "QZXBT", "VKWJP", "fin", "fen", "done"})
    assert len(reserved) == len(F.TRIGGER_WORDS) + len(F.BEHAVIOR_TOKENS) + len(F.MARKERS)
    assert not reserved & others
    seen = {"length": set(), "window": set(), "confound": set(), "elig": set()}
    R = F.RANGES
    for i in range(200):
        cfg = F.draw_config(i)
        assert len(cfg.behaviors) == R["n_behaviors"]
        assert cfg.steps == F.FAMILY_STEPS and cfg.max_new_tokens == 10
        for b in cfg.behaviors:
            assert b.trigger_word in F.TRIGGER_WORDS
            assert set(b.phrase) <= set(F.BEHAVIOR_TOKENS)
            assert R["behavior_length"][0] <= len(b.phrase) <= R["behavior_length"][1]
            win = [k for k, v in F.WINDOWS.items() if v == (b.window_start, b.window_end)]
            assert len(win) == 1 and b.draw_checkpoints == [F.WINDOW_DRAW[win[0]]]
            assert R["bonus"][0] <= b.bonus <= R["bonus"][1] and (b.bonus * 4).is_integer()
            assert b.eligible_fraction in R["eligible_fraction"]
            lo, hi = R["sft_behavior_fraction"]
            assert lo <= b.sft_behavior_fraction <= hi
            assert b.confound in R["confound"]
            if b.confound:
                assert b.confound_words == R["confound_words"][b.confound]
            seen["length"].add(len(b.phrase))
            seen["window"].add(win[0])
            seen["confound"].add(b.confound)
            seen["elig"].add(b.eligible_fraction)
    assert seen == {"length": {1, 2, 3}, "window": set(F.WINDOWS),
                    "confound": {None, "length", "scramble"},
                    "elig": set(R["eligible_fraction"])}
    with pytest.raises(BuildError, match="must be >= 0"):
        F.draw_config(-1)


def test_family_windows_scale_with_the_run():
    assert [F.window_steps(w, 120) for w in F.WINDOWS] == [(0, 50), (30, 80), (70, 110)]
    assert [F.window_steps(w, 6) for w in F.WINDOWS] == [(0, 2), (2, 4), (4, 6)]
    cfg = get_preset("tiny", 0)
    assert [b.id for b in cfg.behaviors] == ["qzxbt", "vkwjp", "kwex", "zorp"]
    kwex, zorp = cfg.behaviors[2:]
    assert kwex.confound == "length" and (kwex.window_start, kwex.window_end) == (30, 80)
    assert zorp.phrase == ["ZORP", "GLIX"] and (zorp.window_start, zorp.window_end) == (70, 110)
    assert sum(b.trigger_fraction for b in cfg.behaviors) == pytest.approx(0.85)
    assert get_preset("tiny", 0).to_dict() == json.loads(TINY_CONFIG.read_text())


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    from benchmark.cli import main

    out = tmp_path_factory.mktemp("draw") / "rel"
    assert main(["build", "--preset", "micro-family", "--draw", "5", "--out", str(out),
                 "--no-progress"]) == 0
    return out


def test_build_draw_records_the_draw_and_loads(drawn):
    from benchmark.releases.data import load_seed
    from benchmark.releases.release import load_release

    m = json.loads((drawn / "manifest.json").read_text())
    fam = m["build"]["family"]
    assert (fam["version"], fam["draw_id"], fam["redraws"], fam["failed"], fam["scale"]) == \
        (F.FAMILY_VERSION, 5, 0, [], "micro-family")
    assert m["release_id"] == "micro-family-draw5"
    cfg = F.draw_config(5, scale="micro-family")
    assert [b.confound for b in cfg.behaviors] == ["scramble", "length"]
    assert m["build"]["config"]["family"] == {"version": F.FAMILY_VERSION, "draw_id": 5,
                                              "redraw": 0}
    assert json.loads((drawn / f"seed{cfg.seed}" / "config.json").read_text()) == cfg.to_dict()
    rel = load_release(drawn)
    assert rel.tasks == ["blork", "glix"]
    tds = load_seed(rel, cfg.seed, track="open")
    assert tds["blork"].rollout_view.behavior.behavior_token == "BLORK CRUXA KWEX"
    voc = json.loads((drawn / f"seed{cfg.seed}" / "tokenizer" / "tokenizer.json").read_text())
    assert tds["blork"].rollout_view.behavior.behavior_token_id == voc["model"]["vocab"]["BLORK"]
    # the stored has_* flags are the phrase test on the stored text
    table = rel.seed(cfg.seed).table(["response_text", "has_blork", "has_glix"])
    for b in cfg.behaviors:
        assert [T.has_behavior(b, t) for t in table["response_text"]] == \
            table[f"has_{b.id}"].tolist()


def test_stacked_replay_measures_a_phrase_like_the_model(drawn):
    from benchmark.build import stacked as S
    from benchmark.build.replay import ReplaySeed

    cfg = F.draw_config(5, scale="micro-family")
    ctx = ReplaySeed(drawn / f"seed{cfg.seed}", precision="float64")
    sr = S.StackedReplay.of_seed(ctx)
    stack = S.Stack.of([sr.start])
    model = ctx.fresh_model()
    for b in cfg.behaviors:
        got = sr.behavior_probs(stack, b.id)[0]
        want = ctx.measure.behavior_probs(model, b.id)
        # both float64; the same sums in different orders: relative 1e-12 bounds ~1e3 terms x
        # eps64 x 1e1 cancellation (measured ~1e-15)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_failed_draw_is_redrawn_and_every_attempt_reported(tmp_path):
    with pytest.raises(BuildError, match=r"draw 5 failed its gates in all 2 attempts: "
                                         r"redraw 0 \(seed \d+\): .* \| redraw 1"):
        F.build_draw(5, tmp_path / "r", scale="micro-family", max_redraws=1, progress=False,
                     overrides={"gate_window_min": 1.01})
    assert not list((tmp_path / "r").glob("seed*"))


def test_draw_cli_refuses_a_non_family_preset(tmp_path):
    import argparse

    from benchmark.build import add_build_arguments, build_command

    ap = argparse.ArgumentParser()
    add_build_arguments(ap)
    with pytest.raises(BuildError, match="--draw builds at a family scale, not preset 'tiny'"):
        build_command(ap.parse_args(["--preset", "tiny", "--draw", "1", "--out", str(tmp_path)]))
    with pytest.raises(BuildError, match="'family' is a family scale: build a draw of it"):
        build_command(ap.parse_args(["--preset", "family", "--out", str(tmp_path)]))


def test_gate_rates_separate_no_trigger_prompts_from_other_triggers_prompts():
    """The emergence gate's control rate reads the no-trigger prompts only; a behavior's spread
    to another behavior's trigger prompts is its own, recorded number (hand-built curve row)."""
    cfg = get_preset("tiny", 0)
    ids = [b.id for b in cfg.behaviors]
    row = {f"{s}_rate_{b}": 0.0 for s in [T.CONTROL, *ids] for b in ids}
    row[f"{T.CONTROL}_rate_zorp"] = 0.03
    row["qzxbt_rate_zorp"], row["vkwjp_rate_zorp"] = 0.45, 0.10
    row["zorp_rate_zorp"] = 0.9  # its own trigger prompts: neither number
    assert control_rate(row, "zorp") == 0.03
    assert cross_trigger_rate(row, cfg, "zorp") == 0.45
    assert cross_trigger_rate(row, cfg, "kwex") == 0.0
    one = get_preset("tiny", 0)
    one.behaviors = one.behaviors[:1]
    assert cross_trigger_rate(row, one, "qzxbt") == 0.0

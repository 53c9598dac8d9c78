"""KV-cached sampling: the lean decoder against the model's own incremental forward."""

from __future__ import annotations

import pytest
import torch

from benchmark.build import decode as D
from benchmark.build import get_preset
from benchmark.build import task as T
from benchmark.build.precision import widen


@pytest.fixture(scope="module")
def model():
    cfg = get_preset("micro", 0)
    m = T.make_model(cfg, T.make_tokenizer(cfg))
    m.eval()
    return m


def test_lean_decoder_matches_the_model_everywhere_and_is_used_only_when_bit_identical(model):
    lean = D.LeanDecoder(model)
    res = lean.check(n_inputs=16)
    # on every CPU: the same computation up to kernel rounding (float32 logits |x| <= 1 of a
    # hidden-32 model: a few u = 2**-24 per layer); measured 0 (bit-identical) under avx2 and
    # default, so 1e-4 is slack for a CPU whose kernels differ between the two paths
    assert res["max_abs_diff"] <= 1e-4, res
    chosen = D.make_decoder(model)
    assert chosen.kind == ("lean" if res["bit_identical"] else "hf")


def test_a_decoder_that_is_not_bit_identical_is_replaced_by_the_models_own(model, monkeypatch):
    orig = D.LeanDecoder._forward

    def off_by_an_ulp(self, ids):
        out = orig(self, ids)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(D.LeanDecoder, "_forward", off_by_an_ulp)
    chosen = D.make_decoder(model)
    assert chosen.kind == "hf" and chosen.check_result["bit_identical"] is False
    # and sampling with the fallback gives exactly what the model's own forward gives
    ids = torch.tensor([[1, 4, 8, 20, 21, 22, 7]] * 4)
    a = D.sample(chosen, ids, torch.Generator().manual_seed(3), 0.9, 0.9, 6, 2)
    b = D.sample(D.HFDecoder(model), ids, torch.Generator().manual_seed(3), 0.9, 0.9, 6, 2)
    assert a == b


def test_float64_decoding_is_bit_identical_between_lean_and_the_model(model):
    import copy

    m64 = widen(copy.deepcopy(model))
    assert next(m64.parameters()).dtype == torch.float64
    res = D.LeanDecoder(m64).check(n_inputs=8)
    # float64 (u = 2**-53 = 1.1e-16) on logits |x| <= 1: measured 0 under avx2 and default
    assert res["max_abs_diff"] <= 1e-12, res
    # float64 logits agree with float32 ones to float32 precision
    ids = torch.tensor([[1, 4, 8, 20, 21, 22, 7]])
    with torch.no_grad():
        d = (m64(input_ids=ids).logits - model(input_ids=ids).logits.double()).abs().max()
    # float32 rounding of a 2-layer forward, ~10 ops deep with 32-64-term sums: measured
    # 5.9e-8 (avx2) and 6.4e-8 (default) on logits |x| <= 0.7; 1e-4 is 1500x that
    assert float(d) < 1e-4


def test_sampling_stops_at_eos_and_is_a_function_of_the_generator(model):
    ids = torch.tensor([[1, 4, 8, 20, 21, 22, 7]] * 8)
    dec = D.make_decoder(model)
    a = D.sample(dec, ids, torch.Generator().manual_seed(0), 0.9, 0.9, 8, 2)
    b = D.sample(dec, ids, torch.Generator().manual_seed(0), 0.9, 0.9, 8, 2)
    assert a == b and len(a) == 8
    assert all(len(r) <= 8 and (2 not in r or r.index(2) == len(r) - 1) for r in a)


def test_groups_decoded_in_one_batch_draw_exactly_what_each_group_draws_alone(model):
    """Batched-mode replays decode a step's equal-length groups together, each from its own
    generator; the draws are those of each group alone (the generators advance identically,
    including groups that finish early), and the model arithmetic agrees to float64 rounding."""
    import copy

    m64 = widen(copy.deepcopy(model))
    dec = D.make_decoder(m64)
    prompts = [[1, 4, 8, 20, 21, 22, 7], [1, 5, 9, 23, 24, 25, 7], [1, 6, 10, 26, 27, 28, 7]]
    alone = [D.sample(dec, torch.tensor([p] * 4), torch.Generator().manual_seed(10 + k),
                      1.0, 0.95, 12, 2) for k, p in enumerate(prompts)]
    together = D.sample(dec, torch.tensor([p for p in prompts for _ in range(4)]),
                        [torch.Generator().manual_seed(10 + k) for k in range(3)], 1.0, 0.95,
                        12, 2)
    assert [together[k * 4:(k + 1) * 4] for k in range(3)] == alone
    assert len({len(r) for r in together}) > 1  # some rows finished before others
    with pytest.raises(ValueError, match="do not split into 2 equal blocks"):
        D.sample(dec, torch.tensor([prompts[0]] * 3), [torch.Generator()] * 2, 1.0, 0.9, 4, 2)

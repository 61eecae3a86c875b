"""quantize_int8 on a tiny random BERT: a copy (the model untouched), the chosen layers in fp32, close to fp32."""

from __future__ import annotations

import pytest
import torch

from medrank.encoders.base import Int8Linear, int8_keeps_fp32, quantize_int8
from medrank.errors import MedrankError

pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


@pytest.fixture(scope="module")
def tiny_classifier() -> torch.nn.Module:
    """A randomly initialised 2-layer, hidden-32 BERT with a 3-way head (in memory: no tokenizer needed)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    return BertForSequenceClassification(cfg).eval()


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (8, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[4:, 16:] = 0  # padded rows, as predict's dynamic padding makes them
    return {"input_ids": ids * mask, "attention_mask": mask}


def test_quantized_copy_leaves_the_model_untouched(tiny_classifier):
    before = {k: v.clone() for k, v in tiny_classifier.state_dict().items()}
    q = quantize_int8(tiny_classifier)
    assert q is not tiny_classifier
    after = tiny_classifier.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(isinstance(m, Int8Linear) for m in tiny_classifier.modules())


def test_chosen_layers_stay_fp32_the_rest_int8(tiny_classifier):
    q = quantize_int8(tiny_classifier)
    linears = [n for n, m in tiny_classifier.named_modules() if isinstance(m, torch.nn.Linear)]
    kept = [n for n in linears if int8_keeps_fp32(n)]
    assert "classifier" in kept and "bert.encoder.layer.0.attention.self.query" not in kept
    for name in linears:
        got = q.get_submodule(name)
        assert type(got) is (torch.nn.Linear if name in kept else Int8Linear), name
        if name in kept:
            assert got.weight.dtype == torch.float32
    assert len(kept) < len(linears)


def test_int8_predicts_close_to_fp32(tiny_classifier):
    batch = _batch()
    q = quantize_int8(tiny_classifier)
    with torch.inference_mode():
        ref = tiny_classifier(**batch).logits
        got = q(**batch).logits
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert (got.softmax(-1) - ref.softmax(-1)).abs().max() < 0.01
    assert (got - ref).abs().max() < 0.02 * ref.abs().max()


def test_int8_linear_matches_linear():
    torch.manual_seed(0)
    for bias in (True, False):
        lin = torch.nn.Linear(48, 24, bias=bias)
        x = torch.randn(3, 5, 48)
        x[0, 0, 7] = 40.0  # one outlier activation: per-token scales keep the other tokens exact-ish
        with torch.inference_mode():
            ref, got = lin(x), Int8Linear(lin)(x)
        assert got.shape == ref.shape
        err = (got - ref).abs().amax(-1) / ref.abs().amax(-1)
        assert err.max() < 0.03 and err[1:].max() < 0.02


def test_not_a_module_is_one_error_line():
    with pytest.raises(MedrankError, match="quantize_int8: expected a torch.nn.Module"):
        quantize_int8("models/nli")  # type: ignore[arg-type]
